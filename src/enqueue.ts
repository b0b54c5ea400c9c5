/**
 * Enqueue: option and argument checks (each an `EnqueueError` with nothing inserted), and
 * the one INSERT statement that stores a batch, wakes workers and honours uniqueKey.
 *
 * @module
 */
import { atomically, jobsChannel, quoteSchema, type Sql, type TransactionSql } from "./db.ts";
import { AkadzeError, DuplicateJob, EnqueueError } from "./errors.ts";
import type { EnqueuedJob, OnEnqueueHook } from "./job.ts";
import { isPlainObject, jsonProblem } from "./json.ts";
import { formatIssues, type StandardSchemaV1 } from "./standard_schema.ts";

/** Per-enqueue options, given to `task.using(...)` (never mixed with task arguments). */
export interface EnqueueOptions {
  /** Run the INSERT on this connection or transaction (a rollback removes the job). */
  session?: Sql | TransactionSql;
  /** Milliseconds from now (database clock) until the job is ready. */
  delay?: number;
  /** When the job becomes ready. Not with `delay`. */
  runAt?: Date;
  /** Overrides the task's priority (smallint; higher runs first). */
  priority?: number;
  /** Overrides the task's attempt budget (1..2147483647). */
  maxAttempts?: number;
  /** At most one queued or running job per key; a second enqueue raises `DuplicateJob`. */
  uniqueKey?: string;
  /** Subject the job to the limits stored for this key (`setLimit`). */
  limitKey?: string;
  /** After this instant the job is cancelled instead of run. */
  expiresAt?: Date;
  /** Overrides the task's queue. */
  queue?: string;
}

const OPTION_NAMES = new Set([
  "session",
  "delay",
  "runAt",
  "priority",
  "maxAttempts",
  "uniqueKey",
  "limitKey",
  "expiresAt",
  "queue",
]);

/** What enqueue needs from the app. */
export interface EnqueueHost {
  /** The app's pool. */
  readonly sql: Sql;
  /** The schema name. */
  readonly schema: string;
  /** Whether to NOTIFY workers. */
  readonly notify: boolean;
  /** The hooks (only `onEnqueue` is used here). */
  readonly hooks: { readonly onEnqueue: readonly OnEnqueueHook[] };
}

/** What enqueue needs from a task. */
export interface EnqueueTarget {
  /** Task name. */
  readonly name: string;
  /** Default queue. */
  readonly queue: string;
  /** Default priority. */
  readonly priority: number;
  /** Default attempt budget. */
  readonly maxAttempts: number;
  /** Argument schema, if any. */
  readonly args?: StandardSchemaV1;
}

/** The queue-name rule (also a CHECK constraint on jobs.queue). */
export const QUEUE_NAME = /^[A-Za-z0-9_.:-]{1,64}$/;
/**
 * Throw `error` (an `AkadzeError` by default) unless `queue` is a valid queue name;
 * returns it.
 */
export function checkQueueName(
  queue: unknown,
  error: new (message: string) => Error = AkadzeError,
): string {
  if (typeof queue !== "string" || !QUEUE_NAME.test(queue)) {
    throw new error(
      `queue name ${JSON.stringify(queue)} must be 1-64 characters of letters, digits, _ . : -`,
    );
  }
  return queue;
}

/** The smallint range of priorities. */
export const PRIORITY_MIN = -32768;
/** The smallint range of priorities. */
export const PRIORITY_MAX = 32767;
/** The largest attempt budget (int4). */
export const MAX_ATTEMPTS_MAX = 2147483647;
const KEY_MAX_LENGTH = 500;

interface Row {
  task: string;
  queue: string;
  priority: number;
  args: Record<string, unknown>;
  max_attempts: number;
  run_at: string | null;
  delay_ms: number | null;
  expires_at: string | null;
  unique_key: string | null;
  limit_key: string | null;
}

/**
 * Check everything, then insert one job per element of `argsList` in one statement and
 * return their ids in order. Throws `EnqueueError` (nothing inserted) or `DuplicateJob`.
 */
export async function enqueueJobs(
  host: EnqueueHost,
  target: EnqueueTarget,
  argsList: readonly unknown[],
  options: EnqueueOptions = {},
): Promise<string[]> {
  const base = checkOptions(target, options);
  const rows: Row[] = [];
  for (let i = 0; i < argsList.length; i++) {
    const args = await checkArgs(target, argsList[i], argsList.length > 1 ? i : undefined);
    rows.push({ ...base, args });
  }
  checkQueueName(base.queue, EnqueueError);
  if (rows.length === 0) return [];
  return await insertRows(host, rows, options.session);
}

function checkOptions(target: EnqueueTarget, options: EnqueueOptions): Omit<Row, "args"> {
  if (!isPlainObject(options)) throw new EnqueueError("enqueue options must be an object");
  for (const key of Object.keys(options)) {
    if (!OPTION_NAMES.has(key)) {
      throw new EnqueueError(
        `unknown enqueue option "${key}" (options: ${[...OPTION_NAMES].join(", ")})`,
      );
    }
  }
  const { delay, runAt, expiresAt, session } = options;
  if (delay !== undefined && runAt !== undefined) {
    throw new EnqueueError("delay and runAt cannot both be set");
  }
  if (delay !== undefined && (typeof delay !== "number" || !Number.isFinite(delay) || delay < 0)) {
    throw new EnqueueError(`delay must be a non-negative number of milliseconds, got ${delay}`);
  }
  for (const [name, value] of [["runAt", runAt], ["expiresAt", expiresAt]] as const) {
    if (value !== undefined && !(value instanceof Date && Number.isFinite(value.getTime()))) {
      throw new EnqueueError(`${name} must be a valid Date`);
    }
  }
  const priority = options.priority ?? target.priority;
  if (!Number.isInteger(priority) || priority < PRIORITY_MIN || priority > PRIORITY_MAX) {
    throw new EnqueueError(
      `priority must be an integer from ${PRIORITY_MIN} to ${PRIORITY_MAX}, got ${priority}`,
    );
  }
  const maxAttempts = options.maxAttempts ?? target.maxAttempts;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > MAX_ATTEMPTS_MAX) {
    throw new EnqueueError(
      `maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS_MAX}, got ${maxAttempts}`,
    );
  }
  const uniqueKey = checkKey("uniqueKey", options.uniqueKey);
  const limitKey = checkKey("limitKey", options.limitKey);
  if (session !== undefined && typeof (session as { unsafe?: unknown }).unsafe !== "function") {
    throw new EnqueueError("session must be a postgres.js sql instance or transaction");
  }
  return {
    task: target.name,
    queue: options.queue ?? target.queue,
    priority,
    max_attempts: maxAttempts,
    run_at: runAt?.toISOString() ?? null,
    delay_ms: delay ?? null,
    expires_at: expiresAt?.toISOString() ?? null,
    unique_key: uniqueKey,
    limit_key: limitKey,
  };
}

function checkKey(name: string, value: unknown): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "string" || value.length === 0 || value.length > KEY_MAX_LENGTH) {
    throw new EnqueueError(
      `${name} must be a non-empty string of at most ${KEY_MAX_LENGTH} characters`,
    );
  }
  const problem = jsonProblem(value, name);
  if (problem) throw new EnqueueError(problem);
  return value;
}

/**
 * Validate one job's arguments: against the task's schema when it has one (storing the
 * schema's output), and as a JSON object that jsonb can carry faithfully.
 */
export async function checkArgs(
  target: EnqueueTarget,
  args: unknown,
  index?: number,
): Promise<Record<string, unknown>> {
  const which = `task "${target.name}"${index === undefined ? "" : ` (element ${index})`}`;
  let value = args;
  if (target.args) {
    const result = await target.args["~standard"].validate(args);
    if (result.issues) {
      throw new EnqueueError(`invalid arguments for ${which}: ${formatIssues(result.issues)}`);
    }
    value = result.value;
  }
  if (!isPlainObject(value)) {
    throw new EnqueueError(`arguments for ${which} must be a JSON object`);
  }
  const problem = jsonProblem(value, "args");
  if (problem) throw new EnqueueError(`arguments for ${which} cannot be stored: ${problem}`);
  return value as Record<string, unknown>;
}

async function insertRows(
  host: EnqueueHost,
  rows: Row[],
  session: Sql | TransactionSql = host.sql,
): Promise<string[]> {
  const hooks = host.hooks.onEnqueue;
  // One statement is atomic on its own; a hook or a batch that may partly collide needs a
  // transaction (or a savepoint in the caller's) so that failure undoes this enqueue only.
  const atomic = hooks.length > 0 || (rows.length > 1 && rows.some((r) => r.unique_key));
  const run = async (tx: Sql | TransactionSql): Promise<string[]> => {
    // One row goes as plain parameters (cheaper to plan than unpacking a JSON batch);
    // only hooks need the whole row back.
    const one = rows.length === 1;
    const params: unknown[] = one ? rowParams(rows[0]) : [JSON.stringify(rows)];
    if (host.notify) params.push(jobsChannel(host.schema));
    const inserted = await tx.unsafe(
      insertStatement(host, one, hooks.length > 0),
      params as string[],
    );
    if (inserted.length < rows.length) {
      const got = new Set(inserted.map((r) => r.unique_key));
      const keys = rows.map((r) => r.unique_key).filter((k) => k !== null && !got.has(k));
      throw new DuplicateJob(
        `a job with uniqueKey ${JSON.stringify(keys[0])} is already queued or running` +
          (rows.length > 1 ? "; nothing of this batch was enqueued" : ""),
      );
    }
    for (const row of inserted) {
      const job: EnqueuedJob = {
        id: row.id,
        task: row.task,
        queue: row.queue,
        priority: row.priority,
        maxAttempts: row.max_attempts,
        runAt: row.run_at,
        expiresAt: row.expires_at,
        uniqueKey: row.unique_key,
        limitKey: row.limit_key,
        args: row.args,
      };
      for (const hook of hooks) await hook(tx as TransactionSql, job);
    }
    return inserted.map((r) => r.id as string);
  };
  return atomic ? await atomically(session, run) : await run(session);
}

const COLUMNS = [
  "task text",
  "queue text",
  "priority smallint",
  "args jsonb",
  "max_attempts int",
  "run_at timestamptz",
  "delay_ms float8",
  "expires_at timestamptz",
  "unique_key text",
  "limit_key text",
] as const;

/** A row as the parameters of the one-row statement, in {@linkcode COLUMNS} order. */
function rowParams(row: Row): unknown[] {
  return [
    row.task,
    row.queue,
    row.priority,
    JSON.stringify(row.args),
    row.max_attempts,
    row.run_at,
    row.delay_ms,
    row.expires_at,
    row.unique_key,
    row.limit_key,
  ];
}

const statements = new Map<string, string>();

/**
 * The INSERT of a batch (`one`: plain parameters for a single row, else a JSON array
 * unpacked by jsonb_to_recordset), returning the whole rows when `full` (for hooks), else
 * just what enqueue needs.
 */
function insertStatement(host: EnqueueHost, one: boolean, full: boolean): string {
  const cacheKey = `${host.schema}:${host.notify}:${one}:${full}`;
  let text = statements.get(cacheKey);
  if (text) return text;
  const s = quoteSchema(host.schema);
  const source = one
    ? `(select ${
      COLUMNS.map((c, i) => {
        const [name, type] = c.split(" ");
        return `$${i + 1}::${type === "jsonb" ? "text::jsonb" : type} as ${name}`;
      }).join(", ")
    }) as x`
    : `jsonb_to_recordset($1::text::jsonb) as x(${COLUMNS.join(", ")})`;
  const channel = `$${one ? COLUMNS.length + 1 : 2}`;
  const notify = host.notify
    ? `, notified as (
         select pg_notify(${channel}, string_agg(distinct queue, ',')) from ins
         having count(*) > 0)`
    : "";
  const returning = full
    ? `id::text as id, task, queue, priority, max_attempts, run_at, expires_at,
                unique_key, limit_key, args`
    : "id::text as id, queue, unique_key";
  text = `
    with ins as (
      insert into ${s}.jobs
        (task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key)
      select x.task, x.queue, x.priority, x.args, x.max_attempts,
             coalesce(x.run_at, now() + coalesce(x.delay_ms, 0) * interval '1 millisecond'),
             x.expires_at, x.unique_key, x.limit_key
        from ${source}
      on conflict (unique_key) where state in ('queued', 'running') and unique_key is not null
        do nothing
      returning ${returning})${notify}
    select ins.* from ins${host.notify ? " cross join (select count(*) from notified) n" : ""}
     order by ins.id::bigint`;
  statements.set(cacheKey, text);
  return text;
}
