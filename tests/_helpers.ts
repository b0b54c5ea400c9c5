// Shared by the test files: a fresh database per test, on the server `deno task test`
// started (or AKADZE_DATABASE_URL's).
import postgres from "postgres";
import { configure, type LogRecord, reset } from "@logtape/logtape";
import { Akadze, type AkadzeOptions } from "../src/app.ts";
import { migrate } from "../src/migrate.ts";
import { Claimer } from "../src/worker/claimer.ts";
import { Worker, type WorkerExit } from "../src/worker/worker.ts";
import type { WorkerOptions } from "../src/worker/config.ts";
import type { Sql } from "../src/db.ts";
import { isClosedConnectionWrite } from "../src/driver_guard.ts";
import { createTestDatabase, type TestDatabase } from "../src/testing.ts";

/** Run `fn` with a fresh database (migrated unless `migrated: false`) and a pool on it. */
export async function withDatabase(
  name: string,
  fn: (db: TestDatabase, sql: Sql) => Promise<void>,
  options: { migrated?: boolean } = {},
): Promise<void> {
  const db = await createTestDatabase({ name });
  const sql = postgres(db.url, { max: 5, onnotice: () => {} });
  try {
    if (options.migrated !== false) await migrate(sql);
    await fn(db, sql);
  } finally {
    await sql.end({ timeout: 1 });
    await db.close();
  }
}

/**
 * Run `fn` with every akadze log record (debug and up) collected in `records`, as they come;
 * the logging configuration is reset afterwards. Returns the records.
 */
export async function withLogs(
  fn: (records: LogRecord[]) => Promise<void>,
): Promise<LogRecord[]> {
  const records: LogRecord[] = [];
  await configure({
    reset: true,
    sinks: { memory: (record: LogRecord) => records.push(record) },
    loggers: [
      { category: ["akadze"], lowestLevel: "debug", sinks: ["memory"] },
      { category: ["logtape", "meta"], lowestLevel: "warning", sinks: [] },
    ],
  });
  try {
    await fn(records);
  } finally {
    await reset();
  }
  return records;
}

/** Run the CLI in a subprocess and collect its output. */
export async function runCli(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-env",
      "--allow-sys=hostname",
      "--allow-read",
      new URL("../cli.ts", import.meta.url).pathname,
      ...args,
    ],
    env: { NO_COLOR: "1", ...passthroughEnv(), ...env },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return {
    code: out.code,
    stdout: decoder.decode(out.stdout),
    // Concurrent `deno run`s may print Deno's own notice about waiting for the
    // node_modules lock before our code runs; it is not the CLI's output.
    stderr: decoder.decode(out.stderr).replace(/^Blocking waiting for file lock on .*\n/gm, ""),
  };
}

/**
 * Run a psql script (from stdin) against `url`: -X no ~/.psqlrc, -At bare rows, errors
 * with their SQLSTATE; stops at the first error unless `stopOnError: false`. `args` adds
 * psql flags (e.g. --single-transaction).
 */
export async function psql(
  url: string,
  script: string,
  options: { stopOnError?: boolean; args?: string[] } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command("psql", {
    args: [
      url,
      "-X",
      "-q",
      "-A",
      "-t",
      "-v",
      `ON_ERROR_STOP=${options.stopOnError === false ? 0 : 1}`,
      "-v",
      "VERBOSITY=verbose",
      ...(options.args ?? []),
    ],
    // No "already exists, skipping" notices on stderr.
    env: { PGOPTIONS: "-c client_min_messages=warning" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(script));
  await writer.close();
  const out = await child.output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/** Wait until `check` returns a truthy value, polling; fail after `timeoutMs`. */
export async function waitFor<T>(
  check: () => Promise<T> | T,
  what: string,
  timeoutMs = 30_000,
): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * What this environment says about reaching the network: a child that downloads npm
 * packages behind a proxy (or a TLS proxy with its own certificate authority) needs it.
 */
const NETWORK_ENV = [
  "DENO_TLS_CA_STORE",
  "DENO_CERT",
  "SSL_CERT_FILE",
  "SSL_CERT_DIR",
  "NPM_CONFIG_REGISTRY",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "NO_PROXY",
  "http_proxy",
  "https_proxy",
  "no_proxy",
];

/**
 * What a test's child process needs from this environment (never AKADZE_DATABASE_URL:
 * each test passes its own).
 */
export function passthroughEnv(): Record<string, string> {
  const keep: Record<string, string> = {};
  for (
    const name of ["HOME", "PATH", "DENO_DIR", "TMPDIR", "AKADZE_TEST_POSTGRES", ...NETWORK_ENV]
  ) {
    const value = Deno.env.get(name);
    if (value !== undefined) keep[name] = value;
  }
  return keep;
}

/** Run `fn` with an app on a fresh migrated database; closes both afterwards. */
export async function withApp(
  name: string,
  fn: (app: Akadze, sql: Sql, db: TestDatabase) => Promise<void>,
  options: Omit<AkadzeOptions, "databaseUrl" | "sql"> = {},
): Promise<void> {
  await withDatabase(name, async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url, ...options });
    try {
      await fn(app, sql, db);
    } finally {
      await app.close();
    }
  });
}

/** Set a default of `sql`'s database (`ALTER DATABASE … SET`), for sessions opened from now on. */
export async function setDatabaseDefault(sql: Sql, name: string, value: string): Promise<void> {
  const [{ db }] = await sql`select current_database() as db`;
  const literal = `'${value.replaceAll("'", "''")}'`;
  await sql`alter database ${sql(db)} set ${sql.unsafe(name)} = ${sql.unsafe(literal)}`;
}

/** Count the jobs in the default schema (in `state` only, when given). */
export async function countJobs(sql: Sql, state?: string): Promise<number> {
  const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
    where ${state === undefined ? sql`true` : sql`state = ${state}`}`;
  return n;
}

/** A worker running in this process, for tests. */
export interface RunningWorker {
  /** The worker. */
  worker: Worker;
  /** Resolves when `run()` returns. */
  exit: Promise<WorkerExit>;
  /** Stop gracefully and wait for the exit. */
  stop(): Promise<WorkerExit>;
}

/** Start `new Worker(app, options).run()` with fast test timings unless overridden. */
export function startWorker(app: Akadze, options: WorkerOptions = {}): RunningWorker {
  const worker = new Worker(app, {
    pollInterval: 100,
    heartbeatInterval: 500,
    heartbeatTtl: 5_000,
    shutdownTimeout: 2_000,
    ...options,
  });
  const exit = worker.run();
  return {
    worker,
    exit,
    stop: () => {
      worker.stop();
      return exit;
    },
  };
}

/** Wait until job `id` satisfies `check` (its row), returning the row. */
export async function waitForJob(
  sql: Sql,
  id: string,
  check: (row: Record<string, unknown>) => boolean,
  what = "the job",
  timeoutMs = 30_000,
): Promise<Record<string, unknown>> {
  const row = await waitFor(
    async () => {
      const [row] = await sql`select * from akadze.jobs where id = ${id}`;
      return row && check(row) ? row : null;
    },
    what,
    timeoutMs,
  );
  return row as Record<string, unknown>;
}

/** The claim of a worker "w1" of task "work" (no hooks) on `sql`, for tests that drive it. */
export function workClaimer(sql: Sql): Claimer {
  return new Claimer(sql, { schema: "akadze", workerId: "w1", tasks: ["work"], hooks: [] });
}

/** Sequential scans of akadze.jobs so far, with `sql`'s own pending counts reported first. */
export async function jobsSeqScans(sql: Sql): Promise<number> {
  await sql`select pg_stat_force_next_flush()`;
  const [{ n }] = await sql`
    select seq_scan::int as n from pg_stat_user_tables
     where schemaname = 'akadze' and relname = 'jobs'`;
  return n;
}

/** Resolve with `promise`'s value, or fail after `ms`. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Wait until a session of `sql`'s database waits on a lock, running a statement whose text
 * is LIKE `query` (any statement when omitted).
 */
export async function waitForLockWait(sql: Sql, what: string, query = "%"): Promise<void> {
  await waitFor(async () => {
    const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
      where datname = current_database() and wait_event_type = 'Lock' and query like ${query}`;
    return n > 0;
  }, what);
}

/** A transaction of another session, holding what `take` locked until `release()`. */
export interface HeldLocks {
  /** End the transaction (rolled back) and close its connection. */
  release(): Promise<void>;
}

/** Open a session on `url`, run `take` in a transaction, and keep it open until released. */
export async function holdLocks(
  url: string,
  take: (tx: postgres.TransactionSql) => Promise<unknown>,
): Promise<HeldLocks> {
  const holder = postgres(url, { max: 1, onnotice: () => {} });
  let release!: () => void;
  const released = new Promise<void>((resolve) => release = resolve);
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => locked = resolve);
  const holding = holder.begin(async (tx) => {
    await take(tx);
    locked();
    await released;
  });
  await Promise.race([isLocked, holding]);
  return {
    async release() {
      release();
      await holding;
      await holder.end();
    },
  };
}

/**
 * Count the driver's writes on a connection it has let go (the rollback of a transaction
 * whose connection closed), which the pools' guard absorbs, until `stop()`.
 */
export function watchClosedConnectionWrites(): { count(): number; stop(): void } {
  let count = 0;
  const seen = (event: ErrorEvent) => {
    if (event.defaultPrevented && isClosedConnectionWrite(event.error)) count++;
  };
  globalThis.addEventListener("error", seen);
  return { count: () => count, stop: () => globalThis.removeEventListener("error", seen) };
}
