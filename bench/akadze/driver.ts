// One akadze run of the benchmark on a fresh database: bulk enqueue, burn-down drain (the
// worker in its own process), dead tuples, single-row enqueue, serial latency (the worker
// beside the enqueue, as the peers' drivers measure it). Prints one line
// "BENCH_RESULT {json}". Started by bench/run.ts with a JSON spec as argument.
import { Akadze, Worker, type WorkerOptions } from "../../mod.ts";
import { migrate } from "../../admin.ts";
import { LineReader, LineWriter } from "../lib/lines.ts";
import type { WorkerSpec } from "./worker.ts";
import { workerApp } from "./worker_app.ts";

/** What bench/run.ts asks of one akadze run. */
export interface DriverSpec {
  url: string;
  /** Jobs to drain. */
  n: number;
  /** Rows per bulk enqueue call. */
  batchRows: number;
  /** Single-row enqueues (0: skip). */
  single: number;
  /** Latency samples (0: skip). */
  samples: number;
  /** Unmeasured repetitions before the single-row and the latency measurements. */
  warmup: number;
  /** Succeeded rows to store in the jobs table before the run (the retained-rows case). */
  retained: number;
  app: WorkerSpec["app"];
  worker: WorkerOptions;
  /** Worker instances in the worker process. Default 1. */
  instances?: number;
  /**
   * Where the latency worker runs: in this process, beside the enqueue, as the peers'
   * drivers run theirs (default), or in a process of its own.
   */
  latencyWorker?: "in-process" | "process";
  postmasterPid?: number;
}

const spec: DriverSpec = JSON.parse(Deno.args[0]);
const WORKER = new URL("./worker.ts", import.meta.url).pathname;
const wallMs = () => performance.timeOrigin + performance.now();
const result: Record<string, unknown> = { system: "akadze" };

await migrate(spec.url);
// The enqueue side uses prepared statements when the worker's configuration does.
const app = new Akadze({ databaseUrl: spec.url, max: 2, prepare: spec.app.prepare ?? false });
const noop = app.task("noop", () => {});
const lat = app.task("lat", () => {});
const single = app.task("single", () => {});
const sql = app.sql;
const lsn = async () => (await sql`select pg_current_wal_lsn()::text as l`)[0].l as string;
const walSince = async (from: string) =>
  Number((await sql`select pg_wal_lsn_diff(pg_current_wal_lsn(), ${from}::pg_lsn) as d`)[0].d);

function spawnWorker(mode: WorkerSpec["mode"]) {
  const workerSpec: WorkerSpec = {
    url: spec.url,
    mode,
    n: spec.n,
    app: spec.app,
    worker: spec.worker,
    instances: spec.instances,
    postmasterPid: spec.postmasterPid,
  };
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all", // reading /proc (CPU time, peak RSS) needs it
      // e.g. --cpu-prof for bench/profile.ts
      ...(Deno.env.get("BENCH_WORKER_FLAGS")?.split(" ").filter(Boolean) ?? []),
      WORKER,
      JSON.stringify(workerSpec),
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = new LineReader(child.stdout);
  const stdin = new LineWriter(child.stdin);
  /** The next message of the worker (a JSON line), or an error when it ends first. */
  const next = async (): Promise<Record<string, unknown>> => {
    for (;;) {
      const line = await lines.next();
      if (line === null) throw new Error(`akadze ${mode} worker exited early`);
      if (!line.startsWith("{")) {
        console.error(`[akadze worker] ${line}`);
        continue;
      }
      const message = JSON.parse(line);
      if (message.event === "error") throw new Error(`akadze worker: ${message.message}`);
      return message;
    }
  };
  return { child, next, stdin, lines };
}

try {
  await sql`select 1`;
  if (spec.retained > 0) {
    const t = performance.now();
    await sql`
      insert into akadze.jobs (task, queue, state, args, run_count, attempt, run_at, created_at,
                               started_at, finished_at)
      select 'noop', 'default', 'succeeded', jsonb_build_object('id', -g), 1, 0,
             now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
             now() - interval '1 day' + g * interval '1 ms'
        from generate_series(1, ${spec.retained}::int) g`;
    await sql`vacuum (analyze) akadze.jobs`;
    result.retained = spec.retained;
    result.retained_setup_ms = Math.round(performance.now() - t);
  }
  await sql`checkpoint`;

  // 1) bulk enqueue: calls of batchRows rows.
  let l0 = await lsn();
  let t = performance.now();
  for (let i = 0; i < spec.n; i += spec.batchRows) {
    const rows = Array.from({ length: Math.min(spec.batchRows, spec.n - i) }, (_, k) => ({
      id: i + k,
    }));
    await noop.enqueueMany(rows);
  }
  result.bulk_ms = performance.now() - t;
  result.bulk_wal_bytes = await walSince(l0);
  // Planner statistics as a running system has them (autovacuum would get there, at a
  // moment that differs from run to run).
  await sql`analyze akadze.jobs`;

  // 2) drain, in a worker process of its own.
  const drainer = spawnWorker("drain");
  const drained = await drainer.next();
  if (drained.event !== "drained") throw new Error(`unexpected ${JSON.stringify(drained)}`);
  const exit = await drainer.next();
  await drainer.child.status;
  await drainer.stdin.close();
  if (exit.code !== 0) throw new Error(`drain worker exited with ${JSON.stringify(exit)}`);
  // With retention 0 a succeeded job's row is gone: count the missing ones as succeeded (only
  // a success deletes a row). Otherwise every job must be there, succeeded.
  const gone = spec.app.retention === 0;
  const [{ done }] = await sql`
    select (count(*) filter (where state = 'succeeded') + ${gone ? spec.n : 0}
            - ${gone ? sql`count(*)` : sql`0`})::int as done
      from akadze.jobs
     where task = 'noop' and args ? 'id' and (args->>'id')::int >= 0`;
  Object.assign(result, {
    drain_ms: drained.drain_ms,
    drain_handler_ms: drained.handler_ms,
    drain_wal_bytes: Number(
      (await sql`select pg_wal_lsn_diff(${drained.wal_end as string}::pg_lsn,
                                        ${drained.wal_start as string}::pg_lsn) as d`)[0].d,
    ),
    drain_worker_cpu_ms: drained.worker_cpu_ms,
    drain_pg_cpu_ms: drained.pg_cpu_ms,
    rss_kb: drained.rss_kb,
    completed: done,
  });

  // 3) dead tuples left by the drain (the worker's backends have flushed their stats by now).
  await new Promise((r) => setTimeout(r, 1_500));
  await sql`select pg_stat_force_next_flush()`;
  const [dead] = await sql`
    select n_dead_tup::int as dead, n_live_tup::int as live, autovacuum_count::int as av
      from pg_stat_user_tables where relid = 'akadze.jobs'::regclass`;
  Object.assign(result, { dead_tuples: dead.dead, live_tuples: dead.live, autovacuums: dead.av });

  // 4) single-row enqueue: sequential, one implicit transaction each.
  if (spec.single > 0) {
    for (let i = 0; i < spec.warmup; i++) await single.enqueue({ id: -1 - i });
    l0 = await lsn();
    t = performance.now();
    for (let i = 0; i < spec.single; i++) await single.enqueue({ id: i });
    result.single_ms = performance.now() - t;
    result.single_wal_bytes = await walSince(l0);
    result.single_n = spec.single;
    await sql`delete from akadze.jobs where task = 'single'`;
  }

  // 5) serial enqueue -> handler start latency, idle worker.
  if (spec.samples > 0) {
    const latency = spec.latencyWorker === "process" ? processLatency : inProcessLatency;
    result.latency = summarize(await latency());
  }
  console.log(`BENCH_RESULT ${JSON.stringify(result)}`);
} finally {
  await app.close();
}

/** Latency samples with the worker in a process of its own. */
async function processLatency(): Promise<number[]> {
  const w = spawnWorker("latency");
  const ready = await w.next();
  if (ready.event !== "ready") throw new Error(`unexpected ${JSON.stringify(ready)}`);
  const samples: number[] = [];
  for (let i = 0; i < spec.warmup + spec.samples; i++) {
    const message = w.next();
    await lat.enqueue({ t0: wallMs() });
    const m = await message;
    if (m.event !== "lat") throw new Error(`unexpected ${JSON.stringify(m)}`);
    if (i >= spec.warmup) samples.push(m.ms as number);
  }
  await w.stdin.write("stop");
  await w.next(); // exit
  await w.child.status;
  await w.stdin.close();
  return samples;
}

/**
 * Latency samples with the worker in this process, on a pool of its own, as the peers'
 * drivers measure theirs (their enqueue and worker share one Node process).
 */
async function inProcessLatency(): Promise<number[]> {
  const { app: latencyApp, close } = workerApp(spec.url, spec.app);
  let started: (ms: number) => void = () => {};
  latencyApp.task("lat", ({ t0 }) => started(wallMs() - (t0 as number)));
  const worker = new Worker(latencyApp, { schedules: false, ...spec.worker });
  const run = worker.run();
  // A worker that stops before the last sample fails the run instead of hanging it.
  const early = run.then((exit) => {
    throw new Error(`latency worker stopped: ${exit.reason} ${exit.message ?? ""}`);
  });
  early.catch(() => {}); // also rejects at the normal stop below; awaited only in the race
  try {
    // Open the pool's connections first, as the worker process does.
    await Promise.all(
      Array.from({ length: Math.min(spec.app.max ?? 10, 4) }, () => latencyApp.sql`select 1`),
    );
    await new Promise((r) => setTimeout(r, 1_000)); // registered and listening
    const samples: number[] = [];
    for (let i = 0; i < spec.warmup + spec.samples; i++) {
      const sample = new Promise<number>((resolve) => started = resolve);
      await lat.enqueue({ t0: wallMs() });
      const ms = await Promise.race([sample, early]);
      if (i >= spec.warmup) samples.push(ms);
    }
    return samples;
  } finally {
    worker.stop();
    await run;
    await close();
  }
}

function summarize(samples: number[]) {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  return { n: s.length, p50: at(0.5), p95: at(0.95), max: s[s.length - 1] };
}
