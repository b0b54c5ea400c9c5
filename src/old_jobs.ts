/**
 * Old jobs: the condition of a terminal job finished longer ago than a retention, and the
 * bounded DELETE of such jobs. `pruneJobs` and the worker's pruner both delete through it.
 *
 * @module
 */
import { stateList, TERMINAL_STATES } from "./job.ts";

/**
 * The condition of a job that finished more than $1 milliseconds ago, `succeeded` or
 * `cancelled` (or `failed`, with `includeFailed`): the terminal states. They are literals, so the
 * planner can prove that the partial index on `finished_at` applies.
 */
export function oldJobsCondition(includeFailed: boolean): string {
  const states = stateList(TERMINAL_STATES.filter((state) => includeFailed || state !== "failed"));
  return `state in (${states}) and finished_at < now() - $1::float8 * interval '1 millisecond'`;
}

/**
 * Delete up to $2 jobs of {@linkcode oldJobsCondition} from schema `s` (quoted), skipping
 * rows another session holds locked. The worker's pruner and `pruneJobs` both use it.
 */
export function deleteOldJobsStatement(s: string, includeFailed: boolean): string {
  return `delete from ${s}.jobs where id in (
      select id from ${s}.jobs where ${oldJobsCondition(includeFailed)}
       limit $2 for update skip locked)`;
}

/** Count the jobs of {@linkcode oldJobsCondition} in schema `s` (quoted), as `n`. */
export function countOldJobsStatement(s: string, includeFailed: boolean): string {
  return `select count(*)::float8 as n from ${s}.jobs where ${oldJobsCondition(includeFailed)}`;
}
