/**
 * SIGINT and SIGTERM for long-running commands: the first starts a graceful stop, a
 * second one exits at once with 130. The supervisor of `--processes N` counts its
 * signals itself with {@linkcode countSignals}.
 *
 * @module
 */

/** The exit code of a stop forced by a second signal. */
export const FORCED_EXIT_CODE = 130;

/** Callbacks of {@linkcode handleStopSignals}. */
export interface StopSignalHandlers {
  /** The first signal: start a graceful stop. */
  onFirst(signal: Deno.Signal): void;
  /** The second signal, just before the process exits with 130. */
  onForce?(signal: Deno.Signal): void;
}

/**
 * Listen for SIGINT and SIGTERM (SIGTERM only where the platform has it). Returns a
 * function that removes the listeners.
 */
export function handleStopSignals(handlers: StopSignalHandlers): () => void {
  return countSignals(["SIGINT", "SIGTERM"], (signal, count) => {
    if (count === 1) return handlers.onFirst(signal);
    handlers.onForce?.(signal);
    Deno.exit(FORCED_EXIT_CODE);
  });
}

/**
 * Listen for `signals` (those the platform cannot listen for are skipped) and call
 * `onSignal` with each one and how many of them have arrived so far, 1 for the first.
 * Returns a function that removes the listeners.
 */
export function countSignals(
  signals: readonly Deno.Signal[],
  onSignal: (signal: Deno.Signal, count: number) => void,
): () => void {
  let received = 0;
  const installed: [Deno.Signal, () => void][] = [];
  for (const signal of signals) {
    const listener = () => onSignal(signal, ++received);
    try {
      Deno.addSignalListener(signal, listener);
      installed.push([signal, listener]);
    } catch {
      // Windows has no SIGTERM (or SIGHUP) listener.
    }
  }
  return () => {
    for (const [signal, listener] of installed) Deno.removeSignalListener(signal, listener);
  };
}

/**
 * Wait for `step` unless a stop comes first: resolves with `true` when `step` finished
 * (rethrowing its error), `false` when `signal` aborted before it did (the step goes on
 * unwaited; its error is then nobody's). A start-up check against a database that never
 * answers must not hold up a stop.
 */
export async function unlessStopped(step: Promise<unknown>, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) {
    step.catch(() => {});
    return false;
  }
  let onAbort = () => {};
  const aborted = new Promise<false>((resolve) => {
    onAbort = () => resolve(false);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  step.catch(() => {});
  try {
    return await Promise.race([step.then(() => true as const), aborted]);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}
