/**
 * Bounded waits for the worker's way out: a query stuck on an unanswering database (a
 * network partition) must not hold up a stop.
 *
 * @module
 */

/**
 * Wait until `promise` settles or `ms` have passed, whichever comes first; never rejects
 * (a rejection is the caller's to handle elsewhere, or nobody's).
 */
export async function settleWithin(promise: Promise<unknown> | null, ms: number): Promise<void> {
  if (promise === null) return;
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    promise.catch(() => {}),
    new Promise((resolve) => timer = setTimeout(resolve, ms)),
  ]);
  clearTimeout(timer);
}
