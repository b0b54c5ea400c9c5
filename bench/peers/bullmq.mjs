// BullMQ run of the benchmark, on its PostgreSQL backend (`createPostgresBackend`): bulk
// enqueue, burn-down drain, dead tuples, single-row enqueue, serial latency. Prints one
// line "BENCH_RESULT {json}". Settings from the environment (see common.mjs), plus CONC
// (Worker concurrency), POOL (pg pool size `max` of each backend) and KEEP (1: keep
// completed jobs, BullMQ's default; 0: `removeOnComplete: true`, what its PostgreSQL guide
// recommends so that finished jobs do not accumulate).
import { createPostgresBackend, Queue, runMigrations, Worker } from "bullmq";
import pg from "pg";
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
const CONC = Number(process.env.CONC ?? 50);
const POOL = Number(process.env.POOL ?? 20);
const KEEP = process.env.KEEP === "1";
const result = {
  system: "bullmq",
  version: packageVersion("bullmq"),
  node: process.version,
  config: { CONC, POOL, removeOnComplete: !KEEP },
};

// Measurements on a pool of their own; BullMQ's classes each own a backend (a pg.Pool of
// POOL connections plus one LISTEN connection), as its guide shows.
const pool = new pg.Pool({ connectionString: url, max: 2 });
pool.on("error", () => {});
pool.on("connect", (client) => client.on("error", () => {}));
const q = async (text, params) => (await pool.query(text, params)).rows;
const lsn = async () => (await q("select pg_current_wal_lsn()::text as l"))[0].l;
const walBetween = async (a, b) =>
  Number((await q("select pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn) as d", [a, b]))[0].d);

{
  const client = await pool.connect();
  try {
    await runMigrations(client);
  } finally {
    client.release();
  }
}
const connection = { connectionString: url, max: POOL };
const jobOpts = KEEP ? {} : { removeOnComplete: true };
const queue = (name) =>
  new Queue(name, { connection, defaultJobOptions: jobOpts }, createPostgresBackend);
const worker = (name, fn) =>
  new Worker(name, fn, { connection, concurrency: CONC, autorun: false }, createPostgresBackend);

const Q = "noop";
const noop = queue(Q);
await noop.waitUntilReady();
await q("checkpoint");

// 1) bulk enqueue: calls of batchRows rows (addBulk, one transaction each).
let l0 = await lsn();
let t = performance.now();
for (let i = 0; i < n; i += batchRows) {
  await noop.addBulk(
    Array.from({ length: Math.min(batchRows, n - i) }, (_, k) => ({
      name: "noop",
      data: { id: i + k },
    })),
  );
}
result.bulk_ms = performance.now() - t;
result.bulk_wal_bytes = await walBetween(l0, await lsn());
await q("analyze bullmq.job"); // statistics, as in akadze's driver

// 2) drain.
let started = 0;
let allStarted;
const everyJobStarted = new Promise((resolve) => (allStarted = resolve));
const w = worker(Q, () => {
  if (++started === n) allStarted();
});
w.on("error", (e) => console.error("bullmq worker error:", e.message));
await w.waitUntilReady();
l0 = await lsn();
const cpu0 = cpuMs();
const pg0 = postgresCpuMs(postmasterPid);
t = performance.now();
const running = w.run();
await everyJobStarted;
result.drain_handler_ms = performance.now() - t;
const l1 = await untilIdle(async () => {
  const [row] = await q(
    "select exists (select 1 from bullmq.job where queue = $1 and state <> 'completed') as busy, pg_current_wal_lsn()::text as lsn",
    [Q],
  );
  return row;
});
result.drain_ms = performance.now() - t;
result.drain_worker_cpu_ms = cpuMs() - cpu0;
result.drain_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.drain_wal_bytes = await walBetween(l0, l1);
result.rss_kb = peakRssKb();
await w.close();
await running;
// Kept: every row completed; removed on completion: none left, none failed.
const [left] = await q(
  "select count(*)::int as c, count(*) filter (where state = 'completed')::int as done from bullmq.job where queue = $1",
  [Q],
);
result.completed = started !== n ? 0 : KEEP ? left.done : left.c === 0 ? n : 0;

// 3) dead tuples left by the drain.
await sleep(1_500);
await q("select pg_stat_force_next_flush()");
const [dead] = await q(`
  select n_dead_tup::int as dead, n_live_tup::int as live, autovacuum_count::int as av
    from pg_stat_user_tables where relid = 'bullmq.job'::regclass`);
Object.assign(result, { dead_tuples: dead.dead, live_tuples: dead.live, autovacuums: dead.av });

// 4) single-row enqueue: sequential Queue.add, one transaction each.
if (single > 0) {
  const one = queue("single");
  await one.waitUntilReady();
  for (let i = 0; i < warmup; i++) await one.add("single", { id: -1 - i });
  l0 = await lsn();
  t = performance.now();
  for (let i = 0; i < single; i++) await one.add("single", { id: i });
  result.single_ms = performance.now() - t;
  result.single_wal_bytes = await walBetween(l0, await lsn());
  result.single_n = single;
  await one.close();
}

// 5) serial enqueue -> handler start latency, idle worker (same settings, LISTEN/NOTIFY).
if (samples > 0) {
  const lat = [];
  let pending;
  const producer = queue("lat");
  await producer.waitUntilReady();
  const lw = worker("lat", (job) => {
    lat.push(wallMs() - job.data.t0);
    pending();
  });
  lw.on("error", (e) => console.error("bullmq worker error:", e.message));
  await lw.waitUntilReady();
  const lr = lw.run();
  await sleep(1_000);
  for (let i = 0; i < warmup + samples; i++) {
    const p = new Promise((resolve) => (pending = resolve));
    await producer.add("lat", { t0: wallMs() });
    await p;
  }
  await lw.close();
  await lr;
  await producer.close();
  result.latency = summarize(lat.slice(warmup));
}
await noop.close();
await pool.end();
report(result);
process.exit(0);
