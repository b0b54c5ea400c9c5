/**
 * The job columns the worker reads back from its statements, and their mapping to
 * {@linkcode JobInfo}. Shared by every service that changes a job's state.
 *
 * @module
 */
import type { Sql, TransactionSql } from "../db.ts";
import { attemptNumber, type JobInfo, type JobState, type OnTransitionHook } from "../job.ts";
import { type FieldsOf, type RowOf, type Same, selectList } from "../job_columns.ts";

/**
 * The RETURNING list of every state-changing statement (table alias `j`): the `row` read of
 * job_columns.ts.
 */
export const JOB_RETURNING: string = selectList("row");

/** A row of {@linkcode JOB_RETURNING}. */
export type JobRow = RowOf<"row">;

/**
 * The application's view of a job row: the `info` read of job_columns.ts, written out (an
 * object literal of one shape is cheaper than a loop over the columns, once per job run).
 */
export function toJobInfo(row: JobRow): JobInfo {
  return {
    id: row.id,
    task: row.task,
    queue: row.queue,
    priority: row.priority,
    attempt: attemptNumber(row.attempt, row.state),
    runCount: row.run_count,
    maxAttempts: row.max_attempts,
    snoozes: row.snoozes,
    runAt: row.run_at,
    expiresAt: row.expires_at,
    uniqueKey: row.unique_key,
    limitKey: row.limit_key,
    createdAt: row.created_at,
    startedAt: row.started_at,
    workerId: row.worker_id,
  };
}

/** `JobInfo` has the fields of the `info` read (a compile error otherwise). */
const _infoMatches: Same<JobInfo, FieldsOf<"info">> = true;

/** A transition statement over a subset of its work (one item in per-job mode). */
export type TransitionStatement<T> = (
  tx: Sql | TransactionSql,
  items: readonly T[],
) => Promise<JobRow[]>;

/** The outcome of {@linkcode applyTransitions}. */
export interface TransitionResult<T> {
  /** Rows that changed state. */
  rows: JobRow[];
  /** Items whose transition was rolled back by an `onTransition` hook error. */
  rolledBack: { item: T; error: unknown }[];
}

/**
 * Apply a batch transition. Without `onTransition` hooks: one statement for all items.
 * With hooks: each item in its own transaction, the hooks running in it, so a hook error
 * rolls back that item's transition only.
 */
export async function applyTransitions<T>(
  sql: Sql,
  hooks: readonly OnTransitionHook[],
  items: readonly T[],
  from: (item: T) => JobState,
  statement: TransitionStatement<T>,
): Promise<TransitionResult<T>> {
  if (items.length === 0) return { rows: [], rolledBack: [] };
  if (hooks.length === 0) return { rows: await statement(sql, items), rolledBack: [] };
  const result: TransitionResult<T> = { rows: [], rolledBack: [] };
  for (const item of items) {
    try {
      const rows = await sql.begin(async (tx) => {
        const changed = await statement(tx, [item]);
        for (const row of changed) await runTransitionHooks(hooks, tx, row, from(item));
        return changed;
      });
      result.rows.push(...(rows as JobRow[]));
    } catch (error) {
      if (!isHookError(error)) throw error;
      result.rolledBack.push({ item, error: error.cause });
    }
  }
  return result;
}

/**
 * Repeat a one-row transition from `queued` (a claim, a cancel) in its own transaction with
 * the hooks, up to `budget` rows or until it changes none; a row whose hook fails is
 * rolled back alone and excluded from the next tries.
 */
export async function transitionOneByOne<R extends JobRow>(
  sql: Sql,
  hooks: readonly OnTransitionHook[],
  budget: number,
  statement: (tx: TransactionSql, excluded: string[]) => Promise<R[]>,
): Promise<{ rows: R[]; rolledBack: number }> {
  const rows: R[] = [];
  const excluded: string[] = [];
  let rolledBack = 0;
  while (budget > 0) {
    let got: R[];
    try {
      got = await sql.begin(async (tx) => {
        const changed = await statement(tx, excluded);
        for (const row of changed) await runTransitionHooks(hooks, tx, row, "queued");
        return changed;
      }) as R[];
    } catch (error) {
      if (!(error instanceof TransitionHookError)) throw error;
      rolledBack++;
      budget--;
      excluded.push(error.jobId);
      continue;
    }
    if (got.length === 0) break;
    rows.push(...got);
    budget -= got.length;
  }
  return { rows, rolledBack };
}

/** An error thrown by an `onTransition` hook (its cause is the hook's error). */
export class TransitionHookError extends Error {
  /** The job whose transition was rolled back. */
  readonly jobId: string;
  /** Wrap a hook's error. */
  constructor(cause: unknown, jobId: string) {
    super("onTransition hook failed", { cause });
    this.name = "TransitionHookError";
    this.jobId = jobId;
  }
}

function isHookError(error: unknown): error is TransitionHookError {
  return error instanceof TransitionHookError;
}

/** Run every onTransition hook for one changed row, wrapping a failure. */
export async function runTransitionHooks(
  hooks: readonly OnTransitionHook[],
  tx: TransactionSql,
  row: JobRow,
  from: JobState,
): Promise<void> {
  const job = toJobInfo(row);
  for (const hook of hooks) {
    try {
      await hook(tx, job, from, row.state);
    } catch (error) {
      throw new TransitionHookError(error, row.id);
    }
  }
}
