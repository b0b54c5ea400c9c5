/**
 * `akadze health`: a probe with an exit code. With `--heartbeat-file` it checks that the
 * worker's liveness files are fresh, without any database access (a liveness probe);
 * without it, it checks the database: reachable, schema migrated, the lag and count of
 * ready jobs per queue under the given thresholds, and optionally that no transaction has
 * held back the cleanup of old rows for too long.
 *
 * @module
 */
import {
  connect,
  DEFAULT_SCHEMA,
  describeError,
  quoteSchema,
  type Sql,
  urlPassword,
} from "../db.ts";
import { readPausedQueues, readReadyJobs } from "../admin/queues.ts";
import { AkadzeError } from "../errors.ts";
import { type Horizon, readHorizon } from "../horizon.ts";
import { pendingVersions } from "../migrate.ts";
import { checkQueueName } from "../rules.ts";
import { databaseUrl, integerFlag, parseFlags, secondsText, UsageError } from "./common.ts";
import { heartbeatFiles } from "./heartbeat_files.ts";
import { safeText } from "./output.ts";
import { MAX_PROCESSES } from "./worker_flags.ts";

/** The default of `--max-age`, seconds. */
export const DEFAULT_MAX_AGE = 60;
/** The default of `--timeout`, seconds. */
export const DEFAULT_HEALTH_TIMEOUT = 10;

/** Help text of `akadze health`. */
export const HEALTH_HELP = `Usage: akadze health --heartbeat-file PATH [--processes N] [--max-age S]
       akadze health [--max-lag S] [--max-ready N] [--queue Q]... [--max-transaction-age S]
                     [--schema NAME]

Exit 0 when healthy, else 1 with one line saying what is wrong (2: usage error).

Liveness, without any database access (for container and Kubernetes probes):
  --heartbeat-file PATH   the worker's --heartbeat-file: PATH must have been modified
                          within --max-age, or with --processes N all of PATH.supervisor
                          and PATH.0 ... PATH.N-1
  --processes N           the worker's --processes (default 1)
  --max-age S             seconds (decimals allowed; default ${DEFAULT_MAX_AGE})

Database (AKADZE_DATABASE_URL): reachable, schema migrated, and per queue:
  --max-lag S             the oldest ready job has waited at most S seconds
  --max-ready N           at most N jobs are ready (queued and due)
  -q, --queue Q           only these queues (repeat or separate with commas; default all)
  --max-transaction-age S and no transaction in the database has been open for more
                          than S seconds while holding back the cleanup of old rows (it
                          slows claims); other roles' sessions count only with pg_monitor
  --schema NAME           schema name (default ${DEFAULT_SCHEMA})
  --timeout S             give up (unhealthy) after S seconds (default ${DEFAULT_HEALTH_TIMEOUT})

  -h, --help              show this help`;

/** The result of a check: healthy or not, and the one line that says so. */
export interface HealthReport {
  /** Healthy. */
  ok: boolean;
  /** One line: what was checked, or what is stale, missing or over a threshold. */
  line: string;
}

/**
 * Check that each file was modified within `maxAgeMs` of `now` (ms since the epoch),
 * reading metadata only. A file modified "in the future" (clock skew) counts as fresh.
 */
export async function checkHeartbeatFiles(
  files: readonly string[],
  maxAgeMs: number,
  now: number = Date.now(),
): Promise<HealthReport> {
  const problems: string[] = [];
  let oldest = 0;
  for (const file of files) {
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(file);
    } catch (error) {
      problems.push(
        error instanceof Deno.errors.NotFound
          ? `${file} is missing`
          : `${file} cannot be read: ${describeError(error)}`,
      );
      continue;
    }
    if (info.mtime === null) {
      problems.push(`${file} has no modification time`);
      continue;
    }
    const age = Math.max(0, now - info.mtime.getTime());
    oldest = Math.max(oldest, age);
    if (age > maxAgeMs) {
      problems.push(`${file} is stale (${seconds(age)} s old, max ${seconds(maxAgeMs)} s)`);
    }
  }
  if (problems.length > 0) return { ok: false, line: problems.join("; ") };
  const what = files.length === 1 ? files[0] : `${files.length} heartbeat files`;
  return {
    ok: true,
    line: `${what} fresh (oldest ${seconds(oldest)} s old, max ${seconds(maxAgeMs)} s)`,
  };
}

/** Thresholds of {@linkcode checkDatabase}. */
export interface DatabaseHealthOptions {
  /** The schema holding akadze's tables. Default `"akadze"`. */
  schema?: string;
  /** Unhealthy when a queue's oldest ready job has waited longer (seconds). */
  maxLag?: number;
  /** Unhealthy when a queue has more ready jobs. */
  maxReady?: number;
  /** Only these queues (default all). */
  queues?: readonly string[];
  /**
   * Unhealthy when a transaction (a session's or a prepared one) that holds back the
   * cleanup of old rows has been open longer (seconds).
   */
  maxTransactionAge?: number;
}

/** One queue's ready jobs, as {@linkcode checkDatabase} reads them. */
interface ReadyQueue {
  queue: string;
  ready: number;
  lag: number;
  paused: boolean;
}

/**
 * Check the database: the schema is migrated, and no queue has more ready jobs (queued,
 * due) than `maxReady` or an oldest ready job older than `maxLag` seconds. Read-only, one
 * short transaction with a statement timeout. Errors (unreachable, refused) propagate.
 */
export async function checkDatabase(
  sql: Sql,
  options: DatabaseHealthOptions = {},
): Promise<HealthReport> {
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const s = quoteSchema(schema);
  const pending = await pendingVersions(sql, { schema });
  if (pending.length > 0) {
    return {
      ok: false,
      line: `schema "${schema}" is not migrated (pending: ${pending.join(", ")})`,
    };
  }
  const queues = options.queues && options.queues.length > 0 ? [...options.queues] : null;
  const { read, horizon } = await sql.begin(
    "isolation level repeatable read read only",
    async (tx) => {
      await tx`set local statement_timeout = '5s'`;
      const read = {
        ready: await readReadyJobs(tx, s, queues),
        pauses: await readPausedQueues(tx, s),
      };
      const horizon = options.maxTransactionAge === undefined
        ? null
        : await readHorizon(tx, { schema });
      return { read, horizon };
    },
  );
  const paused = new Set(read.pauses);
  const ready: ReadyQueue[] = read.ready.map((r) => ({ ...r, paused: paused.has(r.queue) }));
  const problems: string[] = [];
  for (const q of ready) {
    const paused = q.paused ? " (paused)" : "";
    if (options.maxReady !== undefined && q.ready > options.maxReady) {
      problems.push(`queue ${q.queue}${paused}: ${q.ready} ready jobs > ${options.maxReady}`);
    }
    if (options.maxLag !== undefined && q.lag > options.maxLag) {
      problems.push(
        `queue ${q.queue}${paused}: oldest ready job waited ${
          q.lag.toFixed(1)
        } s > ${options.maxLag} s`,
      );
    }
  }
  const held = horizon && options.maxTransactionAge !== undefined
    ? heldBack(horizon, options.maxTransactionAge)
    : null;
  if (held?.problem) problems.push(held.problem);
  if (problems.length > 0) return { ok: false, line: problems.join("; ") };
  const total = ready.reduce((sum, q) => sum + q.ready, 0);
  const lag = ready.reduce((max, q) => Math.max(max, q.lag), 0);
  const scope = queues ? ` in ${queues.join(", ")}` : "";
  return {
    ok: true,
    line: `database reachable, schema "${schema}" up to date, ${total} ready jobs${scope}` +
      (total > 0 ? `, oldest waited ${lag.toFixed(1)} s` : "") + (held?.note ?? ""),
  };
}

/**
 * The `--max-transaction-age` check: a problem when a session's or a prepared transaction
 * holding back cleanup is older than `max` seconds, else a note for the healthy line.
 */
function heldBack(horizon: Horizon, max: number): { problem?: string; note: string } {
  if (!horizon.holders) {
    return { note: ", open transactions not checked (this role may not read them)" };
  }
  const session = horizon.holders.session;
  const prepared = horizon.holders.prepared;
  const cost = "holds back the cleanup of old job rows, which slows claims down";
  if (session && session.seconds > max) {
    const pid = session.pid === null ? "" : ` (server process ${session.pid})`;
    const end = session.pid === null
      ? "end it"
      : `end it with SELECT pg_terminate_backend(${session.pid})`;
    return {
      problem: `a transaction${pid} has been open for ${session.seconds.toFixed(1)} s > ` +
        `${max} s and ${cost}: if it is not needed, ${end}`,
      note: "",
    };
  }
  if (prepared && prepared.seconds > max) {
    return {
      problem: `a prepared transaction has been open for ${prepared.seconds.toFixed(1)} s > ` +
        `${max} s and ${cost}: finish it with COMMIT PREPARED or ROLLBACK PREPARED ` +
        "(pg_prepared_xacts lists it)",
      note: "",
    };
  }
  const oldest = Math.max(session?.seconds ?? 0, prepared?.seconds ?? 0);
  const hidden = horizon.hiddenSessions > 0
    ? ` (${horizon.hiddenSessions} of other roles' sessions not checked: ` +
      "grant this role pg_monitor)"
    : "";
  return { note: `, oldest open transaction ${oldest.toFixed(1)} s${hidden}` };
}

/** Run `akadze health`; returns the exit code (0 healthy, 1 unhealthy). */
export async function healthCommand(args: string[]): Promise<number> {
  const { values } = parseFlags(
    args,
    {
      "heartbeat-file": { type: "string" },
      processes: { type: "string" },
      "max-age": { type: "string" },
      "max-lag": { type: "string" },
      "max-ready": { type: "string" },
      "max-transaction-age": { type: "string" },
      queue: { type: "string", short: "q", multiple: true },
      schema: { type: "string" },
      timeout: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    false,
    "akadze health",
  );
  if (values.help) {
    console.log(HEALTH_HELP);
    return 0;
  }
  const path = values["heartbeat-file"];
  let report: HealthReport;
  if (path !== undefined) {
    for (
      const flag of [
        "max-lag",
        "max-ready",
        "max-transaction-age",
        "queue",
        "schema",
        "timeout",
      ] as const
    ) {
      if (values[flag] !== undefined) {
        throw new UsageError(
          `--${flag} checks the database; --heartbeat-file checks files only (run two probes)`,
        );
      }
    }
    if (path === "") throw new UsageError("--heartbeat-file needs a path");
    const processes = values.processes === undefined
      ? 1
      : integerFlag("--processes", values.processes, 1, MAX_PROCESSES);
    const maxAge = values["max-age"] === undefined
      ? DEFAULT_MAX_AGE
      : positiveSeconds("--max-age", values["max-age"]);
    report = await checkHeartbeatFiles(heartbeatFiles(path, processes), maxAge * 1000);
  } else {
    for (const flag of ["processes", "max-age"] as const) {
      if (values[flag] !== undefined) throw new UsageError(`--${flag} goes with --heartbeat-file`);
    }
    const queues = values.queue?.flatMap((q) => q.split(",")).map((q) => q.trim());
    for (const queue of queues ?? []) checkQueueName(queue, UsageError);
    const options: DatabaseHealthOptions = {
      schema: values.schema,
      queues,
      maxLag: values["max-lag"] === undefined
        ? undefined
        : nonNegativeSeconds("--max-lag", values["max-lag"]),
      maxReady: values["max-ready"] === undefined
        ? undefined
        : integerFlag("--max-ready", values["max-ready"], 0, Number.MAX_SAFE_INTEGER),
      maxTransactionAge: values["max-transaction-age"] === undefined
        ? undefined
        : nonNegativeSeconds("--max-transaction-age", values["max-transaction-age"]),
    };
    if (options.schema !== undefined) {
      try {
        quoteSchema(options.schema);
      } catch (error) {
        if (error instanceof AkadzeError) throw new UsageError(`--schema: ${error.message}`);
        throw error;
      }
    }
    const timeout = values.timeout === undefined
      ? DEFAULT_HEALTH_TIMEOUT
      : positiveSeconds("--timeout", values.timeout);
    report = await probeDatabase(databaseUrl(), options, timeout);
  }
  if (report.ok) {
    console.log(`ok: ${safeText(report.line)}`);
    return 0;
  }
  console.error(`unhealthy: ${safeText(report.line)}`);
  return 1;
}

/** {@linkcode checkDatabase} on a one-connection pool, unhealthy after `timeout` seconds. */
async function probeDatabase(
  url: string,
  options: DatabaseHealthOptions,
  timeout: number,
): Promise<HealthReport> {
  const sql = connect(url, {
    max: 1,
    applicationName: "akadze health",
    connectTimeout: Math.max(1, Math.ceil(timeout)),
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const password = urlPassword(url);
  try {
    return await Promise.race([
      checkDatabase(sql, options).catch((error): HealthReport => ({
        ok: false,
        line: `database: ${describeError(error, password ? [password] : [])}`,
      })),
      new Promise<HealthReport>((resolve) => {
        timer = setTimeout(
          () => resolve({ ok: false, line: `database did not answer within ${timeout} s` }),
          timeout * 1000,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
    await sql.end({ timeout: 0 }).catch(() => {});
  }
}

function seconds(ms: number): string {
  return (ms / 1000).toFixed(1).replace(/\.0$/, "");
}

function positiveSeconds(flag: string, text: string): number {
  const value = secondsText(text);
  if (!(value > 0) || value > 2147483) {
    throw new UsageError(`${flag} must be a positive number of seconds, got "${text}"`);
  }
  return value;
}

function nonNegativeSeconds(flag: string, text: string): number {
  const value = secondsText(text);
  if (!(value >= 0) || value > 2147483) {
    throw new UsageError(`${flag} must be a number of seconds, got "${text}"`);
  }
  return value;
}
