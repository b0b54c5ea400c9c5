/**
 * The pruner: deletes, in bounded batches, terminal jobs finished longer than `retention`
 * ago (a flow as a whole, never a job a live job depends on), old `periodic_runs` rows, and `limit_starts` marks outside their key's window. Rows
 * another session holds locked are skipped, never waited for: a transaction that keeps a
 * finished job locked (a `requeue` not yet committed) must not hold up the prune, nor the
 * worker's stop, which waits for the prune.
 *
 * @module
 */
import { quoteSchema, type Sql } from "../db.ts";
import { pruneStatements } from "../old_jobs.ts";
import { checkInteger } from "./config.ts";
import { logPruned, logPruneFailed } from "./log_events.ts";
import { Periodic } from "./periodic.ts";
import { settleWithin } from "./settle.ts";

/** Rows per DELETE, by default. */
export const PRUNE_BATCH_DEFAULT = 1000;
/** DELETE statements per table and pass at most, by default. */
export const PRUNE_MAX_BATCHES_DEFAULT = 10;
/** How often a worker prunes, by default (ms): `WORKER_DEFAULTS.pruneInterval`. */
export const PRUNE_INTERVAL_DEFAULT = 60_000;

/** Settings of a {@linkcode Pruner}. */
export interface PrunerConfig {
  /** The schema name. */
  schema: string;
  /** Keep terminal jobs this long (ms). */
  retention: number;
  /** Keep periodic_runs at least this long (ms): the schedules' grace. */
  grace: number;
  /** Rows per DELETE. Default {@linkcode PRUNE_BATCH_DEFAULT}. */
  batchSize?: number;
  /** DELETE statements per table and pass at most. Default {@linkcode PRUNE_MAX_BATCHES_DEFAULT}. */
  maxBatches?: number;
  /** How often {@linkcode Pruner.startIfDue} prunes (jittered ±10 %). Default {@linkcode PRUNE_INTERVAL_DEFAULT}. */
  interval?: number;
}

/** What one prune pass deleted. */
export interface PruneResult {
  /** Terminal jobs. */
  jobs: number;
  /** periodic_runs rows. */
  periodicRuns: number;
  /** limit_starts marks. */
  limitStarts: number;
}

/** Deletes old rows. */
export class Pruner extends Periodic<PruneResult> {
  #sql: Sql;
  #config: Required<Omit<PrunerConfig, "interval">>;
  #statements: { jobs: string; linkedJobs: string; periodicRuns: string; limitStarts: string };
  #pruning: Promise<void> | null = null;

  /** Make a pruner on a pool (it runs beside the loop, not on its connection). */
  constructor(sql: Sql, config: PrunerConfig) {
    super(config.interval ?? PRUNE_INTERVAL_DEFAULT);
    this.#sql = sql;
    this.#config = {
      schema: config.schema,
      retention: config.retention,
      grace: config.grace,
      batchSize: checkInteger("batchSize", config.batchSize ?? PRUNE_BATCH_DEFAULT, 1, 1e6),
      maxBatches: checkInteger(
        "maxBatches",
        config.maxBatches ?? PRUNE_MAX_BATCHES_DEFAULT,
        1,
        1e6,
      ),
    };
    const s = quoteSchema(config.schema);
    const jobs = pruneStatements(s, true);
    this.#statements = {
      jobs: jobs.plain,
      linkedJobs: jobs.linked,
      // By ctid: the rows are locked by the same statement, so their ctid cannot change.
      // Each schedule's last row stays (a backfill starts after it), and so does a row
      // inserted within the keep (a backfilled fire is old, but a worker still running the
      // same backfill pass must find it taken).
      periodicRuns: `delete from ${s}.periodic_runs where ctid operator(pg_catalog.=) any(array(
               select r.ctid from ${s}.periodic_runs r
                where r.fire_at operator(pg_catalog.<) (pg_catalog.now() operator(pg_catalog.-) ($1
                  operator(pg_catalog.*) interval '1 millisecond'))
                  and r.created_at operator(pg_catalog.<) (pg_catalog.now() operator(pg_catalog.-)
                    ($1 operator(pg_catalog.*) interval '1 millisecond'))
                  and exists (select 1 from ${s}.periodic_runs n
                               where n.name operator(pg_catalog.=) r.name and n.fire_at
                                 operator(pg_catalog.>) r.fire_at)
                limit $2
                for update of r skip locked))`,
      limitStarts: `delete from ${s}.limit_starts where ctid operator(pg_catalog.=) any(array(
               select m.ctid from ${s}.limit_starts m
                where not exists (select 1 from ${s}.limits l
                                   where l.key operator(pg_catalog.=) m.key
                                     and l."window" is not null
                                     and m.started_at operator(pg_catalog.>) (pg_catalog.now()
                                       operator(pg_catalog.-) l."window"))
                limit $1
                for update of m skip locked))`,
    };
  }

  /** Delete one bounded round of old rows from each table (logged `pruned`, debug). */
  async runOnce(): Promise<PruneResult> {
    const { retention, grace } = this.#config;
    const plain = await this.#drain(this.#statements.jobs, [retention]);
    // Flows and the jobs that others depend on, once the plain ones are drained: their scan
    // would read the plain backlog left over and find nothing in it.
    const linked = plain.drained
      ? await this.#drain(this.#statements.linkedJobs, [retention])
      : null;
    const pruned = {
      jobs: plain.total + (linked?.total ?? 0),
      // A fire older than the grace can never be enqueued again; keep a day for inspection.
      periodicRuns: (await this.#drain(this.#statements.periodicRuns, [
        Math.max(grace, 86_400_000),
      ])).total,
      limitStarts: (await this.#drain(this.#statements.limitStarts, [])).total,
    };
    logPruned(pruned);
    return pruned;
  }

  /** A run begins: its first prune comes at a random point within one interval. */
  override begin(): void {
    super.begin(Math.random() * this.interval);
  }

  /**
   * Start a prune beside the caller when one is due and none runs: deleting thousands of
   * old rows takes a while and no claim needs to wait for it. A failure is logged
   * (`prune_failed`); the next prune comes an interval later.
   */
  startIfDue(): void {
    if (this.#pruning !== null || !this.takeDue(0.9 + 0.2 * Math.random())) return;
    this.#pruning = this.runOnce().then(() => {}, logPruneFailed)
      .finally(() => this.#pruning = null);
  }

  /** Wait for a running prune, at most `ms`: one stuck on an unanswering database is left. */
  settle(ms: number): Promise<void> {
    return settleWithin(this.#pruning, ms);
  }

  /**
   * Run `text` up to `maxBatches` times while it takes a whole batch; `drained` when its
   * last run took less. A statement's count is its rows changed, or its row's `n`.
   */
  async #drain(text: string, params: number[]): Promise<{ total: number; drained: boolean }> {
    const { batchSize, maxBatches } = this.#config;
    let total = 0;
    for (let i = 0; i < maxBatches; i++) {
      const result = await this.#sql.unsafe(text, [...params, batchSize]);
      const count = result.length === 1 && "n" in result[0] ? Number(result[0].n) : result.count;
      total += count;
      if (count < batchSize) return { total, drained: true };
    }
    return { total, drained: false };
  }
}
