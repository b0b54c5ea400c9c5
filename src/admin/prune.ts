/**
 * Deleting old finished jobs from code, with the statements the worker's pruner uses.
 *
 * @module
 */
import { explainMissingSchema, quoteSchema } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { countOldJobsStatement, pruneStatements } from "../old_jobs.ts";
import type { AdminOptions, Session } from "./database.ts";

/** Options of {@linkcode pruneJobs}. */
export interface PruneJobsOptions extends AdminOptions {
  /** Delete jobs finished more than this many milliseconds ago. Default 7 days. */
  olderThan?: number;
  /** Delete `failed` jobs too (by default only `succeeded` and `cancelled`). Default false. */
  includeFailed?: boolean;
  /** Count what would be deleted, delete nothing. Default false. */
  dryRun?: boolean;
  /** Rows per DELETE statement. Default 1000. */
  batchSize?: number;
}

/**
 * Delete terminal jobs finished more than `olderThan` ago: `succeeded` and `cancelled`
 * ones, and `failed` ones only with `includeFailed` (they are what `requeue` needs). A flow
 * is deleted as a whole, once every job of it can be; a job that a waiting, queued or
 * running job depends on is kept. Runs
 * bounded DELETE statements of `batchSize` rows until none are left (each its own
 * transaction on a pool, or all in the caller's transaction when `session` is one), and
 * skips rows another session holds locked (e.g. a worker's pruner). Returns how many jobs
 * it deleted, or with `dryRun` how many it would delete. The worker already prunes with
 * the app's `retention`; this is for one-off cleanups and for keeping failed jobs shorter
 * or longer than that.
 *
 * @example
 * ```ts ignore
 * import { pruneJobs } from "@akadze/akadze/admin";
 * const deleted = await pruneJobs(app.sql, { olderThan: 86_400_000, includeFailed: true });
 * console.log(`deleted ${deleted} jobs`);
 * ```
 */
export async function pruneJobs(
  session: Session,
  options: PruneJobsOptions = {},
): Promise<number> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const olderThan = options.olderThan ?? 7 * 86_400_000;
  if (typeof olderThan !== "number" || !Number.isFinite(olderThan) || olderThan < 0) {
    throw new AkadzeError(
      `olderThan must be a non-negative number of milliseconds, got ${olderThan}`,
    );
  }
  const batchSize = options.batchSize ?? 1000;
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) {
    throw new AkadzeError(`batchSize must be an integer from 1 to 100000, got ${batchSize}`);
  }
  for (const name of ["includeFailed", "dryRun"] as const) {
    if (options[name] !== undefined && typeof options[name] !== "boolean") {
      throw new AkadzeError(`${name} must be a boolean, got ${options[name]}`);
    }
  }
  const includeFailed = options.includeFailed ?? false;
  return await explainMissingSchema(schema, async () => {
    if (options.dryRun) {
      const [row] = await session.unsafe(countOldJobsStatement(s, includeFailed), [olderThan]);
      return Number(row.n);
    }
    const { plain, linked } = pruneStatements(s, includeFailed);
    let total = 0;
    for (;;) {
      const { count } = await session.unsafe(plain, [olderThan, batchSize]);
      total += count;
      if (count < batchSize) break;
    }
    for (;;) {
      const [{ n }] = await session.unsafe(linked, [olderThan, batchSize]);
      total += n;
      if (n < batchSize) return total;
    }
  });
}
