// Fault injection against real processes and a real server:
// kill -9 of a worker process, pg_terminate_backend of a worker's connections, a server
// restart, a worker started while the server is down, a lost heartbeat, a claim that
// returns after the run has ended, the driver's uncaught TypeError, and a schema that was
// never migrated. Tests that stop the server start their own (the shared test server must
// not be disturbed); the others terminate only the connections of their own database.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import type { Sql } from "../src/db.ts";
import type { JobInfo } from "../src/job.ts";
import { migrate } from "../src/migrate.ts";
import { startThrowawayPostgres, type ThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { Completer } from "../src/worker/completer.ts";
import { isDriverError } from "../src/driver_guard.ts";
import type { WorkerOptions } from "../src/worker/config.ts";
import { Worker, type WorkerExit } from "../src/worker/worker.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import {
  type HeldLocks,
  holdLocks,
  waitFor,
  waitForLockWait,
  withDatabase,
  within,
} from "./_helpers.ts";

/** Short timings so the file stays fast; conditions are still awaited with generous bounds. */
const FAST = {
  heartbeatInterval: 200,
  heartbeatTtl: 1_500,
  pollInterval: 100,
  shutdownTimeout: 2_000,
} as const satisfies WorkerOptions;

/** How long a stopping worker tries to put its jobs back (worker.ts RELEASE_TIMEOUT). */
const RELEASE_WINDOW = 5_000;

/**
 * The TTL of the tests that kill connections. After the driver's TypeError (see the
 * completeTx test) postgres.js 3.4.9 leaves that connection with a stale write timer: its
 * next use hangs until connect_timeout (10 s, CONNECT_TIMEOUT) and the worker loop with it.
 * A loop stalled past its TTL has lost its lease by the heartbeat rule (and stops), so these
 * tests use a TTL longer than that stall: they are about surviving, not about the lease.
 */
const STALL_TTL = 15_000;

const FIXTURE = new URL("./fixtures/worker_process.ts", import.meta.url).pathname;
const CONFIG = new URL("../deno.json", import.meta.url).pathname;

type Row = Record<string, unknown> & {
  id: string;
  state: string;
  attempt: number;
  run_count: number;
  errors: { error: string; message: string; at: string }[];
};

// ---------------------------------------------------------------------------------------
// Helpers

/** A promise with its resolve function. */
function latch<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => resolve = r);
  return { promise, resolve };
}

/** Sleep `ms`, or less if `signal` aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** A worker running in this process, with a flag telling whether `run()` returned. */
interface InProcessWorker {
  worker: Worker;
  exit: Promise<WorkerExit>;
  readonly exited: boolean;
  stop(): Promise<WorkerExit>;
}

/** How many in-process workers are running now (see the stray-reset filter below). */
let runningWorkers = 0;

function runWorker(app: Akadze, options: WorkerOptions = {}): InProcessWorker {
  const worker = new Worker(app, { ...FAST, ...options });
  let exited = false;
  runningWorkers++;
  const exit = worker.run().finally(() => {
    exited = true;
    runningWorkers--;
  });
  return {
    worker,
    exit,
    get exited() {
      return exited;
    },
    stop() {
      worker.stop();
      return exit;
    },
  };
}

// After connections were killed, the driver (or Deno's node:net under it, with a bare
// `read ECONNRESET`) can reject where no caller waits, for instance while a test tears its
// pool and database down; that would fail the whole file. Ignored here only while no worker
// runs: during a run the worker's driver guard absorbs it (and logs it), as it would in a
// real worker process (tests/driver_guard_test.ts).
globalThis.addEventListener("unhandledrejection", (event) => {
  if (!isDriverError(event.reason)) return;
  if (runningWorkers === 0) {
    event.preventDefault();
    console.warn(`ignored a driver error outside a worker run: ${event.reason.message}`);
  } else {
    console.warn(`a driver error while ${runningWorkers} worker(s) run: left to their guard`);
  }
});

/** The job's row (errors tolerated while the server restarts: null). */
async function jobRow(sql: Sql, id: string): Promise<Row | null> {
  try {
    const [row] = await sql`select * from akadze.jobs where id = ${id}`;
    return (row ?? null) as Row | null;
  } catch {
    return null;
  }
}

/** Wait until job `id` satisfies `check`; database errors count as "not yet". */
async function waitForJob(
  sql: Sql,
  id: string,
  check: (row: Row) => boolean,
  what: string,
  timeoutMs = 20_000,
): Promise<Row> {
  const row = await waitFor(
    async () => {
      const row = await jobRow(sql, id);
      return row && check(row) ? row : null;
    },
    what,
    timeoutMs,
  );
  return row!;
}

/**
 * Wait until every job of `ids` satisfies `check`; returns the rows in id order. Fails at
 * once when `worker` stopped meanwhile, and names the pending jobs on a timeout.
 */
async function waitForJobs(
  sql: Sql,
  ids: string[],
  check: (row: Row) => boolean,
  what: string,
  worker?: InProcessWorker,
  timeoutMs = 60_000,
): Promise<Row[]> {
  let last: Row[] = [];
  const pending = () =>
    last.filter((r) => !check(r)).map((r) =>
      JSON.stringify({
        id: r.id,
        state: r.state,
        attempt: r.attempt,
        run_count: r.run_count,
        worker_id: r.worker_id,
        run_at: r.run_at,
        errors: r.errors,
      })
    ).join(" ");
  try {
    const rows = await waitFor(
      async () => {
        if (worker?.exited) {
          const exit = await worker.exit;
          throw new Error(`the worker stopped (${JSON.stringify(exit)}) before ${what}`);
        }
        try {
          last = await sql`select * from akadze.jobs where id = any(${ids}::bigint[])
                         order by id` as unknown as Row[];
        } catch {
          return null;
        }
        return last.length === ids.length && last.every(check) ? last : null;
      },
      what,
      timeoutMs,
    );
    return rows!;
  } catch (error) {
    throw new Error(`${(error as Error).message}; still pending: ${pending()}`);
  }
}

/** Whether a worker connection to database `name` is inside a completeTx's pg_sleep. */
async function inTransaction(sql: Sql, name: string): Promise<boolean> {
  const rows = await sql`
    select 1 from pg_stat_activity
     where datname = ${name} and application_name = 'akadze' and state = 'active'
       and query like '%pg_sleep%'`;
  return rows.length > 0;
}

/** Terminate every connection of a worker (application_name akadze) to database `name`. */
async function terminateWorkerConnections(sql: Sql, name: string): Promise<number> {
  const rows = await sql`
    select pg_terminate_backend(pid) as ok from pg_stat_activity
     where datname = ${name} and application_name = 'akadze' and pid <> pg_backend_pid()`;
  return rows.filter((r) => r.ok).length;
}

/** A fresh migrated database on a server of this test's own (free to halt and restart). */
async function withOwnServer(
  fn: (pg: ThrowawayPostgres, url: string, sql: Sql) => Promise<void>,
): Promise<void> {
  const pg = await startThrowawayPostgres();
  try {
    const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
    try {
      await admin`create database faults`;
    } finally {
      await admin.end({ timeout: 1 });
    }
    const url = pg.url.replace(/\/postgres$/, "/faults");
    await migrate(url);
    const sql = postgres(url, { max: 2, onnotice: () => {}, connect_timeout: 2 });
    try {
      await fn(pg, url, sql);
    } finally {
      await sql.end({ timeout: 1 });
    }
  } finally {
    await pg.stop();
  }
}

/** A worker process running tests/fixtures/worker_process.ts. */
interface WorkerProcess {
  readonly pid: number;
  /** Its stdout lines so far. */
  readonly lines: string[];
  /** Resolves when it exited. */
  readonly status: Promise<Deno.CommandStatus>;
  /** Whether it exited. */
  readonly exited: boolean;
  /** Its stderr so far. */
  stderr(): string;
  /** Wait for a stdout line matching `pattern`. */
  waitLine(pattern: RegExp, what: string, timeoutMs?: number): Promise<string>;
  /** Send a signal and wait for the exit (and the end of its output). */
  kill(signal: Deno.Signal): Promise<Deno.CommandStatus>;
}

/** Start the fixture; with `log`, the library's logs go to its stderr. */
function spawnWorkerProcess(url: string, options: WorkerOptions, log = false): WorkerProcess {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", "--config", CONFIG, FIXTURE, JSON.stringify(options)],
    env: {
      AKADZE_DATABASE_URL: url,
      NO_COLOR: "1",
      AKADZE_FIXTURE_LOG: log ? "1" : Deno.env.get("AKADZE_FIXTURE_LOG") ?? "",
    },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const lines: string[] = [];
  let err = "";
  let exited = false;
  const pumpOut = (async () => {
    let buffer = "";
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      const parts = buffer.split("\n");
      buffer = parts.pop()!;
      lines.push(...parts);
    }
    if (buffer) lines.push(buffer);
  })();
  const pumpErr = (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) err += chunk;
  })();
  const status = (async () => {
    const status = await child.status;
    await Promise.all([pumpOut, pumpErr]);
    exited = true;
    return status;
  })();
  return {
    pid: child.pid,
    lines,
    status,
    get exited() {
      return exited;
    },
    stderr: () => err,
    async waitLine(pattern, what, timeoutMs = 30_000) {
      const found = await waitFor(
        () => {
          const line = lines.find((l) => pattern.test(l));
          if (line) return line;
          if (exited) {
            throw new Error(`worker process exited before ${what}; stderr: ${err.slice(-2000)}`);
          }
          return null;
        },
        what,
        timeoutMs,
      );
      return found!;
    },
    async kill(signal) {
      if (!exited) {
        try {
          child.kill(signal);
        } catch {
          // already gone
        }
      }
      return await status;
    },
  };
}

// ---------------------------------------------------------------------------------------
// 1. kill -9 of a worker process

Deno.test("kill -9 mid-job: another worker rescues the job after the TTL (attempt spent, WorkerLost), it then succeeds, and the killed run's late outcome is discarded", async () => {
  await withDatabase("faults_kill9", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url });
    const secondRun = latch<JobInfo>();
    const finishSecondRun = latch();
    // Same task name as the fixture's, so this process's workers can run the rescued job.
    const task = app.task("sleep", async (_args, ctx) => {
      secondRun.resolve(ctx.job);
      await finishSecondRun.promise;
      return "second run";
    });
    const workers: InProcessWorker[] = [];
    let proc: WorkerProcess | undefined;
    try {
      const id = await task.enqueue({ ms: 120_000 });
      proc = spawnWorkerProcess(db.url, FAST);
      await proc.waitLine(new RegExp(`^started ${id} 1$`), "the job to start in the process");
      const running = await jobRow(sql, id);
      assertEquals([running?.state, running?.run_count, running?.attempt], ["running", 1, 0]);
      const workerId = running!.worker_id as string;

      const status = await proc.kill("SIGKILL");
      assertEquals(status.signal, "SIGKILL");
      const [{ heartbeat_at: lastBeat, heartbeat_ttl_ms: ttl }] = await sql`
        select heartbeat_at, heartbeat_ttl_ms from akadze.workers where id = ${workerId}`;
      assertEquals(ttl, FAST.heartbeatTtl);

      // A worker of another queue rescues (every worker does) but cannot claim it, so the
      // rescued state stays visible.
      workers.push(runWorker(app, { queues: ["elsewhere"] }));
      const rescued = await waitForJob(sql, id, (r) => r.state === "queued", "the rescue");
      // The lost worker stays named as the one that ran the attempt.
      assertEquals([rescued.attempt, rescued.run_count, rescued.worker_id], [1, 1, workerId]);
      assertEquals(rescued.errors.map((e) => e.error), ["WorkerLost"]);
      assertMatch(rescued.errors[0].message, new RegExp(`worker ${workerId} stopped heartbeating`));
      const rescuedAfter = new Date(rescued.errors[0].at).getTime() - (lastBeat as Date).getTime();
      assert(rescuedAfter >= FAST.heartbeatTtl, `rescued ${rescuedAfter} ms after the last beat`);
      // The dead worker's row goes once it holds no running job.
      await waitFor(
        async () => (await sql`select 1 from akadze.workers where id = ${workerId}`).length === 0,
        "the dead worker's row to be removed",
      );

      // A worker of its queue runs it again: attempt 2 (one spent), run 2.
      workers.push(runWorker(app));
      const job = await within(secondRun.promise, 20_000, "the second run");
      assertEquals([job.id, job.attempt, job.runCount], [id, 2, 2]);

      // The killed run's outcome arriving late is fenced off, during the new run...
      const completer = new Completer(sql, "akadze", []);
      const late = { id, runCount: 1, kind: "succeeded" as const, result: 1 };
      let write = await completer.write([late]);
      assertEquals([write.written, write.stale, write.rolledBack], [[], [late], []]);
      const stillRunning = await jobRow(sql, id);
      assertEquals([stillRunning?.state, stillRunning?.run_count], ["running", 2]);

      // ...and after it succeeded.
      finishSecondRun.resolve();
      const done = await waitForJob(sql, id, (r) => r.state === "succeeded", "success");
      assertEquals([done.result, done.attempt, done.run_count], ["second run", 1, 2]);
      write = await completer.write([late]);
      assertEquals([write.written, write.stale], [[], [late]]);
      assertEquals(await jobRow(sql, id), done);

      for (const w of workers.splice(0)) assertEquals((await w.stop()).code, 0);
    } finally {
      finishSecondRun.resolve();
      await proc?.kill("SIGKILL");
      for (const w of workers) await w.stop();
      await app.close();
    }
  });
});

Deno.test("kill -9 on the last attempt: the rescue fails the job (WorkerLost)", async () => {
  await withDatabase("faults_kill9_last", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url });
    const task = app.task("sleep", () => "must not run again");
    let proc: WorkerProcess | undefined;
    let rescuer: InProcessWorker | undefined;
    try {
      const id = await task.using({ maxAttempts: 1 }).enqueue({ ms: 120_000 });
      proc = spawnWorkerProcess(db.url, FAST);
      await proc.waitLine(new RegExp(`^started ${id} 1$`), "the job to start in the process");
      assertEquals((await proc.kill("SIGKILL")).signal, "SIGKILL");
      rescuer = runWorker(app);
      const failed = await waitForJob(sql, id, (r) => r.state !== "running", "the rescue");
      assertEquals(
        [failed.state, failed.attempt, failed.max_attempts, failed.run_count],
        ["failed", 1, 1, 1],
      );
      // The killed worker (host:pid:...) stays named as the one that ran the attempt.
      assertEquals(String(failed.worker_id).split(":")[1], String(proc.pid));
      assert(failed.finished_at instanceof Date);
      assertEquals(failed.errors.map((e) => e.error), ["WorkerLost"]);
      assertEquals((await rescuer.stop()).code, 0);
      assertEquals((await jobRow(sql, id))?.state, "failed");
    } finally {
      await proc?.kill("SIGKILL");
      await rescuer?.stop();
      await app.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// 2 and 3. Connections killed under running jobs; a server restart

/**
 * An app whose `work` task sleeps `ms`, then in completeTx holds its transaction open for
 * 200 ms (`pg_sleep`) and records itself in `ledger` (so a row exists only for the run that
 * succeeded); every start is counted in memory.
 */
async function ledgerApp(url: string, sql: Sql) {
  await sql`create table ledger (job_id bigint not null, run_count int not null)`;
  const app = new Akadze({ databaseUrl: url });
  const starts = new Map<string, number[]>();
  const task = app.task("work", { maxAttempts: 20 }, async ({ ms }, ctx) => {
    starts.set(ctx.job.id, [...(starts.get(ctx.job.id) ?? []), ctx.job.runCount]);
    await sleep(Number(ms), ctx.signal);
    await ctx.completeTx(async (tx) => {
      await tx`select pg_sleep(0.2)`;
      await tx`insert into ledger (job_id, run_count) values (${ctx.job.id}, ${ctx.job.runCount})`;
    });
  });
  return { app, task, starts };
}

/**
 * Every job succeeded exactly once: one ledger row each, from its last run; every start
 * was a claim (run_count), and a job that ran more than once has the errors that explain it.
 */
async function assertEachSucceededOnce(
  sql: Sql,
  rows: Row[],
  starts: Map<string, number[]>,
): Promise<void> {
  const ledger = await sql`select job_id::text as id, run_count from ledger order by job_id`;
  assertEquals(
    ledger.map((r) => [r.id, r.run_count]),
    rows.map((r) => [r.id, r.run_count]),
    "one succeeded execution per job",
  );
  for (const row of rows) {
    assertEquals(starts.get(row.id), Array.from({ length: row.run_count }, (_, i) => i + 1));
    assertEquals(row.errors.length, row.attempt, `job ${row.id}: each spent attempt explained`);
    assertEquals(row.attempt, row.run_count - 1, `job ${row.id}: each rerun spent an attempt`);
  }
}

Deno.test("pg_terminate_backend of every worker connection while jobs run: the worker keeps going and every job succeeds exactly once", async () => {
  await withDatabase("faults_terminate", async (db, sql) => {
    const { app, task, starts } = await ledgerApp(db.url, sql);
    let w: InProcessWorker | undefined;
    try {
      const N = 16;
      const ids = await task.enqueueMany(
        Array.from({ length: N }, (_, i) => ({ ms: 400 + 150 * (i % 4) })),
      );
      w = runWorker(app, { slots: 4, heartbeatTtl: STALL_TTL });
      // Three rounds, each while a run is inside its completeTx transaction: at the start,
      // then after progress.
      for (const progress of [0, 4, 8]) {
        await waitFor(async () => {
          const [{ n }] = await sql`select count(*)::int as n from ledger`;
          return n >= progress && await inTransaction(sql, db.name);
        }, `${progress} jobs done and a run inside completeTx`);
        assert((await terminateWorkerConnections(sql, db.name)) > 0, "connections terminated");
      }
      const rows = await waitForJobs(sql, ids, (r) => r.state === "succeeded", "every job", w);
      assert(!w.exited, "the worker kept running");
      await assertEachSucceededOnce(sql, rows, starts);
      assertEquals((await w.stop()).code, 0);
    } finally {
      await w?.stop();
      await app.close();
    }
  });
});

Deno.test("a PostgreSQL restart mid-run: the worker survives and every job succeeds exactly once", async () => {
  await withOwnServer(async (pg, url, sql) => {
    const { app, task, starts } = await ledgerApp(url, sql);
    let w: InProcessWorker | undefined;
    try {
      const ids = await task.enqueueMany(
        Array.from({ length: 12 }, (_, i) => ({ ms: 500 + 150 * (i % 4) })),
      );
      w = runWorker(app, { slots: 4, heartbeatTtl: STALL_TTL });
      await waitFor(
        async () => w!.worker.busy === 4 && await inTransaction(sql, "faults"),
        "four runs in flight, one inside completeTx",
      );
      await pg.restart();
      const rows = await waitForJobs(sql, ids, (r) => r.state === "succeeded", "every job", w);
      assert(!w.exited, "the worker kept running");
      await assertEachSucceededOnce(sql, rows, starts);
      assertEquals((await w.stop()).code, 0);
    } finally {
      await w?.stop();
      await app.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// 4. Started while the database is down

Deno.test("a worker started while the database is down waits, then works once it is up", async () => {
  await withOwnServer(async (pg, url, sql) => {
    const app = new Akadze({ databaseUrl: url });
    const task = app.task("t", () => "ran");
    let w: InProcessWorker | undefined;
    try {
      const id = await task.enqueue({});
      await pg.halt();
      w = runWorker(app);
      // Down for longer than the TTL: with no heartbeat yet, there is no lease to lose.
      const early = await Promise.race([w.exit, sleep(2 * FAST.heartbeatTtl).then(() => null)]);
      assertEquals(early, null, "run() must not return while the database is down");
      assertEquals(w.worker.claimed, 0);
      await pg.resume();
      const done = await waitForJob(sql, id, (r) => r.state === "succeeded", "the job to run");
      assertEquals([done.result, done.attempt, done.run_count], ["ran", 0, 1]);
      assert(!w.exited, "the worker kept running");
      assertEquals((await w.stop()).code, 0);
    } finally {
      await pg.resume().catch(() => {});
      await w?.stop();
      await app.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// 5. Lost heartbeat

Deno.test("a heartbeat lost for longer than the TTL stops the worker promptly with code 1 (heartbeat_lost); its job is rescued, not lost", async () => {
  await withOwnServer(async (pg, url, sql) => {
    const app = new Akadze({ databaseUrl: url });
    const started = latch<JobInfo>();
    app.task("hold", async (_args, ctx) => {
      started.resolve(ctx.job);
      await sleep(120_000, ctx.signal);
      return "first run";
    });
    // Another worker process, as it were: its own app and pool.
    const other = new Akadze({ databaseUrl: url });
    const task = other.task("hold", () => "after the rescue");
    let a: InProcessWorker | undefined;
    let b: InProcessWorker | undefined;
    try {
      const id = await task.enqueue({});
      a = runWorker(app);
      await within(started.promise, 20_000, "the first run");
      const haltedAt = performance.now();
      await pg.halt();
      const exit = await within(a.exit, 60_000, "run() to return");
      const after = performance.now() - haltedAt;
      assertEquals([exit.code, exit.reason], [1, "heartbeat_lost"]);
      assert(exit.message, "the exit says why");
      assert(after >= FAST.heartbeatTtl - FAST.heartbeatInterval, `stopped after ${after} ms`);
      // The lease, then at most 5 s trying to put the job back, then it stops: a write
      // stuck in the driver (its reconnect backoff) must not hold the exit.
      assert(after < FAST.heartbeatTtl + RELEASE_WINDOW + 3_000, `stopped after ${after} ms`);
      await pg.resume();
      b = runWorker(other);
      const done = await waitForJob(sql, id, (r) => r.state === "succeeded", "the job to end");
      assertEquals([done.result, done.run_count], ["after the rescue", 2]);
      if (done.attempt === 0) {
        // Released by the losing worker (possible only if a write got through).
        assertEquals(done.errors, []);
      } else {
        assertEquals([done.attempt, done.errors.map((e) => e.error)], [1, ["WorkerLost"]]);
      }
      assertEquals((await b.stop()).code, 0);
    } finally {
      await pg.resume().catch(() => {});
      await a?.stop();
      await b?.stop();
      await app.close();
      await other.close();
    }
  });
});

Deno.test("a claim held past half the heartbeat TTL: the worker keeps its lease, and the job the held claim took is put back (attempt not spent) and runs once", async () => {
  await withDatabase("faults_late_claim", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url, max: 3 });
    let runs = 0;
    const task = app.task("late", () => {
      runs++;
      return null;
    });
    let held: HeldLocks | undefined;
    let w: InProcessWorker | undefined;
    try {
      w = runWorker(app, { schedules: false });
      await waitFor(
        async () => (await sql`select count(*)::int as n from akadze.workers`)[0].n === 1,
        "the worker to register",
      );
      // The claim reads queue_pauses: a lock on it holds the claim (as a statement that gets
      // no answer), past half the TTL, when the loop replaces its connection.
      held = await holdLocks(
        db.url,
        (tx) => tx`lock table akadze.queue_pauses in access exclusive mode`,
      );
      await waitForLockWait(sql, "the claim to wait on the lock", "%claim%");
      // Ready at once for the held claims, whose statements started before the enqueue.
      const id = await task.using({ runAt: new Date(Date.now() - 60_000) }).enqueue();
      // Longer than the lease: the worker beats on its new connection meanwhile.
      const until = Date.now() + 2 * FAST.heartbeatTtl;
      await waitFor(() => w!.exited || Date.now() > until, "the lease to pass");
      assertEquals(w.exited, false, "the worker kept its lease");
      await held.release();
      held = undefined;
      // A claim the worker gave up on may take the job now: the next beat puts it back.
      const done = await waitForJob(sql, id, (r) => r.state === "succeeded", "the job to run");
      assertEquals([done.attempt, done.errors, runs], [0, [], 1]);
    } finally {
      await held?.release();
      await w?.stop();
      await app.close();
    }
  });
});

Deno.test("a claim that committed while the worker lost its reply: the worker's next heartbeat puts the job back (attempt not spent) and it runs", async () => {
  await withDatabase("faults_lost_claim", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url, max: 3 });
    const task = app.task("t", () => null);
    // With a hook, a claim of two jobs is two transactions: the first commits, the second
    // is held (on a lock taken once the first commits) and its connection killed, so the
    // claim fails after its first job became this worker's without the worker seeing it.
    let holding: Promise<HeldLocks> | undefined;
    app.hooks.onTransition.push(async (_tx, _job, from, to) => {
      if (from !== "queued" || to !== "running" || holding) return;
      holding = holdLocks(
        db.url,
        (tx) => tx`lock table akadze.queue_pauses in access exclusive mode`,
      );
      // The lock is asked for before the first transaction commits, so it is granted then.
      await waitForLockWait(sql, "the lock to be asked for", "lock table%");
    });
    const [first, second] = await task.enqueueMany([{}, {}]);
    let w: InProcessWorker | undefined;
    try {
      const id = "faults-lost-claim";
      w = runWorker(app, { schedules: false, slots: 2, id });
      await waitForLockWait(sql, "the claim's second transaction to wait", "%claim%");
      await sql`select pg_terminate_backend(pid) from pg_stat_activity
                 where datname = current_database() and wait_event_type = 'Lock'
                   and query like '%claim%'`;
      await (await holding!).release();
      // Usually the killed claim fails at once, the loop backs off and the next beat puts
      // the job back. The driver sometimes never settles a transaction whose connection was
      // killed; the watchdog then ends the run (heartbeat_lost), and a worker started again
      // under the same id puts the job back on its first beat, just as well (no attempt).
      const exit = await Promise.race([
        w.exit,
        waitForJobs(sql, [first, second], (r) => r.state === "succeeded", "both jobs", w, 20_000)
          .catch(() => null),
      ]);
      if (w.exited) {
        assertEquals([(exit as WorkerExit).code, (exit as WorkerExit).reason], [
          1,
          "heartbeat_lost",
        ]);
        w = runWorker(app, { schedules: false, slots: 2, id });
      }
      const rows = await waitForJobs(
        sql,
        [first, second],
        (r) => r.state === "succeeded",
        "both jobs to succeed",
        w,
        // Well within the heartbeat's backstop look for orphans (a minute).
        20_000,
      );
      const byId = new Map(rows.map((r) => [r.id, r]));
      // The lost one ran once, after its release (no attempt spent, no WorkerLost).
      assertEquals([byId.get(first)?.run_count, byId.get(first)?.errors], [2, []]);
    } finally {
      if (holding) await (await holding).release().catch(() => {});
      await w?.stop();
      await app.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// 6. The driver's uncaught TypeError

Deno.test("a worker process survives its connections being killed inside a completeTx transaction, and completes the job", async () => {
  await withDatabase("faults_tx_kill", async (db, sql) => {
    await sql`create table ledger (job_id bigint not null, run_count int not null)`;
    const app = new Akadze({ databaseUrl: db.url });
    const task = app.task("tx_sleep", () => {});
    let proc: WorkerProcess | undefined;
    try {
      const id = await task.enqueue({ seconds: 30 });
      proc = spawnWorkerProcess(db.url, { ...FAST, heartbeatTtl: STALL_TTL }, true);
      await proc.waitLine(new RegExp(`^in_tx ${id} 1$`), "the first run's completeTx");
      await waitFor(() => inTransaction(sql, db.name), "the pg_sleep inside completeTx");
      assert((await terminateWorkerConnections(sql, db.name)) > 0, "connections terminated");
      const done = await waitForJob(
        sql,
        id,
        (r) => {
          if (proc!.exited) {
            throw new Error(`the worker process died: ${proc!.stderr().slice(-2000)}`);
          }
          return r.state === "succeeded";
        },
        "the job to succeed",
        60_000,
      );
      assert(!proc.exited, `the process died: ${proc.stderr().slice(-2000)}`);
      // The killed run failed (an attempt spent, explained); a later run committed, once.
      assert(done.attempt >= 1, "the killed run spent an attempt");
      assertEquals([done.run_count, done.errors.length], [done.attempt + 1, done.attempt]);
      assertEquals(
        (await sql`select run_count from ledger where job_id = ${id}`).map((r) => r.run_count),
        [done.run_count],
      );
      await proc.waitLine(new RegExp(`^in_tx ${id} 2$`), "the second run");
      const status = await proc.kill("SIGTERM");
      assertEquals(status.code, 0, proc.stderr().slice(-2000));
      assert(proc.lines.includes("exit 0 stopped"), proc.lines.join("\n"));
      // The hazard did happen (postgres.js 3.4.x), and the pool's guard absorbed it.
      assertMatch(
        proc.stderr(),
        /a statement was sent on a database connection that had just closed \(the rollback of a transaction whose session ended\); the process goes on and the connection is reopened/,
        "the driver did not throw its TypeError: this test no longer exercises the guard",
      );
      assert(!/uncaught/i.test(proc.stderr()), proc.stderr().slice(-2000));
    } finally {
      await proc?.kill("SIGKILL");
      await app.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// 7. A non-transient database error

Deno.test("a schema that was never migrated stops the worker with code 1 (fatal) and says to migrate", async () => {
  await withDatabase("faults_unmigrated", async (db) => {
    const app = new Akadze({ databaseUrl: db.url });
    app.task("t", () => {});
    try {
      const w = runWorker(app);
      const exit = await within(w.exit, 20_000, "run() to return");
      assertEquals([exit.code, exit.reason], [1, "fatal"]);
      assertMatch(exit.message ?? "", /migrate/);
      assert(!(exit.message ?? "").includes(db.url), "no URL in the message");
    } finally {
      await app.close();
    }
  }, { migrated: false });
});
