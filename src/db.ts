/**
 * The PostgreSQL connection factory, credential redaction, the schema-name rule and the
 * transient-error classifier shared by every part of akadze.
 *
 * @module
 */
import { userInfo } from "node:os";
import postgres from "postgres";
import { AkadzeError } from "./errors.ts";
import { installArrayTypes } from "./array_types.ts";
import { guardPools } from "./driver_guard.ts";
import { readEnv } from "./env.ts";
import { openSocket } from "./startup_guard.ts";

/** A postgres.js instance (or a transaction of one), as akadze accepts it. */
export type Sql = postgres.Sql;
/** A postgres.js transaction handle, as given to `sql.begin` callbacks. */
export type TransactionSql = postgres.TransactionSql;

/** Seconds a connection attempt may take by default (see `connect`'s `connectTimeout`). */
export const CONNECT_TIMEOUT_DEFAULT = 10;

/**
 * Query options for the enqueue, the one-queue claim and the outcome write: prepared when the pool
 * prepares, one round trip instead of two. postgres.js's `unsafe` never prepares unless
 * asked, and a `prepare: false` pool overrides the ask (PgBouncer stays safe). Only for
 * statements that cannot scan the jobs table: the insert, and the two functions that turn
 * sequential scans off. A plan PostgreSQL keeps for any other prepared statement may have
 * been made while the table was nearly empty, and scan it once it has grown (found for the
 * multi-queue claim, the heartbeat and the pruner).
 */
export const PREPARED: { readonly prepare: true } = { prepare: true };

/** The schema name used when none is given. */
export const DEFAULT_SCHEMA = "akadze";

/**
 * Open a postgres.js pool with akadze's defaults: no prepared statements, an application
 * name, bounded idle and connect timeouts, notices silenced.
 *
 * @example
 * ```ts ignore
 * import { connect } from "@akadze/akadze";
 * const sql = connect(Deno.env.get("AKADZE_DATABASE_URL")!);
 * await sql`select 1`;
 * await sql.end();
 * ```
 */
export function connect(
  databaseUrl: string,
  options: {
    /** Pool size. Default 10. */
    max?: number;
    /** Use prepared statements. Default false, so a PgBouncer in transaction mode can sit in front. */
    prepare?: boolean;
    /** `application_name` reported to the server. Default `"akadze"`. */
    applicationName?: string;
    /** Seconds an idle connection stays open. Default 30. */
    idleTimeout?: number;
    /**
     * Seconds a connection attempt may take, through the startup handshake, before the query
     * waiting for it fails. Default 10, or the URL's `connect_timeout` parameter when it has
     * one.
     */
    connectTimeout?: number;
    /**
     * Server settings for these connections alone, sent as each connects (startup
     * parameters), e.g. `{ DateStyle: "ISO" }`. A connection pooler may refuse those it
     * does not pass on (PgBouncer passes `DateStyle`, `TimeZone` and a few more).
     */
    settings?: Record<string, string>;
  } = {},
): Sql {
  if (typeof databaseUrl !== "string" || !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    throw new AkadzeError("databaseUrl must be a postgres:// or postgresql:// URL");
  }
  const authority = databaseUrl.slice(databaseUrl.indexOf("://") + 3).split(/[/?#]/)[0];
  if (authority.indexOf("@") !== authority.lastIndexOf("@")) {
    // The driver would take the part of the password after the first @ for a host name, and
    // print it in its errors.
    throw new AkadzeError(
      "the database URL has more than one @ before its host: write each @ of the user name or " +
        "password as %40 (postgres://app:p%40ss@db/app). The URL is not shown: it holds the password",
    );
  }
  checkPorts(authority.slice(authority.lastIndexOf("@") + 1));
  // Each new connection first fetches the array types, and a connection lost during that
  // fetch leaves an unhandled rejection behind that would end the process; so does a
  // transaction whose connection closed under it (driver_guard.ts).
  guardPools();
  let sql: Sql;
  try {
    sql = newPool(databaseUrl, options);
  } catch (error) {
    // The driver's "Invalid URL: '…'" quotes the whole URL, password included.
    if (error instanceof TypeError && /^Invalid URL/.test(error.message)) {
      throw new AkadzeError(
        "the database URL is not a valid URL: check its host names, ports and the %-encoding " +
          "of its user name and password. The URL is not shown: it holds the password",
      );
    }
    throw error;
  }
  // Known before the first statement, not learned by it (see array_types.ts).
  installArrayTypes(sql);
  return sql;
}

/**
 * Refuse a port that is not a TCP port in the URL's host list (`h1:5432,h2:5433`): the
 * driver would throw an uncaught RangeError for it on connecting, or wait forever.
 */
function checkPorts(hosts: string): void {
  for (const entry of hosts.split(",")) {
    const [, host, port] = /^(\[[^\]]*\]|[^:]*)(?::(.*))?$/.exec(entry) ?? [];
    if (port === undefined || port === "") continue;
    if (!/^\d{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
      throw new AkadzeError(
        `the database URL gives host ${host || "(empty)"} the port ${port}, which is not a port ` +
          "number (1 to 65535): correct the URL",
      );
    }
  }
}

function newPool(databaseUrl: string, options: NonNullable<Parameters<typeof connect>[1]>): Sql {
  return postgres(databaseUrl, {
    ...(urlHasUser(databaseUrl) ? {} : { user: defaultUser() }),
    max: options.max ?? 10,
    prepare: options.prepare ?? false,
    idle_timeout: options.idleTimeout ?? 30,
    // The URL's connect_timeout, when it has one, unless the option says otherwise.
    ...(options.connectTimeout === undefined && /[?&]connect_timeout=/.test(databaseUrl)
      ? {}
      : { connect_timeout: options.connectTimeout ?? CONNECT_TIMEOUT_DEFAULT }),
    max_lifetime: 60 * 30,
    // postgres.js counts failed connects across the whole pool and, by default, makes a
    // query routed to a closed connection wait up to 20 s before reconnecting, even once
    // the server is back: after a brief outage a worker's loop would hang that long.
    // Seconds, jittered, at most one.
    backoff: (retries: number) => (0.5 + Math.random() / 2) * Math.min(0.05 * 2 ** retries, 1),
    onnotice: () => {},
    connection: { ...options.settings, application_name: options.applicationName ?? "akadze" },
    // A server that is not PostgreSQL fails the query at once instead of hanging it
    // (postgres.js takes the option; its types do not list it).
    ...{ socket: openSocket } as Record<never, never>,
  });
}

/** Whether the URL names a user (read like postgres.js does, so several hosts work too). */
function urlHasUser(databaseUrl: string): boolean {
  const authority = databaseUrl.slice(databaseUrl.indexOf("://") + 3).split(/[?/]/)[0];
  const at = authority.indexOf("@");
  return at > 0 && !authority.startsWith(":");
}

/**
 * The user name for a URL without one, looked up here so that postgres.js does not: it
 * falls back to the OS user from `USERNAME`, `USER` or `LOGNAME`, which a worker run with
 * `--allow-env=AKADZE_*,PG*` may not read (the read throws). Only what the process may
 * read is looked at: `PGUSERNAME`, `PGUSER`, then the OS user name.
 */
function defaultUser(): string {
  const user = readEnv("PGUSERNAME") ?? readEnv("PGUSER") ?? osUser();
  if (user) return user;
  throw new AkadzeError(
    "the database URL has no user name and PGUSER is not set (reading the OS user's name needs " +
      "--allow-env=USER or --allow-sys=uid,gid,username): put the user in the URL " +
      "(postgres://USER@HOST/DATABASE) or set PGUSER",
  );
}

function osUser(): string | undefined {
  const kinds = ["uid", "gid", "username"] as const;
  if (
    kinds.every((kind) => Deno.permissions.querySync({ name: "sys", kind }).state === "granted")
  ) {
    try {
      const name = userInfo().username;
      if (name) return name;
    } catch {
      // No passwd entry for this uid (a container): try the environment.
    }
  }
  return readEnv("USERNAME") ?? readEnv("USER") ?? readEnv("LOGNAME");
}

// The scheme is bounded: unbounded, a long run of letters costs quadratic time to scan.
// The password runs to the last @ before the path, so that one with an unencoded @ is hidden
// whole.
const URL_CREDENTIALS = /([a-z][a-z0-9+.-]{0,31}:\/\/[^:/?#@\s]*):[^/?#\s]*@/gi;
const PASSWORD_PARAM = /(password=)[^&\s'"]*/gi;

/**
 * Remove credentials from a text: the password of any URL in it, `password=` parameters,
 * and each of the given secrets.
 *
 * @example
 * ```ts
 * redact("postgres://app:s3cret@db/app"); // "postgres://app:***@db/app"
 * ```
 */
export function redact(text: string, secrets: readonly string[] = []): string {
  let out = String(text).replace(URL_CREDENTIALS, "$1:***@").replace(PASSWORD_PARAM, "$1***");
  for (const secret of secrets) {
    if (secret.length >= 3) out = out.split(secret).join("***");
  }
  return out;
}

/** The password of a database URL, or undefined (used to redact messages). */
export function urlPassword(databaseUrl: string): string | undefined {
  try {
    const password = new URL(databaseUrl).password;
    return password ? decodeURIComponent(password) : undefined;
  } catch {
    return undefined;
  }
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

/**
 * Validate a schema name and return it double-quoted for SQL. Only lower-case letters,
 * digits and underscores are accepted (at most 63 bytes, not starting with a digit, not
 * `pg_`-prefixed), so the name means the same quoted and unquoted.
 *
 * @example
 * ```ts
 * quoteSchema("akadze"); // '"akadze"'
 * ```
 */
export function quoteSchema(schema: string): string {
  if (typeof schema !== "string" || !SCHEMA_NAME.test(schema) || schema.startsWith("pg_")) {
    throw new AkadzeError(
      "schema must be a lower-case identifier: letters, digits and _, at most 63 characters, " +
        "not starting with a digit or pg_",
    );
  }
  return `"${schema}"`;
}

/**
 * Run `fn` so that its failure undoes its own writes only and leaves the caller's
 * transaction usable: in a savepoint when `session` is a transaction, else in a
 * transaction of its own.
 */
export async function atomically<T>(
  session: Sql | TransactionSql,
  fn: (tx: TransactionSql) => Promise<T>,
): Promise<T> {
  const tx = session as TransactionSql;
  if (typeof tx.savepoint === "function") return await tx.savepoint(fn) as T;
  return await (session as Sql).begin(fn) as T;
}

/**
 * The NOTIFY channel on which enqueues announce new jobs (payload: the queue names,
 * comma-separated).
 */
export function jobsChannel(schema: string): string {
  return `${schema}_jobs`;
}

/** The NOTIFY channel on which `requestCancel` announces a cancel (payload: the job id). */
export function cancelChannel(schema: string): string {
  return `${schema}_cancel`;
}

/**
 * The NOTIFY channel on which an awaited job announces its terminal state or new progress
 * (payload: the job id; the trigger of migrations/0007_await_progress.sql sends it).
 */
export function doneChannel(schema: string): string {
  return `${schema}_done`;
}

/**
 * One connection to `listenUrl` for LISTEN, named as the connections of `pool` are (the
 * worker's listener and the app's waiters each open one).
 */
export function listenConnection(pool: Sql, listenUrl: string): Sql {
  const options = pool.options as { connection?: { application_name?: unknown } };
  const name = options.connection?.application_name;
  return connect(listenUrl, {
    max: 1,
    applicationName: typeof name === "string" ? name : undefined,
  });
}

/** undefined_table, undefined_function, invalid_schema_name. */
const MISSING_OBJECT_SQLSTATES = new Set(["42P01", "42883", "3F000"]);

/**
 * Whether `error` (or its cause) is PostgreSQL saying that akadze's `schema`, or a table
 * or function in it, does not exist: the database was never migrated, or is behind this
 * release. Errors about other schemas' objects (an application's table in a hook) are not.
 */
export function isSchemaMissing(error: unknown, schema: string): boolean {
  for (let e: unknown = error, depth = 0; e && typeof e === "object" && depth < 3; depth++) {
    const { code, message } = e as { code?: unknown; message?: unknown };
    if (typeof code === "string" && MISSING_OBJECT_SQLSTATES.has(code)) {
      // relation "akadze.jobs" / function akadze.claim_one(...) / schema "akadze"
      const text = String(message);
      return text.includes(`"${schema}.`) || text.includes(` ${schema}.`) ||
        text.includes(`"${schema}"`);
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * Rethrow a missing-schema error of a statement on akadze's tables as one that says to
 * migrate, and a permission denied on akadze's schema, tables or functions as one that
 * says where the grants are (an `AkadzeError`, or `kind`, prefixed with `prefix`); anything
 * else unchanged. Inside a caller's transaction the failed statement has aborted it all the
 * same.
 */
export async function explainMissingSchema<T>(
  schema: string,
  run: () => Promise<T>,
  kind: new (message: string, options?: ErrorOptions) => AkadzeError = AkadzeError,
  prefix = "",
): Promise<T> {
  try {
    return await run();
  } catch (error) {
    if (error instanceof AkadzeError) throw error;
    if (isSchemaMissing(error, schema)) {
      throw new kind(prefix + schemaMissingMessage(schema, error), { cause: error });
    }
    if (isGrantMissing(error, schema)) {
      // The SQLSTATE stays readable where it was (code 42501).
      const explained = new kind(prefix + grantMissingMessage(error), { cause: error });
      throw Object.assign(explained, { code: "42501" });
    }
    throw error;
  }
}

/**
 * akadze's tables, sequences and functions, as a permission error names them (without the
 * schema); tests/roles_test.ts checks it against a migrated schema.
 */
export const AKADZE_OBJECTS: ReadonlySet<string> = new Set([
  "jobs",
  "workers",
  "limits",
  "limit_starts",
  "queue_pauses",
  "periodic_runs",
  "job_dependencies",
  "unique_windows",
  "schema_migrations",
  "jobs_id_seq",
  "enqueue",
  "enqueue_many",
  "enqueue_keyed",
  "enqueue_flow",
  "enqueue_flow_steps",
  "claim_one",
  "claim_one_floor",
  "claim_one_checked",
  "complete_jobs",
  "complete_jobs_plain",
  "append_error",
  "outcome_state",
  "prune_linked_jobs",
  "flow_order",
  "json_integer_in",
  "notify_awaited",
  "settle_dependents",
  "settle_dependents_trigger",
  "revive_dependents",
]);

/**
 * Whether `error` is PostgreSQL's "permission denied" (42501) for akadze's schema `schema`
 * or one of its tables or functions: the role lacks a grant akadze needs.
 */
export function isGrantMissing(error: unknown, schema: string): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown };
  if (code !== "42501") return false;
  const match =
    /permission denied for (?:schema|table|relation|function|sequence|view) "?([^"\s]+)"?/
      .exec(String(message));
  if (!match) return false;
  const name = match[1];
  return name === schema || AKADZE_OBJECTS.has(name.slice(name.lastIndexOf(".") + 1));
}

/** What to tell a user whose role lacks a grant akadze needs (see {@linkcode isGrantMissing}). */
export function grantMissingMessage(error: unknown): string {
  return `the database role lacks a grant akadze needs (${describeError(error)}): the ` +
    `grants each role needs are listed in akadze's production guide, "Database roles"`;
}

/** What to tell a user whose database lacks akadze's schema (see {@linkcode isSchemaMissing}). */
export function schemaMissingMessage(schema: string, error: unknown): string {
  return `the akadze schema "${schema}" is not installed in this database (or is out of ` +
    `date): run akadze migrate, or migrate() from code (${describeError(error)})`;
}

const TRANSIENT_SQLSTATES = new Set([
  "57P01",
  "57P02",
  "57P03",
  "53100",
  "53300",
  "40001",
  "40P01",
  "25006",
]);

/** What PostgreSQL says when a statement needs a primary but reached a server in recovery. */
const IN_RECOVERY = /\b(during recovery|while recovery is in progress|recovery is in progress)\b/i;

/**
 * Whether `error` (or its cause) is a server refusing a write because it is read-only: a
 * hot standby (`cannot execute UPDATE in a read-only transaction`, SQLSTATE 25006, or
 * `... during recovery`), which a multi-host URL can reach while a failover is under way.
 * A new connection may reach the new primary.
 *
 * @example
 * ```ts ignore
 * import { isReadOnlyError } from "./db.ts";
 * isReadOnlyError(Object.assign(new Error("x"), { code: "25006" })); // true
 * ```
 */
export function isReadOnlyError(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e && typeof e === "object" && depth < 5; depth++) {
    const { code, message } = e as { code?: unknown; message?: unknown };
    if (code === "25006") return true;
    if (
      typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && IN_RECOVERY.test(String(message))
    ) {
      return true;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}
const TRANSIENT_DRIVER_CODES = new Set([
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
]);
const TRANSIENT_DENO_ERRORS = new Set([
  "ConnectionRefused",
  "ConnectionReset",
  "ConnectionAborted",
  "BrokenPipe",
  "TimedOut",
]);

/**
 * Whether a database error is transient (worth retrying with backoff): connection
 * exceptions (SQLSTATE class 08), admin/crash shutdown and cannot-connect-now
 * (57P01/57P02/57P03), disk full (53100), too many connections (53300),
 * serialization failure (40001), deadlock (40P01), a read-only server such as a standby
 * during a failover ({@linkcode isReadOnlyError}), and the driver's and runtime's
 * connection errors.
 *
 * @example
 * ```ts
 * isTransientError(Object.assign(new Error("x"), { code: "40P01" })); // true
 * ```
 */
export function isTransientError(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e && depth < 5; depth++) {
    if (typeof e !== "object") return false;
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") {
      // Driver codes first: "EPIPE" has the shape of a SQLSTATE.
      if (TRANSIENT_DRIVER_CODES.has(code)) return true;
      if (/^[0-9A-Z]{5}$/.test(code)) {
        if (code.startsWith("08") || TRANSIENT_SQLSTATES.has(code)) return true;
        if (isReadOnlyError(e)) return true;
      }
    }
    const name = (e as { name?: unknown }).name;
    if (typeof name === "string" && TRANSIENT_DENO_ERRORS.has(name)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * A PostgreSQL data exception (SQLSTATE class 22) quotes the input it refused, which may
 * be a task argument (`invalid input syntax for type integer: "4111-…"`): its message
 * with everything from the first to the last double quote replaced by `"***"`. Other
 * messages are returned as they are (they quote names, not values).
 */
export function hideQuotedInput(message: string, code: unknown): string {
  if (typeof code !== "string" || !/^22[0-9A-Z]{3}$/.test(code)) return message;
  return message.replace(/"[\s\S]*"/, '"***"');
}

/** What postgres.js's connection errors mean, and what to look at. */
const CONNECTION_ERRORS: Record<string, string> = {
  CONNECTION_CLOSED: "the database server closed the connection while it was in use (a restart, " +
    "a failover, a terminated session, or a server timeout such as " +
    "idle_in_transaction_session_timeout ending a transaction that waited too long)",
  CONNECTION_DESTROYED: "the connection was ended while a statement was using it (the pool " +
    "closing, or a statement that did not answer in time)",
  CONNECTION_ENDED: "the connection had already been ended (the pool is closed)",
  CONNECT_TIMEOUT: "no PostgreSQL server answered within the connect timeout (connectTimeout, " +
    "or connect_timeout in the URL): check that the server is up and reachable and that the URL " +
    "names it",
};

/**
 * postgres.js names its connection errors `write CONNECTION_CLOSED host:port`, whatever was
 * being done: the message for such an error says what happened instead, with the code and
 * the address. Other messages are returned as they are.
 */
export function explainConnectionError(message: string, code: unknown): string {
  if (typeof code !== "string" || !Object.hasOwn(CONNECTION_ERRORS, code)) return message;
  const match = new RegExp(`^write ${code}(?: (.*))?$`).exec(message);
  if (!match) return message;
  return `${CONNECTION_ERRORS[code]} (${code}${match[1] ? `, ${match[1]}` : ""})`;
}

/**
 * A one-line, credential-free description of an error, for logs and CLI output: the
 * message (with the SQLSTATE or driver code when the message lacks it), whitespace
 * collapsed, passwords, the input a data exception (SQLSTATE class 22) quotes, and the
 * given secrets removed.
 *
 * @example
 * ```ts
 * const error = Object.assign(new Error("connect failed: postgres://app:s3cret@db/app"), {
 *   code: "ECONNREFUSED",
 * });
 * describeError(error); // "connect failed: postgres://app:***@db/app (ECONNREFUSED)"
 * ```
 */
export function describeError(error: unknown, secrets: readonly string[] = []): string {
  let text: string;
  try {
    if (error instanceof Error) {
      const code = (error as { code?: unknown }).code;
      text = hideQuotedInput(String(error.message || error.name), code);
      text = explainConnectionError(text, code);
      if (typeof code === "string" && !text.includes(code)) text = `${text} (${code})`;
    } else {
      text = String(error);
    }
  } catch {
    text = "an error that cannot be described"; // a Proxy, a getter or toString that throws
  }
  return redact(text.replace(/\s+/g, " ").trim(), secrets);
}
