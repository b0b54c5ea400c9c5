/**
 * The executor: runs one claimed job (argument re-validation, beforeRun hooks, handler,
 * afterRun hooks, all inside the timeout), with its context and abort signal, and turns
 * what happened into an {@linkcode Outcome}. It never writes the outcome itself, except
 * through `ctx.completeTx`.
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import { type JobContext, runWithContext } from "../context.ts";
import {
  flowError,
  type FlowStep,
  ON_FAILURE,
  type OnDependencyFailure,
  prepareFlow,
} from "../flow.ts";
import {
  type DependencyOutcome,
  readDependencies,
  resultOf,
  type ResultSource,
} from "../dependencies.ts";
import { quoteSchema, type TransactionSql } from "../db.ts";
import { AkadzeError, controlKind, EnqueueError, Fail } from "../errors.ts";
import { isDelay, MAX_DELAY, progressText } from "../rules.ts";
import type { JobInfo } from "../job.ts";
import { jsonProblem } from "../json.ts";
import { formatIssues } from "../standard_schema.ts";
import type { AnyTask } from "../task.ts";
import { nextDelay } from "./backoff.ts";
import type { ClaimedJob } from "./claimer.ts";
import type { Completer, Outcome } from "./completer.ts";
import { errorEntry, MESSAGE_MAX, runSecrets, storableText } from "./error_entry.ts";
import { JOB_RETURNING, type JobRow, runTransitionHooks, toJobInfo } from "./job_row.ts";
import { LOOP_BLOCK_WARN_DEFAULT, type RunRef } from "./loop_blocks.ts";
import { ProgressReporter, progressStatement } from "./progress.ts";
import { activeTracer, endRunSpan, inRunSpan, startRunSpan } from "../tracing.ts";
import type { SpanContext } from "@opentelemetry/api";
import { SandboxPool } from "./sandbox_pool.ts";
import { logErrorAfterOutcome } from "./log_events.ts";

/**
 * Why a run was interrupted from outside the handler; "exit": its handler called
 * `Deno.exit` (the run fails with the error given to `interrupt`).
 */
export type Interrupt = "timeout" | "cancel" | "shutdown" | "exit";

/** A run in progress. */
export interface Execution {
  /** The job. */
  readonly job: JobInfo;
  /**
   * Abort the run's signal and settle its outcome now (the handler may keep running);
   * for "exit", as a failure with `error`.
   */
  interrupt(reason: Interrupt, error?: Error): void;
}

/**
 * Receives a run's outcome, once: the outcome to write, or null when `completeTx` already
 * wrote it, and how long the run took (ms, for the metrics). It may be called before
 * `start` returns (a synchronous handler).
 */
export type OnOutcome = (
  outcome: Outcome | null,
  durationMs: number,
  span: SpanContext | undefined,
) => void;

/** Options of an {@linkcode Executor}. */
export interface ExecutorOptions {
  /** Report a synchronous part of a handler call that took `blockWarn` ms or longer. */
  onBlocked?: (job: RunRef, ms: number) => void;
  /** From how long (ms) a synchronous part is reported. Default {@linkcode LOOP_BLOCK_WARN_DEFAULT}. */
  blockWarn?: number;
}

/** Runs jobs of one app. */
export class Executor {
  #app: Akadze;
  #completer: Completer;
  #onBlocked: ((job: RunRef, ms: number) => void) | null;
  #blockWarn: number;
  #secrets: string[];
  #lockJob: string;
  #progress: string;
  /** The thread pools of the sandboxed tasks, made on their first run. */
  #pools = new Map<string, SandboxPool>();

  /**
   * Make an executor; the pool's password (and each job's argument values) are redacted
   * from stored error messages.
   */
  constructor(app: Akadze, completer: Completer, options: ExecutorOptions = {}) {
    this.#app = app;
    this.#completer = completer;
    this.#onBlocked = options.onBlocked ?? null;
    this.#blockWarn = options.blockWarn ?? LOOP_BLOCK_WARN_DEFAULT;
    const password = (app.sql.options as { pass?: unknown }).pass;
    this.#secrets = typeof password === "string" && password ? [password] : [];
    this.#lockJob = `select run_count, state, cancel_requested_at is not null as cancelled,
        coalesce(expires_at operator(pg_catalog.<=) pg_catalog.now(), false) as expired,
          coalesce(flow_id, id)::pg_catalog.text as flow
      from ${quoteSchema(app.schema)}.jobs where id operator(pg_catalog.=) $1 for update`;
    this.#progress = progressStatement(app.schema);
  }

  /**
   * Start running a claimed job; `onOutcome` gets its outcome. A handler that returns
   * without a promise settles the run at once: no promise or context switch per job.
   */
  start(row: ClaimedJob, onOutcome: OnOutcome): Execution {
    const job = toJobInfo(row);
    const task = this.#app.tasks.get(row.task);
    const timeout = task?.timeout;
    const ctx = new RunContext(
      job,
      timeout === undefined ? null : new Date(Date.now() + timeout),
      (run, fn) => this.#completeTx(run, fn),
      () => new ProgressReporter(this.#app.sql, this.#progress, job),
      () => readDependencies(this.#app.sql, this.#app.schema, job.id),
      (run, steps, options) => this.#waitForChildren(run, steps, options ?? {}),
    );
    const tracer = activeTracer();
    const span = tracer === null ? null : startRunSpan(tracer, job, row.trace_context);
    // Settled once: by the handler, or by an interrupt, whichever is first.
    const startedAt = performance.now();
    let finished = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const finish = (settled: Settled) => {
      if (finished) return;
      finished = true;
      if (timer !== undefined) clearTimeout(timer);
      const outcome = this.#outcome(task, job, row.args, ctx, settled);
      const durationMs = performance.now() - startedAt;
      // Only a failed run's outcome says how long it took (the log of its failure).
      if (outcome?.error) outcome.durationMs = Math.round(durationMs);
      if (span) endRunSpan(span, job, outcome?.kind ?? "succeeded", outcome?.error);
      // The run's span, for the log record of its outcome (tracing on).
      const spanContext = span?.span.spanContext();
      // The last progress is written before the outcome (only runs that reported wait).
      const progress = ctx.finishProgress();
      if (progress === null) return onOutcome(outcome, durationMs, spanContext);
      progress.then(() => onOutcome(outcome, durationMs, spanContext));
    };
    const interrupt = (reason: Interrupt, error?: Error) => {
      if (finished) return;
      if (reason === "exit") {
        const failure = error ?? new Error("the handler ended the worker process");
        ctx.abort(failure);
        return finish({ ok: false, error: failure });
      }
      ctx.abort(interruptError(reason, timeout));
      finish(reason);
    };
    if (timeout !== undefined) timer = setTimeout(() => interrupt("timeout"), timeout);
    let value: unknown;
    try {
      value = span === null
        ? runWithContext(ctx, () => this.#run(task, row, job, ctx))
        : inRunSpan(span, () => runWithContext(ctx, () => this.#run(task, row, job, ctx)));
    } catch (error) {
      this.#checkBlock(row, startedAt);
      finish({ ok: false, error });
      return { job, interrupt };
    }
    // Before the outcome is queued: a block past the lease is known when it is written.
    this.#checkBlock(row, startedAt);
    if (isThenable(value)) {
      Promise.resolve(value).then(
        (value) => finish({ ok: true, value }),
        (error) => finish({ ok: false, error }),
      );
    } else {
      finish({ ok: true, value });
    }
    return { job, interrupt };
  }

  /** Report the synchronous part of a handler call when it held the loop too long. */
  #checkBlock(row: ClaimedJob, startedAt: number): void {
    const ms = performance.now() - startedAt;
    if (ms >= this.#blockWarn && this.#onBlocked) {
      this.#onBlocked({ id: row.id, runCount: row.run_count, task: row.task }, ms);
    }
  }

  /**
   * The outcome of a settled run (null when `completeTx` already wrote it). Never throws,
   * whatever the handler threw or returned: a failure here fails the run.
   */
  #outcome(
    task: AnyTask | undefined,
    job: JobInfo,
    args: unknown,
    ctx: RunContext,
    settled: Settled,
  ): Outcome | null {
    try {
      return this.#settledOutcome(task, job, args, ctx, settled);
    } catch {
      return {
        id: job.id,
        runCount: job.runCount,
        kind: "fail",
        error: { error: "Error", message: "the outcome of this run could not be determined" },
      };
    }
  }

  #settledOutcome(
    task: AnyTask | undefined,
    job: JobInfo,
    args: unknown,
    ctx: RunContext,
    settled: Settled,
  ): Outcome | null {
    if (typeof settled === "string") {
      if (settled === "timeout") {
        return this.#failure(task, job, args, interruptError("timeout", task?.timeout));
      }
      return {
        id: job.id,
        runCount: job.runCount,
        kind: settled === "cancel" ? "cancel" : "release",
      };
    }
    if (ctx.completed) {
      // Written already (completeTx, waitForChildren): an error thrown after it changes
      // nothing, but it must not pass unseen.
      if (!settled.ok) logErrorAfterOutcome(job, errorEntry(settled.error, this.#runSecrets(args)));
      return null;
    }
    if (!settled.ok) return this.#failure(task, job, args, settled.error);
    const result = settled.value === undefined ? null : settled.value;
    const problem = result === null ? null : resultProblem(result);
    if (problem) {
      return {
        id: job.id,
        runCount: job.runCount,
        kind: "fail",
        error: {
          error: "ResultNotStorable",
          message: storableText(problem, MESSAGE_MAX, this.#runSecrets(args)),
        },
      };
    }
    return { id: job.id, runCount: job.runCount, kind: "succeeded", result };
  }

  /** Run the handler: a value, or a promise of one (a sync handler without hooks stays sync). */
  #run(task: AnyTask | undefined, row: ClaimedJob, job: JobInfo, ctx: JobContext): unknown {
    if (!task) throw new AkadzeError(`no task "${row.task}" is registered in this worker`);
    const { beforeRun, afterRun } = this.#app.hooks;
    if (!task.args && !task.sandbox && beforeRun.length === 0 && afterRun.length === 0) {
      return task.handler(row.args as never, ctx);
    }
    return this.#runWithHooks(task, row, job, ctx);
  }

  async #runWithHooks(
    task: AnyTask,
    row: ClaimedJob,
    job: JobInfo,
    ctx: JobContext,
  ): Promise<unknown> {
    let args = row.args;
    if (task.args) {
      const result = await task.args["~standard"].validate(args);
      if (result.issues) {
        // Permanent: the same arguments fail the same schema on every attempt.
        const error = new Fail(
          `the job's arguments do not match the schema of task "${task.name}": ${
            formatIssues(result.issues)
          }`,
        );
        error.name = "InvalidArguments";
        throw error;
      }
      args = result.value;
    }
    for (const hook of this.#app.hooks.beforeRun) await hook(job);
    const value = task.sandbox
      ? await this.#runSandboxed(task, args, job, ctx)
      : await task.handler(args as never, ctx);
    for (const hook of this.#app.hooks.afterRun) await hook(job, value);
    return value;
  }

  /** Run a sandboxed task's job in a thread of its pool (the arguments are validated). */
  async #runSandboxed(
    task: AnyTask,
    args: unknown,
    job: JobInfo,
    ctx: JobContext,
  ): Promise<unknown> {
    let pool = this.#pools.get(task.name);
    if (!pool) this.#pools.set(task.name, pool = new SandboxPool(task.name, task.sandbox!));
    // Read here, where the database is (the thread has no connection), while the run starts.
    const dependencies = ctx.dependencies();
    dependencies.catch(() => {}); // the thread's to report, if its handler asks
    return await pool.run({ args, job, deadline: ctx.deadline, dependencies }, {
      signal: ctx.signal,
      onProgress: (value) => ctx.progress(value),
    });
  }

  /**
   * Terminate the sandbox threads (when the worker's runs have settled): a later run
   * starts new ones.
   *
   * @example
   * ```ts ignore
   * executor.close();
   * ```
   */
  close(): void {
    for (const pool of this.#pools.values()) pool.close();
    this.#pools.clear();
  }

  /**
   * The outcome of a failed run: control exceptions, or retry with backoff. A `Retry` or
   * `Snooze` whose delay is not 0..MAX_DELAY ms is a failure like any error (`InvalidDelay`).
   */
  #failure(task: AnyTask | undefined, job: JobInfo, args: unknown, error: unknown): Outcome {
    const base = { id: job.id, runCount: job.runCount };
    const kind = controlKind(error);
    const entry = (e: unknown) => errorEntry(e, this.#runSecrets(args));
    let cause = error;
    if (kind === "Snooze" || kind === "Retry") {
      let delay: unknown;
      try {
        delay = (error as { delay?: unknown }).delay;
      } catch {
        delay = NaN;
      }
      if (isDelay(delay)) {
        if (kind === "Snooze") return { ...base, kind: "snooze", delayMs: delay };
        return { ...base, kind: "retry", delayMs: delay, error: entry(error) };
      }
      // A Retry without a delay takes the task's backoff.
      if (kind === "Snooze" || delay !== undefined) cause = invalidDelay(kind, delay);
    }
    if (kind === "Cancel") return { ...base, kind: "cancel", error: entry(error) };
    if (kind === "Fail") return { ...base, kind: "fail", error: entry(error) };
    const spent = job.attempt; // this run's number: the attempts spent once it fails
    const backoff = nextDelay(task?.backoff, spent, error);
    if (backoff === null) return { ...base, kind: "fail", error: entry(cause) };
    return { ...base, kind: "retry", delayMs: backoff, error: entry(cause) };
  }

  /** What the run's stored errors must not contain: credentials, argument values. */
  #runSecrets(args: unknown): string[] {
    return runSecrets(this.#secrets, args);
  }

  async #completeTx<T>(state: RunContext, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
    const job = state.job;
    return await this.#ownedTx(state, "completeTx", async (tx) => {
      const value = await fn(tx);
      await state.writeProgressIn(tx);
      const written = await this.#completer.writeIn(tx, {
        id: job.id,
        runCount: job.runCount,
        kind: "succeeded",
        result: null,
      });
      if (!written) throw new AkadzeError(`job ${job.id} is no longer owned by this run`);
      await runTransitionHooks(this.#app.hooks.onTransition, tx, written, "running");
      return value;
    });
  }

  /**
   * `ctx.waitForChildren`: the children inserted (a flow joining this job's), each made a
   * dependency of this job, and this job moved to `waiting`, in one transaction.
   */
  async #waitForChildren(
    state: RunContext,
    steps: Record<string, FlowStep>,
    options: { onFailure?: OnDependencyFailure },
  ): Promise<Record<string, string>> {
    const job = state.job;
    const onFailure = options?.onFailure ?? "cancel";
    if (!ON_FAILURE.includes(onFailure)) {
      throw new EnqueueError(
        `onFailure must be ${ON_FAILURE.map((p) => `"${p}"`).join(", ")}, got ${
          JSON.stringify(onFailure)
        }`,
      );
    }
    const app = this.#app;
    const ordered = await prepareFlow(app, steps);
    const s = quoteSchema(app.schema);
    try {
      return await this.#ownedTx(state, "waitForChildren", async (tx, owned) => {
        // dependencies() keys this job's dependencies by step name: a child named as one of
        // them (a child of an earlier round, a step it waits for) would hide it.
        const [taken] = await tx.unsafe(
          `select j.step, j.id::pg_catalog.text as id from ${s}.job_dependencies d
             join ${s}.jobs j on j.id operator(pg_catalog.=) d.depends_on
            where d.job_id operator(pg_catalog.=) $1::bigint
              and j.flow_id operator(pg_catalog.=) $2::bigint
              and $3::pg_catalog.text::pg_catalog.jsonb operator(pg_catalog.?) j.step
            order by j.id limit 1`,
          [job.id, owned.flow, JSON.stringify(Object.keys(steps))],
        );
        if (taken) {
          throw new EnqueueError(
            `step ${
              JSON.stringify(taken.step)
            } is already a dependency of this job (job ${taken.id}), ` +
              "and dependencies() reads them by step name: give each child a name of its own " +
              `(e.g. ${JSON.stringify(`${taken.step}-${job.runCount}`)}); no child was added`,
          );
        }
        const children = await tx.unsafe(
          `select step, id::pg_catalog.text as id from
            ${s}.enqueue_flow($1::pg_catalog.text::pg_catalog.jsonb, $2::bigint)`,
          [JSON.stringify(ordered), owned.flow],
        );
        const ids = `{${children.map((c) => c.id).join(",")}}`;
        await state.writeProgressIn(tx);
        const [written] = await tx.unsafe(
          `with edges as (
             insert into ${s}.job_dependencies (job_id, depends_on, on_failure)
             select $1::bigint, d, $3 from pg_catalog.unnest($2::bigint[]) d),
           marked as (
             update ${s}.jobs set has_dependents = true where id
               operator(pg_catalog.=) any($2::bigint[]))
           update ${s}.jobs j set state = 'waiting', pending_deps =
             pg_catalog.cardinality($2::bigint[]),
                  flow_id = $4::bigint
            where j.id operator(pg_catalog.=) $1::bigint and j.run_count operator(pg_catalog.=) $5
              and j.state operator(pg_catalog.=) 'running'
           returning ${JOB_RETURNING}`,
          [job.id, ids, onFailure, owned.flow, job.runCount],
        );
        if (!written) throw new AkadzeError(`job ${job.id} is no longer owned by this run`);
        await runTransitionHooks(
          app.hooks.onTransition,
          tx,
          written as unknown as JobRow,
          "running",
        );
        return Object.fromEntries(children.map((c) => [c.step as string, c.id as string]));
      });
    } catch (error) {
      throw flowError(error);
    }
  }

  /**
   * Run `fn` in a transaction that holds this run's job locked and still owned (running,
   * same run_count, no cancel request, not expired); marks the run completed when it
   * commits. `what` names the caller in errors.
   */
  async #ownedTx<T>(
    state: RunContext,
    what: string,
    fn: (tx: TransactionSql, owned: { flow: string }) => Promise<T>,
  ): Promise<T> {
    const job = state.job;
    if (state.inCompleteTx) {
      throw new AkadzeError(
        what === "completeTx"
          ? "completeTx cannot be nested"
          : `${what} cannot run inside completeTx`,
      );
    }
    if (state.completed) {
      throw new AkadzeError(
        `${what}: this run's outcome is already written (completeTx or waitForChildren committed)`,
      );
    }
    if (state.abortReason) {
      throw new AkadzeError(
        `job ${job.id}: the run was interrupted (${state.abortReason.message})`,
      );
    }
    state.inCompleteTx = true;
    try {
      const value = await this.#app.sql.begin(async (tx) => {
        const [row] = await tx.unsafe(this.#lockJob, [job.id]);
        if (!row || row.state !== "running" || row.run_count !== job.runCount) {
          throw new AkadzeError(`job ${job.id} is no longer owned by this run`);
        }
        if (row.cancelled) throw new AkadzeError(`job ${job.id} was cancelled`);
        if (row.expired) throw new AkadzeError(`job ${job.id} has expired`);
        return await fn(tx, { flow: row.flow as string });
      });
      state.completed = true;
      return value as T;
    } finally {
      state.inCompleteTx = false;
    }
  }
}

/** Whether a handler's return value is a promise (or another thenable) to wait for. */
function isThenable(value: unknown): value is PromiseLike<unknown> {
  try {
    return typeof (value as PromiseLike<unknown> | null)?.then === "function";
  } catch {
    return false; // a result that cannot be read: the result check refuses it
  }
}

/** Why a result cannot be stored, or null; also when reading it throws. */
function resultProblem(result: unknown): string | null {
  try {
    return jsonProblem(result, "result");
  } catch (error) {
    return `the result cannot be read (reading it threw ${errorEntry(error, []).error})`;
  }
}

/** The error a `Retry` or `Snooze` with an unusable delay is stored as. */
function invalidDelay(kind: "Retry" | "Snooze", delay: unknown): Error {
  const shown = typeof delay === "number" ? String(delay) : `a ${typeof delay}`;
  return Object.assign(
    new Error(
      `${kind} delay must be a number of milliseconds from 0 to ${MAX_DELAY} (365 days), ` +
        `got ${shown}; counted as a failed attempt`,
    ),
    { name: "InvalidDelay" },
  );
}

/** How a run settled: the handler's value or error, or an interrupt. */
type Settled =
  | { ok: true; value: unknown }
  | { ok: false; error: unknown }
  | Exclude<Interrupt, "exit">;

/** How a run's context adds children: see {@linkcode Executor}'s `#waitForChildren`. */
type ChildrenWait = (
  run: RunContext,
  steps: Record<string, FlowStep>,
  options: { onFailure?: OnDependencyFailure },
) => Promise<Record<string, string>>;

/**
 * A run's {@linkcode JobContext}. The AbortController is made on first use of `signal`
 * (most handlers never look at it, and one per job is a measurable share of a no-op run).
 */
class RunContext implements JobContext {
  readonly job: JobInfo;
  readonly deadline: Date | null;
  /** Set once `completeTx` committed: the handler's return value is then ignored. */
  completed = false;
  /** While `completeTx` runs (it cannot be nested). */
  inCompleteTx = false;
  #controller: AbortController | null = null;
  #reason: Error | null = null;
  #completeTx: <T>(run: RunContext, fn: (tx: TransactionSql) => Promise<T>) => Promise<T>;
  #makeReporter: () => ProgressReporter;
  #reporter: ProgressReporter | null = null;
  #readDependencies: () => Promise<Record<string, DependencyOutcome>>;
  #waitForChildren: ChildrenWait;

  constructor(
    job: JobInfo,
    deadline: Date | null,
    completeTx: <T>(run: RunContext, fn: (tx: TransactionSql) => Promise<T>) => Promise<T>,
    makeReporter: () => ProgressReporter,
    readDependencies: () => Promise<Record<string, DependencyOutcome>>,
    waitForChildren: ChildrenWait,
  ) {
    this.#waitForChildren = waitForChildren;
    this.job = job;
    this.deadline = deadline;
    this.#completeTx = completeTx;
    this.#makeReporter = makeReporter;
    this.#readDependencies = readDependencies;
  }

  progress(value: unknown): void {
    const text = progressText(value);
    // Made on first use: most runs never report progress.
    (this.#reporter ??= this.#makeReporter()).report(text);
  }

  /** The run ended: see {@linkcode ProgressReporter.finish} (null when it never reported). */
  finishProgress(): Promise<void> | null {
    return this.#reporter?.finish() ?? null;
  }

  /** In `completeTx`: write the latest progress in its transaction. */
  async writeProgressIn(tx: TransactionSql): Promise<void> {
    await this.#reporter?.writeIn(tx);
  }

  get signal(): AbortSignal {
    if (this.#controller === null) {
      this.#controller = new AbortController();
      if (this.#reason) this.#controller.abort(this.#reason);
    }
    return this.#controller.signal;
  }

  /** Why the run was interrupted, or null. */
  get abortReason(): Error | null {
    return this.#reason;
  }

  /** Abort the run's signal (now, or when it is first asked for). */
  abort(reason: Error): void {
    if (this.#reason) return;
    this.#reason = reason;
    this.#controller?.abort(reason);
  }

  remaining(): number | null {
    return this.deadline === null ? null : Math.max(0, this.deadline.getTime() - Date.now());
  }

  completeTx<T>(fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
    return this.#completeTx(this, fn);
  }

  dependencies(): Promise<Record<string, DependencyOutcome>> {
    return this.#readDependencies();
  }

  async resultOf<R>(task: ResultSource<R>, step?: string): Promise<Awaited<R>> {
    return resultOf(await this.#readDependencies(), task, step);
  }

  waitForChildren(
    steps: Record<string, FlowStep>,
    options: { onFailure?: OnDependencyFailure } = {},
  ): Promise<Record<string, string>> {
    return this.#waitForChildren(this, steps, options);
  }
}

function interruptError(
  reason: Exclude<Interrupt, "exit">,
  timeout: number | undefined,
): Error {
  switch (reason) {
    case "timeout":
      return Object.assign(new Error(`the run timed out after ${timeout} ms`), {
        name: "TimeoutError",
      });
    case "cancel":
      return Object.assign(new Error("the job was cancelled"), { name: "AbortError" });
    case "shutdown":
      return Object.assign(new Error("the worker is shutting down"), { name: "AbortError" });
  }
}
