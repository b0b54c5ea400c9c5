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

/**
 * `promise`'s value, or a rejection once `ms` have passed without it (the promise goes on;
 * its own later rejection is absorbed).
 */
export async function withinTime<T>(promise: Promise<T>, ms: number): Promise<T> {
  // No bound: a timer of Infinity ms would fire at once (it is cut to a 32-bit delay).
  if (ms === Infinity) return await promise;
  let timer: ReturnType<typeof setTimeout> | undefined;
  promise.catch(() => {});
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), Math.max(0, ms));
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
