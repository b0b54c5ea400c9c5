/**
 * akadze: a PostgreSQL-backed task queue for Deno. Enqueue jobs inside your own
 * transaction, run them in a worker with retries and a heartbeat lease, and run cron and
 * interval schedules in that same worker. PostgreSQL is the only broker.
 *
 * - {@linkcode Akadze}: the app (connection, tasks, schedules, hooks); `app.task(...)`
 *   registers a {@linkcode Task}, `task.using({ session: tx }).enqueue(args)` enqueues in
 *   your transaction.
 * - {@linkcode Worker}: claims and runs jobs (`akadze worker ./app.ts` from the CLI).
 * - {@linkcode migrate}: creates or updates the schema (`akadze migrate`).
 * - `Retry`, `Snooze`, `Fail`, `Cancel`: what a handler throws to steer its job;
 *   {@linkcode current} gives the running job's context anywhere inside the run.
 * - Admin functions (`requeue`, `requestCancel`, `pauseQueue`, `setLimit`, `listJobs`, ...).
 *
 * Also: `@akadze/akadze/testing` (a throwaway database, `drain`, `assertEnqueued`),
 * `@akadze/akadze/metrics` (Prometheus text) and `@akadze/akadze/cli` (the `akadze`
 * command).
 *
 * @example A whole round trip: save as `hello.ts`, run with
 * `AKADZE_DATABASE_URL=postgres://... deno run -A hello.ts`
 * ```ts
 * import { Akadze, migrate, Worker } from "@akadze/akadze";
 * import * as v from "valibot";
 *
 * const databaseUrl = Deno.env.get("AKADZE_DATABASE_URL")!;
 * await migrate(databaseUrl); // creates the "akadze" schema; a no-op when up to date
 *
 * const app = new Akadze({ databaseUrl });
 * const hello = app.task(
 *   "hello",
 *   { args: v.object({ name: v.string() }) },
 *   ({ name }) => `hello ${name}`,
 * );
 *
 * // Enqueue in your own transaction: a rollback removes the job.
 * await app.sql.begin(async (tx) => {
 *   await hello.using({ session: tx }).enqueue({ name: "ada" });
 * });
 *
 * // Run every ready job, then stop (a long-running worker omits `batch`).
 * const exit = await new Worker(app, { batch: true }).run();
 * console.log(exit.reason); // "batch_done"
 * await app.close();
 * ```
 *
 * @module
 */
export {
  AkadzeError,
  DuplicateJob,
  EnqueueError,
  JobNotFound,
  JobWaitTimeout,
  MigrateError,
} from "./src/errors.ts";
export {
  connect,
  type ConnectOptions,
  DEFAULT_SCHEMA,
  describeError,
  isTransientError,
  quoteSchema,
  redact,
  type Sql,
  type TransactionSql,
} from "./src/db.ts";
export {
  appliedVersions,
  knownVersions,
  migrate,
  MIGRATE_DEFAULT,
  type MigrateOptions,
  type MigrateRetry,
  migrationSql,
  type MigrationSqlOptions,
  type MigrationStatus,
  migrationStatus,
  pendingVersions,
} from "./src/migrate.ts";
export { Akadze, type AkadzeOptions, type TaskModule } from "./src/app.ts";
export {
  type AnyTask,
  type ArgsInput,
  type ArgsOutput,
  type Backoff,
  type BoundTask,
  type EnqueueArgs,
  type JsonObject,
  Task,
  type TaskHandler,
  type TaskOptions,
} from "./src/task.ts";
export type { EnqueueOptions } from "./src/enqueue.ts";
export type { NodePostgresClient } from "./src/node_postgres.ts";
export { current, type JobContext } from "./src/context.ts";
export type { DeadLetter } from "./src/dead_letter.ts";
export { Cancel, Fail, Retry, type RetryOptions, Snooze } from "./src/errors.ts";
export {
  ACTIVE_STATES,
  type AfterRunHook,
  attemptNumber,
  type BeforeRunHook,
  type EnqueuedJob,
  type Hooks,
  JOB_STATE_KINDS,
  JOB_STATES,
  type JobInfo,
  type JobState,
  type OnEnqueueHook,
  type OnTransitionHook,
  TERMINAL_STATES,
} from "./src/job.ts";
export type {
  InferInput,
  InferOutput,
  StandardSchemaIssue,
  StandardSchemaProps,
  StandardSchemaResult,
  StandardSchemaV1,
} from "./src/standard_schema.ts";
export { Worker, type WorkerExit, type WorkerRunOptions } from "./src/worker/worker.ts";
export { WORKER_DEFAULTS, type WorkerConfig, type WorkerOptions } from "./src/worker/config.ts";
export { type FinishedOutcome, WorkerMetrics } from "./src/worker/worker_metrics.ts";
export type { AdminOptions, Database, Session } from "./src/admin/database.ts";
export {
  type BulkOptions,
  cancelJobs,
  getJob,
  type GetJobOptions,
  type JobDetail,
  type JobError,
  type JobFilter,
  type JobSummary,
  listJobs,
  type ListJobsOptions,
  requestCancel,
  requeue,
  requeueJobs,
  type RequeueJobsResult,
} from "./src/admin/jobs.ts";
export {
  listQueues,
  pauseQueue,
  queueKnown,
  type QueueSnapshot,
  queueSnapshot,
  type QueueSummary,
  resumeQueue,
} from "./src/admin/queues.ts";
export {
  clearLimit,
  type LimitOptions,
  type LimitSummary,
  listLimits,
  setLimit,
} from "./src/admin/limits.ts";
export { listWorkers, type WorkerSummary } from "./src/admin/workers.ts";
export { pruneJobs, type PruneJobsOptions } from "./src/admin/prune.ts";
export { WAIT_POLL_DEFAULT, type WaitOptions } from "./src/wait.ts";
export { type NamedScheduleSpec, Schedule, type ScheduleSpec } from "./src/schedule.ts";
export type { PeriodicOptions } from "./src/app.ts";
