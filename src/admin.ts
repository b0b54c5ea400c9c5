/**
 * Admin operations. Writes run in the caller's transaction (`session`); reads take the
 * app or a postgres.js instance.
 *
 * @module
 */
import { cancelChannel, type Sql, type TransactionSql } from "./db.ts";
import { quoteSchema } from "./db.ts";
import { AkadzeError } from "./errors.ts";

/** Options of the admin functions. */
export interface AdminOptions {
  /** The schema of akadze's tables. Default `"akadze"`. */
  schema?: string;
}

/**
 * Request the cancellation of a queued or running job, in the caller's transaction. A
 * queued job is cancelled by the next claim pass; a running job's worker aborts its
 * signal (NOTIFY at commit, or at its next heartbeat) and the job ends cancelled. Other
 * states and unknown ids are a no-op. Returns whether a job was marked.
 *
 * @example
 * ```ts ignore
 * import { requestCancel } from "@akadze/akadze";
 * await app.sql.begin((tx) => requestCancel(tx, jobId));
 * ```
 */
export async function requestCancel(
  session: Sql | TransactionSql,
  jobId: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const rows = await session.unsafe(
    `with marked as (
       update ${s}.jobs set cancel_requested_at = coalesce(cancel_requested_at, now())
        where id = $1::bigint and state in ('queued', 'running')
       returning id, state)
     select m.id, (select pg_notify($2, m.id::text) where m.state = 'running') from marked m`,
    [normalizeId(jobId), cancelChannel(schema)],
  );
  return rows.length > 0;
}

/** A job id as the database takes it; `AkadzeError` for anything but a decimal id. */
export function normalizeId(jobId: string | number | bigint): string {
  const id = String(jobId);
  if (!/^[1-9]\d{0,18}$/.test(id) || BigInt(id) > 9223372036854775807n) {
    throw new AkadzeError(`job id must be a positive decimal integer, got ${JSON.stringify(id)}`);
  }
  return id;
}
