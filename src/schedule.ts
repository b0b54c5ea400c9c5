/**
 * Periodic schedules: a cron expression (croner, in UTC unless a timezone is given) or an
 * interval aligned to multiples since the Unix epoch, firing a registered task with fixed
 * arguments. Validated at registration; dispatched by every worker (see
 * `worker/scheduler.ts`), each fire enqueued once across all of them.
 *
 * @module
 */
import { Cron } from "croner";
import { AkadzeError } from "./errors.ts";
import { isPlainObject, jsonProblem } from "./json.ts";
import { formatIssues, OWN_OUTPUT_ADVICE, ownOutputProblem } from "./standard_schema.ts";
import type { AnyTask, Task } from "./task.ts";

/** When and how a schedule fires. Exactly one of `cron` and `every`. */
export interface ScheduleSpec {
  /** A 5-field cron expression, or an alias such as `@hourly`, `@daily`, `@weekly`. */
  cron?: string;
  /** An interval in milliseconds; fires at multiples of it since the Unix epoch. */
  every?: number;
  /** false: skip a fire while an earlier run of this schedule is queued or running. Default true. */
  overlap?: boolean;
  /** IANA time zone for `cron`. Default `"UTC"`. */
  timezone?: string;
  /**
   * Milliseconds back from now within which fires missed while no worker ran (an outage, a
   * deploy) are enqueued when a worker runs again: each once across all workers, oldest
   * first, each job's `runAt` its fire time. Only fires after the schedule's last recorded
   * one count, so a new schedule does not fire for its past. Default 0: only the most recent
   * fire within the app's `grace`.
   */
  backfill?: number;
  /** The task arguments of every fire (validated now against the task's schema). Default `{}`. */
  args?: Record<string, unknown>;
  /** The schedule's name (unique in the app). Default: the task name. */
  name?: string;
}

const SPEC_NAMES = new Set(["cron", "every", "overlap", "timezone", "backfill", "args", "name"]);
const CRON_ALIASES = new Set([
  "@yearly",
  "@annually",
  "@monthly",
  "@weekly",
  "@daily",
  "@midnight",
  "@hourly",
]);
/** Intervals must be at least a second and at most a year. */
const EVERY_MIN = 1_000;
const EVERY_MAX = 366 * 86_400_000;
/** The longest backfill window: 31 days. */
const BACKFILL_MAX = 31 * 86_400_000;

/**
 * A validated schedule: made by `app.periodic`, `app.addSchedule` and `app.addSchedules`,
 * listed in `app.schedules`.
 *
 * @example
 * ```ts
 * import { Akadze } from "@akadze/akadze";
 *
 * const app = new Akadze({ databaseUrl: "postgres://localhost/app" }); // connects lazily
 * app.task("ops.prune", () => {});
 * const schedule = app.addSchedule("ops.prune", { cron: "0 * * * *", overlap: false });
 * schedule.describe(); // 'cron "0 * * * *" (UTC)'
 * schedule.nextFire(new Date("2030-01-01T10:30:00Z")); // 2030-01-01T11:00:00.000Z
 * await app.close();
 * ```
 */
export class Schedule {
  /** Unique name (the `periodic_runs.name`). */
  readonly name: string;
  /** The task it fires. */
  // deno-lint-ignore no-explicit-any
  readonly task: Task<any, any, any>;
  /** Cron expression, when cron-based. */
  readonly cron: string | undefined;
  /** Interval in ms, when interval-based. */
  readonly every: number | undefined;
  /** Whether fires may overlap a previous run. */
  readonly overlap: boolean;
  /** Time zone of the cron expression. */
  readonly timezone: string;
  /** The backfill window in ms (0: none). */
  readonly backfill: number;
  /** The arguments each fire enqueues (the schema's output). */
  readonly args: Record<string, unknown>;
  #cron: Cron | undefined;

  /**
   * Validate a spec for a task; `AkadzeError` with a precise message otherwise.
   *
   * @param task The registered task to fire.
   * @param spec When and how.
   */
  // deno-lint-ignore no-explicit-any
  constructor(task: Task<any, any, any>, spec: ScheduleSpec) {
    const name = spec.name ?? task.name;
    const where = `schedule "${name}"`;
    if (!isPlainObject(spec)) throw new AkadzeError(`${where}: the spec must be an object`);
    for (const key of Object.keys(spec)) {
      if (!SPEC_NAMES.has(key)) {
        throw new AkadzeError(
          `${where}: unknown option "${key}" (options: ${[...SPEC_NAMES].join(", ")})`,
        );
      }
    }
    if (typeof name !== "string" || name.length < 1 || name.length > 200) {
      throw new AkadzeError(`schedule name must be a string of 1-200 characters`);
    }
    if ((spec.cron === undefined) === (spec.every === undefined)) {
      throw new AkadzeError(`${where}: give exactly one of cron and every`);
    }
    const timezone = spec.timezone ?? "UTC";
    if (typeof timezone !== "string" || !isTimeZone(timezone)) {
      throw new AkadzeError(`${where}: unknown time zone ${JSON.stringify(timezone)}`);
    }
    if (spec.timezone !== undefined && spec.every !== undefined) {
      throw new AkadzeError(`${where}: timezone applies to cron only (every is zone-free)`);
    }
    if (spec.cron !== undefined) {
      this.#cron = parseCron(where, spec.cron, timezone);
    } else if (
      typeof spec.every !== "number" || !Number.isInteger(spec.every) || spec.every < EVERY_MIN ||
      spec.every > EVERY_MAX
    ) {
      throw new AkadzeError(
        `${where}: every must be a whole number of milliseconds from ${EVERY_MIN} to ${EVERY_MAX}, got ${spec.every}`,
      );
    }
    if (spec.overlap !== undefined && typeof spec.overlap !== "boolean") {
      throw new AkadzeError(`${where}: overlap must be a boolean`);
    }
    const backfill = spec.backfill ?? 0;
    if (
      typeof backfill !== "number" || !Number.isInteger(backfill) || backfill < 0 ||
      backfill > BACKFILL_MAX
    ) {
      throw new AkadzeError(
        `${where}: backfill must be a whole number of milliseconds from 0 to ${BACKFILL_MAX} ` +
          `(31 days), got ${spec.backfill}`,
      );
    }
    this.name = name;
    this.task = task;
    this.cron = spec.cron;
    this.every = spec.every;
    this.overlap = spec.overlap ?? true;
    this.timezone = timezone;
    this.backfill = backfill;
    this.args = validateArgs(where, task, spec.args ?? {});
  }

  /**
   * The most recent fire at or before `now`, or null when there is none.
   *
   * @example
   * ```ts ignore
   * app.addSchedule("ops.prune", { every: 30_000 }).lastFire(new Date(45_000)); // 30 s after the epoch
   * ```
   */
  lastFire(now: Date): Date | null {
    if (this.every !== undefined) {
      return new Date(Math.floor(now.getTime() / this.every) * this.every);
    }
    // previousRuns excludes its reference instant; look from just after `now`.
    const [previous] = this.#cron!.previousRuns(1, new Date(now.getTime() + 1));
    return previous ?? null;
  }

  /**
   * The first fire strictly after `now`, or null when there is none.
   *
   * @example
   * ```ts ignore
   * for (const schedule of app.schedules.values()) {
   *   console.log(schedule.name, schedule.nextFire(new Date())?.toISOString());
   * }
   * ```
   */
  nextFire(now: Date): Date | null {
    if (this.every !== undefined) {
      return new Date((Math.floor(now.getTime() / this.every) + 1) * this.every);
    }
    return this.#cron!.nextRun(now);
  }

  /**
   * The fires after `from` up to and including `to` (at most `limit`), for inspection and
   * tests.
   *
   * @example
   * ```ts ignore
   * const day = schedule.firesBetween(new Date("2030-01-01Z"), new Date("2030-01-02Z"));
   * console.log(`${day.length} fires on Jan 1st`);
   * ```
   */
  firesBetween(from: Date, to: Date, limit = 1000): Date[] {
    const fires: Date[] = [];
    for (let t = this.nextFire(from); t && t <= to && fires.length < limit; t = this.nextFire(t)) {
      fires.push(t);
    }
    return fires;
  }

  /**
   * A one-line description: `cron "0 * * * *" (UTC)` or `every 30000 ms`.
   *
   * @example
   * ```ts ignore
   * console.log(`${schedule.name}: ${schedule.describe()}`);
   * ```
   */
  describe(): string {
    return this.cron !== undefined
      ? `cron ${JSON.stringify(this.cron)} (${this.timezone})`
      : `every ${this.every} ms`;
  }
}

function parseCron(where: string, cron: unknown, timezone: string): Cron {
  if (typeof cron !== "string") throw new AkadzeError(`${where}: cron must be a string`);
  const text = cron.trim();
  const fields = text.split(/\s+/);
  if (!CRON_ALIASES.has(text.toLowerCase()) && fields.length !== 5) {
    throw new AkadzeError(
      `${where}: cron must have 5 fields (minute hour day month weekday) or be an alias ` +
        `such as @hourly, got ${JSON.stringify(cron)}`,
    );
  }
  try {
    const parsed = new Cron(text, { paused: true, timezone });
    if (!parsed.nextRun(new Date(0))) throw new Error("it never fires");
    return parsed;
  } catch (error) {
    throw new AkadzeError(
      `${where}: invalid cron ${JSON.stringify(cron)}: ${(error as Error).message}`,
    );
  }
}

function validateArgs(
  where: string,
  task: AnyTask,
  args: unknown,
): Record<string, unknown> {
  let value = args;
  if (task.args) {
    const result = task.args["~standard"].validate(args);
    if (result instanceof Promise) {
      throw new AkadzeError(
        `${where}: the args schema of task "${task.name}" is asynchronous; schedules need one ` +
          `that validates synchronously at registration`,
      );
    }
    if (result.issues) {
      throw new AkadzeError(`${where}: invalid args: ${formatIssues(result.issues)}`);
    }
    value = result.value;
  }
  if (!isPlainObject(value)) throw new AkadzeError(`${where}: args must be a JSON object`);
  const problem = jsonProblem(value, "args");
  if (problem) throw new AkadzeError(`${where}: args cannot be stored: ${problem}`);
  if (task.args) {
    // Each fire enqueues these (the schema's output), and each run validates them again.
    const own = ownOutputProblem(task.args, args, value);
    if (own instanceof Promise) {
      own.catch(() => {});
      throw new AkadzeError(
        `${where}: the args schema of task "${task.name}" is asynchronous; schedules need one ` +
          `that validates synchronously at registration`,
      );
    }
    if (own) {
      throw new AkadzeError(
        `${where}: the args schema of task "${task.name}" ${own}. ${OWN_OUTPUT_ADVICE}`,
      );
    }
  }
  return value as Record<string, unknown>;
}

function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat("en", { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}
