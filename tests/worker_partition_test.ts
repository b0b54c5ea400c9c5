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
