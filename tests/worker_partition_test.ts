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
import {
  type HeldLocks,
  holdLocks,
  waitFor,
  waitForLockWait,
  within,
  withLogs,
} from "./_helpers.ts";

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

Deno.test("a loop statement answered while the event loop was held past the pass's bound keeps its connection", async () => {
  // The answer comes while a computation holds the event loop for longer than the pass's
  // bound (half the TTL): when the loop turns again, the late bound must not replace the
  // connection whose answer is waiting to be read.
  await withLogs(async (records) => {
    const pg = await startThrowawayPostgres();
    const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
    let app: Akadze | undefined;
    let worker: Worker | undefined;
    let holder: postgres.Sql | undefined;
    let probe: postgres.Sql | undefined;
    try {
      await admin`create database held_loop_test`;
      const url = pg.url.replace(/\/postgres$/, "/held_loop_test");
      await migrate(url);
      probe = postgres(url, { max: 1, onnotice: () => {} });
      holder = postgres(url, { max: 1, onnotice: () => {} });
      app = new Akadze({ databaseUrl: url, max: 3 });
      const ttl = 6_000;
      worker = new Worker(app, { heartbeatInterval: 500, heartbeatTtl: ttl, pollInterval: 100 });
      let ended: { code: number; reason: string } | null = null;
      const exit = worker.run().then((result) => ended = result);
      await waitFor(
        async () => (await probe!`select 1 from akadze.workers`).length > 0,
        "the worker",
      );
      // The server holds the lock for a second and then lets the claim go on its own,
      // whatever this process's event loop does meanwhile.
      const holding = holder.unsafe(`begin; lock table akadze.jobs in access exclusive mode;
        select pg_catalog.pg_sleep(1); commit`).execute();
      await waitForLockWait(probe, "the claim to wait on the lock");
      // Held past the bound (3 s from the pass's start), while the claim's answer comes.
      const end = performance.now() + ttl / 2 + 1_000;
      while (performance.now() < end) { /* the loop is held */ }
      const heldUntil = new Date();
      await holding;
      // A beat after the held loop: the pass that was waiting has ended by then.
      await waitFor(async () => {
        const [row] = await probe!`select heartbeat_at > ${heldUntil} as beat from akadze.workers`;
        return row?.beat === true;
      }, "a heartbeat after the held loop");
      const replaced = records.filter((r) => r.properties.event === "loop_connection_replaced");
      assertEquals(replaced.length, 0, "the connection was replaced though it answered");
      assertEquals(ended, null, "the worker kept running");
      worker.stop();
      assertEquals((await within(exit, 30_000, "the worker to stop")).code, 0);
    } finally {
      worker?.stop();
      await app?.close();
      await holder?.end({ timeout: 1 });
      await probe?.end({ timeout: 1 });
      await admin.end({ timeout: 1 });
      await pg.stop();
    }
  });
});

/**
 * A TCP proxy to `port` that passes everything until the client sends a LISTEN, and from
 * then on passes nothing either way on that connection (a LISTEN that never gets an answer).
 */
function swallowListen(port: number): { port: number; close(): void } {
  const server = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns: Deno.Conn[] = [];
  (async () => {
    for await (const client of server) {
      const upstream = await Deno.connect({ hostname: "127.0.0.1", port });
      conns.push(client, upstream);
      let swallowed = false;
      const pipe = async (from: Deno.Conn, to: Deno.Conn, watch: boolean) => {
        const buf = new Uint8Array(65_536);
        try {
          for (;;) {
            const n = await from.read(buf);
            if (n === null) break;
            if (watch && /listen/i.test(new TextDecoder().decode(buf.subarray(0, n)))) {
              swallowed = true;
            }
            if (swallowed) continue;
            await to.write(buf.subarray(0, n));
          }
        } catch {
          // closed
        }
      };
      pipe(client, upstream, true);
      pipe(upstream, client, false);
    }
  })().catch(() => {});
  return {
    port: (server.addr as Deno.NetAddr).port,
    close() {
      server.close();
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // closed already
        }
      }
    },
  };
}

Deno.test("a LISTEN that never gets an answer leaves the worker claiming by polling, its lease kept", async () => {
  await withLogs(async (records) => {
    await unansweredListen();
    const failed = records.filter((r) => r.properties.event === "listen_failed");
    assertEquals(failed.length, 1, "one warning that the worker polls");
    assert(String(failed[0].properties.message).includes("no answer"));
  });
});

async function unansweredListen(): Promise<void> {
  const pg = await startThrowawayPostgres();
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  let app: Akadze | undefined;
  let worker: Worker | undefined;
  let proxy: { port: number; close(): void } | undefined;
  try {
    await admin`create database unanswered_listen_test`;
    const url = pg.url.replace(/\/postgres$/, "/unanswered_listen_test");
    await migrate(url);
    proxy = swallowListen(Number(new URL(url).port));
    const listenUrl = url.replace(/:\d+\//, `:${proxy.port}/`);
    app = new Akadze({ databaseUrl: url, listenUrl, max: 3 });
    const ran: string[] = [];
    const task = app.task("note", (args) => {
      ran.push(String(args.n));
    });
    const ttl = 2_000;
    worker = new Worker(app, { heartbeatInterval: 250, heartbeatTtl: ttl, pollInterval: 100 });
    let ended: { code: number; reason: string; message?: string } | null = null;
    const exit = worker.run().then((result) => ended = result);
    const started = new Date();
    await task.enqueue({ n: 1 });
    await waitFor(() => ran.length === 1 || ended !== null, "the job to run (found by polling)");
    // Past the TTL and an interval from the start: the worker still beats.
    await waitFor(async () => {
      const [w] = await app!.sql`select heartbeat_at from akadze.workers`;
      return ended !== null ||
        (w !== undefined && w.heartbeat_at.getTime() - started.getTime() > 2 * ttl);
    }, "a heartbeat twice the TTL after the start");
    assertEquals(ended, null, `the worker ended: ${JSON.stringify(ended)}`);
    await task.enqueue({ n: 2 });
    await waitFor(() => ran.length === 2 || ended !== null, "the second job to run");
    assertEquals(ran, ["1", "2"]);
    worker.stop();
    assertEquals((await within(exit, 30_000, "the worker to stop")).code, 0);
  } finally {
    worker?.stop();
    await app?.close();
    proxy?.close();
    await admin.end({ timeout: 1 });
    await pg.stop();
  }
}
