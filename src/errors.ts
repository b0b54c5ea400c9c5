/**
 * Error classes raised by akadze. Messages never contain a database URL or password.
 *
 * @module
 */

/**
 * Base class of every error akadze raises on purpose.
 *
 * @example
 * ```ts
 * import { AkadzeError, Akadze } from "@akadze/akadze";
 *
 * try {
 *   new Akadze({}); // neither databaseUrl nor sql
 * } catch (error) {
 *   if (!(error instanceof AkadzeError)) throw error;
 *   console.error(error.message);
 * }
 * ```
 */
export class AkadzeError extends Error {
  /**
   * Create an error whose message is safe to show.
   *
   * @param message What went wrong, safe to show (no credentials).
   * @param options Standard error options (`cause`).
   *
   * @example
   * ```ts
   * import { AkadzeError } from "@akadze/akadze";
   * throw new AkadzeError("current() is only valid inside a running job");
   * ```
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * An enqueue was refused before anything was inserted (bad options or arguments).
 *
 * @example
 * ```ts ignore
 * import { EnqueueError } from "@akadze/akadze";
 *
 * try {
 *   await hello.using({ delay: -1 }).enqueue({ name: "ada" });
 * } catch (error) {
 *   if (error instanceof EnqueueError) console.error(error.message); // nothing inserted
 * }
 * ```
 */
export class EnqueueError extends AkadzeError {}

/**
 * A job with the same active `uniqueKey` is already queued or running (and the enqueue's
 * `onDuplicate` is `"raise"`, the default). The caller's transaction stays usable.
 *
 * @example
 * ```ts ignore
 * import { DuplicateJob } from "@akadze/akadze";
 *
 * await app.sql.begin(async (tx) => {
 *   try {
 *     await report.using({ session: tx, uniqueKey: "report:42" }).enqueue({ id: 42 });
 *   } catch (error) {
 *     if (!(error instanceof DuplicateJob)) throw error; // already on its way
 *   }
 *   await tx`update reports set requested = true where id = 42`; // still fine
 * });
 * ```
 */
export class DuplicateJob extends EnqueueError {}

/**
 * A migration could not be applied; the transaction was rolled back.
 *
 * @example
 * ```ts ignore
 * import { migrate, MigrateError } from "@akadze/akadze/admin";
 *
 * try {
 *   await migrate(Deno.env.get("AKADZE_DATABASE_URL")!);
 * } catch (error) {
 *   if (error instanceof MigrateError) Deno.exit(1); // the message names the version
 *   throw error;
 * }
 * ```
 */
export class MigrateError extends AkadzeError {}

/**
 * `app.waitForJob` / `app.waitForJobs` gave up: the timeout passed before every job was
 * finished. `unfinished` lists the jobs still not finished and the state each was last
 * seen in; the jobs themselves are untouched (wait again, or read them with `getJob`).
 *
 * @example
 * ```ts ignore
 * import { JobWaitTimeout } from "@akadze/akadze";
 *
 * try {
 *   await app.waitForJob(id, { timeout: 5_000 });
 * } catch (error) {
 *   if (!(error instanceof JobWaitTimeout)) throw error;
 *   console.log(error.unfinished); // [{ id: "42", state: "running" }]
 * }
 * ```
 */
export class JobWaitTimeout extends AkadzeError {
  /** The jobs not finished when the timeout passed, with the state each was last seen in. */
  readonly unfinished: readonly { readonly id: string; readonly state: string }[];

  /**
   * Make the error for `unfinished` jobs after `timeout` ms (its message lists them).
   *
   * @example
   * ```ts
   * import { JobWaitTimeout } from "@akadze/akadze";
   * new JobWaitTimeout([{ id: "42", state: "running" }], 5_000).message;
   * // "job 42 did not finish within 5000 ms: it is still running"
   * ```
   */
  constructor(unfinished: readonly { id: string; state: string }[], timeout: number) {
    const shown = unfinished.slice(0, 10).map((j) => `${j.id} (${j.state})`).join(", ");
    const more = unfinished.length > 10 ? `, and ${unfinished.length - 10} more` : "";
    super(
      unfinished.length === 1
        ? `job ${unfinished[0].id} did not finish within ${timeout} ms: it is still ${
          unfinished[0].state
        }`
        : `${unfinished.length} jobs did not finish within ${timeout} ms: ${shown}${more}`,
    );
    this.unfinished = unfinished;
  }
}

/**
 * A job that `app.waitForJob` / `app.waitForJobs` was asked for does not exist (a wrong
 * id, or a finished job already deleted by retention or `pruneJobs`), or was deleted while
 * it was awaited. `jobId` says which.
 *
 * @example
 * ```ts ignore
 * import { JobNotFound } from "@akadze/akadze";
 *
 * try {
 *   await app.waitForJob("999999", { timeout: 5_000 });
 * } catch (error) {
 *   if (error instanceof JobNotFound) console.log(error.jobId); // "999999"
 * }
 * ```
 */
export class JobNotFound extends AkadzeError {
  /** The id of the missing job. */
  readonly jobId: string;

  /**
   * Make the error for `jobId`, with the message that says what happened.
   *
   * @example
   * ```ts
   * import { JobNotFound } from "@akadze/akadze";
   * new JobNotFound("42", "job 42 does not exist").jobId; // "42"
   * ```
   */
  constructor(jobId: string, message: string) {
    super(message);
    this.jobId = jobId;
  }
}

/**
 * Brands the control exceptions so a worker recognises them even when the application
 * imports another copy of akadze (e.g. the app from JSR, the CLI from a checkout).
 */
const CONTROL = Symbol.for("akadze.control");

/** The kind of control exception `error` is, or undefined (also for a value that throws when read). */
export function controlKind(error: unknown): "Retry" | "Snooze" | "Fail" | "Cancel" | undefined {
  let kind: unknown;
  try {
    kind = (error as { [CONTROL]?: unknown } | null)?.[CONTROL];
  } catch {
    return undefined; // a Proxy whose every trap throws, say
  }
  return kind === "Retry" || kind === "Snooze" || kind === "Fail" || kind === "Cancel"
    ? kind
    : undefined;
}

/**
 * Thrown by a handler (or anything it calls): retry the job, spending an attempt. When no
 * attempts remain the job ends `failed`.
 *
 * @example
 * ```ts ignore
 * import { Retry } from "@akadze/akadze";
 * if (response.status === 429) throw new Retry({ delay: 30_000 });
 * ```
 */
export class Retry extends Error {
  /** Milliseconds until the next attempt, or undefined for the task's backoff. */
  readonly delay: number | undefined;
  /** Create a retry request, optionally with its delay. */
  constructor(options: {
    /** Milliseconds until the next attempt (0 to 365 days); default: the task's backoff. */
    delay?: number;
  } = {}) {
    super(options.delay === undefined ? "retry requested" : `retry in ${options.delay} ms`);
    this.name = "Retry";
    Object.defineProperty(this, CONTROL, { value: "Retry" });
    this.delay = options.delay;
  }
}

/**
 * Thrown by a handler: put the job back for `delay` milliseconds (0 to 365 days) without
 * spending an attempt (`snoozes` counts them). Any other delay counts as a failed attempt.
 *
 * @example
 * ```ts ignore
 * import { Snooze } from "@akadze/akadze";
 * if (!upstreamReady) throw new Snooze(60_000);
 * ```
 */
export class Snooze extends Error {
  /** Milliseconds until the job is ready again. */
  readonly delay: number;
  /** Create a snooze of `delay` milliseconds. */
  constructor(delay: number) {
    super(`snooze ${delay} ms`);
    this.name = "Snooze";
    Object.defineProperty(this, CONTROL, { value: "Snooze" });
    this.delay = delay;
  }
}

/**
 * Thrown by a handler: end the job `failed` now, spending an attempt, whatever remains.
 *
 * @example
 * ```ts ignore
 * import { Fail } from "@akadze/akadze";
 * if (!user) throw new Fail("user was deleted");
 * ```
 */
export class Fail extends Error {
  /** Create a failure with an optional reason (stored, redacted, in the job's errors). */
  constructor(reason?: string) {
    super(reason ?? "failed by the task");
    this.name = "Fail";
    Object.defineProperty(this, CONTROL, { value: "Fail" });
  }
}

/**
 * Thrown by a handler: end the job `cancelled` without spending an attempt.
 *
 * @example
 * ```ts ignore
 * import { Cancel } from "@akadze/akadze";
 * if (order.withdrawn) throw new Cancel("order withdrawn");
 * ```
 */
export class Cancel extends Error {
  /** Create a cancellation with an optional reason. */
  constructor(reason?: string) {
    super(reason ?? "cancelled by the task");
    this.name = "Cancel";
    Object.defineProperty(this, CONTROL, { value: "Cancel" });
  }
}
