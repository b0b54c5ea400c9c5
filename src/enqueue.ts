/**
 * Enqueue: option and argument checks (each an `EnqueueError` with nothing inserted), and
 * the one INSERT statement that stores a batch, wakes workers and honours uniqueKey.
 *
 * @module
 */
import {
  atomically,
  explainMissingSchema,
  jobsChannel,
  PREPARED,
  quoteSchema,
  type Sql,
  type TransactionSql,
} from "./db.ts";
import { DuplicateJob, EnqueueError } from "./errors.ts";
import { ACTIVE_STATES, type EnqueuedJob, type OnEnqueueHook, stateList } from "./job.ts";
import { isPlainObject, jsonProblem } from "./json.ts";
import { isNodePostgres, type NodePostgresClient } from "./node_postgres.ts";
import {
  checkQueueName,
  isDelay,
  isKeyLength,
  isMaxAttempts,
  isPriority,
  KEY_MAX_LENGTH,
  MAX_ARGS_BYTES,
  MAX_ATTEMPTS_MAX,
  MAX_DELAY,
  PRIORITY_MAX,
  PRIORITY_MIN,
} from "./rules.ts";
import {
  formatIssues,
  OWN_OUTPUT_ADVICE,
  ownOutputProblem,
  type StandardSchemaV1,
} from "./standard_schema.ts";
import { tracePublish } from "./tracing.ts";

/** Per-enqueue options, given to `task.using(...)` (never mixed with task arguments). */
export interface EnqueueOptions {
  /**
   * Run the INSERT on this connection or transaction (a rollback removes the job): a
   * postgres.js instance or transaction, or a node-postgres client
   * ({@linkcode NodePostgresClient}; not while the app has `onEnqueue` hooks, which take a
   * postgres.js transaction).
   */
  session?: Sql | TransactionSql | NodePostgresClient;
  /** Milliseconds from now (database clock) until the job is ready. */
  delay?: number;
  /** When the job becomes ready. Not with `delay`. */
  runAt?: Date;
  /** Overrides the task's priority (smallint; higher runs first). */
  priority?: number;
  /** Overrides the task's attempt budget (1..2147483647). */
  maxAttempts?: number;
  /**
   * At most one waiting, queued or running job per key. What a second enqueue of the key does
   * is `onDuplicate`'s choice (by default it raises `DuplicateJob`), with `whileRunning` and
   * `throttle`.
   */
  uniqueKey?: string;
  /**
   * What an enqueue does when its `uniqueKey` is held (needs a `uniqueKey`):
   * - `"raise"` (the default): throw `DuplicateJob`; the caller's transaction stays usable;
   * - `"keep"`: return the holder's id, the holder unchanged;
   * - `"replace"`: a queued holder takes this enqueue's task, arguments and options (`runAt`,
   *   `delay`, priority, attempts, queue, keys, expiry) and its id is returned;
   * - `"debounce"`: as `"replace"`, but the run time only moves later (the later of the
   *   holder's and this enqueue's): with a `delay`, the job runs that long after the last
   *   enqueue of the key.
   *
   * A running holder is kept (its id returned) unless `whileRunning` is `"queueOne"`; a
   * waiting flow step, or a queued one, is kept as it is.
   *
   * @example Debounce: one reindex, 5 s after the last change
   * ```ts ignore
   * await reindex.using({ uniqueKey: "reindex:42", onDuplicate: "debounce", delay: 5_000 })
   *   .enqueue({ id: 42 });
   * ```
   */
  onDuplicate?: "raise" | "keep" | "replace" | "debounce";
  /**
   * When the key's holder is running: `"keep"` (the default) leaves it the holder (the
   * duplicate is `onDuplicate`'s: raised, or the running job's id returned); `"queueOne"`
   * queues exactly one more job, which takes the key over (the running job's `uniqueKey`
   * becomes null): at most one queued and one running job per key. Needs a `uniqueKey`.
   */
  whileRunning?: "keep" | "queueOne";
  /**
   * Milliseconds: once a job of the `uniqueKey` is enqueued (or found holding it), every
   * enqueue of the key within that window returns that job's id, whatever its state, even
   * finished: at most one job per key per window. Needs a `uniqueKey`.
   */
  throttle?: number;
  /** Subject the job to the limits stored for this key (`setLimit`). */
  limitKey?: string;
  /** After this instant the job is cancelled instead of run. */
  expiresAt?: Date;
  /** Overrides the task's queue. */
  queue?: string;
}

/** The names of {@linkcode EnqueueOptions}, in their order. */
export const OPTION_NAMES: ReadonlySet<string> = new Set([
  "session",
  "delay",
  "runAt",
  "priority",
  "maxAttempts",
  "uniqueKey",
  "onDuplicate",
  "whileRunning",
  "throttle",
  "limitKey",
  "expiresAt",
  "queue",
]);

/** The options of {@linkcode EnqueueOptions} that say what a held `uniqueKey` does (not in flows). */
export const KEY_MODE_NAMES: ReadonlySet<string> = new Set([
  "onDuplicate",
  "whileRunning",
  "throttle",
]);

/** A `uniqueKey`'s modes, as `enqueue_keyed` takes them (null: refuse, today's statement). */
interface KeyMode {
  on_duplicate: "raise" | "keep" | "replace" | "debounce";
  while_running: "keep" | "queue_one";
  throttle_ms: number | null;
}

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
  /** The largest arguments of one job, bytes of JSON text. Default {@linkcode MAX_ARGS_BYTES}. */
  readonly maxArgsBytes?: number;
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

// The SQL functions akadze.enqueue() and enqueue_many() check the same rules (rules.ts).

/** What every job of one enqueue call shares (all but the arguments). */
export interface Base {
  task: string;
  queue: string;
  priority: number;
  max_attempts: number;
  run_at: string | null;
  delay_ms: number | null;
  expires_at: string | null;
  unique_key: string | null;
  limit_key: string | null;
  /** The W3C trace context of the enqueue's span, JSON text (tracing.ts); null when off. */
  trace_context?: string | null;
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
  const many = argsList.length > 1;
  const maxBytes = host.maxArgsBytes ?? MAX_ARGS_BYTES;
  const checked: Record<string, unknown>[] = [];
  const texts: string[] = [];
  for (let i = 0; i < argsList.length; i++) {
    const index = many ? i : undefined;
    const pending = checkArgs(target, argsList[i], index);
    const args = pending instanceof Promise ? await pending : pending;
    checked.push(args);
    texts.push(checkSize(target, JSON.stringify(args), maxBytes, index));
  }
  checkQueueName(base.queue, EnqueueError);
  const mode = checkKeyMode(options, base.unique_key);
  if (checked.length === 0) return [];
  if (checked.length > 1 && base.unique_key !== null) {
    // Each job after the first would find the key held by the first.
    throw new DuplicateJob(
      `the ${checked.length} jobs of this batch cannot share uniqueKey ` +
        `${JSON.stringify(base.unique_key)}: at most one job per key is queued or running; ` +
        "nothing of this batch was enqueued",
    );
  }
  if (host.hooks.onEnqueue.length > 0 && isNodePostgres(options.session)) {
    throw new EnqueueError(
      `cannot enqueue task "${target.name}" on a node-postgres session: this app has ` +
        "onEnqueue hooks, which run in the enqueue's transaction and take a postgres.js " +
        "transaction; enqueue on a postgres.js session (app.sql, or a transaction of it) " +
        "instead; nothing was enqueued",
    );
  }
  const publish = { task: base.task, queue: base.queue, count: checked.length };
  return await tracePublish(publish, (traceContext) =>
    explainMissingSchema(
      host.schema,
      () =>
        insertRows(
          host,
          { ...base, trace_context: traceContext },
          checked,
          texts,
          options.session,
          mode,
        ),
      EnqueueError,
      `cannot enqueue task "${target.name}": `,
    ));
}

/**
 * One job's options checked as {@linkcode enqueueJobs} checks them (the steps of a flow are
 * checked so), its queue name too; throws `EnqueueError`. With `bases`, the options (the same
 * for each call) are checked once per target and the same object is returned for it: a
 * caller never changes it.
 */
export function checkJobOptions(
  target: EnqueueTarget,
  options: Omit<EnqueueOptions, "session">,
  bases?: Map<EnqueueTarget, Base>,
): Base {
  const known = bases?.get(target);
  if (known) return known;
  const base = checkOptions(target, options);
  checkQueueName(base.queue, EnqueueError);
  bases?.set(target, base);
  return base;
}

/** The JSON text of checked arguments, refused over the size limit (`EnqueueError`). */
export function argsText(
  host: EnqueueHost,
  target: EnqueueTarget,
  args: Record<string, unknown>,
): string {
  return checkSize(target, JSON.stringify(args), host.maxArgsBytes ?? MAX_ARGS_BYTES, undefined);
}

/**
 * Refuse arguments over `maxBytes` of JSON text before they reach the database (which
 * would take its time over a huge value, then fail with its own error). Returns the text.
 */
function checkSize(
  target: EnqueueTarget,
  text: string,
  maxBytes: number,
  index: number | undefined,
): string {
  // A UTF-16 unit is 1 to 3 bytes of UTF-8: count bytes only when the length cannot decide.
  if (text.length * 3 <= maxBytes) return text;
  const bytes = text.length > maxBytes ? text.length : new TextEncoder().encode(text).length;
  if (bytes > maxBytes) {
    throw new EnqueueError(
      `arguments for ${which(target, index)} are ${
        text.length > maxBytes ? "at least " : ""
      }${bytes} bytes of JSON, over the limit of ${maxBytes} bytes (the Akadze option ` +
        "maxArgsBytes); store large data elsewhere and pass a reference",
    );
  }
  return text;
}

function checkOptions(target: EnqueueTarget, options: EnqueueOptions): Base {
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
  if (delay !== undefined && !isDelay(delay)) {
    throw new EnqueueError(
      `delay must be a non-negative number of milliseconds, at most ${MAX_DELAY} (365 days), ` +
        `got ${delay}`,
    );
  }
  for (const [name, value] of [["runAt", runAt], ["expiresAt", expiresAt]] as const) {
    if (value !== undefined && !(value instanceof Date && Number.isFinite(value.getTime()))) {
      throw new EnqueueError(`${name} must be a valid Date`);
    }
  }
  const priority = options.priority ?? target.priority;
  if (!isPriority(priority)) {
    throw new EnqueueError(
      `priority must be an integer from ${PRIORITY_MIN} to ${PRIORITY_MAX}, got ${priority}`,
    );
  }
  const maxAttempts = options.maxAttempts ?? target.maxAttempts;
  if (!isMaxAttempts(maxAttempts)) {
    throw new EnqueueError(
      `maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS_MAX}, got ${maxAttempts}`,
    );
  }
  const uniqueKey = checkKey("uniqueKey", options.uniqueKey);
  const limitKey = checkKey("limitKey", options.limitKey);
  if (
    session !== undefined && typeof (session as { unsafe?: unknown }).unsafe !== "function" &&
    !isNodePostgres(session)
  ) {
    throw new EnqueueError(
      "session must be a postgres.js sql instance or transaction, or a node-postgres client " +
        "(pg.Client, a client from pool.connect(), or pg.Pool)",
    );
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

/**
 * The `uniqueKey` modes of `options`, or null when a duplicate is refused without a throttle
 * or a running rule (today's statement, `ON CONFLICT DO NOTHING`, serves that).
 */
function checkKeyMode(options: EnqueueOptions, uniqueKey: string | null): KeyMode | null {
  const { onDuplicate, whileRunning, throttle } = options;
  // The common case, with or without a uniqueKey: nothing to check, nothing allocated.
  if (onDuplicate === undefined && whileRunning === undefined && throttle === undefined) {
    return null;
  }
  if (
    onDuplicate !== undefined && onDuplicate !== "raise" && onDuplicate !== "keep" &&
    onDuplicate !== "replace" && onDuplicate !== "debounce"
  ) {
    throw new EnqueueError(
      `onDuplicate must be "raise", "keep", "replace" or "debounce", got ${shown(onDuplicate)}`,
    );
  }
  if (whileRunning !== undefined && whileRunning !== "keep" && whileRunning !== "queueOne") {
    throw new EnqueueError(
      `whileRunning must be "keep" or "queueOne", got ${shown(whileRunning)}`,
    );
  }
  if (throttle !== undefined && !(isDelay(throttle) && throttle > 0)) {
    throw new EnqueueError(
      `throttle must be a positive number of milliseconds, at most ${MAX_DELAY} (365 days), ` +
        `got ${throttle}`,
    );
  }
  const given = [
    ["onDuplicate", onDuplicate],
    ["whileRunning", whileRunning],
    ["throttle", throttle],
  ].filter(([, value]) => value !== undefined).map(([name]) => name);
  if (uniqueKey === null) {
    throw new EnqueueError(
      `${given.join(", ")} ${given.length > 1 ? "need" : "needs"} a uniqueKey`,
    );
  }
  if ((onDuplicate ?? "raise") === "raise" && (whileRunning ?? "keep") === "keep") {
    if (throttle === undefined) return null;
  }
  return {
    on_duplicate: onDuplicate ?? "raise",
    while_running: whileRunning === "queueOne" ? "queue_one" : "keep",
    throttle_ms: throttle ?? null,
  };
}

/** A value in an error message: a string quoted, anything else as `String` shows it. */
function shown(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}

function checkKey(name: string, value: unknown): string | null {
  if (value === undefined || value === null) return null;
  if (!isKeyLength(value)) {
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
 * schema's output, which the schema must accept unchanged: the worker validates it again),
 * and as a JSON object that jsonb can carry faithfully. Synchronous without a schema, so a
 * batch (or a flow of thousands of steps) costs no promise per element.
 */
export function checkArgs(
  target: EnqueueTarget,
  args: unknown,
  index?: number,
): Record<string, unknown> | Promise<Record<string, unknown>> {
  const schema = target.args;
  if (!schema) return checkStorable(target, args, index);
  return Promise.resolve(schema["~standard"].validate(args)).then((result) => {
    if (result.issues) {
      throw new EnqueueError(
        `invalid arguments for ${which(target, index)}: ${formatIssues(result.issues)}`,
      );
    }
    const value = checkStorable(target, result.value, index);
    const settle = (problem: string | null) => {
      if (!problem) return value;
      throw new EnqueueError(
        `cannot enqueue ${which(target, index)}: its args schema ${problem}; nothing was ` +
          "enqueued. " +
          OWN_OUTPUT_ADVICE,
      );
    };
    const own = ownOutputProblem(schema, args, value);
    return own instanceof Promise ? own.then(settle) : settle(own);
  });
}

function checkStorable(
  target: EnqueueTarget,
  value: unknown,
  index: number | undefined,
): Record<string, unknown> {
  if (!isPlainObject(value)) {
    throw new EnqueueError(`arguments for ${which(target, index)} must be a JSON object`);
  }
  const problem = jsonProblem(value, "args");
  if (problem) {
    throw new EnqueueError(`arguments for ${which(target, index)} cannot be stored: ${problem}`);
  }
  return value as Record<string, unknown>;
}

function which(target: EnqueueTarget, index: number | undefined): string {
  return `task "${target.name}"${index === undefined ? "" : ` (element ${index})`}`;
}

/** Insert the jobs; `texts` are the arguments' JSON texts, in the order of `argsList`. */
async function insertRows(
  host: EnqueueHost,
  base: Base,
  argsList: Record<string, unknown>[],
  texts: string[],
  session: Sql | TransactionSql | NodePostgresClient = host.sql,
  mode: KeyMode | null = null,
): Promise<string[]> {
  const hooks = host.hooks.onEnqueue;
  const one = argsList.length === 1;
  const params = [
    base.task,
    base.queue,
    base.priority,
    // The same text as JSON.stringify of the list: no spaces, elements in order.
    one ? texts[0] : `[${texts.join(",")}]`,
    base.max_attempts,
    base.run_at,
    base.delay_ms,
    base.expires_at,
    base.unique_key,
    base.limit_key,
    base.trace_context ?? null,
  ];
  if (mode !== null) {
    const keyed = [...params, mode.on_duplicate, mode.while_running, mode.throttle_ms, host.notify];
    return await insertKeyed(host, base, keyed, session);
  }
  if (host.notify) params.push(jobsChannel(host.schema));
  const text = insertStatement(host, {
    one,
    unique: base.unique_key !== null,
    full: hooks.length > 0,
  });
  const run = async (tx: Sql | TransactionSql | NodePostgresClient): Promise<string[]> => {
    const inserted = isNodePostgres(tx)
      ? (await tx.query(text, params)).rows as Record<string, unknown>[]
      : await tx.unsafe(text, params as string[], PREPARED);
    // A batch never shares a uniqueKey (enqueueJobs refuses it), so only one job can collide.
    if (inserted.length < argsList.length) throw heldKey(base);
    if (hooks.length > 0) {
      for (const row of inserted) await runHooks(hooks, tx, base, row);
    }
    return inserted.map((r) => r.id as string);
  };
  // One statement is atomic on its own; hooks need a transaction (or a savepoint in the
  // caller's) so that their failure undoes this enqueue only. Hooks never come with a
  // node-postgres session (enqueueJobs refuses it).
  if (hooks.length === 0) return await run(session);
  return await atomically(session as Sql | TransactionSql, run);
}

/**
 * One job with a `uniqueKey` and its modes: `enqueue_keyed` (migration 0015) inserts it, or
 * keeps or replaces the key's holder, in one statement, so a duplicate is never an error that
 * aborts the caller's transaction; `DuplicateJob` comes after a statement that succeeded.
 */
async function insertKeyed(
  host: EnqueueHost,
  base: Base,
  params: unknown[],
  session: Sql | TransactionSql | NodePostgresClient,
): Promise<string[]> {
  const hooks = host.hooks.onEnqueue;
  const statement = keyedStatement(host.schema);
  const run = async (tx: Sql | TransactionSql | NodePostgresClient): Promise<string[]> => {
    const [row] = isNodePostgres(tx)
      ? (await tx.query(statement, params)).rows as Record<string, unknown>[]
      : await tx.unsafe(statement, params as string[], PREPARED);
    if (row.outcome === "duplicate") throw heldKey(base);
    if (row.outcome !== "kept" && hooks.length > 0) await runHooks(hooks, tx, base, row);
    return [row.id as string];
  };
  if (hooks.length === 0) return await run(session);
  return await atomically(session as Sql | TransactionSql, run);
}

/** The error of an enqueue whose uniqueKey is held (onDuplicate "raise"). */
function heldKey(base: Base): DuplicateJob {
  return new DuplicateJob(
    `a job with uniqueKey ${JSON.stringify(base.unique_key)} is already waiting, queued or running`,
  );
}

/** Run the onEnqueue hooks for one job the statement inserted (or replaced): its `row`. */
async function runHooks(
  hooks: readonly OnEnqueueHook[],
  tx: Sql | TransactionSql | NodePostgresClient,
  base: Base,
  row: Record<string, unknown>,
): Promise<void> {
  const job: EnqueuedJob = {
    id: row.id as string,
    task: base.task,
    queue: base.queue,
    priority: base.priority,
    maxAttempts: base.max_attempts,
    runAt: row.run_at as Date,
    expiresAt: row.expires_at as Date | null,
    uniqueKey: base.unique_key,
    limitKey: base.limit_key,
    args: row.args as Record<string, unknown>,
  };
  for (const hook of hooks) await hook(tx as TransactionSql, job);
}

const keyedStatements = new Map<string, string>();

/** The call of `enqueue_keyed`: the run time as the INSERT below computes it. */
function keyedStatement(schema: string): string {
  let text = keyedStatements.get(schema);
  if (text) return text;
  const ms = "interval '1 millisecond'";
  text = `select k.id::text as id, k.outcome, k.run_at, k.expires_at, k.args
      from ${quoteSchema(schema)}.enqueue_keyed($1::text, $2::text, $3::int, $4::text::jsonb,
             $5::int,
             coalesce($6::timestamptz, pg_catalog.now() operator(pg_catalog.+)
               (coalesce($7::float8, 0) operator(pg_catalog.*) ${ms})),
             $8::timestamptz, $9::text, $10::text, $11::text::jsonb, $12::text, $13::text,
             $14::float8 operator(pg_catalog.*) ${ms}, $15::bool) k`;
  keyedStatements.set(schema, text);
  return text;
}

const statements = new Map<string, string>();

/**
 * The INSERT of one call's jobs. Every job shares all columns but its arguments, so those
 * go once as parameters and the arguments as one JSON text (`one`: an object, else an
 * array unpacked in order). `ON CONFLICT` only when a uniqueKey is set (it costs a
 * speculative insertion per row otherwise); the whole rows come back only for hooks
 * (`full`). One NOTIFY per statement, and only when a row was inserted.
 */
function insertStatement(
  host: EnqueueHost,
  shape: { one: boolean; unique: boolean; full: boolean },
): string {
  const cacheKey = `${host.schema}:${host.notify}:${shape.one}:${shape.unique}:${shape.full}`;
  let text = statements.get(cacheKey);
  if (text) return text;
  const s = quoteSchema(host.schema);
  const columns = `${s}.jobs
        (task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
         trace_context)`;
  const values = `$1::pg_catalog.text, $2::pg_catalog.text, $3::smallint, ARGS, $5::int,
             coalesce($6::pg_catalog.timestamptz, pg_catalog.now() operator(pg_catalog.+)
               (coalesce($7::pg_catalog.float8, 0)
                 operator(pg_catalog.*) interval '1 millisecond')),
             $8::pg_catalog.timestamptz, $9::pg_catalog.text, $10::pg_catalog.text,
               $11::pg_catalog.text::pg_catalog.jsonb`;
  const conflict = shape.unique
    ? `on conflict (unique_key) where state operator(pg_catalog.=) any (array[${
      stateList(ACTIVE_STATES)
    }]) and unique_key is not null
        do nothing`
    : "";
  if (shape.one) {
    // One row: a plain INSERT ... VALUES, a third of the planning and execution time of the
    // CTE below; RETURNING runs the NOTIFY for the inserted row only.
    const returning = shape.full
      ? "id::pg_catalog.text as id, run_at, expires_at, args"
      : "id::pg_catalog.text as id";
    const notify = host.notify
      ? ", pg_catalog.pg_notify($12, $2::pg_catalog.text) as notified"
      : "";
    text = `insert into ${columns}
      values (${values.replace("ARGS", "$4::pg_catalog.text::pg_catalog.jsonb")})
      ${conflict}
      returning ${returning}${notify}`;
  } else {
    const returning = shape.full ? "id, run_at, expires_at, args" : "id";
    const selected = shape.full
      ? "ins.id::pg_catalog.text as id, ins.run_at, ins.expires_at, ins.args"
      : "ins.id::pg_catalog.text as id";
    // An init plan runs once, and not at all when nothing was inserted.
    const notify = host.notify
      ? ", (select pg_catalog.pg_notify($12, $2::pg_catalog.text)) as notified"
      : "";
    text = `
    with ins as (
      insert into ${columns}
      select ${bulkColumns("k", "x.args")}
        from ${bulkShared(s)} k
       cross join pg_catalog.jsonb_array_elements($4::pg_catalog.text::pg_catalog.jsonb)
         with ordinality as x(args, i)
       order by x.i
      ${conflict}
      returning ${returning})
    select ${selected}${notify} from ins order by ins.id`;
  }
  statements.set(cacheKey, text);
  return text;
}

/**
 * The values every row of a batch shares, computed once (`offset 0` keeps the subquery from
 * being pulled up into the per-row plan) and already of the columns' domain types: a domain
 * value assigned to its column is not checked again, so the domains' checks (the queue name's
 * pattern, the key lengths) run once per batch, not once per row, about a third of the bulk
 * INSERT's time in PostgreSQL. The same checks on the same values: nothing else changes.
 */
function bulkShared(s: string): string {
  return `(select $1::pg_catalog.text::${s}.task_name as task,
    $2::pg_catalog.text::${s}.queue_name as queue,
                $3::smallint as priority, $5::int as max_attempts,
                coalesce($6::pg_catalog.timestamptz,
                         (pg_catalog.now() operator(pg_catalog.+)
                           (coalesce($7::pg_catalog.float8, 0)
                             operator(pg_catalog.*) interval '1 millisecond'))) as run_at,
                $8::pg_catalog.timestamptz as expires_at,
                  $9::pg_catalog.text::${s}.job_key as unique_key,
                $10::pg_catalog.text::${s}.job_key as limit_key,
                  $11::pg_catalog.text::pg_catalog.jsonb as trace_context
           offset 0)`;
}

/** The bulk INSERT's select list: the shared values of `k`, the arguments `args`. */
function bulkColumns(k: string, args: string): string {
  return `${k}.task, ${k}.queue, ${k}.priority, ${args}, ${k}.max_attempts, ${k}.run_at,
             ${k}.expires_at, ${k}.unique_key, ${k}.limit_key, ${k}.trace_context`;
}
