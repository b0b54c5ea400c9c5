/**
 * The shapes of a job as the application sees it, and the hook signatures.
 *
 * @module
 */
import type { TransactionSql } from "./db.ts";

/**
 * Every state of a job, in lifecycle order, and its kind (`waiting`: for its dependencies to
 * finish, see `app.enqueueFlow`): an active job holds its uniqueKey
 * and can still run or be cancelled; a terminal one has finished (`finished_at` is set) and is
 * left to retention. A new state is one line here (the type, the lists below, the admin and
 * CLI filters and the metrics follow), plus a migration that widens `jobs_state_check` and
 * the partial indexes on active or terminal states (tests/job_columns_test.ts compares them).
 *
 * @example
 * ```ts
 * import { JOB_STATE_KINDS } from "@akadze/akadze/admin";
 * console.log(JOB_STATE_KINDS.failed); // "terminal"
 * ```
 */
export const JOB_STATE_KINDS = {
  waiting: "active",
  queued: "active",
  running: "active",
  succeeded: "terminal",
  failed: "terminal",
  cancelled: "terminal",
} as const satisfies Record<string, "active" | "terminal">;

/** The states of a job (see {@linkcode JOB_STATE_KINDS}). */
export type JobState = keyof typeof JOB_STATE_KINDS;

/** Every job state, in lifecycle order. */
export const JOB_STATES: readonly JobState[] = Object.keys(JOB_STATE_KINDS) as JobState[];
/** The states in which a job is still active (holds its uniqueKey). */
export const ACTIVE_STATES: readonly JobState[] = JOB_STATES.filter((state) =>
  JOB_STATE_KINDS[state] === "active"
);
/** The terminal states. */
export const TERMINAL_STATES: readonly JobState[] = JOB_STATES.filter((state) =>
  JOB_STATE_KINDS[state] === "terminal"
);

/**
 * `states` as an SQL list of literals for `state in (...)`, e.g. `'queued', 'running'`: the
 * statements that name a kind of state take it from the lists above.
 */
export function stateList(states: readonly JobState[]): string {
  return states.map((state) => `'${state}'`).join(", ");
}

/** A job as seen by hooks and handlers (never its arguments' or result's history). */
export interface JobInfo {
  /** The job id, a decimal string (bigint in the database). */
  readonly id: string;
  /** The task name. */
  readonly task: string;
  /** The queue. */
  readonly queue: string;
  /** Higher runs first. */
  readonly priority: number;
  /** Attempts spent before this run. */
  readonly attempt: number;
  /** Claims so far, including this run's (the fencing token). */
  readonly runCount: number;
  /** The attempt budget. */
  readonly maxAttempts: number;
  /** How many times the job snoozed. */
  readonly snoozes: number;
  /** When the job became (or becomes) ready. */
  readonly runAt: Date;
  /** After this instant the job is cancelled instead of run. */
  readonly expiresAt: Date | null;
  /** The active-uniqueness key. */
  readonly uniqueKey: string | null;
  /** The limit key. */
  readonly limitKey: string | null;
  /** When it was enqueued. */
  readonly createdAt: Date;
  /** When the current (or last) run started. */
  readonly startedAt: Date | null;
  /** The worker running it. */
  readonly workerId: string | null;
}

/** A job just inserted by an enqueue, as given to `onEnqueue` hooks. */
export interface EnqueuedJob {
  /** The job id. */
  readonly id: string;
  /** The task name. */
  readonly task: string;
  /** The queue. */
  readonly queue: string;
  /** Priority. */
  readonly priority: number;
  /** Attempt budget. */
  readonly maxAttempts: number;
  /** When it becomes ready. */
  readonly runAt: Date;
  /** Expiry, if any. */
  readonly expiresAt: Date | null;
  /** Unique key, if any. */
  readonly uniqueKey: string | null;
  /** Limit key, if any. */
  readonly limitKey: string | null;
  /** The stored arguments. */
  readonly args: Record<string, unknown>;
}

/** The hook arrays of an app; push functions onto them. */
export interface Hooks {
  /** `onEnqueue(tx, job)`: runs in the enqueue's transaction; an error undoes that enqueue. */
  readonly onEnqueue: ((tx: TransactionSql, job: EnqueuedJob) => unknown)[];
  /** `beforeRun(job)`: runs inside the timeout before the handler; an error fails the run. */
  readonly beforeRun: ((job: JobInfo) => unknown)[];
  /** `afterRun(job, result)`: runs inside the timeout after the handler returned. */
  readonly afterRun: ((job: JobInfo, result: unknown) => unknown)[];
  /**
   * `onTransition(tx, job, from, to)`: runs in the transaction that makes the state change;
   * an error rolls back that transition only.
   */
  readonly onTransition:
    ((tx: TransactionSql, job: JobInfo, from: JobState, to: JobState) => unknown)[];
}

/** One `onEnqueue` hook (see {@linkcode Hooks}). */
export type OnEnqueueHook = Hooks["onEnqueue"][number];
/** One `beforeRun` hook (see {@linkcode Hooks}). */
export type BeforeRunHook = Hooks["beforeRun"][number];
/** One `afterRun` hook (see {@linkcode Hooks}). */
export type AfterRunHook = Hooks["afterRun"][number];
/** One `onTransition` hook (see {@linkcode Hooks}). */
export type OnTransitionHook = Hooks["onTransition"][number];
