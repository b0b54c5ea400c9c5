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
