/**
 * The rescuer: every worker puts back the running jobs of workers whose heartbeat is older
 * than their TTL (every pass), or whose row no longer exists (every RESCUE_FULL_EVERY): queued with an attempt spent (failed when
 * none remain), error `WorkerLost`. Then it removes stale worker rows that hold no jobs. A
 * worker that replaces a dead process puts back that process's jobs the same way as it
 * starts (`settleWorker`), with an error that says how the process ended.
 *
 * @module
 */
import { quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import { deadLetterArgs, type DeadLetterTarget } from "../dead_letter.ts";
import { columnsOf } from "../job_columns.ts";
import type { OnTransitionHook } from "../job.ts";
import { checkInteger } from "./config.ts";
import { applyTransitions, JOB_RETURNING, type JobRow } from "./job_row.ts";
import { blockSeconds, logRescued } from "./log_events.ts";
import type { LoopBlock, RunRef } from "./loop_blocks.ts";
import { HEARTBEAT_INTERVAL_DEFAULT } from "./heartbeat.ts";
import { Periodic } from "./periodic.ts";

/** How many jobs one pass rescues at most, by default. */
export const RESCUE_BATCH_DEFAULT = 1000;
/**
 * How often a pass also looks at every running job for one whose worker row is gone (ms);
 * the other passes start from the stale worker rows. A row is removed only with no job
 * running under it (a clean stop, or stale), so a job runs under a gone row only when its
 * worker claimed after its row was removed as stale (frozen or cut off past its TTL, then
 * back) and died before its next beat put the row back or its lost lease put the job back,
 * or when rows are deleted by hand.
 */
export const RESCUE_FULL_EVERY = 60_000;

/** Settings of a {@linkcode Rescuer}. */
export interface RescuerConfig {
  /** The schema name. */
  schema: string;
  /** `onTransition` hooks; with hooks, each rescue gets its own transaction. */
  hooks: readonly OnTransitionHook[];
  /** Jobs one pass rescues at most. Default {@linkcode RESCUE_BATCH_DEFAULT}. */
  batchSize?: number;
  /** How often `runIfDue` rescues (ms; the worker's heartbeatInterval). Default 5000. */
  interval?: number;
  /** How often a pass looks at every running job (ms). Default {@linkcode RESCUE_FULL_EVERY}. */
  fullEvery?: number;
  /** The dead-letter targets of the app's tasks, by task name. */
  deadLetters?: ReadonlyMap<string, DeadLetterTarget>;
}

/** What one rescue pass did. */
export interface RescueResult {
  /** Jobs put back (queued, or failed when no attempt was left). */
  rescued: number;
  /** Of those, the jobs that failed. */
  failed: number;
  /** Stale worker rows removed. */
  removedWorkers: number;
}

/** Rescues the jobs of dead workers. */
export class Rescuer extends Periodic<RescueResult> {
  #sql: Sql;
  #hooks: readonly OnTransitionHook[];
  #find: Record<RescueKind, string>;
  #rescue: Record<RescueKind, string>;
  #removeStale: string;
  #chargeBlock: string;
  /** The dead-letter targets as the rescue's parameters: tasks, their targets, the queues. */
  #deadLetters: [string[], string[], string[]] | [null, null, null];
  #fullEvery: number;
  #fullAt = -Infinity;

  /** Make a rescuer (the worker gives it its loop's connection). */
  constructor(sql: Sql, config: RescuerConfig) {
    super(config.interval ?? HEARTBEAT_INTERVAL_DEFAULT);
    const batch = checkInteger("batchSize", config.batchSize ?? RESCUE_BATCH_DEFAULT, 1, 1e6);
    this.#sql = sql;
    this.#hooks = config.hooks;
    const targets = [...(config.deadLetters ?? new Map<string, DeadLetterTarget>())];
    // No targets: NULLs (unnest yields no row), since an empty list is sent as text.
    this.#deadLetters = targets.length === 0 ? [null, null, null] : [
      targets.map(([task]) => task),
      targets.map(([, t]) => t.task),
      targets.map(([, t]) => t.queue),
    ];
    this.#fullEvery = config.fullEvery ?? RESCUE_FULL_EVERY;
    const s = quoteSchema(config.schema);
    // A job is lost when its worker's heartbeat is older than that worker's own TTL
    // (database clock): found from the stale worker rows through the worker_id index, for
    // a scan of every running job visits every dead entry an old snapshot keeps.
    // (An array of their ids, not a join, which the planner may turn into that scan.)
    const stale = `${s}.jobs c where c.state operator(pg_catalog.=) 'running' and c.worker_id
        operator(pg_catalog.=) any(array(
        select w.id from ${s}.workers w
         where w.heartbeat_at operator(pg_catalog.<) (pg_catalog.now() operator(pg_catalog.-)
           (w.heartbeat_ttl_ms operator(pg_catalog.*) interval '1 millisecond'))))`;
    // ...or when its worker row is gone: that needs the whole scan.
    const full = `${s}.jobs c where c.state operator(pg_catalog.=) 'running' and not exists (
        select 1 from ${s}.workers w
         where w.id operator(pg_catalog.=) c.worker_id
           and w.heartbeat_at operator(pg_catalog.>=) (pg_catalog.now() operator(pg_catalog.-)
             (w.heartbeat_ttl_ms operator(pg_catalog.*) interval '1 millisecond')))`;
    // ...or, for the worker that settles what a dead process left (settleWorker), its jobs.
    const worker = (id: string) =>
      `${s}.jobs c where c.state operator(pg_catalog.=) 'running' and c.worker_id
        operator(pg_catalog.=) ${id}`;
    const find = (from: string) => `select c.id::pg_catalog.text as id from ${from} limit ${batch}`;
    // A job the rescue fails (its last attempt was lost) gets its task's dead letter in the
    // same statement ($2..$4: task, dead-letter task, its queue).
    const names = columnsOf("row").map((c) => c.name).join(", ");
    // Worded as rescueMessage() says: chargeBlock finds the entry by it.
    const lostEntry = `'WorkerLost', 'message', 'worker ' operator(pg_catalog.||) lost.worker_id
          operator(pg_catalog.||) ' stopped heartbeating during the run'`;
    // How the process ended ($6: the error's name, $7: its message).
    const endedEntry = `$6::pg_catalog.text, 'message', $7::pg_catalog.text`;
    const rescue = (from: string, entry: string) => `
      with lost as (
        select c.id, c.worker_id from ${from}
           and ($1::bigint[] is null or c.id operator(pg_catalog.=) any($1::bigint[]))
         limit ${batch}
         for update of c skip locked),
      upd as (update ${s}.jobs j set
        attempt = j.attempt operator(pg_catalog.+) 1,
        -- A lost run is a retry: queued again, or failed when no attempt is left. A cancel
        -- request is left to the cancel pass (queued) or kept on the failed job.
        state = ${s}.outcome_state(false, 'retry', j.attempt, j.max_attempts),
        run_at = pg_catalog.now(),
        finished_at = case when ${s}.outcome_state(false, 'retry', j.attempt, j.max_attempts)
                                operator(pg_catalog.=) 'queued'
                           then null else pg_catalog.now() end,
        -- worker_id stays: the lost worker ran this attempt.
        errors = ${s}.append_error(j.errors, pg_catalog.jsonb_build_object('error', ${entry},
          'attempt', j.attempt operator(pg_catalog.+) 1, 'worker', lost.worker_id))
      from lost where j.id operator(pg_catalog.=) lost.id
      returning ${JOB_RETURNING}, ${deadLetterArgs("j")} as dead_args),
      dead as (
        insert into ${s}.jobs (task, queue, args)
        select d.dead_task, d.dead_queue, upd.dead_args
          from upd join rows from (pg_catalog.unnest($2::pg_catalog.text[]),
            pg_catalog.unnest($3::pg_catalog.text[]),
              pg_catalog.unnest($4::pg_catalog.text[])) as d(task, dead_task, dead_queue)
            on d.task operator(pg_catalog.=) upd.task
         where upd.state operator(pg_catalog.=) 'failed')
      select ${names} from upd`;
    this.#find = {
      stale: find(stale),
      full: find(full),
      worker: find(worker("$1::pg_catalog.text")),
    };
    this.#rescue = {
      stale: rescue(stale, lostEntry),
      full: rescue(full, lostEntry),
      worker: rescue(worker("$5::pg_catalog.text"), endedEntry),
    };
    // The last rescue entry naming this worker, on a job whose run no longer owns it, is
    // re-worded (matched by value: a write meanwhile may shift the list); a bystander's
    // attempt is given back unless the rescue failed the job.
    this.#chargeBlock = `
      with o as (
        select * from rows from (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::integer[]),
          pg_catalog.unnest($4::pg_catalog.text[]::boolean[]))
          as o(id, run_count, culprit)),
      hit as (
        select j.id, o.culprit,
               (select t.e from pg_catalog.jsonb_array_elements(j.errors) with ordinality t(e, i)
                 where t.e operator(pg_catalog.->>) 'error' operator(pg_catalog.=) 'WorkerLost'
                   and t.e operator(pg_catalog.->>) 'message' operator(pg_catalog.=) $5
                 order by t.i desc limit 1) as entry
          from ${s}.jobs j join o on j.id operator(pg_catalog.=) o.id
         where j.run_count operator(pg_catalog.>) o.run_count or j.state
           operator(pg_catalog.<>) 'running'
            or j.worker_id is null or j.worker_id operator(pg_catalog.<>) $1)
      update ${s}.jobs j set
        errors = (select pg_catalog.jsonb_agg(case when t.e operator(pg_catalog.=) hit.entry
                                        then t.e operator(pg_catalog.||)
                                          pg_catalog.jsonb_build_object(
                                               'error', case when hit.culprit
                                                             then 'LoopBlocked'
                                                             else 'WorkerLost' end,
                                               'message', case when hit.culprit then $6 else $7 end)
                                        else t.e end order by t.i)
                    from pg_catalog.jsonb_array_elements(j.errors) with ordinality t(e, i)),
        attempt = case when hit.culprit or j.state operator(pg_catalog.=) 'failed' then j.attempt
                       else greatest(j.attempt operator(pg_catalog.-) 1, 0) end
      from hit where j.id operator(pg_catalog.=) hit.id and hit.entry is not null
      returning j.id::pg_catalog.text as id, hit.culprit`;
    this.#removeStale = `
      delete from ${s}.workers w
       where w.heartbeat_at operator(pg_catalog.<) (pg_catalog.now() operator(pg_catalog.-)
         (w.heartbeat_ttl_ms operator(pg_catalog.*) interval '1 millisecond'))
         and not exists (select 1 from ${s}.jobs j where j.worker_id operator(pg_catalog.=) w.id
           and j.state operator(pg_catalog.=) 'running')`;
  }

  /**
   * Rescue lost jobs (each logged `job_rescued`), then remove stale worker rows. The jobs
   * of stale workers always; with `full` (by default the first pass and then every
   * `fullEvery`), also those whose worker row is gone.
   */
  async runOnce(options: { full?: boolean } = {}): Promise<RescueResult> {
    const now = performance.now();
    const full = options.full ?? now - this.#fullAt >= this.#fullEvery;
    const rescued = await this.#rescueJobs(full ? "full" : "stale", null, []);
    if (full) this.#fullAt = now;
    const removed = await this.#sql.unsafe(this.#removeStale);
    for (const row of rescued) logRescued(row);
    return {
      rescued: rescued.length,
      failed: rescued.filter((row) => row.state === "failed").length,
      removedWorkers: removed.count,
    };
  }

  /**
   * After a block of worker `workerId`'s event loop long enough to cost its lease: the
   * rescues of its jobs meanwhile are charged truthfully. The blocking job keeps its spent
   * attempt with a `LoopBlocked` error naming the block and its length (each job on the loop
   * does when the worker cannot tell which one it was); the jobs that were merely in the
   * worker, and the sandboxed ones, whose handlers run off the loop, get that attempt back.
   * Returns how many of each were re-worded.
   */
  async chargeBlock(
    workerId: string,
    block: LoopBlock,
  ): Promise<{ charged: number; refunded: number }> {
    const runs = [...(block.culprit ? [block.culprit] : []), ...block.bystanders, ...block.outside];
    if (runs.length === 0) return { charged: 0, refunded: 0 };
    const seconds = blockSeconds(block.ms);
    const suspect = (r: RunRef) =>
      r === block.culprit || (block.culprit === null && block.bystanders.includes(r));
    const blocked = block.culprit
      ? `job ${block.culprit.id} blocked its event loop`
      : block.bystanders.length > 0
      ? "a job blocked its event loop"
      : "its event loop was held";
    const rows = await this.#sql.unsafe(this.#chargeBlock, [
      workerId,
      runs.map((r) => r.id),
      runs.map((r) => r.runCount),
      // As text: postgres.js sends a JS array of booleans as one boolean.
      runs.map((r) => String(suspect(r))),
      rescueMessage(workerId),
      `the run blocked the event loop of worker ${workerId} for ${seconds} s, past its ` +
      "heartbeat lease, so the job was rescued as from a dead worker; run CPU-bound work " +
      "outside the worker's loop",
      `worker ${workerId} stopped heartbeating during the run: ${blocked} for ${seconds} s; ` +
      "this attempt is not counted",
    ]);
    const charged = rows.filter((r) => r.culprit).length;
    return { charged, refunded: rows.length - charged };
  }

  /**
   * Settle at once the jobs that worker `workerId`, whose process ended (`ended`: how, in
   * words), left running: each is charged an attempt (failed when none is left, with its
   * dead letter) with error `errorName` saying how the process ended. The worker that
   * replaces that process (the next one of its supervisor's slot, or a restart under its
   * fixed id) calls it as it starts, instead of waiting for the lease to lapse. Logged
   * `job_rescued`; returns the jobs.
   */
  async settleWorker(workerId: string, errorName: string, ended: string): Promise<JobRow[]> {
    const ids = (await this.#sql.unsafe(this.#find.worker, [workerId])).map((r) => r.id as string);
    if (ids.length === 0) return [];
    const others = ids.length === 2 ? "another job" : `${ids.length - 1} other jobs`;
    const message = ids.length === 1 ? `${ended} during this run` : `${ended} while it also ran ` +
      `${others}: which one ended it is unknown, so each is charged an attempt`;
    const rows = await this.#rescueJobs("worker", ids, [workerId, errorName, message]);
    for (const row of rows) logRescued(row);
    return rows;
  }

  /**
   * One rescue of `kind` (`more`: its parameters from $5), of the jobs `ids` when given,
   * through the hooks if any.
   */
  async #rescueJobs(kind: RescueKind, ids: string[] | null, more: string[]): Promise<JobRow[]> {
    if (this.#hooks.length === 0) return await this.#statement(this.#sql, kind, ids, more);
    ids ??= (await this.#sql.unsafe(this.#find[kind])).map((r) => r.id as string);
    return (await applyTransitions(
      this.#sql,
      this.#hooks,
      ids,
      () => "running",
      (tx, items) => this.#statement(tx, kind, items, more),
    )).rows;
  }

  async #statement(
    tx: Sql | TransactionSql,
    kind: RescueKind,
    ids: readonly string[] | null,
    more: string[],
  ): Promise<JobRow[]> {
    return await tx.unsafe(this.#rescue[kind], [
      ids as string[] | null,
      ...this.#deadLetters,
      ...more,
    ] as never) as unknown as JobRow[];
  }
}

/** Whose jobs a rescue looks at: stale workers', gone workers', or one dead process's. */
type RescueKind = "stale" | "full" | "worker";

/** The stored error message of a rescue from worker `workerId` (as the rescue writes it). */
function rescueMessage(workerId: string): string {
  return `worker ${workerId} stopped heartbeating during the run`;
}
