/**
 * The worker loop's own connection: the heartbeat, rescue, claim, cancel and schedule
 * statements run on one connection that is not taken from the app's pool. Tasks use that
 * pool too (`app.sql`, `completeTx`): jobs holding every pooled connection for longer than
 * the heartbeat TTL would otherwise keep the loop, and so its heartbeat, waiting for one,
 * and the worker would lose its lease while it is healthy.
 *
 * It is a postgres.js instance of one connection with the pool's own settings (server,
 * credentials, TLS, timeouts), opened on first use, reopened after it was reset or closed.
 * Where the database's session defaults are not what the worker's statements need (see
 * worker/session_settings.ts), {@linkcode LoopConnection.use} reopens it with startup
 * parameters that set them for this connection only.
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
  /** The statements made since {@linkcode LoopConnection.forget}. */
  #made = new Set<unknown>();
  /** Startup parameters of the connections it opens, and those a pooler refused. */
  #settings: Record<string, string> = {};
  #refused = new Set<string>();
  #onRefused: ((name: string) => void) | null = null;

  /** Derive a loop connection from a pool (nothing is opened until it is used). */
  constructor(source: Sql) {
    this.#source = source;
    const current = () => this.#current ??= this.#open();
    const unsafe = (...args: unknown[]) =>
      this.#track(Reflect.apply(current().unsafe as never, current(), args));
    // A function target, so that tagged-template calls (sql`...`) reach the instance too.
    this.sql = new Proxy((() => {}) as unknown as Sql, {
      apply: (_target, _this, args) =>
        this.#track(Reflect.apply(current() as never, undefined, args)),
      get: (_target, key) => key === "unsafe" ? unsafe : Reflect.get(current(), key),
    });
  }

  /**
   * Forget the statements made so far (they have answered): {@linkcode reset} cancels only
   * those made since. The worker calls it at the start of each pass of its loop.
   */
  forget(): void {
    this.#made.clear();
  }

  /**
   * Drop the current connection (it hangs: a statement did not answer in time); the next
   * use opens a new one instead of queueing behind the stuck statement. The statements made
   * since {@linkcode forget} that still run are cancelled on the server first (best effort),
   * so that one waiting on a lock does not commit later, unseen: a claim would leave its
   * jobs running under this worker with no run of theirs.
   */
  reset(): void {
    for (const query of this.#made) cancel(query);
    this.#made.clear();
    void this.#detach(0);
  }

  #track<T>(query: T): T {
    if (query && typeof query === "object") this.#made.add(query);
    return query;
  }

  /**
   * From now on, open the connection with these startup parameters too, and close the current
   * one, letting its statement finish for a moment. Returns false when it has them already
   * (or a pooler refused them). Nothing changes where the pool is not one this can derive a
   * connection from. A connection pooler may refuse a parameter (PgBouncer passes on only a
   * few): the connection then goes on without it, and `onRefused` is told its name.
   */
  use(settings: Record<string, string>, onRefused?: (name: string) => void): boolean {
    const added = Object.entries(settings).filter(([name, value]) =>
      !this.#refused.has(name) && this.#settings[name] !== value
    );
    if (added.length === 0) return false;
    Object.assign(this.#settings, Object.fromEntries(added));
    this.#onRefused = onRefused ?? null;
    void this.#detach(CLOSE_TIMEOUT);
    return true;
  }

  /** Close the current connection, letting a running statement finish for a moment. */
  async close(): Promise<void> {
    await this.#detach(CLOSE_TIMEOUT);
  }

  /** Let go of the current connection (the next use opens another) and end it (`end`). */
  #detach(timeout: number): Promise<void> {
    const old = this.#current;
    this.#current = null;
    return old ? end(this.#source, old, timeout) : Promise.resolve();
  }

  #open(): Sql {
    const options = (this.#source as unknown as { options?: Record<string, unknown> }).options;
    // Not a postgres.js pool as it knows them (say, a wrapper): share the pool after all.
    if (!options || typeof options !== "object" || !("shared" in options)) return this.#source;
    // As postgres.js derives its own LISTEN connection: the pool's parsed options, one
    // connection, without the pool's notification and close callbacks.
    const connection = options.connection as Record<string, unknown> | undefined;
    const sql = postgres({
      ...options,
      max: 1,
      connection: { ...connection, ...this.#settings },
      onnotify: undefined,
      onclose: undefined,
    } as unknown as postgres.Options<Record<string, never>>) as unknown as Sql;
    // The first statement on it: where a parameter is refused, the statements queued behind
    // it fail with the same (transient) error, and the next use opens one without it.
    if (Object.keys(this.#settings).length > 0) {
      sql`select 1`.catch((error) => {
        const name = refusedParameter(error);
        if (name === null || !(name in this.#settings)) return;
        delete this.#settings[name];
        this.#refused.add(name);
        if (this.#current === sql) void this.#detach(CLOSE_TIMEOUT);
        this.#onRefused?.(name);
      });
    }
    let set = opened.get(this.#source);
    if (!set) opened.set(this.#source, set = new Set());
    set.add(sql);
    return sql;
  }
}

/** The name in a pooler's refusal of a startup parameter (PgBouncer's words), or null. */
function refusedParameter(error: unknown): string | null {
  const found = /unsupported startup parameter:\s*(\S+)/i.exec(String((error as Error)?.message));
  return found ? found[1] : null;
}

/** End every loop connection derived from `source` that is still open (the app closes). */
export async function closeLoopConnections(source: Sql): Promise<void> {
  const set = opened.get(source);
  if (!set) return;
  await Promise.all([...set].map((sql) => end(source, sql, CLOSE_TIMEOUT)));
}

/**
 * Cancel a statement that runs on the server (postgres.js's own cancel request, on a
 * connection of its own), ignoring a failure: the server may be the reason it hangs. One not
 * yet sent is left to the connection's end, which fails it.
 */
function cancel(query: unknown): void {
  const q = query as { active?: boolean; canceller?: ((q: unknown) => unknown) | null };
  if (q.active !== true || typeof q.canceller !== "function") return;
  const request = q.canceller(q);
  q.canceller = null;
  (request as Promise<unknown> | undefined)?.catch?.(() => {});
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
