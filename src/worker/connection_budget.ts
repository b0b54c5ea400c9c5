/**
 * The connection budget: how many connections a worker process opens (its app's pool, the
 * loop's own connection, the LISTEN connection) against what the server has free, checked
 * once when a worker starts.
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import type { Sql } from "../db.ts";

/** What the server has, and what the workers being started will open. */
export interface ConnectionBudget {
  /** Worker processes being started (`--processes N`; 1 otherwise). */
  processes: number;
  /** The pool size of each process's app (`max`). */
  pool: number;
  /** LISTEN connections per process (0 with notify off). */
  listen: number;
  /** What one process opens at most: pool + 1 (the loop) + listen. */
  perProcess: number;
  /** What all of them open at most. */
  needed: number;
  /** The server's `max_connections`. */
  maxConnections: number;
  /** Slots this role may not use (the superuser-reserved ones; 0 for a superuser). */
  reserved: number;
  /** Client connections open now, not counting those of the processes being started. */
  inUse: number;
  /** What is left for them: maxConnections − reserved − inUse. */
  free: number;
}

/** The connections one worker process of `app` opens at most. */
export function connectionsPerProcess(app: Akadze): { pool: number; listen: number } {
  const max = (app.sql.options as { max?: unknown } | undefined)?.max;
  return { pool: typeof max === "number" && max > 0 ? max : 10, listen: app.notify ? 1 : 0 };
}

/**
 * Measure the budget of `processes` worker processes of `app`, asking its database.
 * Connections of this app's name opened since `sinceMs` ago (this process and its
 * siblings, started together) count as theirs, not as in use.
 */
export async function measureConnectionBudget(
  app: Akadze,
  processes: number,
  sinceMs: number,
): Promise<ConnectionBudget> {
  const { pool, listen } = connectionsPerProcess(app);
  const sql: Sql = app.sql;
  const options = app.sql.options as { connection?: { application_name?: unknown } };
  const name = options.connection?.application_name;
  const [row] = await sql`
    select pg_catalog.current_setting('max_connections')::int as max_connections,
           pg_catalog.current_setting('superuser_reserved_connections')::int
             operator(pg_catalog.+)
               ('0' operator(pg_catalog.||)
                coalesce(pg_catalog.current_setting('reserved_connections', true), ''))::int
             as reserved,
           coalesce((select rolsuper from pg_catalog.pg_roles where rolname
             operator(pg_catalog.=) current_user),
                    false) as superuser,
           (select pg_catalog.count(*)::int from pg_catalog.pg_stat_activity a
             where a.backend_type operator(pg_catalog.=) 'client backend'
               and not (a.application_name operator(pg_catalog.=) ${
    typeof name === "string" ? name : ""
  }
                        and a.backend_start operator(pg_catalog.>=) (pg_catalog.now()
                          operator(pg_catalog.-) (${sinceMs}
                            operator(pg_catalog.*) interval '1 millisecond'))))
             as in_use`;
  const perProcess = pool + 1 + listen;
  const reserved = row.superuser ? 0 : row.reserved;
  return {
    processes,
    pool,
    listen,
    perProcess,
    needed: processes * perProcess,
    maxConnections: row.max_connections,
    reserved,
    inUse: row.in_use,
    free: Math.max(0, row.max_connections - reserved - row.in_use),
  };
}

/** The warning for a budget that does not fit: what happens and what to change. */
export function budgetWarning(b: ConnectionBudget): string {
  const who = b.processes === 1 ? "this worker process" : `these ${b.processes} worker processes`;
  const each = `pool ${b.pool} + 1 for the worker loop${b.listen ? " + 1 for LISTEN" : ""}`;
  return `${who} may open ${b.needed} database connections (${
    b.processes === 1 ? "" : `${b.processes} × `
  }(${each})), but the server has ${b.free} free (max_connections ${b.maxConnections}` +
    `${b.reserved ? `, ${b.reserved} reserved` : ""}, ${b.inUse} in use by others). When ` +
    "they run out, connections are refused (too many clients) and the workers wait and " +
    "retry. Lower --pool-size (AKADZE_POOL_SIZE) or --processes, raise max_connections, or " +
    "put PgBouncer in front (see docs/production.md, Database connections)";
}
