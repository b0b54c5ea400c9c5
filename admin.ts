/**
 * Operating akadze: create or update the schema, look at jobs, queues, limits and workers,
 * and act on them. The `akadze` command does the same from a shell; these functions are for
 * your own code (an admin page, a deploy script, a maintenance job).
 *
 * - {@linkcode migrate} creates or updates the schema; {@linkcode migrationStatus} and
 *   {@linkcode migrationSql} report on it or print it for review.
 * - Jobs: {@linkcode listJobs}, {@linkcode getJob}, {@linkcode requeue},
 *   {@linkcode requeueJobs}, {@linkcode requestCancel}, {@linkcode cancelJobs},
 *   {@linkcode pruneJobs}.
 * - Queues: {@linkcode listQueues}, {@linkcode queueSnapshot}, {@linkcode pauseQueue},
 *   {@linkcode resumeQueue}, {@linkcode queueKnown}.
 * - Limits: {@linkcode setLimit}, {@linkcode clearLimit}, {@linkcode listLimits}.
 * - Workers: {@linkcode listWorkers}.
 *
 * Each reads from the app (`app`, its pool and schema) or a postgres.js instance, and each
 * change takes a session: a pool, or your own transaction.
 *
 * @example Migrate, then requeue the failed jobs of a task: save as `ops.ts`, run with
 * `AKADZE_DATABASE_URL=postgres://... deno run -A ops.ts`
 * ```ts
 * import { Akadze } from "@akadze/akadze";
 * import { listJobs, migrate, pauseQueue, requeueJobs, resumeQueue } from "@akadze/akadze/admin";
 *
 * const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL")! });
 * await migrate(app.sql); // a no-op when the schema is up to date
 *
 * const failed = await listJobs(app, { task: "mail.send", state: "failed" });
 * console.log(`${failed.length} failed mail jobs`);
 *
 * await pauseQueue(app.sql, "mail"); // workers stop claiming from it
 * const { requeued } = await requeueJobs(app.sql, { task: "mail.send", state: "failed" });
 * await resumeQueue(app.sql, "mail");
 * console.log(`requeued ${requeued}`);
 * await app.close();
 * ```
 *
 * @module
 */

// Where the functions read and write.
export type { AdminOptions, Database, Session } from "./src/admin/database.ts";

// The schema.
export {
  migrate,
  type MigrateOptions,
  type MigrateRetry,
  migrationSql,
  type MigrationSqlOptions,
  type MigrationStatus,
  migrationStatus,
} from "./src/migrate.ts";
export { MigrateError } from "./src/errors.ts";

// Jobs.
export {
  type BulkOptions,
  cancelJobs,
  type FlowStepSummary,
  getJob,
  type GetJobOptions,
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
export { pruneJobs, type PruneJobsOptions } from "./src/admin/prune.ts";
export {
  ACTIVE_STATES,
  attemptNumber,
  JOB_STATE_KINDS,
  JOB_STATES,
  TERMINAL_STATES,
} from "./src/job.ts";

// Queues.
export {
  listQueues,
  pauseQueue,
  queueKnown,
  type QueueSnapshot,
  queueSnapshot,
  type QueueSummary,
  resumeQueue,
} from "./src/admin/queues.ts";

// Limits.
export {
  clearLimit,
  type LimitOptions,
  type LimitSummary,
  listLimits,
  setLimit,
} from "./src/admin/limits.ts";

// Workers.
export { listWorkers, type WorkerSummary } from "./src/admin/workers.ts";
