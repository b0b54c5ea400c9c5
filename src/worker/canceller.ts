/**
 * The canceller: ends queued jobs of this worker's queues that have a cancel request or a
 * passed expiry as `cancelled`. The claim never takes them; this records why they did not
 * run. A running job's cancel request goes to its run instead (listener, heartbeat).
 *
 * @module
 */
import { quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import { checkInteger } from "./config.ts";
import type { OnTransitionHook } from "../job.ts";
import { JOB_RETURNING, type JobRow, transitionOneByOne } from "./job_row.ts";
import { logJobState } from "./log_events.ts";
import { Periodic } from "./periodic.ts";

/** How many queued jobs one pass cancels at most, by default. */
export const CANCEL_BATCH_DEFAULT = 500;
/**
 * How often `runIfDue` cancels, by default (ms): at most once a second, so it does not
 * hold up the claim that the next NOTIFY asks for.
 */
export const CANCEL_INTERVAL_DEFAULT = 1_000;

/** Settings of a {@linkcode Canceller}. */
export interface CancellerConfig {
  /** The schema name. */
  schema: string;
  /** The queues whose jobs it cancels. */
  queues: readonly string[];
  /** `onTransition` hooks; with hooks, each cancel gets its own transaction. */
  hooks: readonly OnTransitionHook[];
  /** Jobs one pass cancels at most. Default {@linkcode CANCEL_BATCH_DEFAULT}. */
  batchSize?: number;
  /** How often `runIfDue` cancels (ms; 0: every pass). Default {@linkcode CANCEL_INTERVAL_DEFAULT}. */
  interval?: number;
}

/** What one cancel pass did. */
export interface CancelResult {
  /** Queued jobs cancelled (cancel requested or expired). */
  cancelled: number;
  /** Jobs whose cancel an onTransition hook rolled back. */
  rolledBack: number;
}

/** Cancels the queued jobs of one worker's queues. */
export class Canceller extends Periodic<CancelResult> {
  #sql: Sql;
  #config: Required<Omit<CancellerConfig, "interval">>;
  #cancel: string;

  /** Make a canceller (the worker gives it its loop's connection). */
  constructor(sql: Sql, config: CancellerConfig) {
    super(config.interval ?? CANCEL_INTERVAL_DEFAULT);
    const batchSize = checkInteger("batchSize", config.batchSize ?? CANCEL_BATCH_DEFAULT, 1, 1e6);
    this.#sql = sql;
    this.#config = { schema: config.schema, queues: config.queues, hooks: config.hooks, batchSize };
    this.#cancel = cancelStatement(quoteSchema(config.schema));
  }

  /** Cancel up to `batchSize` jobs; each is logged (`job_cancelled`). */
  async runOnce(): Promise<CancelResult> {
    const { queues, hooks, batchSize } = this.#config;
    const run = (sql: Sql | TransactionSql, n: number, excluded: string[]) =>
      sql.unsafe(this.#cancel, [queues as string[], n, excluded]) as unknown as Promise<
        JobRow[]
      >;
    // With hooks, one transition per transaction, so a hook error rolls back only that one.
    const { rows, rolledBack } = hooks.length === 0
      ? { rows: await run(this.#sql, batchSize, []), rolledBack: 0 }
      : await transitionOneByOne(this.#sql, hooks, batchSize, (tx, ex) => run(tx, 1, ex));
    for (const row of rows) logJobState(row, "queued");
    return { cancelled: rows.length, rolledBack };
  }
}

/** Cancel queued jobs: $1 queues, $2 how many, $3 excluded ids. */
function cancelStatement(s: string): string {
  return `
    update ${s}.jobs j set state = 'cancelled', finished_at = pg_catalog.now()
     where j.id operator(pg_catalog.=) any (
       select c.id from ${s}.jobs c
        where c.state operator(pg_catalog.=) 'queued' and c.queue
          operator(pg_catalog.=) any($1::pg_catalog.text[])
          and (c.cancel_requested_at is not null or c.expires_at operator(pg_catalog.<=)
            pg_catalog.now())
          and c.id operator(pg_catalog.<>) all($3::bigint[])
        limit $2
        for update skip locked)
    returning ${JOB_RETURNING}`;
}
