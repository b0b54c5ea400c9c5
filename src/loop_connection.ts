/**
 * The worker loop's own connection: the heartbeat, rescue, claim, cancel and schedule
 * statements run on one connection that is not taken from the app's pool. Tasks use that
 * pool too (`app.sql`, `completeTx`): jobs holding every pooled connection for longer than
 * the heartbeat TTL would otherwise keep the loop, and so its heartbeat, waiting for one,
 * and the worker would lose its lease while it is healthy.
 *
 * It is a postgres.js instance of one connection with the pool's own settings (server,
 * credentials, TLS, timeouts), opened on first use, reopened after it was reset or closed.
 *
 * @module
 */
import postgres from "postgres";
import type { Sql } from "./db.ts";

/** How long a closing connection may finish its statement before it is cut (seconds). */
const CLOSE_TIMEOUT = 1;

/** Instances derived from each pool and not yet ended, for {@linkcode closeLoopConnections}. */
const opened = new WeakMap<Sql, Set<Sql>>();

/** One worker's loop connection. */
export class LoopConnection {
  /** Forwards every use to the current instance (opening one when there is none). */
  readonly sql: Sql;
  #source: Sql;
  #current: Sql | null = null;

  /** Derive a loop connection from a pool (nothing is opened until it is used). */
  constructor(source: Sql) {
    this.#source = source;
    const current = () => this.#current ??= this.#open();
    // A function target, so that tagged-template calls (sql`...`) reach the instance too.
    this.sql = new Proxy((() => {}) as unknown as Sql, {
      apply: (_target, _this, args) => Reflect.apply(current() as never, undefined, args),
      get: (_target, key) => Reflect.get(current(), key),
    });
  }

  /**
   * Drop the current connection (it hangs: a statement did not answer in time); the next
   * use opens a new one instead of queueing behind the stuck statement.
   */
  reset(): void {
    const old = this.#current;
    this.#current = null;
    if (old) void end(this.#source, old, 0);
  }

  /** Close the current connection, letting a running statement finish for a moment. */
  async close(): Promise<void> {
    const old = this.#current;
    this.#current = null;
    if (old) await end(this.#source, old, CLOSE_TIMEOUT);
  }

  #open(): Sql {
    const options = (this.#source as unknown as { options?: Record<string, unknown> }).options;
    // Not a postgres.js pool as it knows them (say, a wrapper): share the pool after all.
    if (!options || typeof options !== "object" || !("shared" in options)) return this.#source;
    // As postgres.js derives its own LISTEN connection: the pool's parsed options, one
    // connection, without the pool's notification and close callbacks.
    const sql = postgres({
      ...options,
      max: 1,
      onnotify: undefined,
      onclose: undefined,
    } as unknown as postgres.Options<Record<string, never>>) as unknown as Sql;
    let set = opened.get(this.#source);
    if (!set) opened.set(this.#source, set = new Set());
    set.add(sql);
    return sql;
  }
}

/** End every loop connection derived from `source` that is still open (the app closes). */
export async function closeLoopConnections(source: Sql): Promise<void> {
  const set = opened.get(source);
  if (!set) return;
  await Promise.all([...set].map((sql) => end(source, sql, CLOSE_TIMEOUT)));
}

async function end(source: Sql, sql: Sql, timeout: number): Promise<void> {
  if (sql === source) return;
  try {
    await sql.end({ timeout });
  } catch {
    // Ending a broken connection can fail; it is gone either way.
  } finally {
    opened.get(source)?.delete(sql);
  }
}
