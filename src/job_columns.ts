/**
 * The columns of a job that akadze reads back, in one ordered table. Each read is a
 * selection of it, its SQL list and its decoding derived from it:
 *
 * - `claim`: what a claim returns (every claim path, and the `claim_one` and
 *   `claim_one_floor` functions of migrations 0001 and 0004, in this order, and the jobs the
 *   outcome write hands over, by name, in migration 0019: tests/job_columns_test.ts compares
 *   them), decoded by name by {@linkcode decodeClaimed};
 * - `row`: what the worker reads of a job whose state it changed (`JobRow`, worker/job_row.ts);
 * - `info`: the `JobInfo` given to hooks and handlers, made from a `row`;
 * - `summary`: `listJobs`'s `JobSummary` (admin/jobs.ts); `detail`: what `getJob` adds;
 * - `step`: a step of a job's flow, as `getJob` lists them with `includeFlow`.
 *
 * Column names are the table's (snake_case); `field` is the camelCase key of the
 * application's objects.
 *
 * @module
 */
import type { JobState } from "./job.ts";

/** Where a column is read; see the module documentation. */
export type JobRead = "claim" | "row" | "info" | "summary" | "detail" | "step";

/** The SQL types of the columns read, and how the reads decode them. */
interface SqlTypes {
  /** Read as its decimal text (`id::text`): a bigint does not fit a JavaScript number. */
  bigint: string;
  text: string;
  state: JobState;
  smallint: number;
  integer: number;
  /** A Date (the claim reads epoch milliseconds, cheaper to decode, see `decodeClaimed`). */
  timestamptz: Date;
  jsonb: unknown;
  boolean: boolean;
}

/** One column of {@linkcode JOB_COLUMNS}. */
export interface JobColumn {
  /** The column (or the key of a computed value), snake_case. */
  readonly name: string;
  /** The key in the application's objects (`JobInfo`, `JobSummary`), camelCase. */
  readonly field: string;
  /** Its type; `state` is a text column holding a `JobState`. */
  readonly type: keyof SqlTypes;
  /** Whether it may be null. */
  readonly nullable: boolean;
  /** The reads that include it. */
  readonly reads: readonly JobRead[];
  /** The SQL of a computed value on alias `j` (a column is read as itself). */
  readonly sql?: string;
}

/**
 * Every job column read, in the claim's order first (the claim functions' result columns),
 * then the rest.
 */
export const JOB_COLUMNS = [
  col("id", "bigint", false, ["claim", "row", "info", "summary", "step"]),
  col("task", "text", false, ["claim", "row", "info", "summary", "step"]),
  col("queue", "text", false, ["claim", "row", "info", "summary", "step"]),
  col("priority", "smallint", false, ["claim", "row", "info", "summary"]),
  col("attempt", "integer", false, ["claim", "row", "info", "summary", "step"]),
  col("run_count", "integer", false, ["claim", "row", "info", "summary"]),
  col("max_attempts", "integer", false, ["claim", "row", "info", "summary"]),
  col("snoozes", "integer", false, ["claim", "row", "info", "detail"]),
  col("run_at", "timestamptz", false, ["claim", "row", "info", "summary"]),
  col("expires_at", "timestamptz", true, ["claim", "row", "info", "summary"]),
  col("unique_key", "text", true, ["claim", "row", "info", "summary"]),
  col("limit_key", "text", true, ["claim", "row", "info", "summary"]),
  col("created_at", "timestamptz", false, ["claim", "row", "info", "summary"]),
  col("started_at", "timestamptz", true, ["claim", "row", "info", "summary"]),
  col("args", "jsonb", false, ["claim", "detail"]),
  col("worker_id", "text", true, ["row", "info", "summary"]),
  col("state", "state", false, ["row", "summary", "step"]),
  col("finished_at", "timestamptz", true, ["summary", "step"]),
  col("cancel_requested", "boolean", false, ["summary"], "j.cancel_requested_at is not null"),
  col("flow_id", "bigint", true, ["summary"]),
  col("step", "text", true, ["summary", "step"]),
  col("errors", "jsonb", false, ["detail"]),
  col("result", "jsonb", true, ["detail"]),
  col("progress", "jsonb", true, ["detail"]),
] as const;

type Columns = typeof JOB_COLUMNS;
type Index = keyof Columns & `${number}`;
type ColumnIn<R extends JobRead> = {
  [I in Index]: R extends Columns[I]["reads"][number] ? Columns[I] : never;
}[Index];
type Value<C extends JobColumn> = SqlTypes[C["type"]] | (C["nullable"] extends true ? null : never);

/** A row of read `R`, keyed by column name (as postgres.js returns it). */
export type RowOf<R extends JobRead> = { -readonly [C in ColumnIn<R> as C["name"]]: Value<C> };
/** An object of read `R`, keyed by field (camelCase), as the application sees it. */
export type FieldsOf<R extends JobRead> = {
  readonly [C in ColumnIn<R> as C["field"]]: Value<C>;
};

/** The columns of read `read`, in table order. */
export function columnsOf(read: JobRead): readonly JobColumn[] {
  return (JOB_COLUMNS as readonly JobColumn[]).filter((c) => c.reads.includes(read));
}

/** A column's value on alias `alias`, as the reads select it (domains cast to their base). */
function value(c: JobColumn, alias: string): string {
  if (c.sql) return c.sql.replaceAll("j.", `${alias}.`);
  const column = `${alias}.${c.name}`;
  switch (c.type) {
    case "bigint":
    case "text":
      return `${column}::pg_catalog.text`;
    case "jsonb":
      return `${column}::pg_catalog.jsonb`;
    default:
      return column;
  }
}

/**
 * The select list of read `read` on alias `alias` (`j` by default), each value named after
 * its column. The claim's timestamps are epoch milliseconds (float8).
 */
export function selectList(read: JobRead, alias = "j"): string {
  return columnsOf(read).map((c) => `${claimValue(c, alias, read)} as ${c.name}`).join(", ");
}

/** A column's value in read `read`: the claim's timestamps in epoch milliseconds. */
function claimValue(c: JobColumn, alias: string, read: JobRead): string {
  return read === "claim" && c.type === "timestamptz"
    ? `pg_catalog.date_part('epoch', ${alias}.${c.name}) operator(pg_catalog.*) 1000`
    : value(c, alias);
}

/**
 * The claim's values (alias `j`) without names, in order: the RETURNING list of the claim
 * functions, whose result columns name them ({@linkcode claimResultColumns}).
 */
export function claimValues(alias = "j"): string[] {
  return columnsOf("claim").map((c) => claimValue(c, alias, "claim"));
}

/** The claim functions' result columns, `name type` each, in order. */
export function claimResultColumns(): string[] {
  return columnsOf("claim").map((c) => {
    const type = c.type === "timestamptz"
      ? "double precision"
      : c.type === "bigint"
      ? "text"
      : c.type;
    return `${c.name} ${type}`;
  });
}

/** The claim's timestamp columns (epoch milliseconds, decoded to a Date). */
const CLAIM_TIMES = columnsOf("claim").filter((c) => c.type === "timestamptz").map((c) => c.name);

/**
 * Decode claimed rows in place, by column name, into a plain array: the epoch milliseconds
 * (float8, with a microsecond fraction) become Dates truncated to the millisecond like a
 * parsed timestamp (the half-microsecond nudge absorbs float error); `extra` (the known state
 * and worker) is added to each.
 */
export function decodeClaimed<E extends object>(
  rows: readonly Record<string, unknown>[],
  extra: E,
): (RowOf<"claim"> & E)[] {
  for (const row of rows) {
    for (const name of CLAIM_TIMES) {
      const ms = row[name] as number | null;
      row[name] = ms === null ? null : new Date(Math.floor(ms + 0.0005));
    }
    Object.assign(row, extra);
  }
  // A plain array (not the driver's result list, with its own properties).
  return [...rows] as unknown as (RowOf<"claim"> & E)[];
}

/** The object of read `read` (`info`, `summary`, `detail`) from a row keyed by column name. */
export function fieldsOf<R extends JobRead>(read: R, row: Record<string, unknown>): FieldsOf<R> {
  const out: Record<string, unknown> = {};
  for (const c of columnsOf(read)) out[c.field] = row[c.name];
  return out as FieldsOf<R>;
}

/** Whether `A` and `B` are the same type (for the checks below). */
export type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;

function col<
  const N extends string,
  const T extends keyof SqlTypes,
  const Null extends boolean,
  const R extends readonly JobRead[],
>(name: N, type: T, nullable: Null, reads: R, sql?: string) {
  return { name, field: camel(name), type, nullable, reads, ...(sql ? { sql } : {}) } as {
    readonly name: N;
    readonly field: Camel<N>;
    readonly type: T;
    readonly nullable: Null;
    readonly reads: R;
    readonly sql?: string;
  };
}

type Camel<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<Camel<T>>}`
  : S;

function camel<S extends string>(name: S): Camel<S> {
  return name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase()) as Camel<S>;
}
