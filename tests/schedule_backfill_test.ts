// Schedule backfill: after an outage, the fires a schedule missed within its backfill window
// are enqueued once across all workers, oldest first, each job's run_at its fire time.
import { Akadze } from "../src/app.ts";
import { AkadzeError } from "../src/errors.ts";
import type { Sql } from "../src/db.ts";
import { BACKFILL_PER_PASS, Scheduler } from "../src/worker/scheduler.ts";
import { assert, assertEquals, assertThrows } from "./assert.ts";
import { withApp } from "./_helpers.ts";

const MINUTE = 60_000;

/** The database clock, in ms. */
async function dbNow(sql: Sql): Promise<number> {
  const [{ now }] = await sql`select extract(epoch from now())::float8 * 1000 as now`;
  return now;
}

/** Record a fire as if a worker had dispatched it before the outage. */
async function recordFire(sql: Sql, name: string, at: number): Promise<void> {
  await sql`insert into akadze.periodic_runs (name, fire_at, created_at)
            values (${name}, ${new Date(at)}, now() - interval '1 hour')`;
}

/** Fires recorded after `after` and the jobs they enqueued, in fire order. */
async function firesAfter(sql: Sql, name: string, after: number) {
  return await sql`
    select extract(epoch from r.fire_at)::float8 * 1000 as fire, j.id::bigint as id,
           extract(epoch from j.run_at)::float8 * 1000 as run_at
      from akadze.periodic_runs r join akadze.jobs j on j.id = r.job_id
     where r.name = ${name} and r.fire_at > ${new Date(after)} order by r.fire_at`;
}

Deno.test("workers starting after an outage enqueue each missed fire in the window once, oldest first", async () => {
  await withApp("backfill_outage", async (app, sql) => {
    app.periodic("report", { every: MINUTE, backfill: 10 * MINUTE }, () => {});
    const now = await dbNow(sql);
    const last = Math.floor(now / MINUTE) * MINUTE - 5 * MINUTE; // 5 minutes of outage
    await recordFire(sql, "report", last);

    // Three workers start at once; each runs its scheduler's first pass.
    await Promise.all([1, 2, 3].map(() => new Scheduler(app.sql, { app }).runOnce()));
    const fires = await firesAfter(sql, "report", last);
    // Every minute mark after the last recorded fire, up to now (a minute may have begun).
    assert(fires.length === 5 || fires.length === 6, `${fires.length} fires`);
    fires.forEach((f, i) => assertEquals(f.fire, last + (i + 1) * MINUTE));
    for (const f of fires) assertEquals(f.run_at, f.fire, "the job's run_at is its fire time");
    const ids = fires.map((f) => Number(f.id));
    assertEquals(ids, [...ids].sort((a, b) => a - b), "enqueued oldest first");
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs where task = 'report'`;
    assertEquals(n, fires.length, "each fire once");

    // A later pass, and another worker's first pass, enqueue nothing more.
    await new Scheduler(app.sql, { app }).runOnce();
    const again = await firesAfter(sql, "report", last);
    assertEquals(again.length >= fires.length && again.length <= fires.length + 1, true);
  });
});

Deno.test("a backfill stops at its window, starts after the last recorded fire, and never fires a new schedule's past", async () => {
  await withApp("backfill_window", async (app, sql) => {
    app.periodic("short", { every: MINUTE, backfill: 3 * MINUTE }, () => {});
    app.periodic("fresh", { every: MINUTE, backfill: 60 * MINUTE }, () => {});
    app.periodic("plain", { every: MINUTE }, () => {});
    const now = await dbNow(sql);
    const mark = Math.floor(now / MINUTE) * MINUTE;
    await recordFire(sql, "short", mark - 30 * MINUTE);
    await recordFire(sql, "plain", mark - 30 * MINUTE);
    await new Scheduler(app.sql, { app }).runOnce();

    // Only the fires within the last 3 minutes.
    const short = await firesAfter(sql, "short", mark - 30 * MINUTE);
    assert(short.length >= 3 && short.length <= 4, `${short.length} fires`);
    for (const f of short) assert(f.fire > now - 3 * MINUTE, `fire ${new Date(f.fire)}`);
    // No rows yet: only the latest fire, as without backfill; and no window: the latest only.
    assertEquals((await firesAfter(sql, "fresh", 0)).length, 1);
    assertEquals((await firesAfter(sql, "plain", mark - 30 * MINUTE)).length, 1);
  });
});

Deno.test("a long backfill is enqueued over several passes, in order", async () => {
  await withApp("backfill_passes", async (app, sql) => {
    app.periodic("tick", { every: 1_000, backfill: 10 * MINUTE }, () => {});
    const now = await dbNow(sql);
    const last = Math.floor(now / 1_000) * 1_000 - MINUTE; // 60 missed fires
    await recordFire(sql, "tick", last);
    const scheduler = new Scheduler(app.sql, { app });
    assertEquals((await scheduler.runOnce()).fired.length, BACKFILL_PER_PASS);
    // Until a pass has only the latest fire (or none) left; bounded.
    for (let pass = 0; pass < 50; pass++) {
      if ((await scheduler.runOnce()).fired.length <= 1) break;
    }
    const fires = await firesAfter(sql, "tick", last);
    assert(fires.length >= 60, `${fires.length} fires`);
    fires.forEach((f, i) => assertEquals(f.fire, last + (i + 1) * 1_000));
    const ids = fires.map((f) => Number(f.id));
    assertEquals(ids, [...ids].sort((a, b) => a - b));
  });
});

Deno.test("backfill is checked at registration", async () => {
  const app = new Akadze({ databaseUrl: "postgres://u@127.0.0.1:1/x_test" });
  try {
    app.task("t", () => {});
    for (const backfill of [-1, 1.5, "1h", 32 * 86_400_000]) {
      assertThrows(
        () => app.addSchedule("t", { every: 60_000, backfill: backfill as never }),
        AkadzeError,
      );
    }
    assertEquals(app.addSchedule("t", { every: 60_000, backfill: 3_600_000 }).backfill, 3_600_000);
  } finally {
    await app.close();
  }
});
