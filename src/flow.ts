/**
 * Flows: named steps, each a job of a task, with dependencies forming a DAG, enqueued
 * atomically (`app.enqueueFlow`). Each step is checked here as a single enqueue checks a
 * job; the SQL function `enqueue_flow_steps` (migrations/0019_flow_steps_hand_off.sql, its
 * body replaced in 0023_flow_enqueue_speed.sql) inserts them, with ids in dependency order, in
 * one call (a running job's children go through `enqueue_flow`, migrations/0008_flows.sql, as
 * SQL callers' flows do). A step with dependencies waits in state `waiting` until they are
 * terminal; the database's trigger queues it, or cancels it, in the transaction that writes
 * its last dependency's outcome.
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
  argsText,
  type Base,
  checkArgs,
  checkJobOptions,
  type EnqueueHost,
  type EnqueueOptions,
  type EnqueueTarget,
  KEY_MODE_NAMES,
  OPTION_NAMES,
} from "./enqueue.ts";
import { DuplicateJob, EnqueueError } from "./errors.ts";
import type { EnqueuedJob } from "./job.ts";
import { isPlainObject } from "./json.ts";
import { arrayLiteral, repeatedLiteral } from "./array_types.ts";
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

/** A step checked, in the shape the SQL function `enqueue_flow` takes (see prepareFlow). */
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
 * The steps of a flow checked, as columns: one element per step in dependency order (each
 * step after the steps it depends on), and the dependencies grouped by step in that order.
 */
interface CheckedFlow {
  /** The steps' names. */
  names: string[];
  /** Their rows: the task and the options (steps without options of their own share one). */
  rows: Base[];
  /** Their arguments (the schema's output) and the arguments' JSON text. */
  args: Record<string, unknown>[];
  texts: string[];
  /** Per dependency: the depending step's position (from 1). */
  depStep: number[];
  /** The position of the step it depends on, or null for an existing job. */
  depOn: (number | null)[];
  /** The existing job's id, or null for a step. */
  depJob: (string | null)[];
  /** What its failure does. */
  depPolicy: OnDependencyFailure[];
}

/**
 * A flow's steps being checked, in the order given (see checkStep): positions count in that
 * order, and `depOn` is 0 for a step not given before the step that depends on it (after it,
 * or itself: its name in `later`).
 */
interface Columns extends CheckedFlow {
  /** The names of the steps not given before the step that depends on them, by dependency. */
  later: Map<number, string>;
  /** Each step's position in the order given (from 0), by name, once checked. */
  position: Map<string, number>;
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
  const flow = await checkFlow(host, steps);
  if (host.hooks.onEnqueue.length > 0 && isNodePostgres(options.session)) {
    throw new EnqueueError(
      "cannot enqueue a flow on a node-postgres session: this app has onEnqueue hooks, which " +
        "run in the enqueue's transaction and take a postgres.js transaction; enqueue on a " +
        "postgres.js session (app.sql, or a transaction of it) instead; nothing was enqueued",
    );
  }
  const s = quoteSchema(host.schema);
  const text = flowStatement(s);
  // The trace context (JSON text, the last parameter) is the enqueue span's, set below when
  // tracing is on.
  const params = flowParams(flow);
  const traceAt = params.length - 1;
  const hooks = host.hooks.onEnqueue;
  const { names, rows } = flow;
  // The steps' job ids, in dependency order.
  const run = async (tx: Sql | TransactionSql | NodePostgresClient): Promise<string[]> => {
    const [row] = isNodePostgres(tx)
      ? (await tx.query(text, params)).rows as Record<string, unknown>[]
      : await tx.unsafe(text, params as never, PREPARED);
    const ids = (row.ids as string).split(",");
    if (hooks.length === 0) return ids;
    const stepOf = new Map(ids.map((id, i) => [id, rows[i]]));
    // The columns an enqueue reads back (the enqueue role's grant); the rest are the steps'.
    const inserted = await (tx as TransactionSql).unsafe(
      `select id::pg_catalog.text as id, run_at, expires_at, args::pg_catalog.jsonb as args
         from ${s}.jobs where id operator(pg_catalog.=) any($1::bigint[]) order by id`,
      [`{${ids.join(",")}}`],
    );
    for (const row of inserted) {
      const step = stepOf.get(row.id)!;
      const job: EnqueuedJob = {
        id: row.id,
        task: step.task,
        queue: step.queue,
        priority: step.priority,
        maxAttempts: step.max_attempts,
        runAt: row.run_at,
        expiresAt: row.expires_at,
        uniqueKey: step.unique_key,
        limitKey: step.limit_key,
        args: row.args,
      };
      for (const hook of hooks) await hook(tx as TransactionSql, job);
    }
    return ids;
  };
  const session = options.session ?? host.sql;
  let ids: string[] = [];
  const distinct = (key: "task" | "queue") => {
    const seen = new Set<string>();
    // Steps without options share their task's row: each row looked at once in a run.
    for (let i = 0; i < rows.length; i++) {
      if (i === 0 || rows[i] !== rows[i - 1]) seen.add(rows[i][key]);
    }
    return [...seen].join(",");
  };
  const target = { task: distinct("task"), queue: distinct("queue"), count: rows.length };
  try {
    await tracePublish(target, async (traceContext) => {
      params[traceAt] = traceContext;
      ids = await explainMissingSchema(
        host.schema,
        () => hooks.length === 0 ? run(session) : atomically(session as Sql, run),
        EnqueueError,
        "cannot enqueue this flow: ",
      );
      return ids;
    });
  } catch (error) {
    throw flowError(error);
  }
  const jobs: Record<string, string> = {};
  for (let i = 0; i < ids.length; i++) jobs[names[i]] = ids[i];
  return { id: ids[0], jobs };
}

/**
 * Check every step of `steps` as a single enqueue checks a job; returns them in dependency
 * order, in the shape of the SQL function `enqueue_flow`'s argument (see `flowStatement`).
 */
export async function prepareFlow(
  host: FlowHost,
  steps: Record<string, FlowStep>,
): Promise<unknown[]> {
  const flow = await checkFlow(host, steps);
  const ordered: SqlStep[] = flow.names.map((name, i) => {
    const row = flow.rows[i];
    const step: SqlStep = {
      name,
      task: row.task,
      args: flow.args[i],
      queue: row.queue,
      priority: row.priority,
      max_attempts: row.max_attempts,
    };
    if (row.run_at !== null) step.run_at = row.run_at;
    if (row.delay_ms !== null) step.delay_ms = row.delay_ms;
    if (row.expires_at !== null) step.expires_at = row.expires_at;
    if (row.unique_key !== null) step.unique_key = row.unique_key;
    if (row.limit_key !== null) step.limit_key = row.limit_key;
    return step;
  });
  for (let k = 0; k < flow.depStep.length; k++) {
    const step = ordered[flow.depStep[k] - 1];
    const on = flow.depOn[k];
    const policy = flow.depPolicy[k];
    (step.depends_on ??= []).push(
      on === null
        ? { job: flow.depJob[k]!, on_failure: policy }
        : { step: flow.names[on - 1], on_failure: policy },
    );
  }
  return ordered;
}

/**
 * The steps of `steps` checked (each as {@linkcode checkStep} checks it), in dependency order.
 * Most flows are written in that order: then nothing is sorted.
 */
async function checkFlow(host: FlowHost, steps: Record<string, FlowStep>): Promise<CheckedFlow> {
  const names = isPlainObject(steps) ? Object.keys(steps) : [];
  if (names.length === 0) {
    throw new EnqueueError(
      "a flow is an object of named steps, e.g. { fetch: { task: fetch, args: { url } } }",
    );
  }
  const n = names.length;
  const c: Columns = {
    names,
    rows: new Array(n),
    args: new Array(n),
    texts: new Array(n),
    depStep: [],
    depOn: [],
    depJob: [],
    depPolicy: [],
    later: new Map(),
    position: new Map(),
  };
  const bases = new Map<EnqueueTarget, Base>();
  for (let i = 0; i < n; i++) {
    const checked = checkStep(host, names[i], i, steps[names[i]], steps, bases, c);
    if (checked !== undefined) await checked;
  }
  if (c.later.size === 0) return c;
  // Given in another order: the steps sorted (a cycle is an error), their dependencies with
  // them.
  const m = c.depStep.length;
  const depName = (k: number) => c.depOn[k] === 0 ? c.later.get(k)! : names[c.depOn[k]! - 1];
  const deps = new Map<string, string[]>(names.map((name) => [name, []]));
  for (let k = 0; k < m; k++) {
    if (c.depOn[k] !== null) deps.get(names[c.depStep[k] - 1])!.push(depName(k));
  }
  const order = dependencyOrder(names, deps).map((name) => c.position.get(name)!);
  const at = new Array<number>(n);
  for (let p = 0; p < n; p++) at[order[p]] = p;
  // Each step's dependencies are together, in the order given: where each step's start.
  const start = new Array<number>(n + 1).fill(0);
  for (let k = 0; k < m; k++) start[c.depStep[k]]++;
  for (let i = 0; i < n; i++) start[i + 1] += start[i];
  const flow: CheckedFlow = {
    names: order.map((i) => names[i]),
    rows: order.map((i) => c.rows[i]),
    args: order.map((i) => c.args[i]),
    texts: order.map((i) => c.texts[i]),
    depStep: new Array(m),
    depOn: new Array(m),
    depJob: new Array(m),
    depPolicy: new Array(m),
  };
  let k = 0;
  for (let p = 0; p < n; p++) {
    const i = order[p];
    for (let d = start[i]; d < start[i + 1]; d++, k++) {
      flow.depStep[k] = p + 1;
      flow.depOn[k] = c.depOn[d] === null ? null : at[c.position.get(depName(d))!] + 1;
      flow.depJob[k] = c.depJob[d];
      flow.depPolicy[k] = c.depPolicy[d];
    }
  }
  return flow;
}

/**
 * The flow enqueue: the SQL function `enqueue_flow_steps`
 * (migrations/0019_flow_steps_hand_off.sql, its body replaced in
 * migrations/0023_flow_enqueue_speed.sql), which takes the steps as parallel arrays (see
 * {@linkcode flowParams}) and returns their ids, comma-separated here.
 */
function flowStatement(s: string): string {
  return `select pg_catalog.array_to_string(${s}.enqueue_flow_steps(
      $1::pg_catalog.text[], $2::pg_catalog.text[], $3::pg_catalog.text[],
      $4::pg_catalog.int4[], $5::pg_catalog.int4[], $6::pg_catalog.text,
      $7::pg_catalog.timestamptz[], $8::pg_catalog.float8[], $9::pg_catalog.timestamptz[],
      $10::pg_catalog.text[], $11::pg_catalog.text[], $12::pg_catalog.int4[],
      $13::pg_catalog.int4[], $14::pg_catalog.int8[], $15::pg_catalog.text[], null,
      $16::pg_catalog.text::pg_catalog.jsonb), ',') as ids`;
}

/**
 * The parameters of {@linkcode flowStatement}: one array element per step, in dependency
 * order (an optional column none of the steps sets is one null), the arguments as one JSON
 * array of their texts, the dependencies as four arrays (the step's position, the position of
 * the step it depends on or the existing job's id, the failure policy), and the trace context
 * (null here). The arrays are sent as array literals, written here (a column of one value
 * repeated, as most are, is that value's text repeated).
 */
function flowParams(flow: CheckedFlow): unknown[] {
  const { rows } = flow;
  return [
    arrayLiteral(flow.names),
    columnLiteral(rows, "task"),
    columnLiteral(rows, "queue"),
    columnLiteral(rows, "priority"),
    columnLiteral(rows, "max_attempts"),
    `[${flow.texts.join(",")}]`,
    columnLiteral(rows, "run_at"),
    columnLiteral(rows, "delay_ms"),
    columnLiteral(rows, "expires_at"),
    columnLiteral(rows, "unique_key"),
    columnLiteral(rows, "limit_key"),
    arrayLiteral(flow.depStep),
    arrayLiteral(flow.depOn),
    arrayLiteral(flow.depJob),
    arrayLiteral(flow.depPolicy),
    null,
  ];
}

/**
 * Column `key` of the steps' rows as an array literal, or null when no step sets it. Steps
 * without options of their own share their task's row: one value, its text repeated.
 */
function columnLiteral(rows: readonly Base[], key: keyof Base): string | null {
  const first = rows[0][key] ?? null;
  let i = 1;
  while (i < rows.length && (rows[i] === rows[0] || (rows[i][key] ?? null) === first)) i++;
  if (i === rows.length && first === null) return null;
  if (i === rows.length) return repeatedLiteral(first as string | number, rows.length);
  const values = new Array<string | number | null>(rows.length);
  for (let k = 0; k < rows.length; k++) values[k] = rows[k][key] ?? null;
  return arrayLiteral(values);
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

/** Options of a step that has none but its task, arguments and dependencies. */
const NO_OPTIONS: Omit<EnqueueOptions, "session"> = Object.freeze({});

/**
 * Check step `name`, the `i`th of `steps`, as a single enqueue checks a job, and its
 * dependencies; adds it to the columns `c`. Synchronous unless the task's args schema is (a
 * flow of thousands of steps would otherwise wait a turn for each).
 */
function checkStep(
  host: FlowHost,
  name: string,
  i: number,
  step: FlowStep,
  steps: Record<string, FlowStep>,
  bases: Map<EnqueueTarget, Base>,
  c: Columns,
): Promise<void> | undefined {
  if (name.length === 0 || name.length > 200) {
    throw new EnqueueError(`step names must be 1 to 200 characters, got ${JSON.stringify(name)}`);
  }
  if (!isPlainObject(step)) {
    throw new EnqueueError(
      `${where(name)} must be an object: { task, args, dependsOn, ...options }`,
    );
  }
  let options: Record<string, unknown> | null = null;
  for (const key of Object.keys(step)) {
    if (key === "task" || key === "args" || key === "dependsOn") continue;
    if (!STEP_KEYS.has(key)) {
      throw new EnqueueError(
        `${where(name)} has an unknown key "${key}" (keys: ${[...STEP_KEYS].join(", ")})`,
      );
    }
    (options ??= {})[key] = (step as unknown as Record<string, unknown>)[key];
  }
  const { task: taskOrName, args, dependsOn } = step;
  const taskName = typeof taskOrName === "string"
    ? taskOrName
    : (taskOrName as { name?: unknown } | undefined)?.name;
  const target = typeof taskName === "string" ? host.tasks.get(taskName) : undefined;
  if (!target) {
    throw new EnqueueError(
      typeof taskName === "string"
        ? `${where(name)} runs task ${JSON.stringify(taskName)}, which this app does not have`
        : `${where(name)} needs a task: a task of this app, or its name`,
    );
  }
  let checked: Record<string, unknown> | Promise<Record<string, unknown>>;
  try {
    // A step without options of its own has its task's: checked once per task and flow.
    c.rows[i] = options === null
      ? checkJobOptions(target, NO_OPTIONS, bases)
      : checkJobOptions(target, options);
    checked = checkArgs(target, args === undefined ? {} : args);
    if (!(checked instanceof Promise)) {
      c.args[i] = checked;
      c.texts[i] = argsText(host, target, checked);
    }
  } catch (error) {
    throw stepError(name, error);
  }
  if (!(checked instanceof Promise)) {
    checkDependencies(name, i, dependsOn, steps, c);
    return;
  }
  return checked.then(
    (value) => {
      try {
        c.args[i] = value;
        c.texts[i] = argsText(host, target, value);
      } catch (error) {
        throw stepError(name, error);
      }
      checkDependencies(name, i, dependsOn, steps, c);
    },
    (error) => {
      throw stepError(name, error);
    },
  );
}

/**
 * Whether step `step` (given at `before`, or after the step being checked when undefined) is
 * among the dependencies listed from `start` on.
 */
function listed(c: Columns, start: number, step: string, before: number | undefined): boolean {
  for (let k = start; k < c.depOn.length; k++) {
    const on = c.depOn[k];
    if (on === null) continue;
    if (before === undefined ? on === 0 && c.later.get(k) === step : on === before + 1) {
      return true;
    }
  }
  return false;
}

/** How an error message names step `name` (made only for an error). */
function where(name: string): string {
  return `step ${JSON.stringify(name)}`;
}

/** The error a step's failed check raises: an `EnqueueError` naming the step. */
function stepError(name: string, error: unknown): unknown {
  if (!(error instanceof EnqueueError)) return error;
  return new EnqueueError(`${where(name)}: ${error.message}; nothing of this flow was enqueued`);
}

/**
 * Check the dependencies of step `name`, the `i`th (`dependsOn`: step names, or { step } / {
 * job } objects with an optional onFailure), and add them to the columns `c`; then the step
 * counts as checked (its position known).
 */
function checkDependencies(
  name: string,
  i: number,
  dependsOn: FlowStep["dependsOn"],
  steps: Record<string, FlowStep>,
  c: Columns,
): void {
  const start = c.depStep.length;
  if (dependsOn !== undefined) {
    if (!Array.isArray(dependsOn)) {
      throw new EnqueueError(
        `${where(name)}: dependsOn must be an array of step names or { step } / { job } objects`,
      );
    }
    // A set only for a long list (a fan-in's): most steps list one or two.
    const seenSteps = dependsOn.length > 8 ? new Set<string>() : null;
    let seenJobs: Set<string> | undefined;
    for (let d = 0; d < dependsOn.length; d++) {
      const dep = dependsOn[d];
      // A step name, the common case: no object to make and look into.
      let stepName: unknown = dep;
      let onFailure: unknown = "cancel";
      let jobId: unknown = undefined;
      if (typeof dep !== "string") {
        const o = dep as { step?: unknown; job?: unknown; onFailure?: unknown };
        if (!isPlainObject(o) || (o.step === undefined) === (o.job === undefined)) {
          throw new EnqueueError(
            `${where(name)}: each dependency is a step name, { step: name } or { job: id }, ` +
              "with an optional onFailure",
          );
        }
        for (const key of Object.keys(o)) {
          if (key !== "step" && key !== "job" && key !== "onFailure") {
            throw new EnqueueError(
              `${
                where(name)
              }: a dependency has an unknown key "${key}" (keys: step, job, onFailure)`,
            );
          }
        }
        onFailure = o.onFailure ?? "cancel";
        if (!ON_FAILURE.includes(onFailure as OnDependencyFailure)) {
          throw new EnqueueError(
            `${where(name)}: onFailure must be ${ON_FAILURE.map((p) => `"${p}"`).join(", ")}, got ${
              JSON.stringify(onFailure)
            }`,
          );
        }
        stepName = o.step;
        jobId = o.job;
      }
      const policy = onFailure as OnDependencyFailure;
      if (stepName !== undefined) {
        // A step given before this one (in the order given: then no sort is needed), or later.
        const before = c.position.get(stepName as string);
        if (before === undefined) {
          if (typeof stepName !== "string" || !Object.hasOwn(steps, stepName)) {
            throw new EnqueueError(
              `${where(name)} depends on ${
                JSON.stringify(stepName)
              }, which is not a step of this flow`,
            );
          }
        }
        const step = stepName as string;
        if (seenSteps ? seenSteps.has(step) : listed(c, start, step, before)) {
          throw new EnqueueError(`${where(name)} lists the dependency ${step} twice`);
        }
        seenSteps?.add(step);
        if (before === undefined) c.later.set(c.depStep.length, step);
        c.depStep.push(i + 1);
        c.depOn.push(before === undefined ? 0 : before + 1);
        c.depJob.push(null);
      } else {
        const id = typeof jobId === "string" || typeof jobId === "number" ? String(jobId) : "";
        if (!/^[1-9][0-9]{0,18}$/.test(id)) {
          throw new EnqueueError(
            `${where(name)} depends on job ${JSON.stringify(jobId)}, which is not a job id`,
          );
        }
        if ((seenJobs ??= new Set()).has(id)) {
          throw new EnqueueError(`${where(name)} lists job ${id} twice`);
        }
        seenJobs.add(id);
        c.depStep.push(i + 1);
        c.depOn.push(null);
        c.depJob.push(id);
      }
      c.depPolicy.push(policy);
    }
  }
  c.position.set(name, i);
}

/**
 * The step names in dependency order (each after the steps it depends on; otherwise in
 * the order given). A cycle is an `EnqueueError` that names it.
 */
export function dependencyOrder(
  names: readonly string[],
  deps: ReadonlyMap<string, readonly string[]>,
): string[] {
  // Given in dependency order already (as most flows are written): nothing to sort.
  const position = new Map<string, number>();
  let sorted = true;
  for (let i = 0; i < names.length && sorted; i++) {
    for (const dep of deps.get(names[i]) ?? []) {
      if (!(position.get(dep)! < i)) {
        sorted = false;
        break;
      }
    }
    position.set(names[i], i);
  }
  if (sorted) return [...names];
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
 * order: the key is the step name, or the job id of a job without one or of one whose name an
 * earlier job of the flow has (two steps may each add a child of the same name; neither may
 * hide the other).
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
  const taken = new Set<string>();
  return rows.map((r) => {
    const step = r.step as string | null;
    const key = step === null || taken.has(step) ? r.id as string : step;
    taken.add(key);
    return [key, r.id as string];
  });
}
