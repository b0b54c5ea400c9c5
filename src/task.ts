/**
 * Tasks: a name, options validated once at registration, a handler, and the enqueue
 * methods.
 *
 * @module
 */
import type { JobContext } from "./context.ts";
import { type EnqueueHost, enqueueJobs, type EnqueueOptions } from "./enqueue.ts";
import { AkadzeError, EnqueueError } from "./errors.ts";
import { isPlainObject } from "./json.ts";
import { checkSandbox, type SandboxSpec } from "./sandbox.ts";
import {
  INT4_MAX,
  isMaxAttempts,
  isPriority,
  MAX_ATTEMPTS_MAX,
  PRIORITY_MAX,
  PRIORITY_MIN,
  QUEUE_NAME,
  QUEUE_NAME_RULE,
  TASK_NAME_MAX,
} from "./rules.ts";
import { isStandardSchema, type StandardSchemaV1 } from "./standard_schema.ts";

/** Any task, whatever its types (for registries). */
// deno-lint-ignore no-explicit-any
export type AnyTask = Task<any, any, any>;

/** The arguments a caller passes to enqueue for a schema (or a JSON object without one). */
export type ArgsInput<S> = S extends StandardSchemaV1
  ? NonNullable<S["~standard"]["types"]>["input"]
  : Record<string, unknown>;
/** The arguments a handler receives for a schema (or a JSON object without one). */
export type ArgsOutput<S> = S extends StandardSchemaV1
  ? NonNullable<S["~standard"]["types"]>["output"]
  : Record<string, unknown>;

/**
 * Decides the delay before the next attempt: milliseconds, or null to stop retrying and
 * fail now. `attempt` is the number of attempts spent so far (1 after the first failure).
 */
export type Backoff = (attempt: number, error: unknown) => number | null;

/** Options of a task, validated at registration. */
export interface TaskOptions<S extends StandardSchemaV1 | undefined = undefined> {
  /** A Standard Schema v1 validator of the arguments (valibot, zod, arktype, ...). */
  args?: S;
  /** Queue name. Default `"default"`. */
  queue?: string;
  /** Attempt budget including the first run, 1..2147483647. Default 3. */
  maxAttempts?: number;
  /** Milliseconds a run may take before its signal is aborted and it counts as an error. */
  timeout?: number;
  /** Smallint; higher runs first. Default 0. */
  priority?: number;
  /** Override the default backoff (`min(2^(attempt-1) s, 300 s)` ± 10 %). */
  backoff?: Backoff;
  /**
   * Run the handler isolated, in a pool of Web Workers or of subprocesses: the handler is
   * the export of a module (`sandbox.module`), given instead of a handler function. See
   * docs/isolation.md.
   */
  sandbox?: {
    /** The absolute URL of the module that exports the handler: `import.meta.resolve("./x.ts")`. */
    module: string;
    /** The name of the handler's export. Default `"default"`. */
    export?: string;
    /**
     * How many threads the task may use at once in one worker, 1..1024; runs beyond that
     * wait (in their slot) for a free thread. Default: one per running job of the task.
     */
    pool?: number;
    /**
     * The Deno permissions of the threads (`Deno.PermissionOptions`: `"inherit"`, `"none"`
     * or e.g. `{ read: ["/srv/uploads"] }`, where a permission left out is denied). Default
     * `"inherit"`: the worker's own. Anything else needs Deno's `--unstable-worker-options`
     * flag (or `"unstable": ["worker-options"]` in deno.json), and cannot exceed what the
     * worker itself may do.
     */
    permissions?: Deno.PermissionOptions;
    /**
     * `"thread"` (default): Web Workers of the worker process. `"process"`: a `deno run`
     * subprocess each, for a heap cap (`maxHeapMb`) and for crashes that take a whole
     * process down (running out of memory, a native crash); the worker needs `--allow-run`.
     */
    isolation?: "thread" | "process";
    /** The V8 heap cap of each sandbox process, MiB (16..1048576); `isolation: "process"` only. */
    maxHeapMb?: number;
  };
  /**
   * Where this task's jobs go when they fail for good (no attempts left, `Fail`, a lost run
   * on the last attempt): the name of another task, whose job gets the failed job's id,
   * task, queue, arguments and errors as its arguments (see `DeadLetter`), enqueued in the
   * same transaction as the failure. It goes to that task's queue when this app defines the
   * task, else to `"default"`; `{ task, queue }` names the queue.
   */
  deadLetter?: string | { task: string; queue?: string };
}

/** A task handler: gets the (validated) arguments and the job context. */
export type TaskHandler<A, R> = (args: A, ctx: JobContext) => R | Promise<R>;

/** Enqueue methods bound to a set of {@linkcode EnqueueOptions}. */
export interface BoundTask<In> {
  /**
   * Enqueue one job; resolves to its id (a decimal string). The arguments may be left out
   * when the task requires none.
   */
  enqueue(
    ...args: Record<PropertyKey, never> extends In ? [args?: In] : [args: In]
  ): Promise<string>;
  /** Enqueue one job per element in one statement; resolves to their ids, in order. */
  enqueueMany(argsList: readonly In[]): Promise<string[]>;
}

const TASK_OPTION_NAMES = new Set([
  "args",
  "queue",
  "maxAttempts",
  "timeout",
  "priority",
  "backoff",
  "sandbox",
  "deadLetter",
]);
/** The longest timeout a timer can carry (about 24.8 days). */
const TIMEOUT_MAX = INT4_MAX;

/**
 * A registered task. Made by `app.task(...)` or `app.register(...)`.
 *
 * @example
 * ```ts ignore
 * const hello = app.task("hello", { args: v.object({ name: v.string() }) },
 *   ({ name }) => `hello ${name}`);
 * const id = await hello.enqueue({ name: "ada" });
 * ```
 */
export class Task<In = Record<string, unknown>, Out = In, R = unknown> {
  /** The task name. */
  readonly name: string;
  /** The default queue. */
  readonly queue: string;
  /** The default attempt budget. */
  readonly maxAttempts: number;
  /** The run timeout in milliseconds, if any. */
  readonly timeout: number | undefined;
  /** The default priority. */
  readonly priority: number;
  /** The backoff override, if any. */
  readonly backoff: Backoff | undefined;
  /** The argument schema, if any. */
  readonly args: StandardSchemaV1<In, Out> | undefined;
  /** Where failed jobs go, if anywhere: a task, and a queue when one was named. */
  readonly deadLetter: { readonly task: string; readonly queue: string | null } | undefined;
  /** The handler (for a sandboxed task, one that says it runs in its sandbox). */
  readonly handler: TaskHandler<Out, R>;
  /** Where the handler runs isolated, for a sandboxed task. */
  readonly sandbox: SandboxSpec | undefined;
  #host: EnqueueHost;

  /**
   * Validate the options and make the task. Use `app.task` or `app.register` instead.
   *
   * @param host The app the task belongs to.
   * @param name The task name.
   * @param options The task options.
   * @param handler The function that runs each job.
   */
  constructor(
    host: EnqueueHost,
    name: string,
    options: TaskOptions<StandardSchemaV1<In, Out> | undefined>,
    handler: TaskHandler<Out, R> | undefined,
  ) {
    checkTaskName(name);
    const where = `task "${name}"`;
    if (!isPlainObject(options)) throw new AkadzeError(`${where}: options must be an object`);
    for (const key of Object.keys(options)) {
      if (!TASK_OPTION_NAMES.has(key)) {
        throw new AkadzeError(
          `${where}: unknown option "${key}" (options: ${[...TASK_OPTION_NAMES].join(", ")})`,
        );
      }
    }
    const sandbox = options.sandbox === undefined
      ? undefined
      : checkSandbox(options.sandbox, where);
    if (sandbox && handler !== undefined) {
      throw new AkadzeError(
        `${where}: a sandboxed task's handler is the export of sandbox.module; give no handler function`,
      );
    }
    if (!sandbox && typeof handler !== "function") {
      throw new AkadzeError(`${where}: handler must be a function`);
    }
    const { queue = "default", maxAttempts = 3, timeout, priority = 0, backoff, args } = options;
    if (typeof queue !== "string" || !QUEUE_NAME.test(queue)) {
      throw new AkadzeError(
        `${where}: queue must be ${QUEUE_NAME_RULE}, got ${JSON.stringify(queue)}`,
      );
    }
    if (!isMaxAttempts(maxAttempts)) {
      throw new AkadzeError(
        `${where}: maxAttempts must be an integer from 1 to ${MAX_ATTEMPTS_MAX}, got ${maxAttempts}`,
      );
    }
    if (
      timeout !== undefined &&
      (typeof timeout !== "number" || !(timeout > 0) || timeout > TIMEOUT_MAX)
    ) {
      throw new AkadzeError(
        `${where}: timeout must be a positive number of milliseconds up to ${TIMEOUT_MAX}, got ${timeout}`,
      );
    }
    if (!isPriority(priority)) {
      throw new AkadzeError(
        `${where}: priority must be an integer from ${PRIORITY_MIN} to ${PRIORITY_MAX}, got ${priority}`,
      );
    }
    if (backoff !== undefined && typeof backoff !== "function") {
      throw new AkadzeError(`${where}: backoff must be a function (attempt, error) => ms | null`);
    }
    if (args !== undefined && !isStandardSchema(args)) {
      throw new AkadzeError(
        `${where}: args must be a Standard Schema v1 validator (valibot, zod, arktype, ...)`,
      );
    }
    this.deadLetter = checkDeadLetter(where, name, options.deadLetter);
    this.#host = host;
    this.name = name;
    this.queue = queue;
    this.maxAttempts = maxAttempts;
    this.timeout = timeout;
    this.priority = priority;
    this.backoff = backoff;
    this.args = args;
    this.sandbox = sandbox;
    this.handler = handler ?? (() => {
      throw new AkadzeError(
        `${where} runs in its sandbox: its handler is "${sandbox!.export}" of ${sandbox!.module}`,
      );
    });
  }

  /**
   * Bind per-enqueue options (session, delay, runAt, priority, maxAttempts, uniqueKey,
   * onDuplicate, whileRunning, throttle, limitKey, expiresAt, queue). They are checked when
   * you enqueue.
   *
   * @example
   * ```ts ignore
   * await app.sql.begin(async (tx) => {
   *   await hello.using({ session: tx, delay: 5_000 }).enqueue({ name: "ada" });
   * });
   * ```
   */
  using(options: EnqueueOptions): BoundTask<In> {
    return {
      enqueue: async (...args: unknown[]) =>
        (await enqueueJobs(this.#host, this, [args[0] === undefined ? {} : args[0]], options))[0],
      enqueueMany: (argsList: readonly In[]) => this.enqueueMany(argsList, options),
    };
  }

  /**
   * Enqueue one job in its own implicit transaction on the app's pool. The arguments may be
   * left out when the task requires none.
   *
   * @example
   * ```ts ignore
   * const id = await hello.enqueue({ name: "ada" });
   * ```
   */
  enqueue(...args: Parameters<BoundTask<In>["enqueue"]>): Promise<string> {
    return this.using({}).enqueue(...args);
  }

  /**
   * Enqueue one job per element in a single INSERT; resolves to the ids in order. With
   * `uniqueKey` set and a collision, nothing of the batch is inserted (`DuplicateJob`).
   *
   * @example
   * ```ts ignore
   * const ids = await hello.enqueueMany([{ name: "ada" }, { name: "alan" }]);
   * ```
   */
  async enqueueMany(argsList: readonly In[], options: EnqueueOptions = {}): Promise<string[]> {
    if (!Array.isArray(argsList)) {
      throw new EnqueueError(`task "${this.name}": enqueueMany takes an array of arguments`);
    }
    return await enqueueJobs(this.#host, this, argsList, options);
  }
}

/** Task names: 1-200 printable characters. */
/** The `deadLetter` option, checked: a task other than this one, and a valid queue. */
function checkDeadLetter(
  where: string,
  name: string,
  option: unknown,
): { task: string; queue: string | null } | undefined {
  if (option === undefined) return undefined;
  const shape: unknown = typeof option === "string" ? { task: option } : option;
  if (
    !isPlainObject(shape) ||
    Object.keys(shape as object).some((k) => k !== "task" && k !== "queue")
  ) {
    throw new AkadzeError(`${where}: deadLetter must be a task name or { task, queue? }`);
  }
  const { task, queue } = shape as { task?: unknown; queue?: unknown };
  try {
    checkTaskName(task);
  } catch (error) {
    throw new AkadzeError(`${where}: deadLetter: ${(error as Error).message}`);
  }
  if (task === name) {
    throw new AkadzeError(
      `${where}: deadLetter names the task itself; name another task, whose handler deals ` +
        "with the failed jobs",
    );
  }
  if (queue !== undefined && (typeof queue !== "string" || !QUEUE_NAME.test(queue))) {
    throw new AkadzeError(
      `${where}: deadLetter queue must be ${QUEUE_NAME_RULE}, got ${JSON.stringify(queue)}`,
    );
  }
  return { task, queue: (queue as string | undefined) ?? null };
}

function checkTaskName(name: unknown): asserts name is string {
  if (
    typeof name !== "string" || name.length < 1 || name.length > TASK_NAME_MAX ||
    /[\p{Cc}]/u.test(name)
  ) {
    throw new AkadzeError(
      `task name must be a string of 1-${TASK_NAME_MAX} printable characters, got ${
        JSON.stringify(name)
      }`,
    );
  }
}
