/**
 * The rules a value must follow to be stored: queue and task names, the priority, attempt
 * and delay ranges, key lengths and the default largest arguments. The app, tasks, enqueue,
 * the worker's options, the admin functions and the CLI all check against these.
 *
 * The SQL functions akadze.enqueue() and enqueue_many() (migrations/0003_sql_enqueue.sql)
 * check the same ranges with the same messages, and leave names, key lengths and the shape
 * of the arguments to the domains of migrations/0001_init.sql: change them together.
 *
 * @module
 */
import { AkadzeError } from "./errors.ts";
import { jsonProblem } from "./json.ts";

/** The queue-name rule (also a CHECK constraint on jobs.queue). */
export const QUEUE_NAME = /^[A-Za-z0-9_.:-]{1,64}$/;
/** The queue-name rule in words, for error messages. */
export const QUEUE_NAME_RULE = "1-64 characters of letters, digits, _ . : -";

/**
 * Throw `error` (an `AkadzeError` by default) unless `queue` is a valid queue name;
 * returns it.
 */
export function checkQueueName(
  queue: unknown,
  error: new (message: string) => Error = AkadzeError,
): string {
  if (typeof queue !== "string" || !QUEUE_NAME.test(queue)) {
    throw new error(`queue name ${JSON.stringify(queue)} must be ${QUEUE_NAME_RULE}`);
  }
  return queue;
}

/** The longest task name, in UTF-16 units. */
export const TASK_NAME_MAX = 200;

/** The smallint range of priorities. */
export const PRIORITY_MIN = -32768;
/** The smallint range of priorities. */
export const PRIORITY_MAX = 32767;
/** The largest int4: the largest attempt budget, limit and timer delay (ms). */
export const INT4_MAX = 2147483647;
/** The largest attempt budget (int4). */
export const MAX_ATTEMPTS_MAX = INT4_MAX;
/** The longest `uniqueKey` and `limitKey`, in UTF-16 units. */
export const KEY_MAX_LENGTH = 500;
/** The default largest arguments of one job: 1 MiB of JSON text (UTF-8). */
export const MAX_ARGS_BYTES = 1_048_576;

/**
 * The longest delay, in milliseconds, that a `Retry`, a `Snooze`, a task's `backoff` or an
 * enqueue's `delay` may ask for: 365 days.
 */
export const MAX_DELAY = 365 * 24 * 60 * 60 * 1000;

/** The longest rate window of a limit key, in milliseconds: 366 days. */
export const LIMIT_WINDOW_MAX = 366 * 86_400_000;
/** The most job summaries one `listJobs` (`akadze jobs list --limit`) returns. */
export const LIST_JOBS_MAX = 1000;
/** The most slots of a worker. */
export const SLOTS_MAX = 10_000;
/** The largest TCP port (a worker's metrics port). */
export const PORT_MAX = 65_535;

/** The largest progress a handler may report with `ctx.progress`: 4 KiB of JSON text (UTF-8). */
export const MAX_PROGRESS_BYTES = 4096;

/**
 * The JSON text of `value` as a job's progress, or throw an `AkadzeError` saying why it
 * cannot be one: a finite number, or a JSON value (object, array, string, boolean) of at
 * most {@linkcode MAX_PROGRESS_BYTES} bytes; null and undefined are refused.
 */
export function progressText(value: unknown): string {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new AkadzeError(`progress must be a finite number or small JSON, got ${value}`);
  }
  if (value === null || value === undefined) {
    throw new AkadzeError(`progress must be a finite number or small JSON, got ${value}`);
  }
  const problem = jsonProblem(value, "progress");
  if (problem) throw new AkadzeError(`progress cannot be stored: ${problem}`);
  const text = JSON.stringify(value);
  const bytes = new TextEncoder().encode(text).length;
  if (bytes > MAX_PROGRESS_BYTES) {
    throw new AkadzeError(
      `progress must be at most ${MAX_PROGRESS_BYTES} bytes of JSON, got ${bytes}: report a ` +
        "summary (a percentage, counts), not the data",
    );
  }
  return text;
}

/** Whether `value` is an integer from `min` to `max`. */
export function isIntegerIn(value: unknown, min: number, max: number): value is number {
  return Number.isInteger(value) && (value as number) >= min && (value as number) <= max;
}

/** Whether `value` is a priority (an integer of the smallint range). */
export function isPriority(value: unknown): value is number {
  return isIntegerIn(value, PRIORITY_MIN, PRIORITY_MAX);
}

/** Whether `value` is an attempt budget (an integer from 1 to {@linkcode MAX_ATTEMPTS_MAX}). */
export function isMaxAttempts(value: unknown): value is number {
  return isIntegerIn(value, 1, MAX_ATTEMPTS_MAX);
}

/** Whether `value` is a delay akadze can store: a number of milliseconds, 0 to MAX_DELAY. */
export function isDelay(value: unknown): value is number {
  return typeof value === "number" && value >= 0 && value <= MAX_DELAY;
}

/** Whether `value` is a key of the right length (a `uniqueKey`, `limitKey` or limit key). */
export function isKeyLength(value: unknown): value is string {
  return typeof value === "string" && value.length > 0 && value.length <= KEY_MAX_LENGTH;
}

/**
 * Parse `text` as a decimal integer from `min` to `max`; else throw `error` (an
 * `AkadzeError` by default) saying so, `name` being the setting or flag it came from.
 */
export function parseIntegerText(
  name: string,
  text: string,
  range: { min: number; max: number; error?: new (message: string) => Error },
): number {
  const n = /^\d+$/.test(text) ? Number(text) : NaN;
  if (!(n >= range.min && n <= range.max)) {
    throw new (range.error ?? AkadzeError)(
      `${name} must be an integer from ${range.min} to ${range.max}, got "${text}"`,
    );
  }
  return n;
}
