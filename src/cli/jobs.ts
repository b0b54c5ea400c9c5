/**
 * `akadze jobs list|show|requeue|cancel`.
 *
 * @module
 */
import {
  getJob,
  type JobDetail,
  type JobSummary,
  listJobs,
  requestCancel,
  requeue,
} from "../admin.ts";
import type { JobState } from "../job.ts";
import { redact } from "../db.ts";
import { runSecrets } from "../worker/error_entry.ts";
import { UsageError } from "./common.ts";
import {
  DATABASE_FOOTER,
  dispatch,
  integerFlag,
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

const STATES: readonly JobState[] = ["queued", "running", "succeeded", "failed", "cancelled"];

/** Help text of `akadze jobs`. */
export const JOBS_HELP = `Usage: akadze jobs <command> [options]

Commands:
  list [--queue Q] [--state S] [--limit N] [--json]
                       job summaries in claim order (priority, run_at, id)
  show ID [--args] [--result] [--json]
                       one job with its error history
  requeue ID           put a failed job back to queued (one more attempt)
  cancel ID            request the cancellation of a queued or running job

Run akadze jobs <command> --help for a command's options.`;

const LIST_HELP = `Usage: akadze jobs list [--queue Q] [--state S] [--limit N] [--json]

Job summaries (no arguments, result or errors) in claim order: priority (higher first),
then run_at, then id.

Options:
  --queue Q       only this queue
  --state S       only this state: ${STATES.join(", ")}
  --limit N       at most N jobs, 1 to 1000 (default 50)
  --json          a JSON array of objects with the keys id, task, queue, state, priority,
                  attempt, maxAttempts, runCount, runAt, createdAt, startedAt, finishedAt,
                  workerId, uniqueKey, limitKey, expiresAt, cancelRequested
${SCHEMA_OPTION}
  -h, --help      show this help

Output: a header line, then one line per job; columns separated by a tab:
  ID QUEUE TASK STATE PRIORITY ATTEMPT MAX_ATTEMPTS RUN_AT STARTED_AT FINISHED_AT WORKER_ID
"-" stands for none; times are ISO 8601 in UTC.

${DATABASE_FOOTER}`;

const SHOW_HELP = `Usage: akadze jobs show ID [--args] [--result] [--json]

One job with its error history (oldest first). Arguments and result are printed only
when asked for; without --args, argument values quoted in the errors show as ***.

Options:
  --args          include the arguments
  --result        include the result
  --json          a JSON object: the keys of jobs list --json plus snoozes, errors
                  ([{error, message, at}]), and args / result when asked for
${SCHEMA_OPTION}
  -h, --help      show this help

Output: "key: value" lines (id, task, queue, state, priority, attempt, maxAttempts,
runCount, runAt, createdAt, startedAt, finishedAt, workerId, uniqueKey, limitKey,
expiresAt, cancelRequested, snoozes, errors: COUNT), then "error: AT NAME: MESSAGE" per
error, then "args: JSON" and "result: JSON" when asked for. "-" stands for none; times
are ISO 8601 in UTC.

Exit codes: 0 shown, 1 job not found or database failure, 2 usage error.`;

const REQUEUE_HELP = `Usage: akadze jobs requeue ID

Put a failed job back to queued. It keeps its attempt count, errors and arguments; its
attempt budget is raised by one when it was spent. Prints "requeued job ID".

Options:
${SCHEMA_OPTION}
  -h, --help      show this help

Exit codes: 0 requeued; 1 the job is unknown or not failed, another job with its
uniqueKey is queued or running (DuplicateJob), or a database failure; 2 usage error.`;

const CANCEL_HELP = `Usage: akadze jobs cancel ID

Request the cancellation of a queued or running job: a queued job is cancelled by the
next claim pass, a running one is stopped by its worker and ends cancelled. Prints
"cancel requested for job ID". For a job that is already finished or does not exist
nothing changes: it prints "nothing cancelled: job ID is STATE" or "nothing cancelled:
job ID not found" and still exits 0 (cancelling is idempotent).

Options:
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
  };
}

async function listCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    queue: { type: "string" },
    state: { type: "string" },
    limit: { type: "string" },
    json: { type: "boolean" },
  }, {
    help: LIST_HELP,
    positionals: [],
    usage: "akadze jobs list [--queue Q] [--state S] [--limit N]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const queue = values.queue === undefined ? undefined : queueArg(values.queue, "--queue");
  let state: JobState | undefined;
  if (values.state !== undefined) {
    if (!(STATES as readonly string[]).includes(values.state)) {
      throw new UsageError(`--state must be one of ${STATES.join(", ")}, got "${values.state}"`);
    }
    state = values.state as JobState;
  }
  const limit = values.limit === undefined ? 50 : integerFlag("--limit", values.limit, 1, 1000);
  const jobs = await withSql((sql) => listJobs(sql, { queue, state, limit, schema }));
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
    getJob(sql, id, { schema, includeArgs: true, includeResult: values.result })
  );
  if (!job) throw new Error(`job ${id} not found`);
  if (!values.args) {
    const secrets = runSecrets([], job.args);
    job.errors = job.errors.map((e) => ({
      ...e,
      error: redact(String(e.error), secrets),
      message: redact(String(e.message), secrets),
    }));
  }
  if (values.json) {
    printJson(detailJson(job, !!values.args, !!values.result));
    return 0;
  }
  printRecord([
    ...Object.entries(summaryJson(job)),
    ["snoozes", job.snoozes],
    ["errors", job.errors.length],
  ]);
  for (const e of job.errors) {
    console.log(safeText(`error: ${oneLine(`${e.at} ${e.error}: ${e.message}`)}`));
  }
  if (values.args) console.log(`args: ${safeJson(job.args ?? null)}`);
  if (values.result) console.log(`result: ${safeJson(job.result ?? null)}`);
  return 0;
}

function detailJson(job: JobDetail, args: boolean, result: boolean): Record<string, unknown> {
  const out: Record<string, unknown> = {
    ...summaryJson(job),
    snoozes: job.snoozes,
    errors: job.errors.map((e) => ({ error: e.error, message: e.message, at: e.at })),
  };
  if (args) out.args = job.args ?? null;
  if (result) out.result = job.result ?? null;
  return out;
}

async function requeueCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {}, {
    help: REQUEUE_HELP,
    positionals: ["ID"],
    usage: "akadze jobs requeue ID",
  });
  if (!parsed) return 0;
  const { positionals: [rawId], schema } = parsed;
  const id = jobIdArg(rawId);
  await withSql((sql) => requeue(sql, id, { schema }));
  console.log(`requeued job ${id}`);
  return 0;
}

async function cancelCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {}, {
    help: CANCEL_HELP,
    positionals: ["ID"],
    usage: "akadze jobs cancel ID",
  });
  if (!parsed) return 0;
  const { positionals: [rawId], schema } = parsed;
  const id = jobIdArg(rawId);
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

function oneLine(text: string): string {
  return String(text).replace(/\s+/g, " ").trim();
}
