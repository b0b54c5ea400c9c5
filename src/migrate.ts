/**
 * Schema migrations: the SQL files of `migrations/`, embedded with text imports so they
 * travel with a checkout, the JSR package and a compiled binary.
 *
 * @module
 */
import init from "../migrations/0001_init.sql" with { type: "text" };
import limitKeyOrder from "../migrations/0002_limit_key_order.sql" with { type: "text" };
import sqlEnqueue from "../migrations/0003_sql_enqueue.sql" with { type: "text" };
import claimFloor from "../migrations/0004_claim_floor.sql" with { type: "text" };
import searchPath from "../migrations/0005_search_path.sql" with { type: "text" };
import sqlArgsSize from "../migrations/0006_sql_args_size.sql" with { type: "text" };
import awaitProgress from "../migrations/0007_await_progress.sql" with { type: "text" };
import flows from "../migrations/0008_flows.sql" with { type: "text" };
import flowIndexes from "../migrations/0009_flow_indexes.sql" with { type: "text" };
import traceContext from "../migrations/0010_trace_context.sql" with { type: "text" };
import flowOps from "../migrations/0011_flow_ops.sql" with { type: "text" };
import attemptWorkerDeadLetters from "../migrations/0012_attempt_worker_dead_letters.sql" with {
  type: "text",
};
import flowSpeed from "../migrations/0014_flow_speed.sql" with { type: "text" };
import uniqueKeyModes from "../migrations/0015_unique_key_modes.sql" with { type: "text" };
import handOff from "../migrations/0016_hand_off.sql" with { type: "text" };
import flowTraceContext from "../migrations/0018_flow_trace_context.sql" with { type: "text" };
import flowStepsHandOff from "../migrations/0019_flow_steps_hand_off.sql" with {
  type: "text",
};
import limitHandOff from "../migrations/0020_limit_hand_off.sql" with { type: "text" };
import flowEnqueueSpeed from "../migrations/0023_flow_enqueue_speed.sql" with { type: "text" };
import completePlain from "../migrations/0024_complete_plain.sql" with { type: "text" };
import finiteTimes from "../migrations/0025_finite_times.sql" with { type: "text" };
import {
  connect,
  DEFAULT_SCHEMA,
  describeError,
  quoteSchema,
  type Sql,
  type TransactionSql,
  urlPassword,
} from "./db.ts";
import { MigrateError } from "./errors.ts";

/** One schema version: its name and SQL (with `{{schema}}` placeholders). */
export interface Migration {
  version: string;
  sql: string;
}

/**
 * Every schema version, in the order they apply.
 *
 * They are applied while workers of the previous release run (a rolling deploy), so each
 * must be safe under load. A version runs in its own transaction with a short
 * `lock_timeout` (rolled back and retried when it cannot get a lock in time), so nothing
 * waits behind it for longer than that: a version that needs a strong lock takes it first
 * (`LOCK TABLE ... IN ... MODE` as its first statement), since a lock it upgrades later can
 * deadlock with a transaction that locked a row in between. A version whose statements
 * contain `CONCURRENTLY` runs outside a transaction instead, one statement at a time: it may
 * hold only `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS` and
 * `DROP INDEX CONCURRENTLY IF EXISTS` statements (each may run again after a failure), and is
 * how an index on a big table (jobs) is built without holding back its writes.
 */
export const MIGRATIONS: readonly Migration[] = [
  { version: "0001_init", sql: init },
  { version: "0002_limit_key_order", sql: limitKeyOrder },
  { version: "0003_sql_enqueue", sql: sqlEnqueue },
  { version: "0004_claim_floor", sql: claimFloor },
  { version: "0005_search_path", sql: searchPath },
  { version: "0006_sql_args_size", sql: sqlArgsSize },
  { version: "0007_await_progress", sql: awaitProgress },
  { version: "0008_flows", sql: flows },
  { version: "0009_flow_indexes", sql: flowIndexes },
  { version: "0010_trace_context", sql: traceContext },
  { version: "0011_flow_ops", sql: flowOps },
  { version: "0012_attempt_worker_dead_letters", sql: attemptWorkerDeadLetters },
  { version: "0014_flow_speed", sql: flowSpeed },
  { version: "0015_unique_key_modes", sql: uniqueKeyModes },
  { version: "0016_hand_off", sql: handOff },
  { version: "0018_flow_trace_context", sql: flowTraceContext },
  { version: "0019_flow_steps_hand_off", sql: flowStepsHandOff },
  { version: "0020_limit_hand_off", sql: limitHandOff },
  { version: "0023_flow_enqueue_speed", sql: flowEnqueueSpeed },
  { version: "0024_complete_plain", sql: completePlain },
  { version: "0025_finite_times", sql: finiteTimes },
];

/** Options of {@linkcode migrate}. */
export interface MigrateOptions {
  /** The schema that holds akadze's tables. Default `"akadze"`. */
  schema?: string;
  /**
   * How long a version waits for a lock before it is rolled back and tried again, in ms
   * (`lock_timeout`): the longest that enqueues and claims wait behind a migration.
   * Default 500.
   */
  lockTimeout?: number;
  /**
   * For how long a version whose lock wait timed out (or that deadlocked) is tried again,
   * in ms, with a growing pause between tries; after that migrate fails. Default 300000.
   */
  retryFor?: number;
  /** Called before each pause of a retry (the CLI prints it). */
  onRetry?: (retry: MigrateRetry) => void;
}

/** A version that is rolled back and tried again, as {@linkcode MigrateOptions.onRetry} gets it. */
export interface MigrateRetry {
  /** The version. */
  version: string;
  /** Tries so far (1 after the first). */
  attempt: number;
  /** The pause before the next try, in ms. */
  delay: number;
  /** Why the try failed: the database's message. */
  reason: string;
}

/** The defaults of {@linkcode MigrateOptions}: `lockTimeout` and `retryFor` in ms. */
export const MIGRATE_DEFAULT = { lockTimeout: 500, retryFor: 300_000 } as const;

/**
 * What a failed try of a version has to say for it to be tried again: a lock wait that
 * timed out (55P03), a deadlock (40P01); for a concurrent index build also the race of
 * two runs creating the same index (42P07, 23505) and another run's build in progress.
 */
const RETRIED = new Set(["55P03", "40P01"]);
const RETRIED_CONCURRENT = new Set([...RETRIED, "42P07", "23505", "AKBUILD"]);

/**
 * The versions this release knows, oldest first.
 *
 * @example
 * ```ts
 * console.log(knownVersions()); // ["0001_init", ...]
 * ```
 */
export function knownVersions(): string[] {
  return MIGRATIONS.map((m) => m.version);
}

/**
 * Bring the schema up to date: creates it when missing and applies each pending version
 * once, each in its own transaction under a transaction-scoped advisory lock, so
 * concurrent callers (several workers deploying at once) are safe. It is meant to run
 * while workers of the previous release work: a version waits at most `lockTimeout` for a
 * lock (so enqueues and claims wait at most that long behind it), else it is rolled back
 * and tried again for up to `retryFor`; indexes on the jobs table are built concurrently
 * (see {@linkcode MIGRATIONS}). Versions applied before one that fails stay applied.
 * Returns the versions applied now (empty when the schema was up to date).
 *
 * @example
 * ```ts ignore
 * import { migrate } from "@akadze/akadze/admin";
 * const applied = await migrate(Deno.env.get("AKADZE_DATABASE_URL")!, {
 *   lockTimeout: 500, // ms, the default
 *   onRetry: (r) => console.error(`${r.version}: ${r.reason}; again in ${r.delay} ms`),
 * });
 * console.log(applied.length ? applied : "schema up to date");
 * ```
 */
export async function migrate(
  database: string | Sql,
  options: MigrateOptions = {},
): Promise<string[]> {
  return await applyMigrations(database, MIGRATIONS, options);
}

/**
 * Apply the given migrations (the mechanism behind {@linkcode migrate}; tests use it with
 * their own lists).
 */
export async function applyMigrations(
  database: string | Sql,
  migrations: readonly Migration[],
  options: MigrateOptions = {},
): Promise<string[]> {
  const name = options.schema ?? DEFAULT_SCHEMA;
  const schema = quoteSchema(name);
  const lockTimeout = positiveMs("lockTimeout", options.lockTimeout, MIGRATE_DEFAULT.lockTimeout);
  const retryFor = positiveMs("retryFor", options.retryFor, MIGRATE_DEFAULT.retryFor);
  for (const migration of migrations) concurrentStatements(migration);
  return await withSql(database, async (sql) => {
    let current = "";
    try {
      await retrying(
        () =>
          sql.begin(async (tx) => {
            for (const statement of preamble(schema)) await tx.unsafe(statement);
          }),
        RETRIED,
        retryFor,
        "the version table",
        options.onRetry,
      );
      const applied: string[] = [];
      for (const migration of migrations) {
        current = migration.version;
        const statements = concurrentStatements(migration, schema);
        const apply = statements
          ? () => applyConcurrently(sql, migration, statements, schema, name)
          : () => applyInTransaction(sql, migration, schema, lockTimeout);
        const retried = statements ? RETRIED_CONCURRENT : RETRIED;
        if (await retrying(apply, retried, retryFor, migration.version, options.onRetry)) {
          applied.push(migration.version);
        }
      }
      return applied;
    } catch (error) {
      const where = current ? ` while applying ${current}` : "";
      const hint = RETRIED.has((error as { code?: unknown })?.code as string)
        ? ` (gave up after retrying for ${retryFor / 1000} s: a transaction held a lock on a ` +
          "table the version changes; find long transactions with akadze health " +
          "--max-transaction-age, end them, or run again with a longer --retry-for)"
        : "";
      throw new MigrateError(
        `migration failed${where}: ${describeError(error, secretsOf(database))}${hint}`,
        { cause: error },
      );
    }
  });
}

/**
 * Apply one version in its own transaction, unless the database records it (another run
 * applied it): true when applied now. Every lock wait is bounded by `lock_timeout` (ms).
 */
async function applyInTransaction(
  sql: Sql,
  migration: Migration,
  schema: string,
  lockTimeout: number,
): Promise<boolean> {
  return await sql.begin(async (tx) => {
    for (const statement of preamble(schema)) await tx.unsafe(statement);
    if (await isRecorded(tx, schema, migration.version)) return false;
    await tx.unsafe(`set local lock_timeout = '${lockTimeout}ms'`);
    // No parameters: postgres.js sends it as a simple query, so $$ bodies and many
    // statements in one file work.
    await tx.unsafe(versionSql(migration, schema));
    await tx.unsafe(`insert into ${schema}.schema_migrations (version) values ($1)`, [
      migration.version,
    ]);
    return true;
  }) as boolean;
}

/**
 * Apply one version of concurrent index statements: outside a transaction, one statement
 * at a time (each may run again), then record it. An index that a failed build left
 * invalid is dropped first; one that another run is building makes this try fail
 * (AKBUILD), to be tried again once that build is done. `name` is the schema unquoted.
 */
async function applyConcurrently(
  sql: Sql,
  migration: Migration,
  statements: string[],
  schema: string,
  name: string,
): Promise<boolean> {
  if (await isRecorded(sql, schema, migration.version)) return false;
  for (const index of await invalidIndexes(sql, name, false)) {
    await sql.unsafe(`drop index concurrently if exists ${schema}.${index}`);
  }
  for (const statement of statements) await sql.unsafe(statement);
  return await sql.begin(async (tx) => {
    for (const statement of preamble(schema)) await tx.unsafe(statement);
    if (await isRecorded(tx, schema, migration.version)) return false;
    const building = await invalidIndexes(tx, name, true);
    if (building.length > 0) {
      throw Object.assign(
        new Error(`another run is building the index ${building.join(", ")}`),
        { code: "AKBUILD" },
      );
    }
    await tx.unsafe(`insert into ${schema}.schema_migrations (version) values ($1)`, [
      migration.version,
    ]);
    return true;
  }) as boolean;
}

/**
 * The indexes of the schema that are not valid (quoted names): those that a failed or
 * running concurrent build left, or, with `all` false, only those no build is running for.
 */
async function invalidIndexes(
  sql: Sql | TransactionSql,
  name: string,
  all: boolean,
): Promise<string[]> {
  const rows = await sql.unsafe(
    `select pg_catalog.quote_ident(c.relname) as index
       from pg_catalog.pg_index i
       join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) i.indexrelid
       join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
      where n.nspname operator(pg_catalog.=) $1 and not (i.indisvalid and i.indisready)
        and ($2 or not exists (select from pg_catalog.pg_stat_progress_create_index p
                                where p.index_relid operator(pg_catalog.=) i.indexrelid))
      order by 1`,
    [name, all],
  );
  return rows.map((r) => r.index as string);
}

async function isRecorded(
  sql: Sql | TransactionSql,
  schema: string,
  version: string,
): Promise<boolean> {
  const rows = await sql.unsafe(
    `select from ${schema}.schema_migrations where version operator(pg_catalog.=) $1`,
    [version],
  );
  return rows.length > 0;
}

/**
 * Run `apply` until it succeeds, trying again after a failure whose SQLSTATE is in
 * `retried` for up to `retryFor` ms, with a pause that grows from 0.2 s to 5 s (jittered,
 * so that runs that failed together do not try again together).
 */
async function retrying<T>(
  apply: () => Promise<T>,
  retried: ReadonlySet<string>,
  retryFor: number,
  version: string,
  onRetry: ((retry: MigrateRetry) => void) | undefined,
): Promise<T> {
  const deadline = performance.now() + retryFor;
  for (let attempt = 1;; attempt++) {
    try {
      return await apply();
    } catch (error) {
      const code = (error as { code?: unknown } | null)?.code;
      const delay = Math.round(Math.min(5_000, 200 * 2 ** (attempt - 1)) * (0.5 + Math.random()));
      if (
        typeof code !== "string" || !retried.has(code) || performance.now() + delay > deadline
      ) throw error;
      onRetry?.({ version, attempt, delay, reason: describeError(error) });
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
}

/**
 * The statements of a version of concurrent index statements (placeholders replaced), or
 * null for a version that runs in a transaction. Throws for a version that mixes them
 * with other statements, or whose statements could not run again after a failure.
 */
function concurrentStatements(migration: Migration, schema = "{{schema}}"): string[] | null {
  const text = versionSql(migration, schema).replace(/^\s*--.*$/gm, "");
  if (!/\bconcurrently\b/i.test(text)) return null;
  const statements = text.split(";").map((s) => s.trim()).filter((s) => s !== "");
  for (const statement of statements) {
    if (
      !/^(create\s+(unique\s+)?index\s+concurrently\s+if\s+not\s+exists|drop\s+index\s+concurrently\s+if\s+exists)\s/i
        .test(statement)
    ) {
      throw new MigrateError(
        `version ${migration.version} builds or drops an index concurrently, so it can hold ` +
          "only CREATE INDEX CONCURRENTLY IF NOT EXISTS and DROP INDEX CONCURRENTLY IF EXISTS " +
          `statements; it also has: ${statement.split("\n")[0]}`,
      );
    }
  }
  return statements;
}

function positiveMs(option: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1 || value > 2_147_483_647) {
    throw new MigrateError(`${option} must be a whole number of milliseconds, at least 1`);
  }
  return value;
}

/**
 * What every migration run does first, in its transaction: take the lock that makes
 * concurrent runs (several workers deploying at once, or another tool applying
 * {@linkcode migrationSql}'s script) wait for each other, then create the schema and its
 * version table when missing. `schema` is quoted.
 */
function preamble(schema: string): string[] {
  return [
    // The schema is checked and quoted by quoteSchema, so it can be a literal here. A DO
    // block, so that the script returns no rows where a tool expects none.
    `do $$ begin perform pg_catalog.pg_advisory_xact_lock(
      pg_catalog.hashtextextended('akadze:migrate:${schema}', 0)); end $$`,
    `create schema if not exists ${schema}`,
    `create table if not exists ${schema}.schema_migrations (
  version text primary key,
  applied_at timestamptz not null default pg_catalog.now())`,
  ];
}

/** A version's SQL for the (quoted) schema. */
function versionSql(migration: Migration, schema: string): string {
  return migration.sql.replaceAll("{{schema}}", schema);
}

/** Options of {@linkcode migrationSql}. */
export interface MigrationSqlOptions {
  /** The schema that holds akadze's tables. Default `"akadze"`. */
  schema?: string;
}

/**
 * The SQL script of every schema version of this release, for teams whose migrations
 * are owned by another tool (Flyway, dbmate, sqitch, Prisma, Rails, ...): save it as one of
 * that tool's migrations. `akadze migrate --print-sql` prints it.
 *
 * The script does what {@linkcode migrate} does: it takes migrate's advisory lock, creates
 * the schema and its `schema_migrations` table when missing, and applies each version
 * that table does not record, recording it. So it is idempotent: on a database where
 * `akadze migrate` (or an earlier script) applied some versions it applies only the rest,
 * and afterwards `akadze migrate`, the worker and `akadze health` see every version as
 * applied. After upgrading akadze, save the new release's script as a new migration.
 * Run it in one transaction (most tools do; psql: `--single-transaction`); run as separate
 * statements, each version still applies whole or not at all. Unlike `migrate`, it builds
 * indexes the plain way (no index is built concurrently in a transaction), which holds back
 * writes to the table while it builds: run it while the queue is quiet.
 *
 * @example
 * ```ts
 * import { migrationSql } from "@akadze/akadze/admin";
 *
 * const script = migrationSql({ schema: "akadze" });
 * console.log(script.split("\n")[0]); // "-- akadze schema "akadze": versions 0001_init, ..."
 * ```
 */
export function migrationSql(options: MigrationSqlOptions = {}): string {
  const schema = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  const versions = MIGRATIONS.map((m) => m.version);
  const parts = [
    `-- akadze schema ${schema}: versions ${versions.join(", ")}.`,
    "-- From akadze migrate --print-sql (or migrationSql()). Run it in one transaction.",
    `-- Each version applies only when ${schema}.schema_migrations does not record it, and`,
    "-- is recorded there, so akadze migrate, the worker and akadze health see it as applied.",
    "",
    ...preamble(schema).map((statement) => `${statement};`),
  ];
  for (const migration of MIGRATIONS) {
    // A version's SQL runs as the string of an EXECUTE, dollar-quoted with a tag it
    // cannot contain ($$ bodies inside it stay as they are).
    const tag = `$akadze_${migration.version}$`;
    // The script runs in one transaction, where an index cannot be built concurrently:
    // there a concurrent version builds its indexes the plain way (holding back writes to
    // the table while it builds).
    const concurrent = concurrentStatements(migration, schema);
    const body = concurrent
      ? concurrent.map((s) => `${s.replace(/\s+concurrently\b/i, "")};`).join("\n")
      : versionSql(migration, schema);
    if (
      !/^[0-9a-z_]+$/.test(migration.version) || body.includes(tag) ||
      body.includes("$akadze_migrate$")
    ) {
      throw new MigrateError(`cannot print version ${migration.version}`);
    }
    parts.push(
      "",
      `-- version ${migration.version}`,
      "DO $akadze_migrate$",
      "BEGIN",
      `  IF NOT EXISTS (SELECT FROM ${schema}.schema_migrations WHERE version
        operator(pg_catalog.=) '${migration.version}') THEN`,
      `    EXECUTE ${tag}`,
      body.trimEnd(),
      `${tag};`,
      `    INSERT INTO ${schema}.schema_migrations (version) VALUES ('${migration.version}');`,
      "  END IF;",
      "END",
      "$akadze_migrate$;",
    );
  }
  return parts.join("\n") + "\n";
}

/**
 * The versions recorded in the schema, oldest first. Read-only: an absent schema gives
 * `[]` and nothing is created.
 *
 * @example
 * ```ts ignore
 * console.log(await appliedVersions(Deno.env.get("AKADZE_DATABASE_URL")!));
 * ```
 */
export async function appliedVersions(
  database: string | Sql,
  options: MigrateOptions = {},
): Promise<string[]> {
  const schema = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  return await withSql(database, async (sql) => {
    const [{ table }] = await sql`select pg_catalog.to_regclass(${
      schema + ".schema_migrations"
    }) as table`;
    if (table === null) return [];
    const rows = await sql.unsafe(
      `select version from ${schema}.schema_migrations order by version`,
    );
    return rows.map((r) => r.version as string);
  });
}

/** One schema version as {@linkcode migrationStatus} reports it. */
export interface MigrationStatus {
  /** The version name, e.g. `"0001_init"`. */
  version: string;
  /** `applied` when the database records it, else `pending`. */
  state: "applied" | "pending";
  /** When it was applied (database clock), or null while pending. */
  appliedAt: Date | null;
}

/**
 * Every version this release knows, plus any the database records that this release does
 * not (applied by a newer one), oldest first, each applied (with its time) or pending.
 * Read-only: an absent schema lists every version as pending and creates nothing.
 *
 * @example
 * ```ts ignore
 * import { migrationStatus } from "@akadze/akadze/admin";
 *
 * for (const m of await migrationStatus(Deno.env.get("AKADZE_DATABASE_URL")!)) {
 *   console.log(m.version, m.state, m.appliedAt?.toISOString() ?? "-");
 * }
 * ```
 */
export async function migrationStatus(
  database: string | Sql,
  options: MigrateOptions = {},
): Promise<MigrationStatus[]> {
  const schema = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  const applied = await withSql(database, async (sql) => {
    const [{ table }] = await sql`select pg_catalog.to_regclass(${
      schema + ".schema_migrations"
    }) as table`;
    if (table === null) return new Map<string, Date>();
    const rows = await sql.unsafe(`select version, applied_at from ${schema}.schema_migrations`);
    return new Map(rows.map((r) => [r.version as string, r.applied_at as Date]));
  });
  const versions = [...new Set([...knownVersions(), ...applied.keys()])].sort();
  return versions.map((version) => {
    const appliedAt = applied.get(version) ?? null;
    return { version, state: appliedAt ? "applied" : "pending", appliedAt };
  });
}

/**
 * The versions known to this release that the database does not have yet (read-only).
 *
 * @example
 * ```ts ignore
 * const pending = await pendingVersions(Deno.env.get("AKADZE_DATABASE_URL")!);
 * if (pending.length > 0) throw new Error(`run akadze migrate (pending: ${pending})`);
 * ```
 */
export async function pendingVersions(
  database: string | Sql,
  options: MigrateOptions = {},
): Promise<string[]> {
  const applied = new Set(await appliedVersions(database, options));
  return knownVersions().filter((v) => !applied.has(v));
}

async function withSql<T>(database: string | Sql, fn: (sql: Sql) => Promise<T>): Promise<T> {
  if (typeof database !== "string") return await fn(database);
  const sql = connect(database, { max: 1 });
  try {
    return await fn(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

function secretsOf(database: string | Sql): string[] {
  const password = typeof database === "string" ? urlPassword(database) : undefined;
  return password ? [password] : [];
}
