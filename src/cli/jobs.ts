/**
 * `akadze jobs list|show|requeue|cancel`.
 *
 * @module
 */
import {
  cancelJobs,
  type FlowStepSummary,
  getJob,
  isTaskFilter,
  type JobDetail,
  type JobFilter,
  type JobSummary,
  listJobs,
  normalizeId,
  requestCancel,
  requeue,
  requeueJobs,
} from "../admin/jobs.ts";
import { ACTIVE_STATES, JOB_STATES, type JobState } from "../job.ts";
import { LIST_JOBS_MAX, TASK_NAME_MAX } from "../rules.ts";
import { redact } from "../db.ts";
import { runSecrets } from "../worker/error_entry.ts";
import { integerFlag, UsageError } from "./common.ts";
import {
  DATABASE_FOOTER,
  dispatch,
  jobIdArg,
  parseSubcommand,
  queueArg,
  SCHEMA_OPTION,
  withSql,
} from "./ops.ts";
import {
  type Column,
  isoTime,
  printJson,
  printRecord,
  printTable,
  safeJson,
  safeText,
} from "./output.ts";

/** How many steps of a flow `jobs show` prints at most (`jobs list --flow` has them all). */
const FLOW_LINES_MAX = 200;

/** Help text of `akadze jobs`. */
export const JOBS_HELP = `Usage: akadze jobs <command> [options]

Commands:
  list [--task T] [--state S] [--queue Q] [--since WHEN] [--flow ID] [--limit N] [--newest]
       [--json]        job summaries, in the order the queue runs them
  show ID [--args] [--result] [--json]
                       one job with its error history and stacks, and its flow's steps
  requeue ID | requeue [--task T] [--state failed] [--queue Q] [--since WHEN] [--flow ID]
       [--dry-run]     put failed jobs back to queued (one more attempt)
  cancel ID | cancel [--task T] [--state S] [--queue Q] [--since WHEN] [--flow ID]
       [--dry-run]     cancel waiting jobs, request the cancellation of queued or running ones

Run akadze jobs <command> --help for a command's options.`;

/** The filter options' lines, shared by list, requeue and cancel. */
function filterHelp(states: string): string {
  return `  --task T        only jobs of this task
  --state S       only jobs in this state: ${states}
  --queue Q       only jobs of this queue
  --since WHEN    only jobs enqueued at or after WHEN: a duration back from now (a whole
                  number with s, m, h or d: 30s, 15m, 2h, 3d, by this machine's clock) or
                  an ISO 8601 time (2026-12-01, 2026-12-01T09:30, 2026-12-01T09:30:00+02:00;
                  without an offset it is UTC)
  --flow ID       only the steps of the flow ID (a flow's id is the job id of its first
                  step: the flowId of jobs show)`;
}

const LIST_HELP = `Usage: akadze jobs list [--task T] [--state S] [--queue Q] [--since WHEN]
                        [--flow ID] [--limit N] [--newest] [--json]

Job summaries (no arguments, result or errors), in the order the queue runs them: by
priority (highest first), then run_at, then id. With --newest, the most recently enqueued
first (by id).

Options:
${filterHelp(JOB_STATES.join(", "))}
  --limit N       at most N jobs, 1 to ${LIST_JOBS_MAX} (default 50)
  --newest        the most recently enqueued first instead
  --json          a JSON array of objects with the keys id, task, queue, state, priority,
                  attempt, maxAttempts, runCount, runAt, createdAt, startedAt, finishedAt,
                  workerId, uniqueKey, limitKey, expiresAt, cancelRequested, flowId,
                  step
${SCHEMA_OPTION}
  -h, --help      show this help

Output: a header line, then one line per job; columns separated by a tab:
  ID QUEUE TASK STATE PRIORITY ATTEMPT MAX_ATTEMPTS RUN_AT STARTED_AT FINISHED_AT WORKER_ID
"-" stands for none; times are ISO 8601 in UTC.

${DATABASE_FOOTER}`;

const SHOW_HELP = `Usage: akadze jobs show ID [--args] [--result] [--json]

One job with its error history (oldest first), each error with the stack it was thrown
from, and, for a job in a flow, every step of its flow. Arguments and result are printed
only when asked for; without --args, argument values quoted in the errors show as ***.

Options:
  --args          include the arguments
  --result        include the result
  --json          a JSON object: the keys of jobs list --json plus snoozes, progress,
                  errors ([{error, message, at, stack}]; stack is absent when there is
                  none), args / result when asked for, and for a job in a flow, flow:
                  its steps in dependency order ([{id, step, task, queue, state,
                  attempt, finishedAt, dependsOn: [{id, onFailure}]}])
${SCHEMA_OPTION}
  -h, --help      show this help

Output: "key: value" lines (id, task, queue, state, priority, attempt, maxAttempts,
runCount, runAt, createdAt, startedAt, finishedAt, workerId, uniqueKey, limitKey,
expiresAt, cancelRequested, flowId, step, snoozes, progress: JSON, errors: COUNT), then
"error: AT NAME: MESSAGE" per error, followed by its stack frames, one "  at ..." line
each. For a job in a flow, then "flow: ID (N steps: COUNT STATE, ...)" and one line per
step, "STEP  job ID  TASK  STATE", indented under the step it waits for (the last one, when
it waits for several: "after: A, B" names them all; "(this job)" marks the job shown);
at most ${FLOW_LINES_MAX} steps, then how many more (jobs list --flow ID lists them all). Then
"args: JSON" and "result: JSON" when asked for. "-" stands for none; times are ISO 8601 in
UTC.

Exit codes: 0 shown, 1 job not found or database failure, 2 usage error.`;

const REQUEUE_HELP = `Usage: akadze jobs requeue ID
       akadze jobs requeue [--task T] [--state failed] [--queue Q] [--since WHEN] [--flow ID]
                           [--dry-run]

Put a failed job back to queued, or every failed job that matches the filters (at least
one is needed). A job keeps its attempt count, errors and arguments; its attempt budget
is raised by one when it was spent. Prints "requeued job ID", or "requeued N jobs".
The steps of a flow that a requeued step's failure cancelled wait again, and run when it
succeeds: --flow ID requeues a flow's failed steps and so resumes the flow.

A matching job whose uniqueKey is held by a queued or running job (or by a newer
matching job, which is requeued instead) stays failed: each one is reported as "skipped
job ID: ..." and the others are still requeued (exit 0).

Options:
${filterHelp("failed (the default; no other state can be requeued)")}
  --dry-run       print "would requeue N jobs" (and the jobs it would skip), change nothing
${SCHEMA_OPTION}
  -h, --help      show this help

Exit codes: 0 requeued (or nothing matched); 1 the job ID is unknown or not failed,
another job with its uniqueKey is queued or running (DuplicateJob), or a database
failure; 2 usage error.`;

const CANCEL_HELP = `Usage: akadze jobs cancel ID
       akadze jobs cancel [--task T] [--state S] [--queue Q] [--since WHEN] [--flow ID]
                          [--dry-run]

Cancel a waiting, queued or running job, or every such job that matches the filters (at
least one is needed): a waiting job (a step of a flow) is cancelled at once, a queued job
by the next claim pass, a running one is stopped by its worker and ends cancelled. The
steps that wait for a cancelled one are cancelled too, unless they ignore its failure:
--flow ID cancels a whole flow.

With ID it prints "cancel requested for job ID"; for a job that is already finished or
does not exist nothing changes: it prints "nothing cancelled: job ID is STATE" or
"nothing cancelled: job ID not found" and still exits 0 (cancelling is idempotent). With
filters it prints "cancel requested for N jobs" (jobs whose cancel was already requested
are not counted again).

Options:
${filterHelp(ACTIVE_STATES.join(", "))}
  --dry-run       print "would request the cancellation of N jobs", change nothing
${SCHEMA_OPTION}
  -h, --help      show this help

Exit codes: 0 requested or nothing to cancel, 1 database failure, 2 usage error.`;

/** Run `akadze jobs`; returns the exit code. */
export function jobsCommand(args: string[]): Promise<number> {
  return dispatch("jobs", args, JOBS_HELP, {
    list: listCommand,
    show: showCommand,
    requeue: requeueCommand,
    cancel: cancelCommand,
  });
}

const LIST_COLUMNS: Column<JobSummary>[] = [
  { header: "ID", value: (j) => j.id },
  { header: "QUEUE", value: (j) => j.queue },
  { header: "TASK", value: (j) => j.task },
  { header: "STATE", value: (j) => j.state },
  { header: "PRIORITY", value: (j) => j.priority },
  { header: "ATTEMPT", value: (j) => j.attempt },
  { header: "MAX_ATTEMPTS", value: (j) => j.maxAttempts },
  { header: "RUN_AT", value: (j) => j.runAt },
  { header: "STARTED_AT", value: (j) => j.startedAt },
  { header: "FINISHED_AT", value: (j) => j.finishedAt },
  { header: "WORKER_ID", value: (j) => j.workerId },
];

/** A job summary with the CLI's stable JSON keys. */
function summaryJson(j: JobSummary): Record<string, unknown> {
  return {
    id: j.id,
    task: j.task,
    queue: j.queue,
    state: j.state,
    priority: j.priority,
    attempt: j.attempt,
    maxAttempts: j.maxAttempts,
    runCount: j.runCount,
    runAt: isoTime(j.runAt),
    createdAt: isoTime(j.createdAt),
    startedAt: isoTime(j.startedAt),
    finishedAt: isoTime(j.finishedAt),
    workerId: j.workerId,
    uniqueKey: j.uniqueKey,
    limitKey: j.limitKey,
    expiresAt: isoTime(j.expiresAt),
    cancelRequested: j.cancelRequested,
    flowId: j.flowId,
    step: j.step,
  };
}

/** The filter flags of list, requeue and cancel. */
const FILTER_FLAGS = {
  task: { type: "string" },
  state: { type: "string" },
  queue: { type: "string" },
  since: { type: "string" },
  flow: { type: "string" },
} as const;

/**
 * The filter of `--task`, `--state` (one of `states`), `--queue`, `--since` and `--flow`,
 * or null when none was given.
 */
function filterFlags(
  values: { task?: string; state?: string; queue?: string; since?: string; flow?: string },
  states: readonly string[],
  schema: string,
): JobFilter | null {
  const filter: JobFilter = { schema };
  if (values.task !== undefined) {
    if (!isTaskFilter(values.task)) {
      throw new UsageError(`--task must be a task name of 1 to ${TASK_NAME_MAX} characters`);
    }
    filter.task = values.task;
  }
  if (values.state !== undefined) {
    if (!states.includes(values.state)) {
      throw new UsageError(`--state must be ${orList(states)}, got "${values.state}"`);
    }
    filter.state = values.state as JobState;
  }
  if (values.queue !== undefined) filter.queue = queueArg(values.queue, "--queue");
  if (values.since !== undefined) filter.since = sinceFlag(values.since);
  if (values.flow !== undefined) filter.flow = flowArg(values.flow);
  return Object.keys(filter).length > 1 ? filter : null;
}

/** `--flow`: a flow id, which is a job id. */
function flowArg(text: string): string {
  try {
    return normalizeId(text);
  } catch {
    throw new UsageError(
      `--flow must be a flow id (the job id of the flow's first step), got "${text}"`,
    );
  }
}

function orList(items: readonly string[]): string {
  return items.length === 1 ? items[0] : `one of ${items.join(", ")}`;
}

const SINCE_DURATION = /^(\d{1,9})([smhd])$/;
const SINCE_TIME =
  /^\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?)?$/;
const UNIT_MS: Record<string, number> = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * `--since`: a whole number of seconds, minutes, hours or days back from now (`15m`), or
 * an ISO 8601 date or time (`2026-12-01`, `2026-12-01T09:30`, with seconds, fractions and
 * an offset optional; without an offset it is UTC).
 */
function sinceFlag(text: string): Date {
  const duration = SINCE_DURATION.exec(text);
  if (duration) {
    const date = new Date(Date.now() - Number(duration[1]) * UNIT_MS[duration[2]]);
    if (!Number.isNaN(date.getTime())) return date; // else: before the first representable date
  }
  const time = SINCE_TIME.exec(text);
  if (time) {
    // A date alone is UTC midnight for Date too; a time without an offset would be local.
    const date = new Date(text.includes("T") && time[1] === undefined ? `${text}Z` : text);
    if (!Number.isNaN(date.getTime())) return date;
  }
  throw new UsageError(
    `--since must be a duration such as 30s, 15m, 2h or 3d, or an ISO 8601 time such as ` +
      `2026-12-01T09:30Z, got "${text}"`,
  );
}

async function listCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    ...FILTER_FLAGS,
    limit: { type: "string" },
    newest: { type: "boolean" },
    json: { type: "boolean" },
  }, {
    help: LIST_HELP,
    positionals: [],
    usage: "akadze jobs list [--task T] [--state S] [--queue Q] [--since WHEN] [--flow ID] " +
      "[--limit N] [--newest]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const filter = filterFlags(values, JOB_STATES, schema) ?? { schema };
  const limit = values.limit === undefined
    ? 50
    : integerFlag("--limit", values.limit, 1, LIST_JOBS_MAX);
  const jobs = await withSql((sql) =>
    listJobs(sql, { ...filter, limit, order: values.newest ? "newest" : "queue" })
  );
  if (values.json) printJson(jobs.map(summaryJson));
  else printTable(LIST_COLUMNS, jobs);
  return 0;
}

async function showCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    args: { type: "boolean" },
    result: { type: "boolean" },
    json: { type: "boolean" },
  }, {
    help: SHOW_HELP,
    positionals: ["ID"],
    usage: "akadze jobs show ID",
  });
  if (!parsed) return 0;
  const { values, positionals: [rawId], schema } = parsed;
  const id = jobIdArg(rawId);
  // The arguments are always read: without --args, their values are hidden in the errors
  // too (an error stored by an older akadze, or by a task, may quote them).
  const job = await withSql((sql) =>
    getJob(sql, id, { schema, includeArgs: true, includeResult: values.result, includeFlow: true })
  );
  if (!job) throw new Error(`job ${id} not found`);
  if (!values.args) {
    const secrets = runSecrets([], job.args);
    job.errors = job.errors.map((e) => ({
      ...e,
      error: redact(String(e.error), secrets),
      message: redact(String(e.message), secrets),
      ...(typeof e.stack === "string" ? { stack: redact(e.stack, secrets) } : {}),
    }));
  }
  if (values.json) {
    printJson(detailJson(job, !!values.args, !!values.result));
    return 0;
  }
  printRecord([
    ...Object.entries(summaryJson(job)),
    ["snoozes", job.snoozes],
    ["progress", job.progress === null ? null : safeJson(job.progress)],
    ["errors", job.errors.length],
  ]);
  for (const e of job.errors) {
    console.log(safeText(`error: ${oneLine(`${e.at} ${e.error}: ${e.message}`)}`));
    if (typeof e.stack !== "string") continue;
    for (const frame of e.stack.split("\n")) {
      if (frame.trim() !== "") console.log(safeText(`  ${oneLine(frame)}`));
    }
  }
  if (job.flow) { for (const line of flowLines(job.flowId!, job.flow, job.id)) console.log(line); }
  if (values.args) console.log(`args: ${safeJson(job.args ?? null)}`);
  if (values.result) console.log(`result: ${safeJson(job.result ?? null)}`);
  return 0;
}

/**
 * A flow as lines of text: a header with the count of steps per state, then each step once,
 * indented under the step of the flow it waits for (the one that comes last, when it waits
 * for several, with "after:" naming them all), in dependency order otherwise.
 */
function flowLines(
  flowId: string,
  steps: readonly FlowStepSummary[],
  shown: string,
): string[] {
  const byId = new Map(steps.map((s) => [s.id, s]));
  const rank = new Map(steps.map((s, i) => [s.id, i]));
  const name = (id: string) => {
    const step = byId.get(id);
    return step?.step != null ? step.step : `job ${id}`;
  };
  const children = new Map<string, FlowStepSummary[]>();
  const roots: FlowStepSummary[] = [];
  for (const step of steps) {
    const parents = step.dependsOn.filter((d) => rank.has(d.id));
    if (parents.length === 0) {
      roots.push(step);
      continue;
    }
    const last = parents.reduce((a, b) => rank.get(b.id)! > rank.get(a.id)! ? b : a);
    children.set(last.id, [...children.get(last.id) ?? [], step]);
  }
  const counts = JOB_STATES.map((state) => [state, steps.filter((s) => s.state === state).length])
    .filter(([, n]) => n !== 0).map(([state, n]) => `${n} ${state}`);
  const lines = [`flow: ${flowId} (${steps.length} steps: ${counts.join(", ")})`];
  const visit = (step: FlowStepSummary, depth: number) => {
    if (lines.length > FLOW_LINES_MAX) return;
    const after = step.dependsOn.length > 1 || step.dependsOn.some((d) => !rank.has(d.id))
      ? `  after: ${step.dependsOn.map((d) => name(d.id)).join(", ")}`
      : "";
    const mark = step.id === shown ? "  (this job)" : "";
    lines.push(safeText(
      `${"  ".repeat(depth + 1)}${oneLine(name(step.id))}  job ${step.id}  ${step.task}  ` +
        `${step.state}${after}${mark}`,
    ));
    for (const child of children.get(step.id) ?? []) visit(child, depth + 1);
  };
  for (const root of roots) visit(root, 0);
  if (lines.length > FLOW_LINES_MAX + 1) {
    lines.length = FLOW_LINES_MAX + 1;
    lines.push(
      `  ... ${steps.length - FLOW_LINES_MAX} more steps: akadze jobs list --flow ${flowId}`,
    );
  }
  return lines;
}

function detailJson(job: JobDetail, args: boolean, result: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = {
    ...summaryJson(job),
    snoozes: job.snoozes,
    progress: job.progress,
    errors: job.errors.map((e) => ({
      error: e.error,
      message: e.message,
      at: e.at,
      ...(typeof e.stack === "string" ? { stack: e.stack } : {}),
    })),
  };
  if (args) out.args = job.args ?? null;
  if (result) out.result = job.result ?? null;
  if (job.flow) {
    out.flow = job.flow.map((s) => ({ ...s, finishedAt: isoTime(s.finishedAt) }));
  }
  return out;
}

/**
 * Parse requeue or cancel: exactly one of ID or filters (a bulk change without any filter
 * is refused, so a mistyped command cannot touch every job).
 */
function targetArgs(
  args: string[],
  command: "requeue" | "cancel",
  help: string,
  states: readonly string[],
): { id: string; schema: string } | { filter: JobFilter; dryRun: boolean } | null {
  const usage = `akadze jobs ${command} ID | akadze jobs ${command} [filters] [--dry-run]`;
  const parsed = parseSubcommand(args, { ...FILTER_FLAGS, "dry-run": { type: "boolean" } }, {
    help,
    positionals: ["ID"],
    usage,
    optionalPositionals: true,
  });
  if (parsed === null) return null;
  const { values, positionals, schema } = parsed;
  const filter = filterFlags(values, states, schema);
  if (positionals.length > 0 && filter !== null) {
    throw new UsageError(`give a job ID or filters, not both: ${usage}`);
  }
  if (positionals.length > 0) {
    if (values["dry-run"]) throw new UsageError(`--dry-run goes with filters: ${usage}`);
    return { id: jobIdArg(positionals[0]), schema };
  }
  if (filter === null) {
    throw new UsageError(
      `missing ID or a filter (--task, --state, --queue, --since or --flow): ${usage}`,
    );
  }
  return { filter, dryRun: !!values["dry-run"] };
}

async function requeueCommand(args: string[]): Promise<number> {
  const target = targetArgs(args, "requeue", REQUEUE_HELP, ["failed"]);
  if (!target) return 0;
  if ("id" in target) {
    const { id, schema } = target;
    await withSql((sql) => requeue(sql, id, { schema }));
    console.log(`requeued job ${id}`);
    return 0;
  }
  const { requeued, skipped } = await withSql((sql) =>
    requeueJobs(sql, target.filter, { dryRun: target.dryRun })
  );
  console.log(`${target.dryRun ? "would requeue" : "requeued"} ${jobs(requeued)}`);
  for (const id of skipped) {
    console.log(
      `${target.dryRun ? "would skip" : "skipped"} job ${id}: another job with its ` +
        "uniqueKey is queued or running",
    );
  }
  return 0;
}

async function cancelCommand(args: string[]): Promise<number> {
  const target = targetArgs(args, "cancel", CANCEL_HELP, ACTIVE_STATES);
  if (!target) return 0;
  if ("filter" in target) {
    const n = await withSql((sql) => cancelJobs(sql, target.filter, { dryRun: target.dryRun }));
    console.log(
      target.dryRun
        ? `would request the cancellation of ${jobs(n)}`
        : `cancel requested for ${jobs(n)}`,
    );
    return 0;
  }
  const { id, schema } = target;
  const line = await withSql(async (sql) => {
    if (await requestCancel(sql, id, { schema })) return `cancel requested for job ${id}`;
    const job = await getJob(sql, id, { schema });
    return job
      ? `nothing cancelled: job ${id} is ${job.state}`
      : `nothing cancelled: job ${id} not found`;
  });
  console.log(line);
  return 0;
}

function jobs(n: number): string {
  return `${n} job${n === 1 ? "" : "s"}`;
}

function oneLine(text: string): string {
  return String(text).replace(/\s+/g, " ").trim();
}
