/**
 * akadze: a PostgreSQL-backed task queue for Deno. Enqueue jobs inside your own
 * transaction, run them in a worker with retries and a heartbeat lease, and run cron and
 * interval schedules in that same worker.
 *
 * @example
 * ```ts ignore
 * import { migrate } from "@akadze/akadze";
 *
 * const applied = await migrate(Deno.env.get("AKADZE_DATABASE_URL")!);
 * console.log(applied.length ? `applied ${applied.join(", ")}` : "schema up to date");
 * ```
 *
 * @module
 */
export { AkadzeError, DuplicateJob, EnqueueError, MigrateError } from "./src/errors.ts";
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
  type MigrateOptions,
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
export { current, type JobContext } from "./src/context.ts";
export { Cancel, Fail, Retry, type RetryOptions, Snooze } from "./src/errors.ts";
export type {
  AfterRunHook,
  BeforeRunHook,
  EnqueuedJob,
  Hooks,
  JobInfo,
  JobState,
  OnEnqueueHook,
  OnTransitionHook,
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
export {
  type AdminOptions,
  clearLimit,
  type Database,
  getJob,
  type GetJobOptions,
  type JobDetail,
  type JobSummary,
  type LimitOptions,
  type LimitSummary,
  listJobs,
  type ListJobsOptions,
  listLimits,
  listQueues,
  listWorkers,
  pauseQueue,
  type QueueSnapshot,
  queueSnapshot,
  type QueueSummary,
  requestCancel,
  requeue,
  resumeQueue,
  type Session,
  setLimit,
  type WorkerSummary,
} from "./src/admin.ts";
export { type NamedScheduleSpec, Schedule, type ScheduleSpec } from "./src/schedule.ts";
export type { PeriodicOptions } from "./src/app.ts";
