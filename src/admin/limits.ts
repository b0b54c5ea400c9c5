/**
 * Operating limits from code: set, clear and list the limits of a `limitKey`, with their
 * current usage.
 *
 * @module
 */
import { atomically, explainMissingSchema, quoteSchema } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { jsonProblem } from "../json.ts";
import { INT4_MAX, isKeyLength, KEY_MAX_LENGTH, LIMIT_WINDOW_MAX } from "../rules.ts";
import { type AdminOptions, type Database, readTarget, type Session } from "./database.ts";

/** Limits of one key; `undefined` keeps the stored value, `null` removes it. */
export interface LimitOptions {
  /** At most this many jobs with the key run at once, cluster-wide. */
  maxRunning?: number | null;
  /** At most this many jobs with the key start per `window`. */
  maxStarts?: number | null;
  /** The rate window in milliseconds (with `maxStarts`). */
  window?: number | null;
}

/**
 * Set the limits of a `limitKey`, in the caller's transaction. Omitted fields keep their
 * previous values; `null` removes one. `maxStarts` and `window` go together.
 *
 * @example
 * ```ts ignore
 * import { setLimit } from "@akadze/akadze/admin";
 * await setLimit(app.sql, "smtp", { maxRunning: 5, maxStarts: 100, window: 60_000 });
 * ```
 */
export async function setLimit(
  session: Session,
  key: string,
  limits: LimitOptions,
  options: AdminOptions = {},
): Promise<LimitSummary> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  checkKey(key);
  if (typeof limits !== "object" || limits === null) {
    throw new AkadzeError("setLimit needs { maxRunning?, maxStarts?, window? }");
  }
  for (const name of Object.keys(limits)) {
    if (!["maxRunning", "maxStarts", "window"].includes(name)) {
      throw new AkadzeError(`unknown limit "${name}" (limits: maxRunning, maxStarts, window)`);
    }
  }
  const { maxRunning, maxStarts, window } = limits;
  if (maxRunning === undefined && maxStarts === undefined && window === undefined) {
    throw new AkadzeError("setLimit needs at least one of maxRunning, maxStarts, window");
  }
  for (const [name, value] of [["maxRunning", maxRunning], ["maxStarts", maxStarts]] as const) {
    if (value != null && (!Number.isInteger(value) || value < 1 || value > INT4_MAX)) {
      throw new AkadzeError(`${name} must be an integer from 1 to ${INT4_MAX}, got ${value}`);
    }
  }
  if (window != null && (!Number.isInteger(window) || window < 1 || window > LIMIT_WINDOW_MAX)) {
    throw new AkadzeError(
      `window must be a whole number of milliseconds up to a year, got ${window}`,
    );
  }
  const keep = (value: unknown) => value === undefined;
  const [row] = await explainMissingSchema(schema, () =>
    atomically(session, (tx) =>
      tx.unsafe(
        `insert into ${s}.limits as l (key, max_running, max_starts, "window")
       values ($1, $2::int, $4::int, $6::pg_catalog.float8
         operator(pg_catalog.*) interval '1 millisecond')
       on conflict (key) do update set
         max_running = case when $3 then l.max_running else excluded.max_running end,
         max_starts = case when $5 then l.max_starts else excluded.max_starts end,
         "window" = case when $7 then l."window" else excluded."window" end,
         updated_at = pg_catalog.now()
       returning ${limitColumns(s)}`,
        [
          key,
          maxRunning ?? null,
          keep(maxRunning),
          maxStarts ?? null,
          keep(maxStarts),
          window ?? null,
          keep(window),
        ],
      ).catch((error) => {
        if ((error as { code?: unknown }).code === "23514") {
          throw new AkadzeError(
            `limit "${key}": maxStarts and window must be set together (and removed together)`,
          );
        }
        throw error;
      })));
  return toLimit(row);
}

/**
 * Remove a key's limits and its start marks (idempotent): the key becomes unlimited, and a
 * later `setLimit` counts starts from zero. Returns whether a limits row existed.
 *
 * @example
 * ```ts ignore
 * import { clearLimit } from "@akadze/akadze/admin";
 * await clearLimit(app.sql, "smtp");
 * ```
 */
export async function clearLimit(
  session: Session,
  key: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  checkKey(key);
  const [row] = await explainMissingSchema(schema, () =>
    session.unsafe(
      `with gone as (delete from ${s}.limits where key operator(pg_catalog.=) $1 returning key),
            marks as (delete from ${s}.limit_starts where key operator(pg_catalog.=) $1)
       select pg_catalog.count(*)::int as n from gone`,
      [key],
    ));
  return row.n > 0;
}

/** A limits row with its current usage. */
export interface LimitSummary {
  /** The limit key. */
  key: string;
  /** Max running, or null. */
  maxRunning: number | null;
  /** Max starts per window, or null. */
  maxStarts: number | null;
  /** The window (ms), or null. */
  window: number | null;
  /** Jobs with the key running now. */
  running: number;
  /** Starts within the current window. */
  starts: number;
}

/** The columns of a {@linkcode LimitSummary}, for a limits row aliased `l`. */
function limitColumns(s: string): string {
  return `l.key, l.max_running, l.max_starts,
    (extract(epoch from l."window") operator(pg_catalog.*) 1000)::pg_catalog.float8 as window_ms,
    (select pg_catalog.count(*) from ${s}.jobs j where j.state operator(pg_catalog.=) 'running'
      and j.limit_key operator(pg_catalog.=) l.key)::int
      as running,
    (select pg_catalog.count(*) from ${s}.limit_starts m
      where m.key operator(pg_catalog.=) l.key and m.started_at operator(pg_catalog.>)
        (pg_catalog.now() operator(pg_catalog.-) l."window"))::int as starts`;
}

/**
 * Every limits row with its usage, by key.
 *
 * @example
 * ```ts ignore
 * import { listLimits } from "@akadze/akadze/admin";
 * console.table(await listLimits(app));
 * ```
 */
export async function listLimits(
  db: Database,
  options: AdminOptions = {},
): Promise<LimitSummary[]> {
  const [sql, s, schema] = readTarget(db, options);
  return await explainMissingSchema(schema, () => readLimits(sql, s));
}

/**
 * Every limits row with its usage, by key, in schema `s` (quoted): what
 * {@linkcode listLimits} returns and the metrics render.
 */
export async function readLimits(session: Session, s: string): Promise<LimitSummary[]> {
  const rows = await session.unsafe(`select ${limitColumns(s)} from ${s}.limits l order by l.key`);
  return rows.map(toLimit);
}

function checkKey(key: string): void {
  if (!isKeyLength(key)) {
    throw new AkadzeError(
      `limit key must be a non-empty string of at most ${KEY_MAX_LENGTH} characters`,
    );
  }
  // As enqueue checks limitKey: NUL cannot be stored, a lone surrogate would be mangled.
  const problem = jsonProblem(key, "limit key");
  if (problem) throw new AkadzeError(problem);
}

function toLimit(r: Record<string, unknown>): LimitSummary {
  return {
    key: r.key as string,
    maxRunning: r.max_running as number | null,
    maxStarts: r.max_starts as number | null,
    window: r.window_ms === null ? null : Math.round(r.window_ms as number),
    running: r.running as number,
    starts: r.starts as number,
  };
}
