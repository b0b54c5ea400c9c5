/**
 * Retry delays: the default backoff and the per-task override.
 *
 * @module
 */
import { isDelay } from "../rules.ts";
import type { Backoff } from "../task.ts";

/** The longest default backoff (ms). */
export const BACKOFF_CAP = 300_000;

/** `min(2^(attempt-1) s, 300 s)` with ±10 % jitter; `attempt` counts spent attempts (≥ 1). */
export function defaultBackoff(attempt: number, random: () => number = Math.random): number {
  const base = Math.min(1000 * 2 ** Math.max(0, attempt - 1), BACKOFF_CAP);
  return Math.round(base * (0.9 + 0.2 * random()));
}

/**
 * The delay before the next attempt: the task's `backoff` when it has one (null = stop
 * retrying), else the default. A backoff that throws or returns nonsense (not a number,
 * negative, more than MAX_DELAY) falls back to the default, so a bug there cannot lose
 * the job.
 */
export function nextDelay(
  backoff: Backoff | undefined,
  attempt: number,
  error: unknown,
): number | null {
  if (!backoff) return defaultBackoff(attempt);
  try {
    const delay = backoff(attempt, error);
    if (delay === null) return null;
    if (isDelay(delay)) return delay;
  } catch {
    // fall through to the default
  }
  return defaultBackoff(attempt);
}
