// BullMQ's run of the flows scenario (bench/flows.ts), on its PostgreSQL backend: one flow of
// the shape asked for, enqueued with FlowProducer (children first, the parent once they
// complete: a parent waits for its children), then drained by one Worker in this process.
// Prints one line "BENCH_RESULT {json}". Settings from the environment: DATABASE_URL,
// SHAPE (fanout | chain | dag), N, LAYERS, CONC (Worker concurrency), POOL (pool size of
// each backend), KEEP (1: keep completed jobs; default removeOnComplete), PG_POSTMASTER_PID.
import { createPostgresBackend, FlowProducer, runMigrations, Worker } from "bullmq";
import pg from "pg";
import { cpuMs, packageVersion, postgresCpuMs, report, sleep } from "./common.mjs";
import { createFlowLog, flowShape } from "./flow_shapes.mjs";

const env = process.env;
const url = env.DATABASE_URL;
const shapeSpec = {
  shape: env.SHAPE,
  n: Number(env.N),
  layers: Number(env.LAYERS ?? 20),
  tree: true,
};
const CONC = Number(env.CONC ?? 50);
const POOL = Number(env.POOL ?? 20);
const KEEP = env.KEEP === "1";
const postmasterPid = Number(env.PG_POSTMASTER_PID ?? 0);
const Q = "flow";
const result = {
  system: "bullmq",
  version: packageVersion("bullmq"),
  node: process.version,
  config: { CONC, POOL, removeOnComplete: !KEEP },
  shape: { ...shapeSpec, form: "tree" },
};

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

const { deps, sinks, edges } = flowShape(shapeSpec);
result.steps = deps.length;
result.edges = edges;
const log = createFlowLog(deps);
const opts = KEEP ? {} : { removeOnComplete: true };
// Each step's node with its dependencies as children (every step has one dependent at most).
const node = (s) => {
  const n = { name: "step", queueName: Q, data: { s }, opts };
  if (deps[s].length) n.children = deps[s].map(node);
  return n;
};
const trees = sinks.map(node);

const connection = { connectionString: url, max: POOL };
const producer = new FlowProducer({ connection }, createPostgresBackend);
await producer.waitUntilReady();
const worker = new Worker(
  Q,
  (job) => {
    log.begin(job.data.s);
    log.finish(job.data.s);
  },
  { connection, concurrency: CONC, autorun: false },
  createPostgresBackend,
);
worker.on("error", (e) => console.error("bullmq worker error:", e.message));
await worker.waitUntilReady();
await q("checkpoint");

// 1) the flow's enqueue: one FlowProducer call (add for one tree, addBulk for several).
let l0 = await lsn();
let pg0 = postgresCpuMs(postmasterPid);
let t = performance.now();
if (trees.length === 1) await producer.add(trees[0]);
else await producer.addBulk(trees);
result.enqueue_ms = performance.now() - t;
result.enqueue_pg_cpu_ms = postgresCpuMs(postmasterPid) - pg0;
result.enqueue_wal_bytes = await walBetween(l0, await lsn());
await q("analyze bullmq.job");

// 2) the drain: worker start until the database shows every step finished.
l0 = await lsn();
const cpu0 = cpuMs();
pg0 = postgresCpuMs(postmasterPid);
t = performance.now();
const running = worker.run();
await log.done;
result.handlers_ms = performance.now() - t;
let l1;
for (;;) {
  const [row] = await q(
    "select exists (select 1 from bullmq.job where queue = $1 and state <> 'completed') as busy, pg_current_wal_lsn()::text as lsn",
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
await worker.close();
await running;
const [left] = await q(
  "select count(*)::int as c, count(*) filter (where state = 'completed')::int as done from bullmq.job where queue = $1",
  [Q],
);
Object.assign(result, log.summary());
result.completed = log.ended !== deps.length
  ? 0
  : KEEP
  ? left.done
  : left.c === 0
  ? deps.length
  : 0;
await producer.close();
await pool.end();
report(result);
process.exit(0);
