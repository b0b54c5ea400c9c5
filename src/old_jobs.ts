/**
 * Old jobs: the condition of a terminal job finished longer ago than a retention, and the
 * bounded statements that delete such jobs. `pruneJobs` and the worker's pruner both delete
 * through them: the plain statement takes the jobs outside flows that no job depends on
 * (planned as before flows: they pay nothing for them), the linked one the rest, a flow as
 * a whole and never a job that a live job still needs (`prune_linked_jobs`,
 * migrations/0011_flow_ops.sql).
 *
 * @module
 */
import { ACTIVE_STATES, stateList, TERMINAL_STATES } from "./job.ts";

/** The terminal states a prune deletes: `failed` only with `includeFailed`. */
function prunedStates(includeFailed: boolean): string {
  return stateList(TERMINAL_STATES.filter((state) => includeFailed || state !== "failed"));
}

/**
 * The condition of a job (on alias `alias`, or unqualified) that finished more than $1
 * milliseconds ago, `succeeded` or `cancelled` (or `failed`, with `includeFailed`): the
 * terminal states. They are literals, so the planner can prove that the partial index on
 * `finished_at` applies.
 */
export function oldJobsCondition(includeFailed: boolean, alias?: string): string {
  const a = alias === undefined ? "" : `${alias}.`;
  return `${a}state operator(pg_catalog.=) any (array[${prunedStates(includeFailed)}]) and ` +
    `${a}finished_at operator(pg_catalog.<) (pg_catalog.now() operator(pg_catalog.-)
      ($1::pg_catalog.float8 operator(pg_catalog.*) interval '1 millisecond'))`;
}

/** The condition of a job outside flows that no job depends on (on alias `alias`). */
function unlinked(alias?: string): string {
  const a = alias === undefined ? "" : `${alias}.`;
  return `${a}flow_id is null and not ${a}has_dependents`;
}

/** The statements of a prune, each run with $1 the retention (ms) and $2 the batch size. */
export interface PruneStatements {
  /**
   * Delete up to $2 jobs of {@linkcode oldJobsCondition} outside flows that no job depends
   * on, skipping rows another session holds locked (its row count is the number deleted).
   */
  plain: string;
  /**
   * Delete up to about $2 (a whole flow may take it past) old jobs in flows or that jobs
   * depend on, flows as a whole; returns the number deleted as `n`.
   */
  linked: string;
}

/** The statements that delete old jobs from schema `s` (quoted). */
export function pruneStatements(s: string, includeFailed: boolean): PruneStatements {
  return {
    plain: `delete from ${s}.jobs where id operator(pg_catalog.=) any (
      select id from ${s}.jobs where ${oldJobsCondition(includeFailed)} and ${unlinked()}
       limit $2 for update skip locked)`,
    linked: `select ${s}.prune_linked_jobs($1::pg_catalog.float8, $2::integer,
      array[${prunedStates(includeFailed)}]::pg_catalog.text[]) as n`,
  };
}

/**
 * Count, as `n`, the jobs of schema `s` (quoted) that the statements of
 * {@linkcode pruneStatements} would delete (ignoring locks).
 */
export function countOldJobsStatement(s: string, includeFailed: boolean): string {
  const live = (dependency: string) =>
    `exists (select 1 from ${s}.job_dependencies d join ${s}.jobs w on w.id
      operator(pg_catalog.=) d.job_id
              where d.depends_on operator(pg_catalog.=) ${dependency} and w.state
                operator(pg_catalog.=) any (array[${stateList(ACTIVE_STATES)}]))`;
  return `select
    (select pg_catalog.count(*) from ${s}.jobs where ${
    oldJobsCondition(includeFailed)
  } and ${unlinked()})
    operator(pg_catalog.+) (select pg_catalog.count(*) from ${s}.jobs j
        where ${oldJobsCondition(includeFailed, "j")} and j.flow_id is null and j.has_dependents
          and not ${live("j.id")})
    operator(pg_catalog.+) (select pg_catalog.count(*) from ${s}.jobs x where x.flow_id
      operator(pg_catalog.=) any (
        select r.id from ${s}.jobs r
         where ${oldJobsCondition(includeFailed, "r")} and r.flow_id operator(pg_catalog.=) r.id
           and not exists (select 1 from ${s}.jobs y where y.flow_id operator(pg_catalog.=) r.id
                            and (${oldJobsCondition(includeFailed, "y")}) is not true)
           and not exists (select 1 from ${s}.jobs y where y.flow_id operator(pg_catalog.=) r.id
                            and y.has_dependents and ${live("y.id")})))
    ::pg_catalog.float8 as n`;
}
