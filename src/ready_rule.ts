/**
 * The ready rule: which jobs are ready to run. The claims take only ready jobs (with their
 * own order and limits, worker/claim_rule.ts) and the readers count them (queue lag and
 * ready counts, admin/queues.ts), so both use this one definition. The `claim_one` and
 * `claim_one_floor` functions (migrations 0001 and 0004) repeat it in SQL;
 * tests/job_columns_test.ts checks that every predicate below stands in them.
 *
 * @module
 */

/**
 * The conditions of a ready job (alias `c`), one predicate each: queued, its run_at passed,
 * no cancel request, not expired; and in queue `queue` (SQL) when given. A reader that
 * groups by queue gives none. Pauses are checked per queue by the claims, not per row: a
 * per-row subplan raises the plan's cost estimate past PostgreSQL's jit_above_cost, and JIT
 * compiling every claim costs ~45 ms.
 */
export function readyPredicates(queue?: string): string[] {
  return [
    "c.state operator(pg_catalog.=) 'queued'",
    ...(queue === undefined ? [] : [`c.queue operator(pg_catalog.=) ${queue}`]),
    "c.run_at operator(pg_catalog.<=) pg_catalog.now()",
    "c.cancel_requested_at is null",
    "(c.expires_at is null or c.expires_at operator(pg_catalog.>) pg_catalog.now())",
  ];
}

/** {@linkcode readyPredicates} as one condition. */
export function readyCondition(queue?: string): string {
  return readyPredicates(queue).join(" and ");
}
