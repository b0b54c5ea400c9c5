// A database that stops answering (every server process frozen, as in a network
// partition) must not freeze the worker: its lease clock runs on, and it stops with
// code 1 once the heartbeat has failed for longer than the TTL.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { migrate } from "../src/migrate.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { installDriverGuard } from "../src/driver_guard.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals } from "./assert.ts";
import { type HeldLocks, holdLocks, waitFor, waitForLockWait, within } from "./_helpers.ts";

async function signalServer(pids: number[], signal: "SIGSTOP" | "SIGCONT"): Promise<void> {
  for (const pid of pids) {
    try {
      Deno.kill(pid, signal);
    } catch {
      // the process ended meanwhile
    }
  }
  await Promise.resolve();
}

/**
 * Run a worker holding one job, freeze the whole server and return how the run ended and
 * how long after the freeze. With `stuckPrune`, a prune is first left waiting on a lock, as
 * one caught mid-statement by a partition would be.
 */
async function freezeDuringRun(
  stuckPrune: boolean,
): Promise<{ code: number; reason: string; took: number }> {
  // Connections frozen under the driver can raise its uncaught errors after the worker (and
  // its guard) is gone, while the server is thawed and stopped: the known hazard, not a failure.
  const removeGuard = installDriverGuard(() => {});
  const pg = await startThrowawayPostgres();
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  let pids: number[] = [];
  let held: HeldLocks | undefined;
  // Closed in finally too, so a failure does not leave the worker's pool reconnecting after
  // the server is gone.
  let app: Akadze | undefined;
  let worker: Worker | undefined;
  try {
    await admin`create database frozen_test`;
    const url = pg.url.replace(/\/postgres$/, "/frozen_test");
    await migrate(url);
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const postmaster = Number((await Deno.readTextFile(`${dir}/postmaster.pid`)).split("\n")[0]);
    app = new Akadze({ databaseUrl: url, max: 3 });
    let started = false;
    app.task("hold", (_args, ctx) =>
      new Promise((resolve) => {
        started = true;
        ctx.signal.addEventListener("abort", () => resolve(null));
      }));
    await app.tasks.get("hold")!.enqueue();
    if (stuckPrune) {
      held = await holdLocks(
        url,
        (tx) => tx`lock table akadze.limit_starts in access exclusive mode`,
      );
    }
    worker = new Worker(app, {
      heartbeatInterval: 200,
      heartbeatTtl: 1_500,
      pollInterval: 100,
      pruneInterval: stuckPrune ? 100 : undefined,
    });
    const exit = worker.run();
    await waitFor(() => started, "the job to start");
    if (stuckPrune) {
      await waitForLockWait(app.sql, "the prune to wait on the lock", "%limit_starts%");
    }
    // Freeze the postmaster and every backend: connections stay open, nothing answers.
    const out = await new Deno.Command("pgrep", { args: ["-P", String(postmaster)] }).output();
    pids = [postmaster, ...new TextDecoder().decode(out.stdout).trim().split("\n").map(Number)];
    const frozenAt = performance.now();
    await signalServer(pids, "SIGSTOP");
    // Bounded, so a worker that hangs fails the test instead of stalling the suite.
    const result = await within(exit, 30_000, "the worker to exit");
    const took = performance.now() - frozenAt;
    await signalServer(pids, "SIGCONT");
    pids = [];
    await held?.release();
    held = undefined;
    const closing = app.close();
    app = undefined;
    await closing;
    return { code: result.code, reason: result.reason, took };
  } finally {
    await signalServer(pids, "SIGCONT");
    worker?.stop();
    await app?.close();
    await held?.release();
    await admin.end({ timeout: 1 });
    await pg.stop();
    removeGuard();
  }
}

Deno.test("a frozen database (queries hang) ends the run with heartbeat_lost, not a hang", async () => {
  const { code, reason, took } = await freezeDuringRun(false);
  assertEquals([code, reason], [1, "heartbeat_lost"]);
  assert(took < 15_000, `stopped after ${Math.round(took)} ms`);
});

Deno.test("a prune stuck when the database freezes does not hold up the worker's exit", async () => {
  const { code, reason, took } = await freezeDuringRun(true);
  assertEquals([code, reason], [1, "heartbeat_lost"]);
  assert(took < 15_000, `stopped after ${Math.round(took)} ms`);
});

Deno.test("a loop statement that gets no answer costs the worker neither its lease nor its running job", async () => {
  // The claim's look at the limits table waits on a lock held for longer than the lease
  // (a statement that does not answer); the heartbeat runs after it on the same loop.
  const pg = await startThrowawayPostgres();
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  let app: Akadze | undefined;
  let worker: Worker | undefined;
  let held: HeldLocks | undefined;
  let probe: postgres.Sql | undefined;
  try {
    await admin`create database unanswered_test`;
    const url = pg.url.replace(/\/postgres$/, "/unanswered_test");
    await migrate(url);
    probe = postgres(url, { max: 1, onnotice: () => {} });
    app = new Akadze({ databaseUrl: url, max: 3 });
    let started = false;
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => finish = resolve);
    app.task("hold", async () => {
      started = true;
      await finished;
    });
    const id = await app.tasks.get("hold")!.enqueue();
    const ttl = 2_000;
    worker = new Worker(app, {
      heartbeatInterval: 250,
      heartbeatTtl: ttl,
      pollInterval: 100,
      slots: 4,
    });
    let ended: { code: number; reason: string } | null = null;
    const exit = worker.run().then((result) => ended = result);
    await waitFor(() => started, "the job to start");
    held = await holdLocks(url, (tx) => tx`lock table akadze.limits in access exclusive mode`);
    // Held for twice the TTL: the claim waits on it, and the heartbeat must stay younger
    // than the TTL all the same.
    const until = performance.now() + 2 * ttl;
    let [oldest, waited] = [0, false];
    while (performance.now() < until && ended === null) {
      const [row] =
        await probe`select (select (extract(epoch from now() - heartbeat_at) * 1000)::int
          from akadze.workers) as age,
        exists (select 1 from pg_stat_activity where datname = current_database()
                   and wait_event_type = 'Lock'
                   and application_name = 'akadze' and query not like '%limit_starts%')
          as waiting`;
      oldest = Math.max(oldest, row.age ?? 0);
      waited ||= row.waiting;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert(waited, "the claim waited on the lock");
    assert(oldest < ttl, `the heartbeat was ${oldest} ms old (TTL ${ttl} ms)`);
    assertEquals(ended, null, "the worker kept running");
    await held.release();
    held = undefined;
    finish();
    await waitFor(async () => {
      const [row] = await app!.sql`select state, run_count from akadze.jobs where id = ${id}`;
      return row.state === "succeeded";
    }, "the job to succeed");
    const [row] = await app.sql`select run_count, attempt from akadze.jobs where id = ${id}`;
    assertEquals([row.run_count, row.attempt], [1, 0], "the job ran once, no attempt spent");
    worker.stop();
    assertEquals((await within(exit, 30_000, "the worker to stop")).code, 0);
  } finally {
    worker?.stop();
    await held?.release();
    await app?.close();
    await probe?.end({ timeout: 1 });
    await admin.end({ timeout: 1 });
    await pg.stop();
  }
});
