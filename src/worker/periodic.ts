/**
 * The schedule of a service the worker loop runs every so often (rescuer, canceller,
 * pruner): each pass asks whether a run is due, so tests drive `runOnce()` directly and
 * the loop never sleeps for a service.
 *
 * @module
 */
import { AkadzeError } from "../errors.ts";

/** A service with a `runOnce()` that is due every `interval` ms. */
export abstract class Periodic<R> {
  /** The time between two runs (ms); 0: every pass. */
  readonly interval: number;
  #next = -Infinity;

  /** Plan runs `interval` ms apart (validated: `AkadzeError`). */
  constructor(interval: number) {
    if (typeof interval !== "number" || !(interval >= 0) || interval > 2147483647) {
      throw new AkadzeError(`interval must be a number of milliseconds, got ${interval}`);
    }
    this.interval = interval;
  }

  /** Do one pass now; the result counts what it did. */
  abstract runOnce(): Promise<R>;

  /** A run of the worker begins: the first pass is due `firstIn` ms from now (at once by default). */
  begin(firstIn = -Infinity): void {
    this.#next = performance.now() + firstIn;
  }

  /** Run once when due (null when not). */
  async runIfDue(): Promise<R | null> {
    return this.takeDue() ? await this.runOnce() : null;
  }

  /** Whether a pass is due; if so, the next is planned `interval` ms (times `stretch`) on. */
  protected takeDue(stretch = 1): boolean {
    const now = performance.now();
    if (now < this.#next) return false;
    this.#next = now + this.interval * stretch;
    return true;
  }
}
