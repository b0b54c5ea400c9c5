// The pruner service driven directly through runOnce.
import { Pruner } from "../src/worker/pruner.ts";
import { assertEquals } from "./assert.ts";
import { holdLocks, withApp } from "./_helpers.ts";

Deno.test("the pruner deletes old terminal jobs in bounded batches and keeps the rest", async () => {
  await withApp("w_pruner", async (app, sql) => {
    await sql`insert into akadze.jobs (task, state, finished_at)
              select 't', 'succeeded', now() - interval '8 days' from generate_series(1, 25)`;
    await sql`insert into akadze.jobs (task, state, finished_at)
              values ('t', 'failed', now() - interval '1 day'), ('t', 'cancelled', now())`;
    await sql`insert into akadze.jobs (task, created_at) values ('t', now() - interval '30 days')`;
    // An old fire goes; a schedule's last fire stays, however old (a backfill starts after
    // it), and so does an old fire recorded within the grace (a backfill's).
    await sql`insert into akadze.periodic_runs (name, fire_at, created_at) values
              ('old', now() - interval '3 days', now() - interval '3 days'), ('old', now(), now()),
              ('last', now() - interval '3 days', now() - interval '3 days'),
              ('backfilled', now() - interval '3 days', now()), ('backfilled', now(), now())`;
    await sql`insert into akadze.limit_starts (key, started_at, job_id) values ('gone', now(), 1)`;
    const pruner = new Pruner(app.sql, {
      schema: app.schema,
      retention: 7 * 86_400_000,
      grace: 60_000,
      batchSize: 10,
      maxBatches: 2,
    });
    assertEquals(await pruner.runOnce(), { jobs: 20, periodicRuns: 1, limitStarts: 1 });
    assertEquals((await pruner.runOnce()).jobs, 5);
    const runs = await sql`select name, fire_at < now() - interval '1 day' as old
                           from akadze.periodic_runs order by name, fire_at`;
    assertEquals(runs.map((r) => `${r.name}:${r.old}`), [
      "backfilled:true",
      "backfilled:false",
      "last:true",
      "old:false",
    ]);
    const rows = await sql`select state from akadze.jobs order by state`;
    assertEquals(rows.map((r) => r.state), ["cancelled", "failed", "queued"]);
  });
});

Deno.test("a prune skips rows another transaction holds locked instead of waiting for them", async () => {
  await withApp("w_prune_locked", async (app, sql, db) => {
    const old = await sql`insert into akadze.jobs (task, state, finished_at)
                          select 't', 'failed', now() - interval '8 days'
                            from generate_series(1, 3) returning id`;
    await sql`insert into akadze.periodic_runs (name, fire_at, created_at) values
              ('a', now() - interval '3 days', now() - interval '3 days'), ('a', now(), now()),
              ('b', now() - interval '3 days', now() - interval '3 days'), ('b', now(), now())`;
    const pruner = new Pruner(app.sql, { schema: app.schema, retention: 86_400_000, grace: 0 });
    // Another session keeps one old job and one old fire locked (say, a requeue not yet
    // committed), for longer than the prune may take.
    const held = await holdLocks(db.url, async (tx) => {
      await tx`select 1 from akadze.jobs where id = ${old[0].id} for update`;
      await tx`select 1 from akadze.periodic_runs where name = 'a' for update`;
    });
    try {
      const timeout = new Promise<"waited">((r) => setTimeout(() => r("waited"), 5_000));
      const pruned = await Promise.race([pruner.runOnce(), timeout]);
      assertEquals(pruned, { jobs: 2, periodicRuns: 1, limitStarts: 0 });
    } finally {
      await held.release();
    }
    assertEquals((await pruner.runOnce()).jobs, 1, "the row is pruned once it is free");
    // Each schedule's last fire stays.
    assertEquals((await sql`select count(*)::int as n from akadze.periodic_runs`)[0].n, 2);
  });
});
