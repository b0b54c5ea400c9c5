/**
 * node-postgres (`npm:pg`) sessions: enqueue runs its statement on a `pg` client the
 * application already holds, recognised by shape, so akadze depends on no driver but
 * postgres.js.
 *
 * @module
 */

/**
 * A node-postgres client, as `task.using({ session })` accepts it: a `pg.Client`, or a
 * `PoolClient` from `pool.connect()`, inside the application's transaction (a rollback
 * removes the job), or a `pg.Pool` (the statement commits on its own). Anything whose
 * `query(text, values)` resolves to `{ rows }` fits.
 *
 * @example
 * ```ts ignore
 * import pg from "pg";
 *
 * const client = new pg.Client({ connectionString: Deno.env.get("DATABASE_URL") });
 * await client.connect();
 * await client.query("begin");
 * await hello.using({ session: client }).enqueue({ name: "ada" });
 * await client.query("commit");
 * ```
 */
export interface NodePostgresClient {
  /** Run one statement with `$1`, `$2`, ... parameters. */
  query(text: string, values: unknown[]): Promise<{ rows: unknown[] }>;
}

/** Whether `session` is a node-postgres client rather than a postgres.js instance. */
export function isNodePostgres(session: unknown): session is NodePostgresClient {
  const s = session as { query?: unknown; unsafe?: unknown } | null;
  return typeof s?.query === "function" && typeof s.unsafe !== "function";
}
