// The worker's SQL functions keep generic plans per connection: the outcome write
// (`complete_jobs`) and the one-queue claim (`claim_one`) must find their jobs by index
// whatever the statistics or the table's size were when the plan was made.
import { connect } from "../src/db.ts";
import { Completer } from "../src/worker/completer.ts";
import { assert, assertEquals } from "./assert.ts";
import { jobsSeqScans, withApp, workClaimer } from "./_helpers.ts";

Deno.test("a batch outcome write looks jobs up by primary key when statistics say none run", async () => {
  await withApp("completer_plan", async (_app, sql, db) => {
    // Statistics taken while every job is queued: the running-jobs index then looks empty,
    // the trap a drain starts in.
    await sql`insert into akadze.jobs (task) select 'work' from generate_series(1, 5000)`;
    await sql`analyze akadze.jobs`;
    const ids = (await sql`
      update akadze.jobs set state = 'running', worker_id = 'w1', run_count = 1,
                             started_at = now()
       where id in (select id from akadze.jobs order by id limit 300)
      returning id::text as id`).map((r) => r.id as string);

    const one = connect(db.url, { max: 1 });
    try {
      // Index scans counted by the statistics system, flushed by this backend on request.
      const scans = async () => {
        await one`select pg_stat_force_next_flush()`;
        const rows = await one`
          select indexrelname as name, idx_scan::int as n from pg_stat_user_indexes
           where relname = 'jobs' and schemaname = 'akadze'
             and indexrelname in ('jobs_pkey', 'jobs_running_worker_idx')`;
        return Object.fromEntries(rows.map((r) => [r.name, r.n]));
      };
      const before = await scans();
      const completer = new Completer(one, "akadze", []);
      // A stale run (run_count 0) is fenced out; the rest are written.
      const outcomes = ids.map((id, i) => ({
        id,
        runCount: i === 0 ? 0 : 1,
        kind: "succeeded" as const,
      }));
      const { written, stale } = await completer.write(outcomes);
      assertEquals(written.length, ids.length - 1);
      assertEquals(stale.map((o) => o.id), [ids[0]]);
      const after = await scans();
      assertEquals(
        after.jobs_running_worker_idx - before.jobs_running_worker_idx,
        0,
        "the write scanned the running-jobs index",
      );
      assert(
        after.jobs_pkey - before.jobs_pkey >= ids.length,
        "one primary key lookup per outcome",
      );
    } finally {
      await one.end();
    }
    const states = await sql`
      select state, count(*)::int as n from akadze.jobs where id = any(${ids}::bigint[])
       group by state order by state`;
    assertEquals(states.map((r) => [r.state, r.n]), [["running", 1], ["succeeded", 299]]);
  });
});

Deno.test("claim and outcome plans made on a near-empty table still look jobs up by index when it grows", async () => {
  await withApp("plans_grow", async (app, sql, db) => {
    const work = app.task("work", () => {});
    // No autovacuum: its statistics update would re-plan and hide a plan made too early.
    await sql`alter table akadze.jobs set (autovacuum_enabled = off)`;
    const one = connect(db.url, { max: 1 });
    try {
      const claimer = workClaimer(one);
      const completer = new Completer(one, "akadze", []);
      const runOne = async () => {
        const [job] = (await claimer.claim([{ queue: "default", slots: 1 }], 1)).claimed;
        assert(job !== undefined, "a job was claimed");
        const { written } = await completer.write([
          { id: job.id, runCount: job.run_count, kind: "succeeded" },
        ]);
        assertEquals(written.map((r) => r.state), ["succeeded"]);
      };
      // Both plans are made now, on a table of one row.
      await work.enqueue({});
      await runOne();
      await sql`insert into akadze.jobs (task, state, run_count, started_at, finished_at)
                select 'work', 'succeeded', 1, now(), now() from generate_series(1, 20000)`;
      await work.enqueue({});
      const before = await jobsSeqScans(one);
      await runOne();
      assertEquals(
        await jobsSeqScans(one) - before,
        0,
        "a claim or an outcome write scanned the table",
      );
    } finally {
      await one.end();
    }
  });
});
