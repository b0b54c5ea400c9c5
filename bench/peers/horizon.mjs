// The peers' driver of the pinned-horizon scenario (bench/horizon.ts): a producer enqueuing
// at a steady rate and one worker, both in this Node process, talking the
// protocol of steady.mjs. Settings from the environment:
//   SYSTEM   graphile | pgboss | bullmq
//   DATABASE_URL, RATE (jobs/s), TICK_MS (producer tick), ENQUEUE_BATCH (jobs per call at
//   most; 1: single-job calls)
//   graphile: CONC (concurrentJobs), LQ (localQueue size, -1 off), BATCH
//             (complete/failJobBatchDelay ms, -1 off)
//   pgboss:   CONC (localConcurrency), BATCH (batchSize)
//   bullmq:   CONC (Worker concurrency), POOL (pool size of each backend), KEEP (1: keep
//             completed jobs; default removeOnComplete)
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import { PgBoss } from "pg-boss";
import { createPostgresBackend, Queue, runMigrations, Worker } from "bullmq";
import pg from "pg";
import { createSteady } from "./steady.mjs";

const env = process.env;
const url = env.DATABASE_URL;
const num = (name, fallback) => Number(env[name] ?? fallback);
const steady = createSteady({
  rate: num("RATE", 500),
  tickMs: num("TICK_MS", 10),
  batch: num("ENQUEUE_BATCH", 100),
});

if (env.SYSTEM === "graphile") {
  const quiet = new Logger(() => () => {});
  const LQ = num("LQ", -1), BATCH = num("BATCH", -1);
  // Only what the entry changes; everything else is graphile-worker's default (pool of 10,
  // poll every 2 s, LISTEN/NOTIFY, prepared statements).
  const worker = { connectionString: url, concurrentJobs: num("CONC", 10) };
  if (LQ > 0) worker.localQueue = { size: LQ };
  if (BATCH >= 0) Object.assign(worker, { completeJobBatchDelay: BATCH, failJobBatchDelay: BATCH });
  // The producer: WorkerUtils.addJob / addJobs, what an application enqueuing jobs calls.
  const utils = await makeWorkerUtils({ connectionString: url, logger: quiet });
  await utils.migrate();
  const runner = await run({
    preset: { worker },
    logger: quiet,
    noHandleSignals: true,
    crontab: "",
    taskList: { noop: (payload) => steady.record(payload) },
  });
  let stopping = false;
  await steady.run(
    (jobs) =>
      jobs.length === 1
        ? utils.addJob("noop", jobs[0])
        : utils.addJobs(jobs.map((payload) => ({ identifier: "noop", payload }))),
    async () => {
      stopping = true;
      await runner.stop();
      await utils.release();
    },
    runner.promise.then((e) => stopping ? new Promise(() => {}) : { ended: String(e) }),
  );
} else if (env.SYSTEM === "pgboss") {
  const CONC = num("CONC", 4), BATCH = num("BATCH", 500);
  const Q = "noop";
  // The worker's instance runs pg-boss's maintenance (supervise, its default); the
  // producer's is a plain client, as a web process sending jobs would be.
  const boss = new PgBoss({ connectionString: url, max: CONC + 4, useListenNotify: true });
  boss.on("error", (e) => console.error("pg-boss error:", e.message));
  await boss.start();
  await boss.createQueue(Q, { notify: true });
  const producer = new PgBoss({ connectionString: url, supervise: false, schedule: false });
  producer.on("error", (e) => console.error("pg-boss error:", e.message));
  await producer.start();
  await boss.work(
    Q,
    {
      batchSize: BATCH,
      localConcurrency: CONC,
      burstWhenBatchFull: true,
      pollingIntervalSeconds: 0.5,
    },
    (jobs) => {
      for (const job of jobs) steady.record(job.data);
    },
  );
  await steady.run(
    (jobs) =>
      jobs.length === 1
        ? producer.send(Q, jobs[0])
        : producer.insert(Q, jobs.map((data) => ({ data }))),
    async () => {
      await boss.offWork(Q);
      await boss.stop({ graceful: false, wait: false });
      await producer.stop({ graceful: false, wait: false });
    },
  );
} else if (env.SYSTEM === "bullmq") {
  // BullMQ on its PostgreSQL backend, the settings of `deno task bench`'s entry: the worker
  // and the producer (a Queue, as a web process adding jobs would have) own a backend each.
  const Q = "noop";
  const connection = { connectionString: url, max: num("POOL", 20) };
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await runMigrations(client);
  await client.end();
  const producer = new Queue(Q, {
    connection,
    defaultJobOptions: env.KEEP === "1" ? {} : { removeOnComplete: true },
  }, createPostgresBackend);
  await producer.waitUntilReady();
  const worker = new Worker(Q, (job) => steady.record(job.data), {
    connection,
    concurrency: num("CONC", 50),
  }, createPostgresBackend);
  worker.on("error", (e) => console.error("bullmq worker error:", e.message));
  await worker.waitUntilReady();
  await steady.run(
    (jobs) =>
      jobs.length === 1
        ? producer.add("noop", jobs[0])
        : producer.addBulk(jobs.map((data) => ({ name: "noop", data }))),
    async () => {
      await worker.close();
      await producer.close();
    },
  );
} else {
  console.error(`SYSTEM must be graphile, pgboss or bullmq, got ${env.SYSTEM}`);
  process.exit(2);
}
process.exit(0);
