/**
 * akadze: a PostgreSQL-backed task queue for Deno. Enqueue jobs inside your own
 * transaction, run them in a worker with retries and a heartbeat lease, and run cron and
 * interval schedules in that same worker. PostgreSQL is the only broker.
 *
 * This entry point is what an application uses:
 *
 * - {@linkcode Akadze}: the app (connection, tasks, schedules, hooks); `app.task(...)`
 *   registers a {@linkcode Task}, `task.using({ session: tx }).enqueue(args)` enqueues in
 *   your transaction, `app.waitForJob(id, ...)` awaits a job's result.
 * - {@linkcode Worker}: claims and runs jobs (`akadze worker ./app.ts` from the CLI).
 * - `Retry`, `Snooze`, `Fail`, `Cancel`: what a handler throws to steer its job;
 *   {@linkcode current} gives the running job's context anywhere inside the run.
 * - The errors akadze throws, all {@linkcode AkadzeError}s.
 *
 * Also: `@akadze/akadze/admin` (create or update the schema with `migrate`; list, requeue,
 * cancel and prune jobs; pause queues; set limits; list workers),
 * `@akadze/akadze/testing` (a throwaway database, `drain`, `assertEnqueued`),
 * `@akadze/akadze/metrics` (Prometheus text) and `@akadze/akadze/cli` (the `akadze`
 * command).
 *
 * @example A whole round trip: save as `hello.ts`, run with
 * `AKADZE_DATABASE_URL=postgres://... deno run -A hello.ts`
 * ```ts
 * import { Akadze, Worker } from "@akadze/akadze";
 * import { migrate } from "@akadze/akadze/admin";
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

// The app and its connection.
export { Akadze, type AkadzeOptions } from "./src/app.ts";
export { connect, isTransientError, type Sql, type TransactionSql } from "./src/db.ts";

// Tasks and enqueue.
export {
  chain,
  chord,
  type EnqueuedFlow,
  type FlowStep,
  group,
  type OnDependencyFailure,
} from "./src/flow.ts";
export {
  type ArgsInput,
  type ArgsOutput,
  type Backoff,
  type BoundTask,
  Task,
  type TaskHandler,
  type TaskOptions,
} from "./src/task.ts";
export type { EnqueueOptions } from "./src/enqueue.ts";
export type { NodePostgresClient } from "./src/node_postgres.ts";
export type { StandardSchemaV1 } from "./src/standard_schema.ts";

// Awaiting a job's result.
export type { WaitOptions } from "./src/wait.ts";
export type { JobDetail } from "./src/admin/jobs.ts";

// Schedules.
export { Schedule, type ScheduleSpec } from "./src/schedule.ts";

// The running job: its context, the hooks, and the outcomes a handler throws.
export { current, type JobContext } from "./src/context.ts";
export type { SandboxContext, SandboxHandler, SandboxSpec } from "./src/sandbox.ts";
export type { DeadLetter } from "./src/dead_letter.ts";
export type { EnqueuedJob, Hooks, JobInfo, JobState } from "./src/job.ts";
export { Cancel, Fail, Retry, Snooze } from "./src/errors.ts";

// Errors.
export {
  AkadzeError,
  DuplicateJob,
  EnqueueError,
  JobNotFound,
  JobWaitTimeout,
} from "./src/errors.ts";

// The worker.
export { Worker, type WorkerExit } from "./src/worker/worker.ts";
export type { WorkerConfig, WorkerOptions } from "./src/worker/config.ts";
