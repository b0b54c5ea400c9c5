/**
 * SIGINT and SIGTERM for long-running commands: the first starts a graceful stop, a
 * second one exits at once with 130.
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
  let received = 0;
  const installed: [Deno.Signal, () => void][] = [];
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    const listener = () => {
      if (++received === 1) return handlers.onFirst(signal);
      handlers.onForce?.(signal);
      Deno.exit(FORCED_EXIT_CODE);
    };
    try {
      Deno.addSignalListener(signal, listener);
      installed.push([signal, listener]);
    } catch {
      // Windows has no SIGTERM listener.
    }
  }
  return () => {
    for (const [signal, listener] of installed) Deno.removeSignalListener(signal, listener);
  };
}
