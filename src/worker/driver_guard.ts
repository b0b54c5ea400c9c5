/**
 * Survive postgres.js's known hazard: terminating a backend while a transaction is open
 * can throw an uncaught `TypeError (reading 'write')` from inside the driver (and
 * connection errors can surface as unhandled rejections). The worker treats those like
 * any transient database error instead of dying.
 *
 * @module
 */

/** Whether an uncaught error comes from inside the postgres.js driver's connection code. */
export function isDriverError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  return /postgres[\\/]src[\\/](connection|index|query)\.js/.test(error.stack ?? "");
}

/**
 * Swallow uncaught driver errors while installed (reporting each to `onError`); returns
 * the function that uninstalls the guard.
 */
export function installDriverGuard(onError: (error: unknown) => void): () => void {
  const onUncaught = (event: ErrorEvent) => {
    if (isDriverError(event.error)) {
      event.preventDefault();
      onError(event.error);
    }
  };
  const onRejection = (event: PromiseRejectionEvent) => {
    if (isDriverError(event.reason)) {
      event.preventDefault();
      onError(event.reason);
    }
  };
  globalThis.addEventListener("error", onUncaught);
  globalThis.addEventListener("unhandledrejection", onRejection);
  return () => {
    globalThis.removeEventListener("error", onUncaught);
    globalThis.removeEventListener("unhandledrejection", onRejection);
  };
}
