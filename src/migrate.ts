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
import {
  connect,
  DEFAULT_SCHEMA,
  describeError,
  quoteSchema,
  type Sql,
  urlPassword,
} from "./db.ts";
import { MigrateError } from "./errors.ts";

/** One schema version: its name and SQL (with `{{schema}}` placeholders). */
export interface Migration {
  version: string;
  sql: string;
}

/** Every schema version, in the order they apply. */
export const MIGRATIONS: readonly Migration[] = [
  { version: "0001_init", sql: init },
  { version: "0002_limit_key_order", sql: limitKeyOrder },
  { version: "0003_sql_enqueue", sql: sqlEnqueue },
  { version: "0004_claim_floor", sql: claimFloor },
  { version: "0005_search_path", sql: searchPath },
];

/** Options of {@linkcode migrate} and {@linkcode appliedVersions}. */
export interface MigrateOptions {
  /** The schema that holds akadze's tables. Default `"akadze"`. */
  schema?: string;
}

/**
 * The versions this release knows, oldest first.
 *
 * @example
 * ```ts
 * import { knownVersions } from "@akadze/akadze";
 *
 * console.log(knownVersions()); // ["0001_init", ...]
 * ```
 */
export function knownVersions(): string[] {
  return MIGRATIONS.map((m) => m.version);
}

/**
 * Bring the schema up to date: creates it when missing and applies each pending version
 * once, all in one transaction under a transaction-scoped advisory lock, so concurrent
 * callers (several workers deploying at once) are safe. Returns the versions applied now
 * (empty when the schema was up to date).
 *
 * @example
 * ```ts ignore
 * import { migrate } from "@akadze/akadze";
 * const applied = await migrate(Deno.env.get("AKADZE_DATABASE_URL")!);
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
  const schema = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  return await withSql(database, async (sql) => {
    let current = "";
    try {
      return await sql.begin(async (tx) => {
        for (const statement of preamble(schema)) await tx.unsafe(statement);
        const rows = await tx.unsafe(`select version from ${schema}.schema_migrations`);
        const done = new Set(rows.map((r) => r.version as string));
        const applied: string[] = [];
        for (const migration of migrations) {
          if (done.has(migration.version)) continue;
          current = migration.version;
          // No parameters: postgres.js sends it as a simple query, so $$ bodies and many
          // statements in one file work.
          await tx.unsafe(versionSql(migration, schema));
          await tx.unsafe(`insert into ${schema}.schema_migrations (version) values ($1)`, [
            migration.version,
          ]);
          applied.push(migration.version);
        }
        return applied;
      });
    } catch (error) {
      const where = current ? ` while applying ${current}` : "";
      throw new MigrateError(
        `migration failed${where}: ${describeError(error, secretsOf(database))}`,
        { cause: error },
      );
    }
  });
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
    `do $$ begin perform pg_advisory_xact_lock(hashtextextended('akadze:migrate:${schema}', 0)); end $$`,
    `create schema if not exists ${schema}`,
    `create table if not exists ${schema}.schema_migrations (
  version text primary key,
  applied_at timestamptz not null default now())`,
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
 * statements, each version still applies whole or not at all.
 *
 * @example
 * ```ts
 * import { migrationSql } from "@akadze/akadze";
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
    const body = versionSql(migration, schema);
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
      `  IF NOT EXISTS (SELECT FROM ${schema}.schema_migrations WHERE version = '${migration.version}') THEN`,
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
 * import { appliedVersions } from "@akadze/akadze";
 * console.log(await appliedVersions(Deno.env.get("AKADZE_DATABASE_URL")!));
 * ```
 */
export async function appliedVersions(
  database: string | Sql,
  options: MigrateOptions = {},
): Promise<string[]> {
  const schema = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  return await withSql(database, async (sql) => {
    const [{ table }] = await sql`select to_regclass(${schema + ".schema_migrations"}) as table`;
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
 * import { migrationStatus } from "@akadze/akadze";
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
    const [{ table }] = await sql`select to_regclass(${schema + ".schema_migrations"}) as table`;
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
 * import { pendingVersions } from "@akadze/akadze";
 *
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
