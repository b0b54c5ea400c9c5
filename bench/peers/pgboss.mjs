// pg-boss run of the benchmark (adapted from ../shared/bench-peers/boss12-bench.mjs): bulk
// enqueue, burn-down drain, dead tuples, single-row enqueue, serial latency. Prints one
// line "BENCH_RESULT {json}". Settings from the environment (see common.mjs), plus CONC
// (localConcurrency) and BATCH (batchSize); LISTEN/NOTIFY and burstWhenBatchFull on.
import { PgBoss } from "pg-boss";
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
const CONC = Number(process.env.CONC ?? 4);
const BATCH = Number(process.env.BATCH ?? 500);
const result = {
  system: "pg-boss",
  version: packageVersion("pg-boss"),
  node: process.version,
  config: { CONC, BATCH, notify: true, burst: true },
};

const boss = new PgBoss({
  connectionString: url,
  max: CONC + 4,
  schedule: false,
  supervise: false,
  useListenNotify: true,
});
boss.on("error", (e) => console.error("pg-boss error:", e.message));
await boss.start();
const db = boss.getDb();
const q = async (text, params) => (await db.executeSql(text, params)).rows;
const lsn = async () => (await q("select pg_current_wal_lsn()::text as l"))[0].l;
const walBetween = async (a, b) =>
  Number((await q("select pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn) as d", [a, b]))[0].d);
const Q = "noop";
for (const name of [Q, "single", "lat"]) await boss.createQueue(name, { notify: true });
await Promise.all(Array.from({ length: 4 }, () => q("select 1")));
await q("checkpoint");

// 1) bulk enqueue: calls of batchRows rows.
let l0 = await lsn();
let t = performance.now();
for (let i = 0; i < n; i += batchRows) {
  await boss.insert(
    Q,
    Array.from({ length: Math.min(batchRows, n - i) }, (_, k) => ({ data: { id: i + k } })),
  );
}
result.bulk_ms = performance.now() - t;
result.bulk_wal_bytes = await walBetween(l0, await lsn());
await q("analyze pgboss.job"); // statistics, as in akadze's driver

// 2) drain.
let started = 0;
let allStarted;
const everyJobStarted = new Promise((resolve) => (allStarted = resolve));
l0 = await lsn();
const cpu0 = cpuMs();
const pg0 = postgresCpuMs(postmasterPid);
t = performance.now();
await boss.work(
  Q,
  {
    batchSize: BATCH,
    localConcurrency: CONC,
    burstWhenBatchFull: true,
    pollingIntervalSeconds: 0.5,
  },
  (jobs) => {
    started += jobs.length;
    if (started >= n) allStarted();
  },
);
await everyJobStarted;
result.drain_handler_ms = performance.now() - t;
const l1 = await untilIdle(async () => {
  const [row] = await q(
    "select exists (select 1 from pgboss.job where name = $1 and state < 'completed') as busy, pg_current_wal_lsn()::text as lsn",
    [Q],
  );
  return row;
});
result.drain_ms = performance.now() - t;
result.drain_worker_cpu_ms = cpuMs() - cpu0;
result.drain_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.drain_wal_bytes = await walBetween(l0, l1);
result.rss_kb = peakRssKb();
await boss.offWork(Q);
result.completed = (await q(
  "select count(*)::int as c from pgboss.job where name = $1 and state = 'completed'",
  [Q],
))[0].c;

// 3) dead tuples left by the drain: the partitions of pgboss.job.
await sleep(1_500);
await q("select pg_stat_force_next_flush()");
const [dead] = await q(`
  select coalesce(sum(n_dead_tup), 0)::int as dead, coalesce(sum(n_live_tup), 0)::int as live,
         coalesce(sum(autovacuum_count), 0)::int as av
    from pg_stat_user_tables
   where relid = 'pgboss.job'::regclass
      or relid in (select inhrelid from pg_inherits where inhparent = 'pgboss.job'::regclass)`);
Object.assign(result, { dead_tuples: dead.dead, live_tuples: dead.live, autovacuums: dead.av });

// 4) single-row enqueue: sequential, one implicit transaction each.
if (single > 0) {
  for (let i = 0; i < warmup; i++) await boss.send("single", { id: -1 - i });
  l0 = await lsn();
  t = performance.now();
  for (let i = 0; i < single; i++) await boss.send("single", { id: i });
  result.single_ms = performance.now() - t;
  result.single_wal_bytes = await walBetween(l0, await lsn());
  result.single_n = single;
  await q("delete from pgboss.job where name = 'single'");
}

// 5) serial enqueue -> handler start latency, idle worker (batchSize 1, NOTIFY).
if (samples > 0) {
  const lat = [];
  let pending;
  await boss.work("lat", { batchSize: 1 }, ([job]) => {
    lat.push(wallMs() - job.data.t0);
    pending();
  });
  await sleep(1_000);
  for (let i = 0; i < warmup + samples; i++) {
    const p = new Promise((resolve) => (pending = resolve));
    await boss.send("lat", { t0: wallMs() });
    await p;
  }
  await boss.offWork("lat");
  result.latency = summarize(lat.slice(warmup));
}
report(result);
await boss.stop({ graceful: false, wait: false });
process.exit(0);
