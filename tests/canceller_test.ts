// The canceller service driven directly through runOnce: the cancel pass of queued jobs.
import { Canceller } from "../src/worker/canceller.ts";
import { assertEquals, assertThrows } from "./assert.ts";
import { withApp, withLogs } from "./_helpers.ts";

Deno.test("the canceller ends queued jobs with a cancel request or a passed expiry, in its queues only", async () => {
  await withApp("canceller_pass", async (app, sql) => {
    const [requested] = await sql`insert into akadze.jobs (task, cancel_requested_at)
                                  values ('t', now()) returning id::text as id`;
    const [expired] = await sql`insert into akadze.jobs (task, expires_at)
                                values ('t', now() - interval '1 second') returning id::text as id`;
    const [ready] = await sql`insert into akadze.jobs (task) values ('t') returning id::text as id`;
    const [other] = await sql`insert into akadze.jobs (task, queue, cancel_requested_at)
                              values ('t', 'other', now()) returning id::text as id`;
    const canceller = new Canceller(app.sql, {
      schema: app.schema,
      queues: ["default"],
      hooks: [],
    });
    const records = await withLogs(async () => {
      assertEquals(await canceller.runOnce(), { cancelled: 2, rolledBack: 0 });
    });
    const states = new Map(
      (await sql`select id::text as id, state from akadze.jobs`).map((r) => [r.id, r.state]),
    );
    assertEquals(
      [requested.id, expired.id, ready.id, other.id].map((id) => states.get(id)),
      ["cancelled", "cancelled", "queued", "queued"],
    );
    const logged = records.filter((r) => r.properties.event === "job_cancelled");
    assertEquals(logged.map((r) => r.properties.jobId).sort(), [requested.id, expired.id].sort());
    assertEquals(await canceller.runOnce(), { cancelled: 0, rolledBack: 0 });
  });
});

Deno.test("the canceller cancels at most batchSize per pass; a failing hook rolls back only its job", async () => {
  await withApp("canceller_hooks", async (app, sql) => {
    const ids = (await sql`insert into akadze.jobs (task, cancel_requested_at)
                           select 't', now() from generate_series(1, 3)
                           returning id::text as id`).map((r) => r.id as string);
    const veto = ids[0];
    const canceller = new Canceller(app.sql, {
      schema: app.schema,
      queues: ["default"],
      batchSize: 2,
      hooks: [(_tx, job) => {
        if (job.id === veto) throw new Error("vetoed");
      }],
    });
    // One pass: the vetoed job counts against the batch, the next one is cancelled.
    assertEquals(await canceller.runOnce(), { cancelled: 1, rolledBack: 1 });
    assertEquals(await canceller.runOnce(), { cancelled: 1, rolledBack: 1 });
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs where state = 'queued'`;
    assertEquals(n, 1, "only the vetoed job is still queued");
    assertThrows(() =>
      new Canceller(app.sql, { schema: app.schema, queues: [], hooks: [], batchSize: 0 })
    );
  });
});
