/**
 * A run's progress reports (`ctx.progress`): written at most once per interval, the latest
 * value winning, one write at a time (so an older value never lands after a newer one),
 * each fenced on the run (run_count and state `running`), so a stale run cannot overwrite a
 * newer run's progress. The run's end waits for the last value to be written before its
 * outcome is handed on; `completeTx` writes it in its own transaction.
 *
 * @module
 */
import { quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import { logProgressWriteFailed } from "./log_events.ts";

/**
 * The shortest time between two progress writes of one run, by default (ms). Reports in
 * between are coalesced: the latest is written when the interval has passed.
 */
export const PROGRESS_INTERVAL_DEFAULT = 1_000;

/** The fenced progress UPDATE: $1 id, $2 run_count, $3 the JSON text. */
export function progressStatement(schema: string): string {
  return `update ${quoteSchema(schema)}.jobs set progress = $3::pg_catalog.text::pg_catalog.jsonb
     where id operator(pg_catalog.=) $1::bigint and run_count operator(pg_catalog.=) $2 and state
       operator(pg_catalog.=) 'running'`;
}

/** The progress of one run. */
export class ProgressReporter {
  #sql: Sql;
  #statement: string;
  #id: string;
  #runCount: number;
  #interval: number;
  #latest: string | null = null;
  #pending: string | null = null;
  #inflight: Promise<void> | null = null;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #lastWriteAt = -Infinity;
  #closed = false;

  /** Make the reporter of the run `runCount` of job `id`; `statement` from {@linkcode progressStatement}. */
  constructor(
    sql: Sql,
    statement: string,
    run: { id: string; runCount: number; interval?: number },
  ) {
    this.#sql = sql;
    this.#statement = statement;
    this.#id = run.id;
    this.#runCount = run.runCount;
    this.#interval = run.interval ?? PROGRESS_INTERVAL_DEFAULT;
  }

  /** Report `text` (JSON): written now, or when the interval since the last write passed. */
  report(text: string): void {
    if (this.#closed) return;
    this.#latest = text;
    this.#pending = text;
    if (this.#inflight !== null || this.#timer !== undefined) return;
    const wait = this.#lastWriteAt + this.#interval - performance.now();
    if (wait <= 0) return this.#start();
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#start();
    }, wait);
  }

  #start(): void {
    if (this.#closed || this.#pending === null) return;
    const text = this.#pending;
    this.#pending = null;
    this.#lastWriteAt = performance.now();
    this.#inflight = this.#write(this.#sql, text).finally(() => {
      this.#inflight = null;
      if (this.#pending !== null && !this.#closed) this.report(this.#pending);
    });
  }

  async #write(sql: Sql | TransactionSql, text: string): Promise<void> {
    try {
      await sql.unsafe(this.#statement, [this.#id, this.#runCount, text]);
    } catch (error) {
      logProgressWriteFailed(this.#id, error);
    }
  }

  /**
   * The run ended: no more writes; a promise that settles once the last value reported is
   * written (after the write in flight), or null when there is nothing left to write.
   */
  finish(): Promise<void> | null {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#inflight === null && this.#pending === null) return null;
    return (async () => {
      await this.#inflight;
      const text = this.#pending;
      this.#pending = null;
      if (text !== null) await this.#write(this.#sql, text);
    })();
  }

  /**
   * Inside `completeTx`, which holds the job's row lock: write the latest value in `tx`. A
   * write in flight either committed before the lock, or waits for it and then finds the
   * job no longer running; so does any write after the commit.
   */
  async writeIn(tx: TransactionSql): Promise<void> {
    if (this.#latest !== null) {
      await tx.unsafe(this.#statement, [this.#id, this.#runCount, this.#latest]);
    }
  }
}
