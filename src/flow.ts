/**
 * Flows: named steps, each a job of a task, with dependencies forming a DAG, enqueued
 * atomically (`app.enqueueFlow`). Each step is checked here as a single enqueue checks a
 * job; the SQL function `enqueue_flow` (migrations/0008_flows.sql) inserts them, with ids in
 * dependency order, in one call. A step with dependencies waits in state `waiting` until
 * they are terminal; the database's trigger queues it, or cancels it, in the transaction
 * that writes its last dependency's outcome.
 *
 * @module
 */
import {
  atomically,
  explainMissingSchema,
  PREPARED,
  quoteSchema,
  type Sql,
  type TransactionSql,
} from "./db.ts";
import {
  type CheckedJob,
  checkJob,
  type EnqueueHost,
  type EnqueueOptions,
  type EnqueueTarget,
  KEY_MODE_NAMES,
  OPTION_NAMES,
} from "./enqueue.ts";
import { DuplicateJob, EnqueueError } from "./errors.ts";
import type { EnqueuedJob } from "./job.ts";
import { isPlainObject } from "./json.ts";
import { isNodePostgres, type NodePostgresClient } from "./node_postgres.ts";
import { tracePublish } from "./tracing.ts";

/**
 * What a failed or cancelled dependency does to the step that depends on it: `"cancel"`
 * it (the default; and so on down the flow), `"ignore"` the failure (the step runs once its
 * other dependencies are done, and sees the failure in `ctx.dependencies()`), or
 * `"continue"` (the step runs at once, without waiting for the others).
 */
export type OnDependencyFailure = "cancel" | "ignore" | "continue";

/** The failure policies, in the order the docs list them. */
export const ON_FAILURE: readonly OnDependencyFailure[] = ["cancel", "ignore", "continue"];

/**
 * One dependency of a step: another step of the flow (`step`) or an existing job (`job`,
 * its id), with what its failure does (`onFailure`, default `"cancel"`).
 */
interface FlowDependency {
  /** A step of the same flow, by name. */
  step?: string;
  /** An existing job, by id. */
  job?: string;
  /** What its failure does to this step. Default `"cancel"`. */
  onFailure?: OnDependencyFailure;
}

/**
 * One step of a flow: a job of `task` with `args`, the options of a single enqueue, and
 * the steps (by name) or jobs it waits for.
 */
export interface FlowStep extends Omit<EnqueueOptions, "session"> {
  /** The task (as `app.task` returned it), or its name: a task of this app. */
  task: { readonly name: string } | string;
  /** Its arguments, checked against the task's schema. Default `{}`. */
  args?: unknown;
  /**
   * What it waits for: step names, or objects naming another step of the flow (`step`) or
   * an existing job (`job`, its id), with what its failure does (`onFailure`, default
   * `"cancel"`).
   */
  dependsOn?: readonly (string | {
    step?: string;
    job?: string;
    onFailure?: OnDependencyFailure;
  })[];
}

/** Options of `app.enqueueFlow`. */
interface FlowOptions {
  /** Enqueue on this connection or transaction (a rollback removes the whole flow). */
  session?: Sql | TransactionSql | NodePostgresClient;
}

/** A flow just enqueued: its id (its first step's job id) and each step's job id. */
export interface EnqueuedFlow {
  /** The flow's id: the job id of its first step (in dependency order). */
  id: string;
  /** Each step's job id, by step name. */
  jobs: Record<string, string>;
}

/** What a flow enqueue needs from the app (the app itself): an enqueue host and its tasks. */
export interface FlowHost extends EnqueueHost {
  /** The app's tasks by name. */
  readonly tasks: ReadonlyMap<string, EnqueueTarget>;
}

/** A step's keys: its task, arguments and dependencies, and an enqueue's options. */
const STEP_KEYS = new Set([
  "task",
  "args",
  "dependsOn",
  ...[...OPTION_NAMES].filter((name) => name !== "session" && !KEY_MODE_NAMES.has(name)),
]);

/** A step checked, in the shape the SQL function takes. */
interface SqlStep {
  name: string;
  task: string;
  args: Record<string, unknown>;
  queue: string;
  priority: number;
  max_attempts: number;
  run_at?: string;
  delay_ms?: number;
  expires_at?: string;
  unique_key?: string;
  limit_key?: string;
  depends_on?: ({ step: string; on_failure: OnDependencyFailure } | {
    job: string;
    on_failure: OnDependencyFailure;
  })[];
}

/**
 * Check every step of `steps`, then insert them all in one statement; returns the flow id
 * and each step's job id. Throws `EnqueueError` (a bad step, a cycle, a dependency on a job
 * that does not exist) or `DuplicateJob`, with nothing inserted.
 */
export async function enqueueFlow(
  host: FlowHost,
  steps: Record<string, FlowStep>,
  options: FlowOptions = {},
): Promise<EnqueuedFlow> {
  if (!isPlainObject(options)) throw new EnqueueError("flow options must be an object");
  for (const key of Object.keys(options)) {
    if (key !== "session") {
      throw new EnqueueError(`unknown flow option "${key}" (options: session)`);
    }
  }
  const ordered = await prepareFlow(host, steps);
  if (host.hooks.onEnqueue.length > 0 && isNodePostgres(options.session)) {
    throw new EnqueueError(
      "cannot enqueue a flow on a node-postgres session: this app has onEnqueue hooks, which " +
        "run in the enqueue's transaction and take a postgres.js transaction; enqueue on a " +
        "postgres.js session (app.sql, or a transaction of it) instead; nothing was enqueued",
    );
  }
  const s = quoteSchema(host.schema);
  const text = `select step, id::pg_catalog.text as id from ${s}.enqueue_flow(
      $1::pg_catalog.text::pg_catalog.jsonb, null, $2::pg_catalog.text::pg_catalog.jsonb)`;
  // The trace context (JSON text) is the enqueue span's, set below when tracing is on.
  const params: (string | null)[] = [JSON.stringify(ordered), null];
  const hooks = host.hooks.onEnqueue;
  const run = async (
    tx: Sql | TransactionSql | NodePostgresClient,
  ): Promise<Record<string, unknown>[]> => {
    const rows = isNodePostgres(tx)
      ? (await tx.query(text, params)).rows as Record<string, unknown>[]
      : await tx.unsafe(text, params, PREPARED);
    if (hooks.length === 0) return rows;
    const ids = rows.map((r) => r.id as string);
    const stepOf = new Map(rows.map((r) => [r.id as string, r.step as string]));
    const byName = new Map((ordered as SqlStep[]).map((step) => [step.name, step]));
    // The columns an enqueue reads back (the enqueue role's grant); the rest are the steps'.
    const inserted = await (tx as TransactionSql).unsafe(
      `select id::pg_catalog.text as id, run_at, expires_at, args::pg_catalog.jsonb as args
         from ${s}.jobs where id operator(pg_catalog.=) any($1::bigint[]) order by id`,
      [`{${ids.join(",")}}`],
    );
    for (const row of inserted) {
      const step = byName.get(stepOf.get(row.id)!)!;
      const job: EnqueuedJob = {
        id: row.id,
        task: step.task,
        queue: step.queue,
        priority: step.priority,
        maxAttempts: step.max_attempts,
        runAt: row.run_at,
        expiresAt: row.expires_at,
        uniqueKey: step.unique_key ?? null,
        limitKey: step.limit_key ?? null,
        args: row.args,
      };
      for (const hook of hooks) await hook(tx as TransactionSql, job);
    }
    return rows;
  };
  const session = options.session ?? host.sql;
  let rows: Record<string, unknown>[] = [];
  const distinct = (key: "task" | "queue") =>
    [...new Set((ordered as SqlStep[]).map((step) => step[key]))].join(",");
  const target = { task: distinct("task"), queue: distinct("queue"), count: ordered.length };
  try {
    await tracePublish(target, async (traceContext) => {
      params[1] = traceContext;
      rows = await explainMissingSchema(
        host.schema,
        () => hooks.length === 0 ? run(session) : atomically(session as Sql, run),
        EnqueueError,
        "cannot enqueue this flow: ",
      );
      return rows.map((row) => row.id as string);
    });
  } catch (error) {
    throw flowError(error);
  }
  const jobs: Record<string, string> = {};
  for (const row of rows) jobs[row.step as string] = row.id as string;
  return { id: jobs[(ordered[0] as SqlStep).name], jobs };
}

/**
 * Check every step of `steps` as a single enqueue checks a job; returns them in dependency
 * order, in the shape of the SQL function `enqueue_flow`'s argument (see `flowStatement`).
 */
export async function prepareFlow(
  host: FlowHost,
  steps: Record<string, FlowStep>,
): Promise<unknown[]> {
  if (!isPlainObject(steps) || Object.keys(steps).length === 0) {
    throw new EnqueueError(
      "a flow is an object of named steps, e.g. { fetch: { task: fetch, args: { url } } }",
    );
  }
  const names = Object.keys(steps);
  const checked = new Map<string, SqlStep>();
  const deps = new Map<string, string[]>();
  for (const name of names) {
    const [step, stepDeps] = await checkStep(host, name, steps[name], steps);
    checked.set(name, step);
    deps.set(name, stepDeps);
  }
  return dependencyOrder(names, deps).map((name) => checked.get(name)!);
}

/** The database's refusal of a flow as the error a single enqueue would raise. */
export function flowError(error: unknown): unknown {
  const code = (error as { code?: unknown }).code;
  const message = error instanceof Error ? error.message : String(error);
  if (code === "AKDUP") return new DuplicateJob(message);
  if (code === "23503" || code === "22023" || code === "54000") {
    return new EnqueueError(`cannot enqueue this flow: ${message}; nothing was enqueued`);
  }
  return error;
}

/** Check one step; returns it in the SQL function's shape and the steps it depends on. */
async function checkStep(
  host: FlowHost,
  name: string,
  step: FlowStep,
  steps: Record<string, FlowStep>,
): Promise<[SqlStep, string[]]> {
  const where = `step ${JSON.stringify(name)}`;
  if (name.length === 0 || name.length > 200) {
    throw new EnqueueError(`step names must be 1 to 200 characters, got ${JSON.stringify(name)}`);
  }
  if (!isPlainObject(step)) {
    throw new EnqueueError(`${where} must be an object: { task, args, dependsOn, ...options }`);
  }
  for (const key of Object.keys(step)) {
    if (!STEP_KEYS.has(key)) {
      throw new EnqueueError(
        `${where} has an unknown key "${key}" (keys: ${[...STEP_KEYS].join(", ")})`,
      );
    }
  }
  const { task: taskOrName, args, dependsOn, ...options } = step;
  const taskName = typeof taskOrName === "string"
    ? taskOrName
    : (taskOrName as { name?: unknown } | undefined)?.name;
  const target = typeof taskName === "string" ? host.tasks.get(taskName) : undefined;
  if (!target) {
    throw new EnqueueError(
      typeof taskName === "string"
        ? `${where} runs task ${JSON.stringify(taskName)}, which this app does not have`
        : `${where} needs a task: a task of this app, or its name`,
    );
  }
  let job: CheckedJob;
  try {
    job = await checkJob(host, target, args === undefined ? {} : args, options);
  } catch (error) {
    if (error instanceof EnqueueError) {
      throw new EnqueueError(`${where}: ${error.message}; nothing of this flow was enqueued`);
    }
    throw error;
  }
  const out: SqlStep = {
    name,
    task: job.task,
    args: job.args,
    queue: job.queue,
    priority: job.priority,
    max_attempts: job.max_attempts,
  };
  if (job.run_at !== null) out.run_at = job.run_at;
  if (job.delay_ms !== null) out.delay_ms = job.delay_ms;
  if (job.expires_at !== null) out.expires_at = job.expires_at;
  if (job.unique_key !== null) out.unique_key = job.unique_key;
  if (job.limit_key !== null) out.limit_key = job.limit_key;
  const stepDeps: string[] = [];
  if (dependsOn !== undefined) {
    if (!Array.isArray(dependsOn)) {
      throw new EnqueueError(
        `${where}: dependsOn must be an array of step names or { step } / { job } objects`,
      );
    }
    out.depends_on = [];
    const seen = new Set<string>();
    for (const dep of dependsOn) {
      const d = typeof dep === "string" ? { step: dep } : dep;
      if (!isPlainObject(d) || (d.step === undefined) === (d.job === undefined)) {
        throw new EnqueueError(
          `${where}: each dependency is a step name, { step: name } or { job: id }, ` +
            "with an optional onFailure",
        );
      }
      for (const key of Object.keys(d)) {
        if (key !== "step" && key !== "job" && key !== "onFailure") {
          throw new EnqueueError(
            `${where}: a dependency has an unknown key "${key}" (keys: step, job, onFailure)`,
          );
        }
      }
      const onFailure = d.onFailure ?? "cancel";
      if (!ON_FAILURE.includes(onFailure)) {
        throw new EnqueueError(
          `${where}: onFailure must be ${ON_FAILURE.map((p) => `"${p}"`).join(", ")}, got ${
            JSON.stringify(onFailure)
          }`,
        );
      }
      if (d.step !== undefined) {
        if (typeof d.step !== "string" || !Object.hasOwn(steps, d.step)) {
          throw new EnqueueError(
            `${where} depends on ${JSON.stringify(d.step)}, which is not a step of this flow`,
          );
        }
        if (seen.has(`s:${d.step}`)) {
          throw new EnqueueError(`${where} lists the dependency ${d.step} twice`);
        }
        seen.add(`s:${d.step}`);
        stepDeps.push(d.step);
        out.depends_on.push({ step: d.step, on_failure: onFailure });
      } else {
        const id = typeof d.job === "string" || typeof d.job === "number" ? String(d.job) : "";
        if (!/^[1-9][0-9]{0,18}$/.test(id)) {
          throw new EnqueueError(
            `${where} depends on job ${JSON.stringify(d.job)}, which is not a job id`,
          );
        }
        if (seen.has(`j:${id}`)) throw new EnqueueError(`${where} lists job ${id} twice`);
        seen.add(`j:${id}`);
        out.depends_on.push({ job: id, on_failure: onFailure });
      }
    }
  }
  return [out, stepDeps];
}

/**
 * The step names in dependency order (each after the steps it depends on; otherwise in
 * the order given). A cycle is an `EnqueueError` that names it.
 */
export function dependencyOrder(
  names: readonly string[],
  deps: ReadonlyMap<string, readonly string[]>,
): string[] {
  const order: string[] = [];
  const state = new Map<string, "visiting" | "done">();
  for (const root of names) {
    if (state.has(root)) continue;
    // Depth first, without recursion (a chain of thousands of steps).
    const stack: { name: string; next: number }[] = [{ name: root, next: 0 }];
    state.set(root, "visiting");
    while (stack.length > 0) {
      const top = stack[stack.length - 1];
      const list = deps.get(top.name) ?? [];
      if (top.next < list.length) {
        const dep = list[top.next++];
        const seen = state.get(dep);
        if (seen === "visiting") {
          const path = stack.map((f) => f.name);
          const cycle = [...path.slice(path.indexOf(dep)), dep];
          throw new EnqueueError(
            `this flow has a cycle: ${
              cycle.map((n) => JSON.stringify(n)).join(" → ")
            } (a step cannot depend, directly or through other steps, on itself); nothing ` +
              "was enqueued",
          );
        }
        if (seen === undefined) {
          state.set(dep, "visiting");
          stack.push({ name: dep, next: 0 });
        }
      } else {
        state.set(top.name, "done");
        order.push(top.name);
        stack.pop();
      }
    }
  }
  return order;
}

/** Steps given to {@linkcode chain}, {@linkcode group} and {@linkcode chord}: named, or a list. */
type StepList = readonly FlowStep[] | Record<string, FlowStep>;

/** The steps of `steps` by name: a list's steps are named "1", "2", … in order. */
function named(steps: StepList, what: string): [string, FlowStep][] {
  const entries = Array.isArray(steps)
    ? steps.map((step, i) => [String(i + 1), step] as [string, FlowStep])
    : isPlainObject(steps)
    ? Object.entries(steps as Record<string, FlowStep>)
    : null;
  if (!entries || entries.length === 0) {
    throw new EnqueueError(`${what} takes a non-empty list or object of steps`);
  }
  for (const [name, step] of entries) {
    if (isPlainObject(step) && (step as FlowStep).dependsOn !== undefined) {
      throw new EnqueueError(
        `${what}: step ${JSON.stringify(name)} has its own dependsOn; ${what} sets them`,
      );
    }
  }
  return entries;
}

/**
 * A chain, as Celery's: each step waits for the one before it (and reads its result with
 * `ctx.dependencies()` or `ctx.resultOf(task)`); a failure cancels the rest. A list's steps
 * are named "1", "2", …. Pass the result to `app.enqueueFlow`.
 *
 * @example
 * ```ts ignore
 * import { chain } from "@akadze/akadze";
 * await app.enqueueFlow(chain([
 *   { task: download, args: { url } },
 *   { task: transcode },
 *   { task: publish },
 * ]));
 * ```
 */
export function chain(
  steps: readonly FlowStep[] | Record<string, FlowStep>,
): Record<string, FlowStep> {
  const out: Record<string, FlowStep> = {};
  let previous: string | undefined;
  for (const [name, step] of named(steps, "chain")) {
    out[name] = previous === undefined ? step : { ...step, dependsOn: [previous] };
    previous = name;
  }
  return out;
}

/**
 * A group, as Celery's: steps that run independently (in one enqueue). A list's steps are
 * named "1", "2", …. Pass the result to `app.enqueueFlow`, or to {@linkcode chord}.
 *
 * @example
 * ```ts ignore
 * import { group } from "@akadze/akadze";
 * await app.enqueueFlow(group(files.map((file) => ({ task: resize, args: { file } }))));
 * ```
 */
export function group(
  steps: readonly FlowStep[] | Record<string, FlowStep>,
): Record<string, FlowStep> {
  return Object.fromEntries(named(steps, "group"));
}

/**
 * A chord, as Celery's: the steps of `header` run independently, and `callback` (step
 * "callback") runs when all have finished, reading their results with
 * `ctx.dependencies()`. A failed header step cancels the callback unless `onFailure` says
 * otherwise (`"ignore"`: the callback runs when the others are done, and sees it).
 *
 * @example
 * ```ts ignore
 * import { chord } from "@akadze/akadze";
 * await app.enqueueFlow(chord(
 *   rows.map((row) => ({ task: importRow, args: { row } })),
 *   { task: summarize },
 * ));
 * ```
 */
export function chord(
  header: readonly FlowStep[] | Record<string, FlowStep>,
  callback: FlowStep,
  options: { onFailure?: OnDependencyFailure } = {},
): Record<string, FlowStep> {
  const steps = named(header, "chord");
  if (steps.some(([name]) => name === "callback")) {
    throw new EnqueueError('chord: a header step cannot be named "callback"');
  }
  const [[, last]] = named({ callback }, "chord");
  const onFailure = options.onFailure ?? "cancel";
  return {
    ...Object.fromEntries(steps),
    callback: { ...last, dependsOn: steps.map(([step]) => ({ step, onFailure })) },
  };
}

/**
 * The jobs of flow `flowId` (its steps, and children added at run time), `[key, id]` in id
 * order: the key is the step name, or the job id of a job without one.
 */
export async function flowJobs(
  sql: Sql,
  schema: string,
  flowId: string,
): Promise<[string, string][]> {
  const rows = await sql.unsafe(
    `select id::pg_catalog.text as id, step from ${quoteSchema(schema)}.jobs
      where flow_id operator(pg_catalog.=) $1::bigint order by id`,
    [flowId],
  );
  return rows.map((r) => [(r.step ?? r.id) as string, r.id as string]);
}
