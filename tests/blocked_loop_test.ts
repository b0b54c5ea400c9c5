// A handler that blocks the worker's event loop longer than the heartbeat TTL (a CPU-bound
// task run in the loop): whatever happens, the job ends within its attempts, a job still
// owned when the loop wakes keeps its outcome, the stored error names the block and its
// length, and the log names the task and job that blocked the loop.
import type { Sql } from "../src/db.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { startWorker, waitFor, waitForJob, withApp, withDatabase, withLogs } from "./_helpers.ts";
import { MOD, SLOW, spawnCli, withDir, withProcesses } from "./_processes.ts";

/** Scaled from the defaults (5 s beat, 30 s TTL, a 45 s loop): the loop blocks for 2 x TTL. */
const SCALED = {
  heartbeatInterval: 500,
  heartbeatTtl: 2_000,
  pollInterval: 100,
  shutdownTimeout: 2_000,
  schedules: false,
} as const;
const BLOCK_MS = 4_000;

function busy(ms: number): number {
  const end = performance.now() + ms;
  let n = 0;
  while (performance.now() < end) n++;
  return n;
}

type Entry = { error: string; message: string };
type Row = { state: string; attempt: number; run_count: number; errors: Entry[]; result: unknown };

async function row(sql: Sql, id: string): Promise<Row> {
  const [r] = await sql`select state, attempt, run_count, errors, result from akadze.jobs
    where id = ${id}`;
  return r as unknown as Row;
}

Deno.test("a loop blocked for twice the TTL, one worker: the job's outcome is written on its first run, the worker runs on, and the warning names the task, the job and the block", async () => {
  await withLogs(async (records) => {
    await withApp("blocked_one_worker", async (app, sql) => {
      let runs = 0;
      const task = app.task("crunch", { maxAttempts: 3 }, () => {
        runs++;
        busy(BLOCK_MS);
        return "crunched";
      });
      const fine = app.task("fine", () => "fine");
      // A worker id of its own, as after a restart under the same id.
      const w = startWorker(app, { ...SCALED, id: "blocked-worker" });
      let exited = false;
      w.exit.finally(() => exited = true);
      try {
        const id = await task.enqueue();
        const r = await waitForJob(sql, id, (r) => r.state !== "running" && r.state !== "queued");
        assertEquals([r.state, r.attempt, r.run_count, r.result, runs], [
          "succeeded",
          0,
          1,
          "crunched",
          1,
        ]);
        // The worker beats again and runs on: a later job runs in it.
        const next = await fine.enqueue();
        const n = await waitForJob(sql, next, (r) => r.state === "succeeded");
        assertEquals(n.worker_id, "blocked-worker"); // it ran there (and the id is kept)
        assert(
          !exited,
          `the worker stopped: ${JSON.stringify(await Promise.race([w.exit, null]))}`,
        );
        const blocked = records.filter((r) => r.properties.event === "loop_blocked");
        assertEquals(blocked.length, 1, "one warning for the block");
        assertEquals(blocked[0].level, "warning");
        assertEquals([blocked[0].properties.task, blocked[0].properties.jobId], ["crunch", id]);
        assert((blocked[0].properties.blockedMs as number) >= BLOCK_MS);
      } finally {
        const exit = await w.stop();
        assertEquals([exit.code, exit.reason], [0, "stopped"], exit.message);
      }
    });
  });
});

/** An app whose `crunch` task blocks the loop for BLOCK_MS; `fine` returns at once. */
const BLOCKING_APP = `
import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("crunch", { maxAttempts: 2 }, () => {
  const end = performance.now() + ${BLOCK_MS};
  while (performance.now() < end);
  return "crunched";
});
app.task("wait", async () => {
  await new Promise((resolve) => setTimeout(resolve, 2_000));
  return "waited";
});
`;

const WORKER_FLAGS = [
  "--heartbeat-interval",
  "0.5",
  "--heartbeat-ttl",
  "2",
  "--poll-interval",
  "0.1",
  "--log-format",
  "json",
];

async function insertJob(sql: Sql, task: string, maxAttempts = 2): Promise<string> {
  const [{ id }] = await sql`insert into akadze.jobs (task, args, max_attempts)
    values (${task}, '{}', ${maxAttempts}) returning id::text as id`;
  return id;
}

Deno.test("a loop blocked for twice the TTL, two worker processes: each rescued run is charged as a blocked loop with its length, maxAttempts ends the job, neither worker exits", async () => {
  await withDir({ "app.ts": BLOCKING_APP }, async (dir) => {
    await withDatabase("blocked_two_workers", async (db, sql) => {
      await withProcesses(async () => {
        const env = { AKADZE_DATABASE_URL: db.url };
        const workers = [0, 1].map(() =>
          spawnCli(["worker", ...WORKER_FLAGS, `${dir}/app.ts`], env)
        );
        for (const w of workers) await w.waitForEvent("worker_started");
        const id = await insertJob(sql, "crunch");
        const r = (await waitFor(
          async () => {
            const r = await row(sql, id);
            return r.state === "failed" && r.errors.every((e) => e.error === "LoopBlocked")
              ? r
              : null;
          },
          "the job to fail with every run charged as a blocked loop",
          SLOW,
        ))!;
        assertEquals([r.attempt, r.errors.length], [2, 2]);
        for (const entry of r.errors) {
          assertMatch(entry.message, /blocked the event loop of worker .* for \d+(\.\d)? s/);
        }
        // Both still run (no heartbeat_lost exit), and stop cleanly.
        for (const w of workers) {
          assertEquals(w.events("worker_stopped").length, 0, w.stderr());
          w.child.kill("SIGTERM");
          const out = await w.done();
          assertEquals(out.code, 0, out.stderr);
        }
        const warned = workers.flatMap((w) => w.events("loop_blocked"));
        assert(warned.length >= 2, "each blocked run is logged");
        for (const w of warned) assertEquals([w.task, w.jobId], ["crunch", id]);
      });
    });
  });
});

/**
 * `crunch_later` blocks the loop for BLOCK_MS after an await (the lag timer's case, where
 * the worker tells the culprit by which jobs run when it wakes: it is still running then);
 * `nap` spins in a sandbox thread.
 */
const SANDBOX_APP = `
import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("crunch_later", { maxAttempts: 1 }, async () => {
  await new Promise((resolve) => setTimeout(resolve, 0));
  const end = performance.now() + ${BLOCK_MS};
  while (performance.now() < end);
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  return "crunched";
});
app.task("nap", {
  maxAttempts: 3,
  sandbox: { module: ${
  JSON.stringify(import.meta.resolve("./fixtures/sandbox_handlers.ts"))
}, export: "spin" },
});
`;

/** A second worker that runs none of those tasks: it only rescues. */
const RESCUER_APP = `
import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("other", () => null);
`;

Deno.test("a loop blocked while a sandboxed job runs beside the job that blocked it: the blocker is charged, the sandboxed job (whose handler runs elsewhere) gets its attempt back", async () => {
  await withDir({ "app.ts": SANDBOX_APP, "rescuer.ts": RESCUER_APP }, async (dir) => {
    await withDatabase("blocked_beside_sandbox", async (db, sql) => {
      await withProcesses(async () => {
        const env = { AKADZE_DATABASE_URL: db.url };
        const worker = spawnCli(["worker", ...WORKER_FLAGS, "--slots", "2", `${dir}/app.ts`], env);
        const rescuer = spawnCli(["worker", ...WORKER_FLAGS, `${dir}/rescuer.ts`], env);
        for (const w of [worker, rescuer]) await w.waitForEvent("worker_started");
        // The sandbox thread spins (off the loop) for longer than the block.
        const [{ id: nap }] = await sql`insert into akadze.jobs (task, args, max_attempts)
          values ('nap', ${sql.json({ ms: 10_000 })}, 3) returning id::text as id`;
        await waitForJob(sql, nap, (r) => r.state === "running", "the nap to start", SLOW);
        const crunch = await insertJob(sql, "crunch_later", 1);
        // Both rescued while the loop was blocked, then re-worded once the worker beats again
        // (more than the rescue's words).
        const reworded = (id: string, what: string) =>
          waitFor(
            async () => {
              const r = await row(sql, id);
              return r.errors.length > 0 && r.errors.every((e) => !e.message.endsWith("the run"))
                ? r
                : null;
            },
            what,
            SLOW,
          ) as Promise<Row>;
        const blocker = await reworded(crunch, "the blocker's rescue to be re-worded");
        assertEquals(blocker.errors.map((e) => e.error), ["LoopBlocked"], JSON.stringify(blocker));
        assertEquals([blocker.state, blocker.attempt], ["failed", 1]);
        const napped = await reworded(nap, "the nap's rescue to be re-worded");
        assertEquals(napped.errors.map((e) => e.error), ["WorkerLost"], JSON.stringify(napped));
        assertMatch(napped.errors[0].message, /this attempt is not counted/);
        assertEquals(napped.attempt, 0);
        for (const w of [worker, rescuer]) {
          w.child.kill("SIGTERM");
          assertEquals((await w.done()).code, 0, w.stderr());
        }
      });
    });
  });
});
