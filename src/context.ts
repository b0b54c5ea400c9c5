/**
 * The job context: the second argument of every handler, and `current()` anywhere inside
 * a run (AsyncLocalStorage).
 *
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";
import type { TransactionSql } from "./db.ts";
import { AkadzeError } from "./errors.ts";
import type { JobInfo, JobState } from "./job.ts";
import type { FlowStep, OnDependencyFailure } from "./flow.ts";

/** What a running job can see and do. */
export interface JobContext {
  /** The job being run. */
  readonly job: JobInfo;
  /** Aborted on timeout, on a cancel request, and at the shutdown deadline. */
  readonly signal: AbortSignal;
  /** When the timeout fires, or null without a timeout. */
  readonly deadline: Date | null;
  /** Milliseconds left before the timeout (never negative), or null without one. */
  remaining(): number | null;
  /**
   * Run `fn` and the transition to `succeeded` in one transaction. Throws (rolling back
   * `fn`'s writes) if this run no longer owns the job, or it was cancelled or expired.
   * After it commits the handler's return value is ignored.
   */
  completeTx<T>(fn: (tx: TransactionSql) => Promise<T>): Promise<T>;
  /**
   * Report how far the run is: a finite number (a percentage, a count) or small JSON (at
   * most 4 KiB), stored on the job for `getJob`, `akadze jobs show` and `app.waitForJob`'s
   * `onProgress`. Writes are throttled (at most one a second; the latest value wins) and
   * the last value is written before the outcome. A value that cannot be stored throws an
   * `AkadzeError`; a failed write is logged and the run goes on.
   */
  progress(value: unknown): void;
  /**
   * The outcomes of the jobs this one depends on (see `app.enqueueFlow`), keyed by step
   * name (a job outside this job's flow by its id): state, result and last error. Read from
   * the database on each call.
   */
  dependencies(): Promise<
    Record<string, {
      /** Its job id. */
      readonly id: string;
      /** Its step name in the flow, or null for a job outside it. */
      readonly step: string | null;
      /** Its task. */
      readonly task: string;
      /**
       * Its state: `succeeded`, `failed` or `cancelled` (a step that ignores failures, or
       * continues after one, sees them; with `continue` the others may still be unfinished).
       */
      readonly state: JobState;
      /** Its result (null unless it succeeded). */
      readonly result: unknown;
      /** Its last error (name and message), or null. */
      readonly error: { readonly error: string; readonly message: string } | null;
    }>
  >;
  /**
   * The result of the dependency that ran `task`, typed as that task's handler returns it
   * (`step` names it when several dependencies ran the task). Throws an `AkadzeError` when
   * there is no such dependency or it did not succeed.
   */
  resultOf<R>(
    task: { readonly name: string; readonly handler: (...args: never[]) => R },
    step?: string,
  ): Promise<Awaited<R>>;
  /**
   * Add child jobs to this one and end the run waiting for them, without holding a slot:
   * the children (steps of a flow, which may depend on each other) are inserted in the
   * transaction that moves this job to `waiting`. When they have finished, the job runs
   * again (no attempt spent) and reads their outcomes with `dependencies()`. By default a
   * failed child cancels this job; `onFailure: "ignore"` runs it anyway, to see the failure.
   * Like `completeTx`, it throws if this run no longer owns the job, and after it commits
   * the handler's return value is ignored: return right after it. Returns the children's
   * job ids by step name.
   */
  waitForChildren(
    steps: Record<string, FlowStep>,
    options?: { onFailure?: OnDependencyFailure },
  ): Promise<Record<string, string>>;
}

// Shared through the global registry, so current() works when the application imports
// another copy of akadze than the worker that runs it.
const STORAGE = Symbol.for("akadze.context");
const storage: AsyncLocalStorage<JobContext> =
  ((globalThis as Record<symbol, unknown>)[STORAGE] as AsyncLocalStorage<JobContext>) ??
    ((globalThis as Record<symbol, unknown>)[STORAGE] = new AsyncLocalStorage<JobContext>());

/**
 * The context of the job running in this async call chain.
 *
 * @example
 * ```ts ignore
 * import { current } from "@akadze/akadze";
 * console.log(`attempt ${current().job.attempt}`); // 1 on the first run
 * ```
 */
export function current(): JobContext {
  const ctx = storage.getStore();
  if (!ctx) throw new AkadzeError("current() is only valid inside a running job");
  return ctx;
}

/** The context of the job running in this async call chain, or undefined outside a run. */
export function activeContext(): JobContext | undefined {
  return storage.getStore();
}

/** Run `fn` with `ctx` as {@linkcode current}'s answer (the worker's executor uses it). */
export function runWithContext<T>(ctx: JobContext, fn: () => T): T {
  return storage.run(ctx, fn);
}
