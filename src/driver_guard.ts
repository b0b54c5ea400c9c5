/**
 * Survive postgres.js's known hazards: terminating a backend while a transaction is open
 * can throw an uncaught `TypeError (reading 'write')` from inside the driver, connection
 * errors can surface as unhandled rejections, and once a killed connection's socket has
 * been let go, the runtime's socket code can reject on its own (`read ECONNRESET`, with no
 * frame outside the runtime). The worker treats those like any transient database error
 * instead of dying. And the driver's own first statement on each new connection (it fetches
 * the array types) is awaited by nobody: when that connection is lost meanwhile, its error is
 * an unhandled rejection. Every pool akadze makes absorbs that rejection, and the write on a
 * connection the driver has let go, for the whole process ({@linkcode guardPools}).
 *
 * @module
 */

import { logger } from "./log.ts";

const log = logger("db");

/** What to look for when connections keep breaking (the end of the logs that report it). */
export const CONNECTIONS_END_HINT: string =
  "If this repeats, look for what ends connections: server restarts or failovers, terminated " +
  "sessions, idle_in_transaction_session_timeout, a proxy's or firewall's idle timeout";

/** Socket error codes a killed or reset connection produces. */
const SOCKET_CODES = new Set(["ECONNRESET", "EPIPE", "ECONNABORTED", "ETIMEDOUT"]);

/** The statement postgres.js runs first on each new connection, to learn the array types. */
const TYPE_FETCH = /^\s*select b\.oid, b\.typarray\s+from pg_catalog\.pg_type a\b/;

/**
 * Whether an uncaught error comes from inside the postgres.js driver's connection code, is
 * a stray socket error ({@linkcode isStraySocketError}) or the driver's failed type fetch
 * ({@linkcode isTypeFetchError}).
 */
export function isDriverError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  return /postgres[\\/]src[\\/](connection|index|query)\.js/.test(error.stack ?? "") ||
    isStraySocketError(error) || isTypeFetchError(error);
}

/**
 * Whether an error failed the driver's own array-type query, which nobody awaits: a new
 * connection lost while it ran (a database restarting, say). The query that asked for the
 * connection fails with the same error, so its caller still hears of it.
 */
export function isTypeFetchError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const query = (error as { query?: unknown }).query;
  return typeof query === "string" && TYPE_FETCH.test(query);
}

/**
 * Whether an uncaught error is postgres.js writing on a connection it has let go: when a
 * transaction's connection closes under it (its backend terminated, an idle-in-transaction
 * timeout, a failover), the driver sends the transaction's rollback on that connection and
 * throws `TypeError: Cannot read properties of null (reading 'write')` on a later turn, where
 * no caller can catch it. The transaction has failed already, with the connection's own error,
 * and the pool connects again for the next statement.
 */
export function isClosedConnectionWrite(error: unknown): boolean {
  if (!(error instanceof TypeError) || !error.message.includes("(reading 'write')")) return false;
  const frame = (error.stack ?? "").split("\n").find((line) => /^\s+at /.test(line)) ?? "";
  return /postgres[\\/]src[\\/]connection\.js/.test(frame);
}

let poolsGuarded = false;

/**
 * Absorb, for the rest of the process, the driver's errors that no caller can catch and that
 * would otherwise end it: the unhandled rejection of a failed type fetch
 * ({@linkcode isTypeFetchError}) and the write on a connection it has let go
 * ({@linkcode isClosedConnectionWrite}). Installed once, by every pool akadze makes or
 * adopts, so that an application that only enqueues survives them as a worker does; other
 * errors are left alone.
 */
export function guardPools(): void {
  if (poolsGuarded) return;
  poolsGuarded = true;
  globalThis.addEventListener("unhandledrejection", (event: PromiseRejectionEvent) => {
    if (isTypeFetchError(event.reason)) event.preventDefault();
  });
  globalThis.addEventListener("error", (event: ErrorEvent) => {
    if (event.defaultPrevented || !isClosedConnectionWrite(event.error)) return;
    event.preventDefault();
    // The driver's own words say nothing a user can act on.
    log.warn(
      "a statement was sent on a database connection that had just closed (the rollback of a " +
        "transaction whose session ended); the process goes on and the connection is reopened " +
        `for the next statement. ${CONNECTIONS_END_HINT}`,
      { event: "db_error_transient", message: (event.error as Error).message },
    );
  });
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
 * Swallow uncaught driver errors while installed (reporting each to `onError`; one another
 * listener prevented already is left alone); returns the function that uninstalls the guard.
 */
export function installDriverGuard(onError: (error: unknown) => void): () => void {
  const onUncaught = (event: ErrorEvent) => {
    if (!event.defaultPrevented && isDriverError(event.error)) {
      event.preventDefault();
      onError(event.error);
    }
  };
  const onRejection = (event: PromiseRejectionEvent) => {
    if (!event.defaultPrevented && isDriverError(event.reason)) {
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
