// pg-boss's run of the flows scenario (bench/flows.ts): one flow of the shape asked for,
// enqueued with `boss.flow` (jobs with refs and `dependsOn`, one call), then drained by one
// worker in this process. pg-boss releases a dependent out of band: its flow resolver runs
// every `flowIntervalSeconds` (1 here, the smallest it accepts; default 5), not when the
// dependency completes. LISTEN/NOTIFY is off here: with it on, a dependent the resolver
// released waited 30 s for its worker (measured with pg-boss 12.38: the resolver's release
// sends no NOTIFY, and the listening worker then polls at 30 s, not pollingIntervalSeconds);
// off, the worker polls every 0.5 s. Prints one line "BENCH_RESULT {json}". Settings from the
// environment: DATABASE_URL, SHAPE (fanout | chain | dag), N, LAYERS, CONC
// (localConcurrency), BATCH (batchSize), PG_POSTMASTER_PID.
import { PgBoss } from "pg-boss";
import { cpuMs, packageVersion, postgresCpuMs, report, sleep } from "./common.mjs";
import { createFlowLog, flowShape } from "./flow_shapes.mjs";

const env = process.env;
const shapeSpec = { shape: env.SHAPE, n: Number(env.N), layers: Number(env.LAYERS ?? 20) };
const CONC = Number(env.CONC ?? 4);
const BATCH = Number(env.BATCH ?? 500);
const FLOW_INTERVAL = 1;
const postmasterPid = Number(env.PG_POSTMASTER_PID ?? 0);
const Q = "flow";
const result = {
  system: "pg-boss",
  version: packageVersion("pg-boss"),
  node: process.version,
  config: { CONC, BATCH, notify: false, burst: true, flowIntervalSeconds: FLOW_INTERVAL },
  shape: shapeSpec,
};

const boss = new PgBoss({
  connectionString: env.DATABASE_URL,
  max: CONC + 4,
  schedule: false,
  useListenNotify: false,
  flowIntervalSeconds: FLOW_INTERVAL,
});
boss.on("error", (e) => console.error("pg-boss error:", e.message));
await boss.start();
const db = boss.getDb();
const q = async (text, params) => (await db.executeSql(text, params)).rows;
const lsn = async () => (await q("select pg_current_wal_lsn()::text as l"))[0].l;
const walBetween = async (a, b) =>
  Number((await q("select pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn) as d", [a, b]))[0].d);
await boss.createQueue(Q);

const { deps, edges } = flowShape(shapeSpec);
result.steps = deps.length;
result.edges = edges;
const log = createFlowLog(deps);
const jobs = deps.map((d, s) => {
  const job = { ref: `s${s}`, name: Q, data: { s } };
  if (d.length) job.dependsOn = d.map((x) => `s${x}`);
  return job;
});
await q("checkpoint");

// 1) the flow's enqueue: one boss.flow call.
let l0 = await lsn();
let pg0 = postgresCpuMs(postmasterPid);
let t = performance.now();
await boss.flow(jobs);
result.enqueue_ms = performance.now() - t;
result.enqueue_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.enqueue_wal_bytes = await walBetween(l0, await lsn());
await q("analyze pgboss.job");

// 2) the drain: worker start until the database shows every step finished.
l0 = await lsn();
const cpu0 = cpuMs();
pg0 = postgresCpuMs(postmasterPid);
t = performance.now();
await boss.work(
  Q,
  {
    batchSize: BATCH,
    localConcurrency: CONC,
    burstWhenBatchFull: true,
    pollingIntervalSeconds: 0.5,
  },
  (batch) => {
    for (const job of batch) log.begin(job.data.s);
    for (const job of batch) log.finish(job.data.s);
  },
);
await log.done;
result.handlers_ms = performance.now() - t;
let l1;
for (;;) {
  const [row] = await q(
    "select exists (select 1 from pgboss.job where name = $1 and state < 'completed') as busy, pg_current_wal_lsn()::text as lsn",
    [Q],
  );
  if (!row.busy) {
    l1 = row.lsn;
    break;
  }
  await sleep(1);
}
result.drain_ms = performance.now() - t;
result.worker_cpu_ms = cpuMs() - cpu0;
result.drain_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.drain_wal_bytes = await walBetween(l0, l1);
await boss.offWork(Q);
const [{ c }] = await q(
  "select count(*)::int as c from pgboss.job where name = $1 and state = 'completed'",
  [Q],
);
Object.assign(result, log.summary());
result.completed = log.ended === deps.length ? c : 0;
await boss.stop({ graceful: false, wait: false });
report(result);
process.exit(0);
