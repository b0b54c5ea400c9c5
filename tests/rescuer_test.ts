// The rescuer service driven directly through runOnce.
import { Rescuer } from "../src/worker/rescuer.ts";
import { assertEquals, assertThrows } from "./assert.ts";
import { withApp } from "./_helpers.ts";

Deno.test("the rescuer returns lost jobs with an attempt spent, fails exhausted ones, removes stale workers", async () => {
  await withApp("w_rescuer", async (app, sql) => {
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
              values ('dead', 'h', 1, '{default}', now() - interval '1 minute', 30000),
                     ('alive', 'h', 2, '{default}', now(), 30000)`;
    const insert = (worker: string, attempt: number, max: number) =>
      sql`insert into akadze.jobs (task, state, worker_id, run_count, attempt, max_attempts, started_at)
          values ('t', 'running', ${worker}, 1, ${attempt}, ${max}, now()) returning id::text as id`;
    const [dead] = await insert("dead", 0, 3);
    const [gone] = await insert("vanished", 0, 3);
    const [last] = await insert("dead", 2, 3);
    const [alive] = await insert("alive", 0, 3);
    const result = await new Rescuer(app.sql, { schema: app.schema, hooks: [] }).runOnce();
    assertEquals(result, { rescued: 3, failed: 1, removedWorkers: 1 });
    const rows =
      await sql`select id::text as id, state, attempt, worker_id, errors from akadze.jobs`;
    const byId = new Map(rows.map((r) => [r.id, r]));
    assertEquals([byId.get(dead.id)?.state, byId.get(dead.id)?.attempt], ["queued", 1]);
    assertEquals(byId.get(dead.id)?.errors[0].error, "WorkerLost");
    assertEquals([byId.get(gone.id)?.state, byId.get(gone.id)?.attempt], ["queued", 1]);
    assertEquals([byId.get(last.id)?.state, byId.get(last.id)?.attempt], ["failed", 3]);
    assertEquals(byId.get(alive.id)?.state, "running");
    assertEquals((await sql`select id from akadze.workers`).map((r) => r.id), ["alive"]);
  });
});

Deno.test("the rescuer rescues at most batchSize jobs per pass and is due once per interval", async () => {
  await withApp("rescuer_batch", async (app, sql) => {
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
              values ('dead', 'h', 1, '{default}', now() - interval '1 minute', 30000)`;
    await sql`insert into akadze.jobs (task, state, worker_id, run_count, started_at)
              select 't', 'running', 'dead', 1, now() from generate_series(1, 5)`;
    assertEquals(new Rescuer(app.sql, { schema: app.schema, hooks: [] }).interval, 5_000);
    const config = { schema: app.schema, hooks: [], batchSize: 2, interval: 600_000 };
    const rescuer = new Rescuer(app.sql, config);
    assertEquals(await rescuer.runIfDue(), { rescued: 2, failed: 0, removedWorkers: 0 });
    assertEquals(await rescuer.runIfDue(), null, "not due again within the interval");
    assertEquals((await rescuer.runOnce()).rescued, 2);
    assertEquals((await rescuer.runOnce()).rescued, 1);
    assertThrows(() => new Rescuer(app.sql, { schema: app.schema, hooks: [], batchSize: 0 }));
  });
});

Deno.test("the rescuer finds a stale worker's jobs every pass, and jobs whose worker row is gone on its first pass and then every fullEvery", async () => {
  await withApp("rescuer_full", async (app, sql) => {
    // A stale worker row (removed by each pass once its jobs are rescued).
    const dead = () =>
      sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
          values ('dead', 'h', 1, '{default}', now() - interval '1 minute', 30000)
          on conflict do nothing`;
    const insert = (worker: string) =>
      sql`insert into akadze.jobs (task, state, worker_id, run_count, started_at)
          values ('t', 'running', ${worker}, 1, now()) returning id::text as id`;
    const config = { schema: app.schema, hooks: [], fullEvery: 600_000 };
    const rescuer = new Rescuer(app.sql, config);
    await insert("vanished");
    assertEquals((await rescuer.runOnce()).rescued, 1, "the first pass looks at every job");
    const [gone] = await insert("vanished");
    await dead();
    await insert("dead");
    assertEquals((await rescuer.runOnce()).rescued, 1, "only the stale worker's job");
    const [{ state }] = await sql`select state from akadze.jobs where id = ${gone.id}`;
    assertEquals(state, "running");
    assertEquals((await rescuer.runOnce({ full: true })).rescued, 1);
    const hooked = new Rescuer(app.sql, { ...config, hooks: [() => {}] });
    await insert("vanished");
    await dead();
    await insert("dead");
    assertEquals((await hooked.runOnce()).rescued, 2, "with hooks too");
  });
});
