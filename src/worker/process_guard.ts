/**
 * The process guard of a running worker: a promise rejection nothing handles, or an error
 * thrown where nothing can catch it (a task's stray timer callback, say), would otherwise
 * end the process and every job in it, and the runtime's report of it prints the error's
 * message and stack, where a task's arguments or a database URL can be. The guard keeps
 * the process running and reports each one without its text: the error's class, a code,
 * and the job it came from when that is known.
 *
 * @module
 */
import { activeContext } from "../context.ts";
import { isTransientError } from "../db.ts";
import { isDriverError } from "../driver_guard.ts";

/** An error that reached the process level, described without its message or stack. */
export interface Stray {
  /** A rejected promise nothing handled, or an error thrown where nothing could catch it. */
  kind: "unhandled_rejection" | "uncaught_error";
  /** The error's class name (`"Error"` when it has no plain one), or the thrown value's type. */
  error: string;
  /** The error's code, when it looks like one (`"ECONNRESET"`, a SQLSTATE). */
  code?: string;
  /** The job in whose run it was raised, when the runtime tells (not for timer callbacks). */
  job?: { id: string; task: string };
}

/** What the guard reports to. */
export interface ProcessGuardHandlers {
  /** The database driver's own known hazards (see driver_guard.ts): a transient error. */
  onDriverError(error: unknown): void;
  /** Anything else. */
  onStray(stray: Stray): void;
}

/**
 * Keep unhandled rejections and uncaught errors from ending the process while installed,
 * reporting each once (one already prevented by another listener is left alone); returns
 * the function that uninstalls the guard.
 */
export function installProcessGuard(handlers: ProcessGuardHandlers): () => void {
  const handle = (event: Event, error: unknown, kind: Stray["kind"]) => {
    if (event.defaultPrevented) return;
    event.preventDefault();
    if (isDriverError(error) && (!isServerError(error) || isTransientError(error))) {
      handlers.onDriverError(error);
    } else {
      handlers.onStray(describeStray(kind, error));
    }
  };
  const onError = (event: ErrorEvent) => handle(event, event.error, "uncaught_error");
  const onRejection = (event: PromiseRejectionEvent) =>
    handle(event, event.reason, "unhandled_rejection");
  globalThis.addEventListener("error", onError);
  globalThis.addEventListener("unhandledrejection", onRejection);
  return () => {
    globalThis.removeEventListener("error", onError);
    globalThis.removeEventListener("unhandledrejection", onRejection);
  };
}

const PLAIN_NAME = /^[A-Za-z_$][\w$]{0,63}$/;
const PLAIN_CODE = /^[A-Z][A-Z0-9_]{1,39}$/;
const SQLSTATE = /^[0-9A-Z]{5}$/;

/**
 * A stray error without its message: a PostgreSQL error's message can quote a value
 * (`invalid input syntax for type integer: "…"`), any other one whatever the task put in it.
 */
export function describeStray(kind: Stray["kind"], error: unknown): Stray {
  const stray: Stray = { kind, error: "Error" };
  if (error instanceof Error) {
    if (PLAIN_NAME.test(error.name)) stray.error = error.name;
    const code = (error as { code?: unknown }).code;
    if (
      typeof code === "string" &&
      (PLAIN_CODE.test(code) || (isServerError(error) && SQLSTATE.test(code)))
    ) {
      stray.code = code;
    }
  } else {
    stray.error = error === null ? "null" : typeof error;
  }
  const ctx = activeContext();
  if (ctx) stray.job = { id: ctx.job.id, task: ctx.job.task };
  return stray;
}

/** An error the PostgreSQL server sent (postgres.js's PostgresError). */
function isServerError(error: unknown): boolean {
  return error instanceof Error && error.name === "PostgresError";
}
