/**
 * The scheduler: inside every worker, enqueues each schedule's most recent due fire
 * (within the app's `grace`) exactly once across all workers: the `periodic_runs`
 * primary key `(name, fire_at)` decides who enqueues it, in the same transaction as the
 * job, whose `run_at` is the fire time. A schedule with a `backfill` window also gets the
 * fires missed since its last recorded one (at the first pass, and after a gap in this
 * worker's passes), oldest first, at most {@linkcode BACKFILL_PER_PASS} a pass; the pruner
 * keeps each schedule's last row, so that lower bound survives an outage. Without one,
 * missed fires older than the grace are not enqueued.
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import { isTransientError, quoteSchema, type Sql } from "../db.ts";
import { ACTIVE_STATES, stateList } from "../job.ts";
import type { Schedule } from "../schedule.ts";
import { logScheduleFailed, logScheduleFired, logScheduleSkipped } from "./log_events.ts";

/** Settings of a {@linkcode Scheduler}. */
export interface SchedulerConfig {
  /** The app whose schedules it dispatches (and whose `grace` applies). */
  app: Akadze;
}

/** What one pass did, by schedule name. */
export interface SchedulerResult {
  /** Fires this worker enqueued. */
  fired: string[];
  /** Fires recorded as skipped (overlap: false with an earlier run still active). */
  skipped: string[];
  /** Fires another worker had already taken. */
  taken: string[];
  /** Fires whose dispatch failed (logged; retried later within the grace). */
  failed: string[];
}

/**
 * The most fires one pass enqueues for one schedule's backfill (the rest: next passes): the
 * pass runs in the worker's loop, between its heartbeats and claims.
 */
export const BACKFILL_PER_PASS = 20;
/** How often the database's clock is read again (ms). */
export const CLOCK_SYNC_EVERY = 60_000;
/** The first wait before a failed schedule is tried again (ms); it doubles per failure. */
export const RETRY_MIN = 1_000;
/** The longest wait before a failed schedule is tried again (ms). */
export const RETRY_MAX = 60_000;
/**
 * How long a dispatch waits for a row lock (e.g. the same fire's row, inserted by another
 * worker whose transaction has not ended). That worker may be frozen mid-transaction (a
 * stopped process, a partition): waiting longer would stall this worker's loop and its
 * heartbeat. The fire is tried again on a later pass, within the grace.
 */
const LOCK_TIMEOUT = "100ms";
/** lock_not_available: the lock timeout above expired. */
const LOCK_NOT_AVAILABLE = "55P03";

/** Dispatches due schedule fires for one worker. */
export class Scheduler {
  #app: Akadze;
  #sql: Sql;
  #statements: { claim: string; busy: string; link: string; now: string; last: string };
  /** The last fire handled (or given up on) per schedule, in ms. */
  #handled = new Map<string, number>();
  /** When a failed schedule may be tried again, and its current backoff. */
  #retry = new Map<string, { at: number; delay: number }>();
  #offset = 0;
  #nextSync = 0;

  /** Make a scheduler for an app's schedules, on `sql` (the worker gives it its loop's). */
  constructor(sql: Sql, config: SchedulerConfig) {
    const app = config.app;
    this.#app = app;
    this.#sql = sql;
    const s = quoteSchema(app.schema);
    this.#statements = {
      claim: `insert into ${s}.periodic_runs (name, fire_at) values ($1, $2)
              on conflict do nothing returning name`,
      busy:
        `select 1 from ${s}.periodic_runs r join ${s}.jobs j on j.id operator(pg_catalog.=) r.job_id
              where r.name operator(pg_catalog.=) $1 and j.state
                operator(pg_catalog.=) any (array[${stateList(ACTIVE_STATES)}]) limit 1`,
      link:
        `update ${s}.periodic_runs set job_id = $3 where name operator(pg_catalog.=) $1 and fire_at
          operator(pg_catalog.=) $2`,
      now: `select extract(epoch from pg_catalog.now())::pg_catalog.float8
          operator(pg_catalog.*) 1000 as now`,
      last: `select extract(epoch from pg_catalog.max(fire_at))::pg_catalog.float8
          operator(pg_catalog.*) 1000 as last
               from ${s}.periodic_runs where name operator(pg_catalog.=) $1`,
    };
  }

  /** The database's clock, as measured at the last sync (ms since the epoch). */
  now(): number {
    return Date.now() + this.#offset;
  }

  /** Enqueue every due fire not handled yet. A failing schedule never stops the others. */
  async runOnce(): Promise<SchedulerResult> {
    const result: SchedulerResult = { fired: [], skipped: [], taken: [], failed: [] };
    if (this.#app.schedules.size === 0) return result;
    if (Date.now() >= this.#nextSync) await this.#syncClock();
    const now = this.now();
    for (const schedule of this.#app.schedules.values()) {
      const fire = schedule.lastFire(new Date(now));
      if (!fire) continue;
      const at = fire.getTime();
      const handled = this.#handled.get(schedule.name) ?? -Infinity;
      if (handled >= at) continue;
      const retry = this.#retry.get(schedule.name);
      if (retry && Date.now() < retry.at) continue;
      try {
        for (const due of await this.#dueFires(schedule, fire, handled, now)) {
          const outcome = await this.#dispatch(schedule, due);
          this.#handled.set(schedule.name, due.getTime());
          result[outcome].push(schedule.name);
        }
        this.#retry.delete(schedule.name);
      } catch (error) {
        const busy = (error as { code?: unknown }).code === LOCK_NOT_AVAILABLE;
        if (!isTransientError(error) && !busy) {
          // Database unreachable is the worker's business; anything else is this schedule's.
          logScheduleFailed(schedule.name, fire, error);
        }
        const delay = Math.min(Math.max((retry?.delay ?? 0) * 2, RETRY_MIN), RETRY_MAX);
        this.#retry.set(schedule.name, { at: Date.now() + delay, delay });
        result.failed.push(schedule.name);
        if (isTransientError(error)) throw error;
      }
    }
    return result;
  }

  /**
   * The fires to dispatch now, oldest first: the latest one within the grace; with a
   * backfill window, at the first pass or after a gap since the last handled fire, every
   * fire after the schedule's last recorded one within the window (new schedules have none).
   */
  async #dueFires(schedule: Schedule, fire: Date, handled: number, now: number): Promise<Date[]> {
    const latest = now - fire.getTime() > this.#app.grace ? [] : [fire];
    if (schedule.backfill === 0) return latest;
    if (
      handled !== -Infinity &&
      (schedule.nextFire(new Date(handled))?.getTime() ?? 0) >= fire.getTime()
    ) {
      return latest; // no gap: the next fire after the last handled one is the latest
    }
    const [{ last }] = await this.#sql.unsafe(this.#statements.last, [schedule.name]);
    if (last === null) return latest;
    const from = Math.max(last as number, handled, now - schedule.backfill);
    return schedule.firesBetween(new Date(from), new Date(now), BACKFILL_PER_PASS);
  }

  async #dispatch(schedule: Schedule, fire: Date): Promise<"fired" | "skipped" | "taken"> {
    const { claim, busy, link } = this.#statements;
    const outcome = await this.#sql.begin(async (tx) => {
      await tx.unsafe(`set local lock_timeout = '${LOCK_TIMEOUT}'`);
      const [claimed] = await tx.unsafe(claim, [schedule.name, fire]);
      if (!claimed) return { kind: "taken" as const };
      if (!schedule.overlap && (await tx.unsafe(busy, [schedule.name])).length > 0) {
        return { kind: "skipped" as const };
      }
      // The job's run_at is its fire time (a backfilled fire's is in the past).
      const id = await schedule.task.using({ session: tx, runAt: fire }).enqueue(schedule.args);
      await tx.unsafe(link, [schedule.name, fire, id]);
      return { kind: "fired" as const, id };
    });
    if (outcome.kind === "fired") logScheduleFired(schedule.name, fire, outcome.id);
    else if (outcome.kind === "skipped") logScheduleSkipped(schedule.name, fire);
    return outcome.kind;
  }

  async #syncClock(): Promise<void> {
    const before = Date.now();
    const [{ now }] = await this.#sql.unsafe(this.#statements.now);
    const after = Date.now();
    this.#offset = now - (before + after) / 2;
    this.#nextSync = after + CLOCK_SYNC_EVERY;
  }
}
