/**
 * The job context: the second argument of every handler, and `current()` anywhere inside
 * a run (AsyncLocalStorage).
 *
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";
import type { TransactionSql } from "./db.ts";
import { AkadzeError } from "./errors.ts";
import type { JobInfo } from "./job.ts";

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
