// Limits enforced by the claim (SPEC §5.11), raced by several worker processes.
import { setLimit } from "../src/admin.ts";
import { assert, assertEquals } from "./assert.ts";
import { countJobs, startWorker, waitFor, withApp } from "./_helpers.ts";
import { WORKER_PERMISSIONS } from "./_processes.ts";

const FIXTURE = new URL("./fixtures/limits_worker.ts", import.meta.url).pathname;

function spawnWorker(url: string, options: Record<string, unknown>): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...WORKER_PERMISSIONS,
      FIXTURE,
      JSON.stringify({ pollInterval: 20, heartbeatInterval: 500, heartbeatTtl: 5000, ...options }),
    ],
    env: { AKADZE_DATABASE_URL: url },
    stdout: "null",
    stderr: "null",
    stdin: "null",
  }).spawn();
}

Deno.test("maxRunning is never exceeded by worker processes racing on one key; others flow", async () => {
  await withApp("lim_running", async (app, sql, db) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "api", { maxRunning: 2 });
    await work.using({ limitKey: "api" }).enqueueMany(
      Array.from({ length: 60 }, () => ({ ms: 15 })),
    );
    await work.using({ limitKey: "no-row" }).enqueueMany(
      Array.from({ length: 20 }, () => ({ ms: 15 })),
    );
    await work.enqueueMany(Array.from({ length: 20 }, () => ({ ms: 15 })));
    const workers = [0, 1, 2].map(() => spawnWorker(db.url, { slots: 4 }));
    let peak = 0;
    let peakFree = 0;
    try {
      await waitFor(
        async () => {
          const [s] = await sql`
          select count(*) filter (where state = 'running' and limit_key = 'api')::int as api,
                 count(*) filter (where state = 'running' and limit_key is distinct from 'api')::int
                   as free,
                 count(*) filter (where state = 'succeeded')::int as done
            from akadze.jobs`;
          peak = Math.max(peak, s.api);
          peakFree = Math.max(peakFree, s.free);
          return s.done === 100;
        },
        "all 100 jobs",
        90_000,
      );
    } finally {
      for (const w of workers) w.kill("SIGTERM");
      for (const w of workers) await w.status;
    }
    assert(peak <= 2, `maxRunning 2 exceeded: ${peak} running`);
    assertEquals(peak, 2, "the key did run at its limit");
    assert(peakFree > 2, `jobs without a limit ran alongside (peak ${peakFree})`);
    const [row] = await sql`select max(run_count)::int as runs, max(attempt)::int as attempts
                            from akadze.jobs`;
    assertEquals(row, { runs: 1, attempts: 0 }, "held jobs kept their attempt and run_count");
  });
});

Deno.test("maxStarts per window caps claims and counts them in limit_starts", async () => {
  await withApp("lim_rate", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "rate", { maxStarts: 3, window: 3_000 });
    await work.using({ limitKey: "rate" }).enqueueMany(Array.from({ length: 7 }, () => ({})));
    const free = await work.enqueue();
    const w = startWorker(app, { slots: 5 });
    try {
      await waitFor(async () => {
        const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                  where state = 'succeeded' and limit_key = 'rate'`;
        return n === 3;
      }, "the first window's three starts");
      const [{ first }] = await sql`select min(started_at) as first from akadze.limit_starts`;
      await new Promise((r) => setTimeout(r, 800));
      const [s] = await sql`select count(*) filter (where state = 'succeeded')::int as done,
                                   count(*) filter (where state = 'queued' and run_count = 0)::int
                                     as held,
                                   now() - ${first}::timestamptz < interval '3 seconds' as in_window
                              from akadze.jobs where limit_key = 'rate'`;
      if (s.in_window) assertEquals([s.done, s.held], [3, 4]);
      const [{ marks }] = await sql`select count(*)::int as marks from akadze.limit_starts`;
      assert(marks >= 3);
      await waitFor(
        async () => {
          const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                  where state = 'succeeded' and limit_key = 'rate'`;
          return n === 7;
        },
        "all rate-limited jobs over three windows",
        30_000,
      );
      const [row] = await sql`select state from akadze.jobs where id = ${free}`;
      assertEquals(row.state, "succeeded");
    } finally {
      await w.stop();
    }
    assertEquals(await countJobs(sql), 8);
  });
});

Deno.test("a limit key without a limits row is unlimited", async () => {
  await withApp("lim_none", async (app, sql) => {
    let running = 0;
    let peak = 0;
    const t = app.task("t", async () => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 100));
      running--;
    });
    await t.using({ limitKey: "unlimited" }).enqueueMany(Array.from({ length: 5 }, () => ({})));
    const w = startWorker(app, { slots: 5 });
    await waitFor(async () => {
      const [{ n }] =
        await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
      return n === 5;
    }, "all jobs");
    await w.stop();
    assertEquals(peak, 5);
  });
});
