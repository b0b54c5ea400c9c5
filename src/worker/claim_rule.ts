/**
 * The claim's rule, shared by every claim path of claimer.ts: of the ready jobs
 * (ready_rule.ts), which the plain claim may take, the order they are claimed in, what the
 * claim writes to a claimed job and what it returns (from job_columns.ts). The `claim_one`
 * and `claim_one_floor` functions (migrations 0001 and 0004), and the hand-off of the outcome
 * write (`complete_jobs`, migrations 0016 and 0019), repeat it in SQL, so that their plans are
 * kept per connection; tests/job_columns_test.ts reads their bodies from the database and
 * checks each part below stands in them.
 *
 * @module
 */
import { selectList } from "../job_columns.ts";

/**
 * The condition of a job (alias `c`) that the plain claim may take: no limit key, or one
 * without a `limits` row (those are the limited claim's), in schema `s` (quoted).
 */
export function noLimitPredicate(s: string): string {
  return `(c.limit_key is null or not exists (select 1 from ${s}.limits l where l.key
    operator(pg_catalog.=) c.limit_key))`;
}

/** The claim order on alias `alias`: higher priority first, then earlier run_at, then id. */
export function claimOrder(alias: string): string {
  return `${alias}.priority desc, ${alias}.run_at, ${alias}.id`;
}

/** What a claim writes to a claimed job (alias `j`) for worker `workerId` (SQL). */
export function claimSet(workerId: string): string {
  return `state = 'running', run_count = j.run_count operator(pg_catalog.+) 1, worker_id =
    ${workerId},
    started_at = pg_catalog.now()`;
}

/**
 * What a claim returns, on alias `alias`, each value named after its column (read by name,
 * see `decodeClaimed`). The claim functions return the same values (`claimValues`) under the
 * same names.
 */
export function claimReturning(alias = "j"): string {
  return selectList("claim", alias);
}
