/**
 * Error classes raised by akadze. Messages never contain a database URL or password.
 *
 * @module
 */

/** Base class of every error akadze raises on purpose. */
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

/** An enqueue was refused before anything was inserted. */
export class EnqueueError extends AkadzeError {}

/** A job with the same active `uniqueKey` is already queued or running. */
export class DuplicateJob extends EnqueueError {}

/** A migration could not be applied; the transaction was rolled back. */
export class MigrateError extends AkadzeError {}
