/**
 * The application object: the connection, the task registry, hooks and (later)
 * schedules. Workers and admin functions take it.
 *
 * @module
 */
import {
  connect,
  DEFAULT_SCHEMA,
  describeError,
  quoteSchema,
  type Sql,
  type TransactionSql,
} from "./db.ts";
import type { NodePostgresClient } from "./node_postgres.ts";
import { installArrayTypes } from "./array_types.ts";
import { guardPools, installDriverGuard } from "./driver_guard.ts";
import { LISTEN_URL_ENV, poolSizeFromEnv, readEnv } from "./env.ts";
import { AkadzeError, JobNotFound } from "./errors.ts";
import type { Hooks } from "./job.ts";
import { isPlainObject } from "./json.ts";
import { logger } from "./log.ts";
import { MAX_ARGS_BYTES } from "./rules.ts";
import { Schedule, type ScheduleSpec } from "./schedule.ts";
import type { StandardSchemaV1 } from "./standard_schema.ts";
import { closeLoopConnections } from "./loop_connection.ts";
import { type JobDetail, normalizeId } from "./admin/jobs.ts";
import { JobWaiters, type WaitOptions } from "./wait.ts";
import { type EnqueuedFlow, enqueueFlow, flowJobs, type FlowStep } from "./flow.ts";
import {
  type AnyTask,
  type ArgsInput,
  type ArgsOutput,
  Task,
  type TaskHandler,
  type TaskOptions,
} from "./task.ts";

/** Options of {@linkcode Akadze}. Durations are milliseconds. */
export interface AkadzeOptions {
  /** A postgres:// URL; the app opens and owns a pool (`prepare: false`). */
  databaseUrl?: string;
  /** Adopt an existing postgres.js instance instead (never closed by `app.close()`). */
  sql?: Sql;
  /** The schema of akadze's tables. Default `"akadze"`. */
  schema?: string;
  /**
   * How long finished jobs are kept before the worker prunes them. Default 7 days. 0 keeps
   * none: a succeeded job's row is deleted as its outcome is written (by the pruner when
   * there are onTransition hooks), failed and cancelled ones at the next prune.
   */
  retention?: number;
  /** How late a schedule fire may still be enqueued. Default 60 s. */
  grace?: number;
  /**
   * NOTIFY workers on enqueue, and let workers LISTEN for it. Behind PgBouncer in transaction
   * mode, give workers a `listenUrl` that reaches PostgreSQL directly, or turn it off.
   * Default true.
   */
  notify?: boolean;
  /**
   * A postgres:// URL for the workers' LISTEN connection only (everything else uses
   * `databaseUrl` or `sql`): a direct connection to PostgreSQL when the rest goes through a
   * pooler in transaction mode, which cannot carry LISTEN. Default: the environment variable
   * `AKADZE_LISTEN_URL` when set, else the LISTEN connection is derived from the pool.
   */
  listenUrl?: string;
  /**
   * Pool size of the owned pool. Default: the environment variable `AKADZE_POOL_SIZE` when
   * set (`akadze worker --pool-size N` sets it), else 10.
   */
  max?: number;
  /** Use prepared statements in the owned pool. Default false. */
  prepare?: boolean;
  /**
   * The largest arguments of one job, in bytes of JSON text (UTF-8): a bigger enqueue is
   * refused with an `EnqueueError`. Default 1 MiB (1048576).
   */
  maxArgsBytes?: number;
}

const APP_OPTION_NAMES = new Set([
  "databaseUrl",
  "sql",
  "schema",
  "retention",
  "grace",
  "notify",
  "listenUrl",
  "max",
  "prepare",
  "maxArgsBytes",
]);
const DAY_MS = 24 * 60 * 60 * 1000;
// deno-lint-ignore no-explicit-any
type AnyHandler = TaskHandler<any, unknown>;

/**
 * An akadze application: its database, tasks and hooks.
 *
 * @example
 * ```ts ignore
 * import { Akadze } from "@akadze/akadze";
 * import * as v from "valibot";
 *
 * export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
 * export const hello = app.task("hello", { args: v.object({ name: v.string() }) },
 *   ({ name }) => `hello ${name}`);
 *
 * await app.sql.begin(async (tx) => {
 *   await hello.using({ session: tx }).enqueue({ name: "ada" });
 * });
 * ```
 */
export class Akadze {
  /** The postgres.js instance (owned, or adopted from `options.sql`). */
  readonly sql: Sql;
  /** The schema name. */
  readonly schema: string;
  /** Retention of finished jobs, ms. */
  readonly retention: number;
  /** Schedule grace, ms. */
  readonly grace: number;
  /** Whether enqueues NOTIFY workers. */
  readonly notify: boolean;
  /** The URL of the workers' LISTEN connection, when it is not derived from the pool. */
  readonly listenUrl: string | undefined;
  /** The largest arguments of one job, bytes of JSON text. */
  readonly maxArgsBytes: number;
  /** Registered tasks by name. */
  // deno-lint-ignore no-explicit-any
  readonly tasks: ReadonlyMap<string, Task<any, any, any>>;
  /** Hook arrays: push functions onto them. */
  readonly hooks: Hooks = { onEnqueue: [], beforeRun: [], afterRun: [], onTransition: [] };
  /** Registered schedules by name. */
  readonly schedules: ReadonlyMap<string, Schedule>;
  #tasks = new Map<string, AnyTask>();
  #schedules = new Map<string, Schedule>();
  #owned: boolean;
  #waiters: JobWaiters | null = null;

  /**
   * Create the app. Exactly one of `databaseUrl` and `sql` must be given.
   *
   * @param options See {@linkcode AkadzeOptions}.
   */
  constructor(options: AkadzeOptions) {
    if (!isPlainObject(options)) throw new AkadzeError("Akadze options must be an object");
    options = options as AkadzeOptions;
    for (const key of Object.keys(options)) {
      if (!APP_OPTION_NAMES.has(key)) {
        throw new AkadzeError(
          `unknown Akadze option "${key}" (options: ${[...APP_OPTION_NAMES].join(", ")})`,
        );
      }
    }
    const { databaseUrl, sql } = options;
    if (databaseUrl !== undefined && sql !== undefined) {
      throw new AkadzeError("give either databaseUrl or sql, not both");
    }
    if (databaseUrl === undefined && sql === undefined) {
      throw new AkadzeError("give databaseUrl (a postgres:// URL) or sql (a postgres.js instance)");
    }
    if (sql !== undefined && typeof (sql as { unsafe?: unknown }).unsafe !== "function") {
      throw new AkadzeError("sql must be a postgres.js instance");
    }
    this.schema = options.schema ?? DEFAULT_SCHEMA;
    quoteSchema(this.schema);
    this.retention = positiveMs("retention", options.retention, 7 * DAY_MS, { zero: true });
    this.grace = positiveMs("grace", options.grace, 60_000);
    if (options.notify !== undefined && typeof options.notify !== "boolean") {
      throw new AkadzeError("notify must be a boolean");
    }
    this.notify = options.notify ?? true;
    const listenUrl = options.listenUrl ?? readEnv(LISTEN_URL_ENV);
    if (
      listenUrl !== undefined &&
      (typeof listenUrl !== "string" || !/^postgres(ql)?:\/\//.test(listenUrl))
    ) {
      throw new AkadzeError(
        options.listenUrl === undefined
          ? `${LISTEN_URL_ENV} must be a postgres:// or postgresql:// URL`
          : "listenUrl must be a postgres:// or postgresql:// URL",
      );
    }
    this.listenUrl = listenUrl;
    const maxArgsBytes = options.maxArgsBytes;
    if (maxArgsBytes !== undefined && (!Number.isSafeInteger(maxArgsBytes) || maxArgsBytes < 1)) {
      throw new AkadzeError(`maxArgsBytes must be a positive integer, got ${maxArgsBytes}`);
    }
    this.maxArgsBytes = maxArgsBytes ?? MAX_ARGS_BYTES;
    let max = options.max;
    if (max !== undefined && (!Number.isInteger(max) || max < 1)) {
      throw new AkadzeError(`max must be a positive integer, got ${max}`);
    }
    if (max === undefined && sql === undefined) max = poolSizeFromEnv();
    this.#owned = sql === undefined;
    // An adopted pool has the driver's hazards too (connect() guards its own).
    if (sql) {
      guardPools();
      // Its statements with array parameters must not depend on the driver's lazy type fetch.
      installArrayTypes(sql);
    }
    this.sql = sql ?? connect(databaseUrl as string, { max, prepare: options.prepare });
    this.tasks = this.#tasks;
    this.schedules = this.#schedules;
  }

  /**
   * Register a task.
   *
   * @example
   * ```ts ignore
   * const add = app.task("add", { args: v.object({ a: v.number(), b: v.number() }) },
   *   ({ a, b }) => a + b);
   * ```
   */
  task<R>(
    name: string,
    handler: TaskHandler<Record<string, unknown>, R>,
  ): Task<Record<string, unknown>, Record<string, unknown>, R>;
  /**
   * Register a task with options: an argument schema (`args`), `queue`, `maxAttempts`,
   * `timeout`, `priority`, `backoff`.
   *
   * @example
   * ```ts ignore
   * const send = app.task(
   *   "mail.send",
   *   { args: v.object({ to: v.string() }), queue: "mail", maxAttempts: 6, timeout: 60_000 },
   *   async ({ to }, ctx) => await mailer.send(to, { signal: ctx.signal }),
   * );
   * ```
   */
  task<S extends StandardSchemaV1 | undefined = undefined, R = unknown>(
    name: string,
    options: TaskOptions<S>,
    handler: TaskHandler<ArgsOutput<S>, R>,
  ): Task<ArgsInput<S>, ArgsOutput<S>, R>;
  /**
   * Register a sandboxed task: its handler is the export of `sandbox.module`, run in a pool
   * of Web Workers (see docs/isolation.md).
   *
   * @example
   * ```ts ignore
   * const render = app.task("pdf.render", {
   *   args: v.object({ file: v.string() }),
   *   timeout: 60_000,
   *   sandbox: { module: import.meta.resolve("./render.ts"), export: "render", pool: 2 },
   * });
   * ```
   */
  task<S extends StandardSchemaV1 | undefined = undefined, R = unknown>(
    name: string,
    options: TaskOptions<S> & Required<Pick<TaskOptions<S>, "sandbox">>,
  ): Task<ArgsInput<S>, ArgsOutput<S>, R>;
  task(
    name: string,
    optionsOrHandler: TaskOptions<StandardSchemaV1 | undefined> | AnyHandler,
    handler?: AnyHandler,
  ): AnyTask {
    if (typeof optionsOrHandler === "function") {
      if (handler !== undefined) {
        throw new AkadzeError(`task "${name}": give (name, handler) or (name, options, handler)`);
      }
      return this.#add(name, {}, optionsOrHandler);
    }
    return this.#add(name, optionsOrHandler ?? {}, handler);
  }

  /**
   * Register a plain function as a task (the dependency-injection path): same options as
   * `task`, plus the `name`.
   *
   * @example
   * ```ts ignore
   * app.register((args) => deps.mailer.send(args), { name: "mail.send", queue: "mail" });
   * ```
   */
  register<S extends StandardSchemaV1 | undefined = undefined, R = unknown>(
    handler: TaskHandler<ArgsOutput<S>, R>,
    options: TaskOptions<S> & { name: string },
  ): Task<ArgsInput<S>, ArgsOutput<S>, R> {
    if (!isPlainObject(options)) {
      throw new AkadzeError("register(handler, { name, ...options }): options must be an object");
    }
    const { name, ...rest } = options;
    return this.#add(name, rest, handler as AnyHandler);
  }

  /**
   * Call `module.register(this)`: split tasks over modules without import side effects. A
   * module of tasks is anything with a `register(app)` function: a module's namespace, or
   * an object.
   *
   * @example
   * ```ts ignore
   * import * as mail from "./tasks/mail.ts"; // export function register(app) { ... }
   * app.include(mail);
   * ```
   */
  include(module: { register(app: Akadze): void }): this {
    if (typeof (module as { register?: unknown } | null)?.register !== "function") {
      throw new AkadzeError("include(module): the module must export a register(app) function");
    }
    module.register(this);
    return this;
  }

  /**
   * Register a task and a schedule that fires it (Celery beat's job, inside every worker).
   * The options are the schedule's (`cron` or `every`, `overlap`, `timezone`, `backfill`,
   * `args` = the arguments of every fire) plus the task's, with the argument schema under
   * `schema` (since `args` holds the values here).
   *
   * @example
   * ```ts ignore
   * app.periodic("reports.nightly", { cron: "0 3 * * *", timezone: "Europe/Berlin" },
   *   async () => { await buildReports(); });
   * app.periodic("ops.prune", { every: 30_000, overlap: false }, prune);
   * ```
   */
  periodic<S extends StandardSchemaV1 | undefined = undefined, R = unknown>(
    name: string,
    options:
      & Omit<TaskOptions<S>, "args">
      & Omit<ScheduleSpec, "name" | "args">
      & {
        /** The arguments every fire enqueues. Default `{}`. */
        args?: Record<string, unknown>;
        /** A Standard Schema v1 validator of the arguments. */
        schema?: S;
      },
    handler: TaskHandler<ArgsOutput<S>, R>,
  ): Task<ArgsInput<S>, ArgsOutput<S>, R> {
    if (!isPlainObject(options)) {
      throw new AkadzeError(`periodic "${name}": options must be an object`);
    }
    const { cron, every, overlap, timezone, backfill, args, schema, ...taskOptions } = options;
    const spec: ScheduleSpec = { cron, every, overlap, timezone, backfill, args };
    for (const key of Object.keys(spec) as (keyof ScheduleSpec)[]) {
      if (spec[key] === undefined) delete spec[key];
    }
    // Validate the schedule before registering anything, so a bad one leaves no task.
    const probe = new Task(this, name, { ...taskOptions, args: schema }, handler as AnyHandler);
    const schedule = new Schedule(probe, spec);
    if (this.#schedules.has(name)) throw new AkadzeError(`schedule "${name}" already exists`);
    const task = this.#add(name, { ...taskOptions, args: schema }, handler as AnyHandler);
    this.#schedules.set(name, new Schedule(task, { ...spec, name: schedule.name }));
    return task;
  }

  /**
   * Schedule an already registered task, e.g. from application config (already-parsed
   * values: cron text or milliseconds). `spec.name` names the schedule (default: the task
   * name); give one per schedule when a task has several.
   *
   * @example
   * ```ts ignore
   * app.addSchedule("ops.prune", { every: 30_000, overlap: false });
   * ```
   */
  addSchedule(taskName: string, spec: ScheduleSpec): Schedule {
    const task = this.#tasks.get(taskName);
    if (!task) {
      throw new AkadzeError(
        `cannot schedule unknown task "${taskName}": register it first (app.task or app.register)`,
      );
    }
    const schedule = new Schedule(task, spec);
    if (this.#schedules.has(schedule.name)) {
      throw new AkadzeError(`schedule "${schedule.name}" already exists`);
    }
    this.#schedules.set(schedule.name, schedule);
    return schedule;
  }

  /**
   * Add several schedules, each a {@linkcode ScheduleSpec} plus `task`, the name of the
   * registered task it fires; all are validated before any is added.
   *
   * @example
   * ```ts ignore
   * app.addSchedules([
   *   { task: "ops.prune", every: 30_000 },
   *   { task: "reports.build", cron: "0 * * * *", args: { kind: "hourly" } },
   * ]);
   * ```
   */
  addSchedules(specs: readonly (ScheduleSpec & { task: string })[]): Schedule[] {
    if (!Array.isArray(specs)) throw new AkadzeError("addSchedules takes an array of specs");
    const names = new Set<string>();
    for (const { task: taskName, ...spec } of specs) {
      const task = this.#tasks.get(taskName);
      if (!task) throw new AkadzeError(`cannot schedule unknown task "${taskName}"`);
      const name = new Schedule(task, spec).name;
      if (this.#schedules.has(name) || names.has(name)) {
        throw new AkadzeError(`schedule "${name}" already exists`);
      }
      names.add(name);
    }
    return specs.map(({ task, ...spec }) => this.addSchedule(task, spec));
  }

  /**
   * Wait until a job is finished (`succeeded`, `failed` or `cancelled`) and return it as
   * `getJob` does, with its `result` and `progress`. Woken by a notification when the job
   * finishes, and polling every `pollInterval` (1 s) in case notifications do not arrive.
   * After `timeout` ms it rejects with a `JobWaitTimeout` (the state the job is still in);
   * an id that names no job rejects with a `JobNotFound`. All waits of an app share one
   * LISTEN connection (opened by the first, ended by `close()`).
   *
   * @example
   * ```ts ignore
   * const id = await report.enqueue({ month: "2026-11" });
   * const job = await app.waitForJob(id, { timeout: 30_000 });
   * if (job.state === "succeeded") console.log(job.result);
   * ```
   */
  async waitForJob(jobId: string, options: WaitOptions): Promise<JobDetail> {
    const [job] = await this.#waitersOf().wait([jobId], options);
    return job;
  }

  /**
   * Wait until every job of `jobIds` is finished, as {@linkcode Akadze.waitForJob} does;
   * the jobs in the order of `jobIds`. A `JobWaitTimeout` lists the jobs still unfinished.
   *
   * @example
   * ```ts ignore
   * const ids = await resize.enqueueMany(files.map((file) => ({ file })));
   * const jobs = await app.waitForJobs(ids, { timeout: 60_000 });
   * console.log(jobs.filter((j) => j.state !== "succeeded").length, "did not succeed");
   * ```
   */
  async waitForJobs(jobIds: readonly string[], options: WaitOptions): Promise<JobDetail[]> {
    return await this.#waitersOf().wait(jobIds, options);
  }

  /**
   * Enqueue a flow: named steps, each a job of a task of this app with its arguments and
   * enqueue options, that wait for the steps (or existing jobs) named in `dependsOn`. All of
   * it is inserted in one statement, in `options.session`'s transaction when given: a
   * rollback removes the whole flow. A step with dependencies waits (state `waiting`) until
   * each is finished; by default a failed or cancelled dependency cancels it (see
   * {@linkcode OnDependencyFailure}). A bad step, a cycle or a dependency on a job that does
   * not exist is an `EnqueueError` and nothing is inserted. Returns the flow's id (its
   * first step's job id) and each step's job id.
   *
   * @example
   * ```ts ignore
   * const flow = await app.enqueueFlow({
   *   fetch: { task: fetchPage, args: { url } },
   *   parse: { task: parsePage, dependsOn: ["fetch"] },
   *   index: { task: indexPage, dependsOn: ["parse"], queue: "search" },
   * });
   * console.log(flow.jobs.index);
   * ```
   */
  async enqueueFlow(
    steps: Record<string, FlowStep>,
    options: { session?: Sql | TransactionSql | NodePostgresClient } = {},
  ): Promise<EnqueuedFlow> {
    return await enqueueFlow(this, steps, options);
  }

  /**
   * Wait until every job of flow `flowId` (the id `enqueueFlow` returned) is finished, as
   * {@linkcode Akadze.waitForJobs} does, including children its steps add while it runs;
   * resolves to each job by step name (by its id a job without one, or a child whose name an
   * earlier job of the flow has: two steps may each add a child `page-1`). `JobNotFound` when no
   * job belongs to the flow; `JobWaitTimeout` after `timeout` ms.
   *
   * @example
   * ```ts ignore
   * const flow = await app.enqueueFlow(chain([{ task: fetchPage, args: { url } }, { task: parse }]));
   * const steps = await app.waitForFlow(flow.id, { timeout: 60_000 });
   * console.log(steps["2"].state, steps["2"].result);
   * ```
   */
  async waitForFlow(flowId: string, options: WaitOptions): Promise<Record<string, JobDetail>> {
    const id = normalizeId(flowId);
    const start = performance.now();
    let jobs = await flowJobs(this.sql, this.schema, id);
    if (jobs.length === 0) throw new JobNotFound(id, `flow ${id} has no jobs`);
    let first = true;
    for (;;) {
      const ids = jobs.map(([, job]) => job);
      const details = await this.waitForJobs(
        ids,
        first
          ? options
          : { ...options, timeout: Math.max(1, options.timeout - (performance.now() - start)) },
      );
      first = false;
      // Finished unless a step added children meanwhile (they join its flow).
      const now = await flowJobs(this.sql, this.schema, id);
      if (now.length === jobs.length) {
        return Object.fromEntries(jobs.map(([key], i) => [key, details[i]]));
      }
      jobs = now;
    }
  }

  #waitersOf(): JobWaiters {
    return this.#waiters ??= new JobWaiters(this.sql, this.schema, this.listenUrl);
  }

  /**
   * Close the pool if the app owns it (an adopted `sql` is left open), and the connections
   * of its workers' loops that are still open.
   *
   * @example
   * ```ts ignore
   * try {
   *   await hello.enqueue({ name: "ada" });
   * } finally {
   *   await app.close();
   * }
   * ```
   */
  async close(): Promise<void> {
    // Connections an outage killed or froze (a worker that lost its lease, say) can still
    // raise the driver's uncaught errors while they end: log those, do not end the process.
    // The workers' loop connections are the app's own, also on an adopted pool.
    const removeGuard = installDriverGuard((error) =>
      logger("app").warn("database driver error ignored while closing: {message}", {
        event: "db_error_transient",
        message: describeError(error),
      })
    );
    try {
      await this.#waiters?.close();
      this.#waiters = null;
      await closeLoopConnections(this.sql);
      if (!this.#owned) return;
      await this.sql.end({ timeout: 5 });
      // A write the driver scheduled before the end runs on a later turn.
      await new Promise((resolve) => setTimeout(resolve, 0));
    } finally {
      removeGuard();
    }
  }

  #add(
    name: string,
    options: TaskOptions<StandardSchemaV1 | undefined>,
    handler: AnyHandler | undefined,
  ): AnyTask {
    if (this.#tasks.has(name)) throw new AkadzeError(`task "${name}" is already registered`);
    // deno-lint-ignore no-explicit-any
    const task: AnyTask = new Task<any, any, unknown>(this, name, options, handler);
    this.#tasks.set(name, task);
    return task;
  }
}

function positiveMs(
  name: string,
  value: unknown,
  fallback: number,
  options: { zero?: boolean } = {},
): number {
  if (value === undefined) return fallback;
  const min = options.zero ? "a non-negative" : "a positive";
  if (
    typeof value !== "number" || !Number.isFinite(value) || value < 0 ||
    (value === 0 && !options.zero)
  ) {
    throw new AkadzeError(`${name} must be ${min} number of milliseconds, got ${value}`);
  }
  return value;
}
