/**
 * Every log record the worker and its services write: event names, messages and fields in
 * one place, so the wording stays consistent and documented event names cannot drift.
 * Categories: `["akadze", "worker"]`, and `["akadze", "schedule"]` for the scheduler. A
 * record never carries task arguments, results or database passwords.
 *
 * @module
 */
import type { SpanContext } from "@opentelemetry/api";
import { describeError } from "../db.ts";
import { CONNECTIONS_END_HINT } from "../driver_guard.ts";
import { attemptNumber } from "../job.ts";
import { logger } from "../log.ts";
import { inRunSpanContext } from "../tracing.ts";
import type { Outcome } from "./completer.ts";
import type { WrittenRow } from "./completer.ts";
import type { JobRow } from "./job_row.ts";
import type { Stray } from "./process_guard.ts";
import type { SessionReport } from "./session_settings.ts";

const log = logger("worker");
const scheduleLog = logger("schedule");

/** What the log lines of a job's run say about it (absent for an orphan release). */
export interface LoggedJob {
  /** Task name. */
  task: string;
  /** Queue. */
  queue: string;
  /** Attempts spent before this run (the column's count; logged 1-based). */
  attempt: number;
  /** The attempt budget. */
  max_attempts: number;
  /**
   * The run's span (tracing on): the record of its outcome carries its `traceId` and
   * `spanId`, and is written with it active.
   */
  span?: SpanContext;
}

/** How a run ended, as `worker_stopped` reports it. */
export interface StopRecord {
  /** 0 or 1. */
  code: 0 | 1;
  /** What ended the run. */
  reason: string;
  /** What went wrong (credential-free). */
  message?: string;
}

/** Whether debug records are written (so loops over rows can be skipped). */
export function debugEnabled(): boolean {
  return log.isEnabledFor("debug");
}

/** `worker_started`. */
export function logStarted(workerId: string, queues: readonly string[], slots: number): void {
  log.info("worker {workerId} started on {queues}", {
    event: "worker_started",
    workerId,
    queues: queues.join(","),
    slots,
  });
}

/** `worker_stopped` (info for code 0, error for code 1). */
export function logStopped(workerId: string, exit: StopRecord): void {
  const level = exit.code === 0 ? "info" : "error";
  log[level](`worker {workerId} stopped: {reason}${exit.message ? ": {message}" : ""}`, {
    event: "worker_stopped",
    workerId,
    reason: exit.reason,
    code: exit.code,
    ...(exit.message ? { message: exit.message } : {}),
  });
}

/**
 * `db_error_transient` for a database driver error the process guard ignored (the driver's
 * write on a closed connection is reported by the pools' own guard, driver_guard.ts).
 */
export function logDriverError(error: unknown): void {
  const message = describeError(error);
  log.warn(
    "a database connection broke while the driver was using it ({message}); the worker goes " +
      `on, reopens the connection and retries what it was doing. ${CONNECTIONS_END_HINT}`,
    { event: "db_error_transient", message },
  );
}

/** `db_error_transient` for a failed loop pass, retried after `delay` ms. */
export function logLoopRetry(delay: number, error: unknown): void {
  log.warn("database error, retrying in {delay} ms: {message}", {
    event: "db_error_transient",
    delay,
    message: describeError(error),
  });
}

/**
 * `loop_connection_replaced`: a statement of the worker loop had no answer after
 * `waitedMs`; its connection was replaced, so the statement fails and the loop goes on.
 */
export function logLoopConnectionReplaced(workerId: string, waitedMs: number): void {
  log.warn(
    "a statement of worker {workerId} got no answer in {waitedMs} ms; its connection was " +
      "replaced and the loop goes on",
    { event: "loop_connection_replaced", workerId, waitedMs },
  );
}

/** `loop_left_on_stop`: a stop's bound passed while a statement of the loop got no answer. */
export function logLoopLeftOnStop(workerId: string, shutdownTimeoutMs: number): void {
  log.warn(
    "worker {workerId} is stopping: a statement of its loop got no answer within the " +
      "shutdown timeout ({shutdownTimeoutMs} ms), so it is left and the jobs are put back",
    { event: "loop_left_on_stop", workerId, shutdownTimeoutMs },
  );
}

/** `db_error_transient` for a failed outcome write, retried after `delay` ms. */
export function logOutcomeRetry(delay: number, error: unknown): void {
  log.warn("outcome write failed, retrying in {delay} ms: {message}", {
    event: "db_error_transient",
    delay,
    message: describeError(error),
  });
}

/** A task's error that reached the process level: its class and job, never its text. */
export function logStray(workerId: string, stray: Stray): void {
  const where = stray.job ? "job {jobId} (task {task}): " : "";
  const what = stray.kind === "unhandled_rejection"
    ? "a promise was rejected and nothing handled it ({error}); the worker goes on. " +
      "Await or catch every promise a task starts"
    : "an error was thrown where nothing could catch it ({error}), e.g. in a timer " +
      "callback; the worker goes on. Catch errors inside the callbacks a task schedules";
  log.error(where + what, {
    event: stray.kind,
    workerId,
    error: stray.error,
    ...(stray.code ? { code: stray.code } : {}),
    ...(stray.job ? { jobId: stray.job.id, task: stray.job.task } : {}),
  });
}

/** `job_claimed` (debug). */
export function logClaimed(row: JobRow): void {
  log.debug("job {jobId} claimed", {
    event: "job_claimed",
    jobId: row.id,
    task: row.task,
    queue: row.queue,
    attempt: attemptNumber(row.attempt, "running"),
    runCount: row.run_count,
  });
}

/**
 * `error_after_outcome`: a handler threw after its run's outcome was written (completeTx,
 * waitForChildren); the error is ignored.
 */
export function logErrorAfterOutcome(
  job: { id: string; task: string },
  error: { error: string; message: string },
): void {
  log.warn(
    "job {jobId} ({task}): the handler threw {error} after its outcome was written " +
      "(completeTx or waitForChildren); the error changes nothing: {message}",
    {
      event: "error_after_outcome",
      jobId: job.id,
      task: job.task,
      error: error.error,
      message: error.message,
    },
  );
}

/** `task_after_worker`: the app registered a task after the worker was made. */
export function logTaskAfterWorker(workerId: string, task: string): void {
  log.warn(
    "task {task} was registered after worker {workerId} was made: this worker does not run " +
      "its jobs; register every task before creating the Worker",
    { event: "task_after_worker", workerId, task },
  );
}

/** `job_cancel_requested`: a running job's cancel request reached this worker. */
export function logCancelRequested(jobId: string): void {
  log.info("job {jobId} cancel requested while running", {
    event: "job_cancel_requested",
    jobId,
  });
}

/** `job_rescued`: a lost worker's job was put back (queued or failed). */
export function logRescued(row: JobRow): void {
  log.warn("job {jobId} rescued from a lost worker", {
    event: "job_rescued",
    jobId: row.id,
    task: row.task,
    queue: row.queue,
    attempt: attemptNumber(row.attempt, row.state),
    state: row.state,
  });
}

/**
 * `handler_exit`: a handler called `Deno.exit`; the worker puts its jobs back, then the
 * process exits with that code.
 */
export function logHandlerExit(workerId: string, jobId: string, code: number): void {
  log.error(
    "job {jobId}'s handler called Deno.exit({code}): worker {workerId} charges that job an " +
      "attempt, puts its other jobs back without spending theirs, and exits",
    { event: "handler_exit", workerId, jobId, code },
  );
}

/**
 * `previous_process_settled`: the jobs a dead worker process left running were settled as
 * this worker started (each logged `job_rescued`).
 */
export function logPreviousSettled(workerId: string, previousId: string, jobs: number): void {
  log.warn("worker {workerId} settled {jobs} job(s) left running by worker {previousId}", {
    event: "previous_process_settled",
    workerId,
    previousId,
    jobs,
  });
}

/** A job that ran in the worker, by its claim. */
export interface RunRef {
  /** Job id. */
  id: string;
  /** The claim's run_count (the fence of every write). */
  runCount: number;
  /** Its task. */
  task: string;
}

/** One block of the event loop. */
export interface LoopBlock {
  /** The job whose handler blocked the loop, when it is known. */
  culprit: RunRef | null;
  /** How long the loop was held (ms). */
  ms: number;
  /**
   * The other jobs of the worker at the time (claimed, running or waiting for a write) whose
   * handlers run on its loop; without a culprit, each of them may have blocked it.
   */
  bystanders: RunRef[];
  /** The sandboxed jobs of the worker at the time: their handlers run off the loop. */
  outside: RunRef[];
}

/**
 * `loop_blocked` (warning): a handler held the worker's event loop (no beat, no other run,
 * no write meanwhile); `lease` says whether that was long enough for other workers to
 * rescue this worker's jobs.
 */
export function logLoopBlocked(block: LoopBlock, heartbeatTtl: number): void {
  const { culprit, ms } = block;
  const seconds = blockSeconds(ms);
  const lease = ms >= heartbeatTtl;
  const tail = lease
    ? "longer than heartbeatTtl: other workers may have rescued its jobs; run CPU-bound work outside the worker's loop"
    : "no heartbeat, run or write could happen meanwhile";
  const props = {
    event: "loop_blocked",
    blockedMs: Math.round(ms),
    seconds,
    heartbeatTtl,
    lease,
    running: block.bystanders.length + block.outside.length + (culprit ? 1 : 0),
  };
  if (culprit) {
    log.warn(`job {jobId} ({task}) blocked the event loop for {seconds} s: ${tail}`, {
      ...props,
      jobId: culprit.id,
      task: culprit.task,
    });
  } else {
    log.warn(`the event loop was blocked for {seconds} s while {running} jobs ran: ${tail}`, {
      ...props,
      jobIds: [...block.bystanders, ...block.outside].map((job) => job.id).join(","),
    });
  }
}

/** `block_charge_failed`: what a loop block cost could not be written down (left as rescued). */
export function logBlockChargeFailed(error: unknown): void {
  log.warn("could not record what the blocked event loop cost its jobs: {message}", {
    event: "block_charge_failed",
    message: describeError(error),
  });
}

/** A block's length in seconds, as the log and the stored errors say it (one decimal). */
export function blockSeconds(ms: number): number {
  return Math.round(ms / 100) / 10;
}

/** `orphan_released`: a job the database says this worker runs, but it does not. */
export function logOrphanReleased(jobId: string, runCount: number): void {
  log.warn("job {jobId} is running under this worker but not in it; releasing it", {
    event: "orphan_released",
    jobId,
    runCount,
  });
}

/** Whether info records are written (a written outcome is then logged). */
export function infoEnabled(): boolean {
  return log.isEnabledFor("info");
}

/**
 * A job's new state after a transition from `from`: `job_succeeded`, `job_failed`,
 * `job_cancelled`, `job_snoozed`, `job_released` or `job_retrying`.
 */
export function logJobState(
  row: WrittenRow & { task?: string; queue?: string },
  from: string,
  outcome?: Outcome,
  job?: LoggedJob,
): void {
  const props: JobStateProps = {
    jobId: row.id,
    task: row.task ?? job?.task,
    queue: row.queue ?? job?.queue,
    // The attempt's number, 1-based (1 for a first run that failed or succeeded).
    attempt: attemptNumber(row.attempt ?? job?.attempt ?? 0, row.state),
    from,
  };
  const span = job?.span;
  if (span === undefined) return writeJobState(row, props, outcome, job);
  // The run's ids, in the record and in what Deno exports of it (OTEL_DENO=true).
  props.traceId = span.traceId;
  props.spanId = span.spanId;
  inRunSpanContext(span, () => writeJobState(row, props, outcome, job));
}

/** The properties of every job state record. */
interface JobStateProps {
  jobId: string;
  task: string | undefined;
  queue: string | undefined;
  attempt: number;
  from: string;
  traceId?: string;
  spanId?: string;
}

/** Write the record of `row`'s new state (see {@linkcode logJobState}). */
function writeJobState(
  row: WrittenRow,
  props: JobStateProps,
  outcome: Outcome | undefined,
  job: LoggedJob | undefined,
): void {
  switch (row.state) {
    case "succeeded":
      return log.info("job {jobId} succeeded", { event: "job_succeeded", ...props });
    case "failed":
      return log.warn(`job {jobId} ({task}) failed on ${FAILED_RUN}`, {
        event: "job_failed",
        ...props,
        ...failedRun(outcome, job),
      });
    case "cancelled":
      return log.info("job {jobId} cancelled", { event: "job_cancelled", ...props });
    case "queued": {
      const event = outcome?.kind === "snooze"
        ? "job_snoozed"
        : outcome?.kind === "release"
        ? "job_released"
        : "job_retrying";
      const runAt = row.runAt === undefined ? undefined : new Date(row.runAt).toISOString();
      if (event === "job_retrying") {
        return log.info(`job {jobId} ({task}) failed on ${FAILED_RUN}; retrying at {runAt}`, {
          event,
          ...props,
          ...failedRun(outcome, job),
          runAt,
        });
      }
      return log.info(`job {jobId} ${event.slice(4)}`, { event, ...props, runAt });
    }
  }
}

/** `outcome_not_storable`: the database refused the outcome's values; the job ends. */
export function logOutcomeNotStorable(outcome: Outcome, error: unknown): void {
  log.warn("the outcome of job {jobId} cannot be stored; ending the job: {message}", {
    event: "outcome_not_storable",
    jobId: outcome.id,
    kind: outcome.kind,
    message: describeError(error),
  });
}

/** `outcome_write_failed`: an outcome could not be written; the lease puts the job back. */
export function logOutcomeWriteFailed(outcome: Outcome, error: unknown): void {
  log.error("could not write the outcome of job {jobId}: {message}", {
    event: "outcome_write_failed",
    jobId: outcome.id,
    message: describeError(error),
  });
}

/** `progress_write_failed`: a run's progress could not be written (the run goes on). */
export function logProgressWriteFailed(jobId: string, error: unknown): void {
  log.warn("could not write the progress of job {jobId}: {message}", {
    event: "progress_write_failed",
    jobId,
    message: describeError(error),
  });
}

/**
 * `trace_contexts_failed`: the trace contexts of claimed jobs could not be read (tracing is
 * on); their runs start traces of their own.
 */
export function logTraceContextsFailed(error: unknown): void {
  log.warn(
    "could not read the trace context of claimed jobs, their runs start new traces: {message}",
    {
      event: "trace_contexts_failed",
      message: describeError(error),
    },
  );
}

/** `outcome_discarded`: the run no longer owns the job. */
export function logOutcomeDiscarded(outcome: Outcome): void {
  log.warn("outcome of job {jobId} discarded: the run no longer owns the job", {
    event: "outcome_discarded",
    jobId: outcome.id,
    runCount: outcome.runCount,
    kind: outcome.kind,
  });
}

/** `transition_rolled_back`: an onTransition hook failed; the outcome is written again. */
export function logTransitionRolledBack(jobId: string, error: unknown): void {
  log.warn("onTransition hook failed for job {jobId}; retrying: {message}", {
    event: "transition_rolled_back",
    jobId,
    message: describeError(error),
  });
}

/** `pruned` (debug), when the pass deleted anything. */
export function logPruned(pruned: { jobs: number; periodicRuns: number; limitStarts: number }) {
  if (pruned.jobs + pruned.periodicRuns + pruned.limitStarts > 0) {
    log.debug("pruned {jobs} jobs", { event: "pruned", ...pruned });
  }
}

/** `prune_failed`: the next prune comes an interval later. */
export function logPruneFailed(error: unknown): void {
  log.warn("prune failed: {message}", { event: "prune_failed", message: describeError(error) });
}

/** `worker_registered` (debug): the first successful beat inserted the worker row. */
export function logRegistered(workerId: string): void {
  log.debug("worker {workerId} registered", { event: "worker_registered", workerId });
}

/**
 * `session_settings`: the database's session defaults differ from what the worker's own
 * statements need; its loop's connection sets them for itself.
 */
export function logSessionSettings(
  workerId: string,
  session: SessionReport,
  settings: Record<string, string>,
): void {
  log.info(
    "worker {workerId} opens its own connection with {settings}: the database's defaults " +
      "(isolation {isolation}, DateStyle {dateStyle}, extra_float_digits {floatDigits}) would " +
      "make claims fail against each other or misread times; your sessions keep them",
    { event: "session_settings", workerId, settings, ...session },
  );
}

/**
 * `session_setting_refused`: a connection pooler refused a setting on the worker's own
 * connection; the worker goes on without it.
 */
export function logSessionSettingRefused(workerId: string, name: string): void {
  log.warn(
    "the connection pooler refused the setting {name} on worker {workerId}'s own connection; " +
      "the worker goes on without it. Set it for the workers' role instead (ALTER ROLE … SET " +
      "{name} = …; see the production guide)",
    { event: "session_setting_refused", workerId, name },
  );
}

/**
 * `database_server_changed`: the heartbeat reached another server, or the same one
 * restarted, without the worker seeing an error (the driver reconnected on its own).
 */
export function logServerChanged(workerId: string, address: string, was: string): void {
  const what = address === was
    ? "the database server at {address} restarted"
    : "the worker now reaches the database server at {address} (it was {was}): a failover";
  log.warn(`${what}; jobs go on`, {
    event: "database_server_changed",
    workerId,
    address,
    was,
  });
}

/** `heartbeat_failed`. */
export function logHeartbeatFailed(workerId: string, error: unknown): void {
  log.warn("heartbeat failed: {message}", {
    event: "heartbeat_failed",
    workerId,
    message: describeError(error),
  });
}

/** `heartbeat_file_failed`. */
export function logHeartbeatFileFailed(error: unknown): void {
  log.warn("could not touch the heartbeat file: {message}", {
    event: "heartbeat_file_failed",
    message: describeError(error),
  });
}

/** `listen_failed`: the worker polls until LISTEN works. */
export function logListenFailed(workerId: string, pollInterval: number, error: unknown): void {
  log.warn(
    "could not LISTEN for new jobs, finding them by polling every {pollInterval} ms " +
      "until it works: {message}",
    { event: "listen_failed", workerId, pollInterval, message: describeError(error) },
  );
}

/** `listen_started`: LISTEN works again after `listen_failed`. */
export function logListenStarted(workerId: string): void {
  log.info("listening for new jobs again", { event: "listen_started", workerId });
}

/** `listen_probed` (debug): a probe notification arrived. */
export function logListenProbed(workerId: string): void {
  log.debug("notifications reach this worker", { event: "listen_probed", workerId });
}

/** `listen_unavailable`: notifications do not arrive; the worker only polls. */
export function logListenUnavailable(
  workerId: string,
  pollInterval: number,
  viaListenUrl: boolean,
): void {
  const via = !viaListenUrl
    ? "LISTEN does not work through a connection pooler in transaction mode (such as " +
      "PgBouncer). Give the worker a direct connection to PostgreSQL for LISTEN (the app " +
      "option listenUrl, or AKADZE_LISTEN_URL), or set notify: false to silence this"
    : "check that listenUrl (AKADZE_LISTEN_URL) reaches the same PostgreSQL database " +
      "directly, not through a pooler in transaction mode";
  log.warn(
    "notifications do not reach this worker: it finds new jobs only by polling every " +
      `{pollInterval} ms, and notices cancel requests at its heartbeat. ${via}`,
    { event: "listen_unavailable", workerId, pollInterval },
  );
}

/** `metrics_listening`. */
export function logMetricsListening(host: string, port: number): void {
  log.info("metrics served at http://{host}:{port}/metrics", {
    event: "metrics_listening",
    host,
    port,
  });
}

/** `metrics_queue_state_failed`: a scrape served the worker's own series only. */
export function logMetricsQueueStateFailed(error: unknown): void {
  log.warn("metrics: could not read the queue state: {message}", {
    event: "metrics_queue_state_failed",
    message: describeError(error),
  });
}

/** `schedule_failed` (category schedule). */
export function logScheduleFailed(schedule: string, fireAt: Date, error: unknown): void {
  scheduleLog.error("schedule {schedule} failed to fire: {message}", {
    event: "schedule_failed",
    schedule,
    fireAt: fireAt.toISOString(),
    message: describeError(error),
  });
}

/** `schedule_fired` (category schedule). */
export function logScheduleFired(schedule: string, fireAt: Date, jobId: string): void {
  scheduleLog.info("schedule {schedule} fired job {jobId}", {
    event: "schedule_fired",
    jobId,
    schedule,
    fireAt: fireAt.toISOString(),
  });
}

/** `schedule_skipped` (category schedule): overlap false, the previous run still active. */
export function logScheduleSkipped(schedule: string, fireAt: Date): void {
  scheduleLog.info("schedule {schedule} skipped: its previous run is still active", {
    event: "schedule_skipped",
    schedule,
    fireAt: fireAt.toISOString(),
  });
}

/** A failed run in a log line: its attempt, how long it ran and its stored error. */
const FAILED_RUN = "attempt {attempt}/{maxAttempts} after {durationMs} ms: {error}: {message}";

/**
 * A failed run's log properties: the attempt budget, how long it ran and its stored
 * error entry (name and message, already redacted: never the raw error, which may quote
 * arguments). The stack stays in the database (`akadze jobs show`).
 */
function failedRun(
  outcome: Outcome | undefined,
  job: { max_attempts: number } | undefined,
): { maxAttempts?: number; durationMs?: number; error: string; message: string } {
  return {
    maxAttempts: job?.max_attempts,
    durationMs: outcome?.durationMs,
    error: outcome?.error?.error ?? "Error",
    message: outcome?.error?.message ?? "no error was recorded",
  };
}
