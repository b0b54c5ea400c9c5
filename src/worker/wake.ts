/**
 * The loop's sleep, which a wake-up ends early: a notification, a freed slot, a stop. A
 * wake-up while the loop is awake makes its next sleep return at once.
 *
 * @module
 */

/** One loop's sleep and wake-up. */
export class Wake {
  #flag = false;
  #wake: () => void = () => {};

  /** End the current sleep, or the next one. */
  up(): void {
    this.#flag = true;
    this.#wake();
  }

  /** Sleep `ms` or until woken. */
  sleep(ms: number): Promise<void> {
    if (this.#flag || ms <= 0) {
      this.#flag = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = () => {};
        this.#flag = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#wake = done;
    });
  }
}
