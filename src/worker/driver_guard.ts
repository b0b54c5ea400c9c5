/**
 * Survive postgres.js's known hazards: terminating a backend while a transaction is open
 * can throw an uncaught `TypeError (reading 'write')` from inside the driver, connection
 * errors can surface as unhandled rejections, and once a killed connection's socket has
 * been let go, the runtime's socket code can reject on its own (`read ECONNRESET`, with no
 * frame outside the runtime). The worker treats those like any transient database error
 * instead of dying.
 *
 * @module
 */

/** Socket error codes a killed or reset connection produces. */
const SOCKET_CODES = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED", "ETIMEDOUT"]);

/**
 * Whether an uncaught error comes from inside the postgres.js driver's connection code, or
 * is a stray socket error ({@linkcode isStraySocketError}).
 */
export function isDriverError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  return /postgres[\\/]src[\\/](connection|index|query)\.js/.test(error.stack ?? "") ||
    isStraySocketError(error);
}

/**
 * Whether an error is a socket error raised by the runtime alone: a killed or reset
 * connection's code, and every stack frame in Deno's or Node's own code, so no application
 * code is waiting for it.
 */
export function isStraySocketError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code !== "string" || !SOCKET_CODES.has(code)) return false;
  const frames = (error.stack ?? "").split("\n").filter((line) => /^\s+at /.test(line));
  return frames.length > 0 && frames.every((line) => /\((ext|node):|\bat (ext|node):/.test(line));
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
