// graphile-worker run of the benchmark (adapted from ../shared/bench-peers/gw-bench.mjs):
// bulk enqueue, burn-down drain, dead tuples, single-row enqueue, serial latency. Prints
// one line "BENCH_RESULT {json}". Settings from the environment (see common.mjs), plus
// CONC (concurrentJobs), LQ (localQueue size, -1 off) and BATCH (complete/failJobBatchDelay,
// -1 off).
import pg from "pg";
import { Logger, runMigrations, runTaskList } from "graphile-worker";
import {
  benchEnv,
  cpuMs,
  packageVersion,
  peakRssKb,
  postgresCpuMs,
  report,
  sleep,
  summarize,
  untilIdle,
  wallMs,
} from "./common.mjs";

const { url, n, batchRows, single, samples, warmup, postmasterPid } = benchEnv();
const CONC = Number(process.env.CONC ?? 24);
const LQ = Number(process.env.LQ ?? 500);
const BATCH = Number(process.env.BATCH ?? 0);
const quiet = new Logger(() => () => {});
const preset = {
  worker: {
    connectionString: url,
    concurrentJobs: CONC,
    maxPoolSize: CONC + 1,
    localQueue: { size: LQ },
    completeJobBatchDelay: BATCH,
    failJobBatchDelay: BATCH,
    pollInterval: 1000,
  },
};
const result = {
  system: "graphile-worker",
  version: packageVersion("graphile-worker"),
  node: process.version,
  config: { CONC, LQ, BATCH },
};

// Measurements and enqueues on one pool; the workers on their own.
const pool = new pg.Pool({ connectionString: url, max: 2 });
pool.on("error", () => {});
pool.on("connect", (client) => client.on("error", () => {}));
const q = async (text, params) => (await pool.query(text, params)).rows;
const lsn = async () => (await q("select pg_current_wal_lsn()::text as l"))[0].l;
const walBetween = async (a, b) =>
  Number((await q("select pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn) as d", [a, b]))[0].d);

async function startWorkers(tasks) {
  const workerPool = new pg.Pool({ connectionString: url, max: CONC + 2 });
  workerPool.on("error", () => {});
  workerPool.on("connect", (client) => client.on("error", () => {}));
  await Promise.all(Array.from({ length: 4 }, () => workerPool.query("select 1")));
  return {
    workerPool,
    start: () => runTaskList({ preset, logger: quiet, noHandleSignals: true }, tasks, workerPool),
  };
}

async function stopWorkers(runner, workerPool) {
  await runner.gracefulShutdown();
  await Promise.race([runner.promise, sleep(10_000)]);
  await workerPool.end();
}

await runMigrations({ pgPool: pool, logger: quiet });
await q("checkpoint");

// 1) bulk enqueue: calls of batchRows rows (add_jobs, one round trip each).
let l0 = await lsn();
let t = performance.now();
for (let i = 0; i < n; i += batchRows) {
  const specs = Array.from({ length: Math.min(batchRows, n - i) }, (_, k) => ({
    identifier: "noop",
    payload: { id: i + k },
  }));
  await q(
    "select 1 from graphile_worker.add_jobs(array(select json_populate_recordset(null::graphile_worker.job_spec, $1::json)))",
    [JSON.stringify(specs)],
  );
}
result.bulk_ms = performance.now() - t;
result.bulk_wal_bytes = await walBetween(l0, await lsn());
await q("analyze graphile_worker._private_jobs"); // statistics, as in akadze's driver

// 2) drain.
let started = 0;
let allStarted;
const everyJobStarted = new Promise((resolve) => (allStarted = resolve));
const drain = await startWorkers({
  noop: () => {
    if (++started === n) allStarted();
  },
});
l0 = await lsn();
const cpu0 = cpuMs();
const pg0 = postgresCpuMs(postmasterPid);
t = performance.now();
const runner = drain.start();
await everyJobStarted;
result.drain_handler_ms = performance.now() - t;
const l1 = await untilIdle(async () => {
  const [row] = await q(
    "select exists (select 1 from graphile_worker._private_jobs) as busy, pg_current_wal_lsn()::text as lsn",
  );
  return row;
});
result.drain_ms = performance.now() - t;
result.drain_worker_cpu_ms = cpuMs() - cpu0;
result.drain_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.drain_wal_bytes = await walBetween(l0, l1);
result.rss_kb = peakRssKb();
await stopWorkers(runner, drain.workerPool);
// Completed jobs are deleted: none may be left, none may have failed.
result.completed = started === n &&
    (await q("select count(*)::int as c from graphile_worker._private_jobs"))[0].c === 0
  ? n
  : 0;

// 3) dead tuples left by the drain.
await sleep(1_500);
await q("select pg_stat_force_next_flush()");
const [dead] = await q(`
  select n_dead_tup::int as dead, n_live_tup::int as live, autovacuum_count::int as av
    from pg_stat_user_tables where relid = 'graphile_worker._private_jobs'::regclass`);
Object.assign(result, { dead_tuples: dead.dead, live_tuples: dead.live, autovacuums: dead.av });

// 4) single-row enqueue: sequential, one implicit transaction each.
if (single > 0) {
  const addSingle = (i) =>
    q("select graphile_worker.add_job('single', json_build_object('id', $1::int))", [i]);
  for (let i = 0; i < warmup; i++) await addSingle(-1 - i);
  l0 = await lsn();
  t = performance.now();
  for (let i = 0; i < single; i++) await addSingle(i);
  result.single_ms = performance.now() - t;
  result.single_wal_bytes = await walBetween(l0, await lsn());
  result.single_n = single;
  await q("delete from graphile_worker._private_jobs");
}

// 5) serial enqueue -> handler start latency, idle worker (same preset).
if (samples > 0) {
  const lat = [];
  let pending;
  const w = await startWorkers({
    lat: ({ t0 }) => {
      lat.push(wallMs() - t0);
      pending();
    },
  });
  const r2 = w.start();
  await sleep(1_000);
  for (let i = 0; i < warmup + samples; i++) {
    const p = new Promise((resolve) => (pending = resolve));
    await q("select graphile_worker.add_job('lat', json_build_object('t0', $1::float8))", [
      wallMs(),
    ]);
    await p;
  }
  await stopWorkers(r2, w.workerPool);
  result.latency = summarize(lat.slice(warmup));
}
await pool.end();
report(result);
