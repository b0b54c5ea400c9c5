/**
 * Operating jobs from code: list and show them, requeue failed ones, request cancellations.
 * Writes take a `session` (a postgres.js instance or the caller's transaction) and run in
 * it; reads take the app or a postgres.js instance and never change anything. Admin writes
 * do not run the app's hooks.
 *
 * @module
 */
import {
  atomically,
  cancelChannel,
  explainMissingSchema,
  jobsChannel,
  quoteSchema,
  type Sql,
  type TransactionSql,
} from "../db.ts";
import { AkadzeError, DuplicateJob } from "../errors.ts";
import { ACTIVE_STATES, attemptNumber, JOB_STATES, type JobState, stateList } from "../job.ts";
import { type FieldsOf, fieldsOf, type Same, selectList } from "../job_columns.ts";
import { checkQueueName, isIntegerIn, LIST_JOBS_MAX, TASK_NAME_MAX } from "../rules.ts";
import { type AdminOptions, type Database, readTarget, type Session } from "./database.ts";
import { dependencyOrder } from "../flow.ts";

/**
 * Request the cancellation of a waiting, queued or running job, in the caller's
 * transaction. A waiting job (of a flow) is cancelled at once; a queued job is cancelled by
 * the next claim pass; a running job's worker aborts its signal (NOTIFY at commit, or at
 * its next heartbeat) and the job ends cancelled. Other states and unknown ids are a no-op.
 * Returns whether a job was marked.
 *
 * @example
 * ```ts ignore
 * import { requestCancel } from "@akadze/akadze/admin";
 * await app.sql.begin((tx) => requestCancel(tx, jobId));
 * ```
 */
export async function requestCancel(
  session: Session,
  jobId: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const id = normalizeId(jobId);
  const rows = await explainMissingSchema(schema, () =>
    session.unsafe(
      `with marked as (
         update ${s}.jobs set ${CANCEL_SET}
          where id operator(pg_catalog.=) $1::bigint and state operator(pg_catalog.=) any (array[${
        stateList(ACTIVE_STATES)
      }])
         returning id, state)
       select m.id, (select pg_catalog.pg_notify($2, m.id::pg_catalog.text) where m.state
         operator(pg_catalog.=) 'running') from marked m`,
      [id, cancelChannel(schema)],
    ));
  return rows.length > 0;
}

/**
 * The SET list of a cancel request: the mark a worker acts on (it cancels a queued job
 * before it runs, and signals a running one); a job waiting for its dependencies, which no
 * worker would take, is cancelled at once (and its dependents, by their failure policy).
 */
const CANCEL_SET = `cancel_requested_at = coalesce(cancel_requested_at, pg_catalog.now()),
  state = case when state operator(pg_catalog.=) 'waiting' then 'cancelled' else state end,
  finished_at = case when state operator(pg_catalog.=) 'waiting' then pg_catalog.now()
                     else finished_at end`;

/**
 * The SET list that puts a failed job `j` back to `queued`: attempts, errors and arguments
 * kept, one more attempt when its budget is spent, an expiry that has passed cleared.
 * {@linkcode requeue} and {@linkcode requeueJobs} both use it.
 */
const REQUEUE_SET = `state = 'queued', run_at = pg_catalog.now(), finished_at = null,
  result = null, cancel_requested_at = null,
  max_attempts = greatest(j.max_attempts, j.attempt operator(pg_catalog.+) 1),
  expires_at = case when j.expires_at operator(pg_catalog.<=) pg_catalog.now() then null
                    else j.expires_at end`;

/**
 * Put a `failed` job back to `queued`, in the caller's transaction. It keeps its attempt
 * count, errors and arguments; `maxAttempts` is raised to `attempt + 1` when needed (so it
 * gets one more run), and `expiresAt` is cleared only if it has passed. A conflicting
 * active `uniqueKey` raises `DuplicateJob`, the job stays failed and the caller's
 * transaction stays usable. Any other state, or an unknown id, is an `AkadzeError`.
 *
 * @example
 * ```ts ignore
 * import { requeue } from "@akadze/akadze/admin";
 * await app.sql.begin((tx) => requeue(tx, "42"));
 * ```
 */
export async function requeue(
  session: Session,
  jobId: string,
  options: AdminOptions = {},
): Promise<void> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const id = normalizeId(jobId);
  const statement = `
    with target as (
      select id, state from ${s}.jobs where id operator(pg_catalog.=) $1::bigint for update
    ),
    moved as (
      update ${s}.jobs j set ${REQUEUE_SET}
        from target where j.id operator(pg_catalog.=) target.id and target.state
          operator(pg_catalog.=) 'failed'
      returning j.queue)
    select (select state from target) as state,
           (select pg_catalog.pg_notify($2, queue) from moved) as notified,
           (select pg_catalog.count(*) from moved)::int as moved`;
  let row: { state: string | null; moved: number };
  try {
    row = await explainMissingSchema(schema, () =>
      atomically(session, async (tx) => {
        const [r] = await tx.unsafe(statement, [id, jobsChannel(schema)]);
        return r as unknown as { state: string | null; moved: number };
      }));
  } catch (error) {
    if ((error as { code?: unknown }).code === "23505") {
      throw new DuplicateJob(
        `job ${id} cannot be requeued: ${heldKey(error)} is held by another queued or running ` +
          "job (the key is this job's, or that of a flow step its failure cancelled, which the " +
          "requeue puts back); nothing was requeued",
      );
    }
    throw error;
  }
  if (row.state === null) throw new AkadzeError(`job ${id} does not exist`);
  if (row.moved === 0) throw new AkadzeError(`job ${id} is not failed (it is ${row.state})`);
}

/** The uniqueKey a unique violation names (from the server's detail), for an error message. */
function heldKey(error: unknown): string {
  const detail = (error as { detail?: unknown }).detail;
  const key = typeof detail === "string"
    ? /^Key \(unique_key\)=\((.*)\) already exists\.$/s.exec(detail)?.[1]
    : undefined;
  return key === undefined ? "a uniqueKey" : `uniqueKey ${JSON.stringify(key)}`;
}

/** A job without its arguments, result and errors, as `listJobs` returns it. */
export interface JobSummary {
  /** Job id. */
  id: string;
  /** Task name. */
  task: string;
  /** Queue. */
  queue: string;
  /** State. */
  state: JobState;
  /** Priority. */
  priority: number;
  /**
   * The current or last counted attempt's number, 1-based; 0 before the first run (see
   * `attemptNumber`).
   */
  attempt: number;
  /** Attempt budget. */
  maxAttempts: number;
  /** Claims so far. */
  runCount: number;
  /** When it is (was) ready. */
  runAt: Date;
  /** Enqueued at. */
  createdAt: Date;
  /** Last run started at. */
  startedAt: Date | null;
  /** Finished at. */
  finishedAt: Date | null;
  /** The worker running it, or that ran its last run (null before the first). */
  workerId: string | null;
  /** Unique key. */
  uniqueKey: string | null;
  /** Limit key. */
  limitKey: string | null;
  /** Expiry. */
  expiresAt: Date | null;
  /** Whether a cancel was requested. */
  cancelRequested: boolean;
  /** The flow it belongs to (its first step's id), or null outside flows. */
  flowId: string | null;
  /** Its step name in the flow, or null. */
  step: string | null;
}

/** Which jobs {@linkcode listJobs}, {@linkcode requeueJobs} and {@linkcode cancelJobs} take. */
export interface JobFilter extends AdminOptions {
  /** Only this task. */
  task?: string;
  /** Only this state. */
  state?: JobState;
  /** Only this queue. */
  queue?: string;
  /** Only jobs enqueued at or after this time (`created_at >= since`). */
  since?: Date;
  /** Only the steps of this flow (its id: the job id of its first step, `flowId`). */
  flow?: string;
}

/** Options of {@linkcode listJobs}. */
export interface ListJobsOptions extends JobFilter {
  /** At most this many, 1..1000. Default 50. */
  limit?: number;
  /**
   * `"queue"` (the default): in the order the queue runs them, by priority (highest first),
   * then `run_at`, then id. `"newest"`: the most recently enqueued first (by id).
   */
  order?: "queue" | "newest";
}

/** The ORDER BY of each {@linkcode ListJobsOptions.order}. */
const LIST_ORDERS = {
  queue: "j.priority desc, j.run_at, j.id",
  newest: "j.id desc",
} as const;

/** The select list of a {@linkcode JobSummary} (the `summary` read of job_columns.ts). */
const SUMMARY_COLUMNS = selectList("summary");
/** What a {@linkcode JobDetail} selects beyond the summary. */
const DETAIL_COLUMNS = selectList("detail");

/** `JobSummary` has the fields of the `summary` read (a compile error otherwise). */
const _summaryMatches: Same<JobSummary, FieldsOf<"summary">> = true;

/**
 * Job summaries (no arguments, result or errors), in the order the queue runs them
 * (priority, highest first, then `run_at`, then id) or newest first with
 * `order: "newest"`, filtered by task, state, queue and enqueue time.
 *
 * @example
 * ```ts ignore
 * import { listJobs } from "@akadze/akadze/admin";
 * const failed = await listJobs(app, { state: "failed", limit: 20 });
 * ```
 */
export async function listJobs(db: Database, options: ListJobsOptions = {}): Promise<JobSummary[]> {
  const [sql, s, schema] = readTarget(db, options);
  const limit = options.limit ?? 50;
  if (!isIntegerIn(limit, 1, LIST_JOBS_MAX)) {
    throw new AkadzeError(`limit must be an integer from 1 to ${LIST_JOBS_MAX}, got ${limit}`);
  }
  const order = options.order ?? "queue";
  if (!Object.hasOwn(LIST_ORDERS, order)) {
    throw new AkadzeError(`order must be "queue" or "newest", got ${JSON.stringify(order)}`);
  }
  const rows = await explainMissingSchema(schema, () =>
    sql.unsafe(
      `select ${SUMMARY_COLUMNS} from ${s}.jobs j where ${FILTER}
        order by ${LIST_ORDERS[order]} limit $6`,
      [...filterParams(options), limit],
    ));
  return rows.map(toSummary);
}

/**
 * The WHERE condition of a {@linkcode JobFilter} on `jobs j`: parameters $1 task, $2
 * state, $3 queue, $4 since, $5 flow (each null for no condition; the statements are
 * planned with their values, so a flow reads the flow index).
 */
const FILTER = `($1::pg_catalog.text is null or j.task operator(pg_catalog.=) $1) and
    ($2::pg_catalog.text is null or j.state operator(pg_catalog.=) $2)
  and ($3::pg_catalog.text is null or j.queue operator(pg_catalog.=) $3) and
    ($4::pg_catalog.timestamptz is null or j.created_at operator(pg_catalog.>=) $4)
  and ($5::bigint is null or j.flow_id operator(pg_catalog.=) $5::bigint)`;

/** The five parameters of {@linkcode FILTER}, validated; `AkadzeError` when one is wrong. */
function filterParams(
  filter: JobFilter,
): [string | null, string | null, string | null, Date | null, string | null] {
  const { task, state, queue, since, flow } = filter;
  if (task !== undefined && !isTaskFilter(task)) {
    throw new AkadzeError(
      `task must be a task name of 1 to ${TASK_NAME_MAX} characters, got ${JSON.stringify(task)}`,
    );
  }
  if (state !== undefined && !JOB_STATES.includes(state)) {
    throw new AkadzeError(`state must be one of ${JOB_STATES.join(", ")}, got ${state}`);
  }
  if (queue !== undefined) checkQueueName(queue);
  if (since !== undefined && (!(since instanceof Date) || Number.isNaN(since.getTime()))) {
    throw new AkadzeError("since must be a valid Date");
  }
  if (flow !== undefined && !isFlowId(flow)) {
    throw new AkadzeError(
      `flow must be a flow id (the job id of its first step), got ${JSON.stringify(flow)}`,
    );
  }
  return [task ?? null, state ?? null, queue ?? null, since ?? null, flow ?? null];
}

/** Whether `flow` is a flow id (a job id, as decimal text). */
function isFlowId(flow: unknown): flow is string {
  return typeof flow === "string" && /^[1-9]\d{0,18}$/.test(flow) &&
    BigInt(flow) <= 9223372036854775807n;
}

/**
 * Whether `task` can stand in a {@linkcode JobFilter}: a string of 1 to
 * {@linkcode TASK_NAME_MAX} characters (`akadze jobs --task` checks the same).
 */
export function isTaskFilter(task: unknown): task is string {
  return typeof task === "string" && task.length >= 1 && task.length <= TASK_NAME_MAX;
}

/** What {@linkcode requeueJobs} did (or, with `dryRun`, would do). */
export interface RequeueJobsResult {
  /** Failed jobs put back to queued. */
  requeued: number;
  /**
   * Ids of matching failed jobs left failed because another job with their `uniqueKey` is
   * queued or running (or another matching job with that key was requeued instead).
   */
  skipped: string[];
}

/** Options of {@linkcode requeueJobs} and {@linkcode cancelJobs}. */
export interface BulkOptions {
  /** Count what would change, change nothing. Default false. */
  dryRun?: boolean;
}

/**
 * Put every `failed` job matching `filter` back to `queued`, in the caller's transaction,
 * each as {@linkcode requeue} does it (attempts, errors and arguments kept, one more attempt
 * when the budget was spent). With `flow`, the failed steps of that flow: the steps their
 * failure cancelled wait again, and run when they succeed. A `state` other than `failed`
 * is an `AkadzeError`. A job whose `uniqueKey` is held by a waiting, queued or running job
 * stays failed and is reported in `skipped` (of several matching jobs with one key, the
 * newest is requeued): one conflict does not stop the others. An empty filter takes every
 * failed job.
 *
 * @example
 * ```ts ignore
 * import { requeueJobs } from "@akadze/akadze/admin";
 * const { requeued, skipped } = await app.sql.begin((tx) =>
 *   requeueJobs(tx, { task: "send-email", since: new Date(Date.now() - 3_600_000) })
 * );
 * ```
 */
export async function requeueJobs(
  session: Session,
  filter: JobFilter = {},
  options: BulkOptions = {},
): Promise<RequeueJobsResult> {
  if (filter.state !== undefined && filter.state !== "failed") {
    throw new AkadzeError(`only failed jobs can be requeued, got state ${filter.state}`);
  }
  const schema = filter.schema ?? "akadze";
  const s = quoteSchema(schema);
  const params = filterParams({ ...filter, state: "failed" });
  // Locked, then split: a job whose key is held (by an active job, or by a newer matching
  // one) is skipped instead of failing the whole UPDATE on the unique index.
  const select = `
    with matched as (
      select j.id, j.unique_key from ${s}.jobs j where ${FILTER} order by j.id for update
    ),
    ranked as (
      select m.id, m.unique_key is not null and (
          exists (select 1 from ${s}.jobs a where a.unique_key operator(pg_catalog.=) m.unique_key
                   and a.state operator(pg_catalog.=) any (array[${stateList(ACTIVE_STATES)}]))
          or pg_catalog.row_number() over (partition by m.unique_key order by m.id desc)
            operator(pg_catalog.>) 1
        ) as held
        from matched m
    )`;
  const run = async (tx: TransactionSql): Promise<RequeueJobsResult> => {
    const rows = options.dryRun
      ? await tx.unsafe(`${select} select id::pg_catalog.text as id, held from ranked`, params)
      : await tx.unsafe(
        `${select},
         moved as (
           update ${s}.jobs j set ${REQUEUE_SET}
             from ranked r where j.id operator(pg_catalog.=) r.id and not r.held
           returning j.queue),
         notified as (
           select pg_catalog.pg_notify($6, q.queue) from (select distinct queue from moved) q)
         select r.id::pg_catalog.text as id, r.held, (select pg_catalog.count(*)
           from notified) as n from ranked r`,
        [...params, jobsChannel(schema)],
      );
    const skipped = rows.filter((r) => r.held).map((r) => r.id as string);
    return { requeued: rows.length - skipped.length, skipped };
  };
  try {
    return await explainMissingSchema(schema, () => atomically(session, run));
  } catch (error) {
    if ((error as { code?: unknown }).code === "23505") {
      throw new DuplicateJob(
        `failed jobs cannot be requeued: ${heldKey(error)} is held by another queued or running ` +
          "job (the key of a flow step their failure cancelled, which the requeue puts back, or " +
          "of a job enqueued meanwhile); nothing was requeued",
      );
    }
    throw error;
  }
}

/**
 * Request the cancellation of every waiting, queued or running job matching `filter`, in
 * the caller's transaction, each as {@linkcode requestCancel} does it: a waiting job is
 * cancelled at once, a queued one by the next claim pass, a running one's signal is
 * aborted. With `flow`, that cancels a whole flow: its dependents waiting for a running
 * step are cancelled now, so nothing of the flow runs after its running steps. Jobs whose
 * cancel was already requested are left as they are. A `state` that is not active
 * (`waiting`, `queued`, `running`) is an `AkadzeError`. Returns how many jobs were marked
 * (with `dryRun`: would be). An empty filter takes every active job.
 *
 * @example
 * ```ts ignore
 * import { cancelJobs } from "@akadze/akadze/admin";
 * const marked = await app.sql.begin((tx) => cancelJobs(tx, { queue: "reports" }));
 * const steps = await app.sql.begin((tx) => cancelJobs(tx, { flow: "41" }));
 * ```
 */
export async function cancelJobs(
  session: Session,
  filter: JobFilter = {},
  options: BulkOptions = {},
): Promise<number> {
  if (filter.state !== undefined && !ACTIVE_STATES.includes(filter.state)) {
    throw new AkadzeError(
      `only ${ACTIVE_STATES.join(", ")} jobs can be cancelled, got state ${filter.state}`,
    );
  }
  const schema = filter.schema ?? "akadze";
  const s = quoteSchema(schema);
  const params = filterParams(filter);
  const where = `${FILTER} and j.state operator(pg_catalog.=) any (array[${
    stateList(ACTIVE_STATES)
  }]) and j.cancel_requested_at is null`;
  const [row] = await explainMissingSchema(
    schema,
    () =>
      options.dryRun
        ? session.unsafe(
          `select pg_catalog.count(*)::int as n from ${s}.jobs j where ${where}`,
          params,
        )
        : session.unsafe(
          `with marked as (
           update ${s}.jobs j set ${CANCEL_SET} where ${where}
           returning j.id, j.state),
         notified as (select pg_catalog.pg_notify($6, m.id::pg_catalog.text) from marked m
           where m.state operator(pg_catalog.=) 'running')
         select (select pg_catalog.count(*)::int from marked) as n,
                (select pg_catalog.count(*)::int from notified) as notified`,
          [...params, cancelChannel(schema)],
        ),
  );
  return row.n as number;
}

/** One job in full, as `getJob` returns it. */
export interface JobDetail extends JobSummary {
  /** Snoozes so far. */
  snoozes: number;
  /**
   * The last errors, oldest first: name, message, when, and where it was thrown (`stack`:
   * one `at …` frame per line; absent for errors without one, such as `WorkerLost`).
   */
  errors: JobError[];
  /**
   * The last progress its run reported with `ctx.progress` (a number or small JSON), or
   * null. A retried job shows the previous run's until the new run reports.
   */
  progress: unknown;
  /** The arguments (only with `includeArgs`). */
  args?: Record<string, unknown>;
  /** The result (only with `includeResult`). */
  result?: unknown;
  /**
   * Every step of the job's flow (this job included), in dependency order (a step after
   * the steps it depends on): only with `includeFlow`, and only for a job in a flow.
   */
  flow?: FlowStepSummary[];
}

/** One step of a flow, as {@linkcode getJob} lists them with `includeFlow`. */
export interface FlowStepSummary {
  /** Job id. */
  id: string;
  /** Its step name (null for a job that joined the flow without one). */
  step: string | null;
  /** Task name. */
  task: string;
  /** Queue. */
  queue: string;
  /** State. */
  state: JobState;
  /** Attempts spent. */
  attempt: number;
  /** Finished at. */
  finishedAt: Date | null;
  /**
   * What it waits for, by job id (a step of this flow, or a job outside it), with what a
   * failure of that dependency does to it.
   */
  dependsOn: { id: string; onFailure: "cancel" | "ignore" | "continue" }[];
}

/** `FlowStepSummary` has the fields of the `step` read plus its dependencies. */
const _stepMatches: Same<Omit<FlowStepSummary, "dependsOn">, FieldsOf<"step">> = true;

/** One stored error of a job (see {@linkcode JobDetail}). */
export interface JobError {
  /** The error's name (`TypeError`, `WorkerLost`, ...). */
  error: string;
  /** What went wrong (redacted: no argument values or credentials). */
  message: string;
  /** When it was stored (ISO 8601, database clock). */
  at: string;
  /** Where it was thrown: one `at …` frame per line; absent for errors without one. */
  stack?: string;
  /** The number of the attempt whose run ended with it, 1-based (absent on older entries). */
  attempt?: number;
  /** The worker that ran that attempt (absent on older entries). */
  worker?: string;
}

/** Options of {@linkcode getJob}. */
export interface GetJobOptions extends AdminOptions {
  /** Include the arguments. Default false. */
  includeArgs?: boolean;
  /** Include the result. Default false. */
  includeResult?: boolean;
  /** Include the steps of the job's flow ({@linkcode JobDetail.flow}). Default false. */
  includeFlow?: boolean;
}

/**
 * One job with its error history (arguments and result only when asked), or null.
 *
 * @example
 * ```ts ignore
 * import { getJob } from "@akadze/akadze/admin";
 * const job = await getJob(app, "42");
 * console.log(job?.state, job?.errors.at(-1)?.message);
 * ```
 */
export async function getJob(
  db: Database,
  jobId: string,
  options: GetJobOptions = {},
): Promise<JobDetail | null> {
  const [sql, s, schema] = readTarget(db, options);
  const id = normalizeId(jobId);
  return await explainMissingSchema(schema, async () => {
    const job = (await readJobDetails(sql, s, [id], options)).get(id) ?? null;
    if (job !== null && options.includeFlow && job.flowId !== null) {
      job.flow = await readFlowSteps(sql, s, job.flowId);
    }
    return job;
  });
}

/** The select list of a {@linkcode FlowStepSummary} (the `step` read of job_columns.ts). */
const STEP_COLUMNS = selectList("step");

/** The steps of flow `flowId` in schema `s` (quoted), in dependency order. */
async function readFlowSteps(sql: Sql, s: string, flowId: string): Promise<FlowStepSummary[]> {
  const rows = await sql.unsafe(
    `select ${STEP_COLUMNS},
            coalesce((select pg_catalog.json_agg(pg_catalog.json_build_object('id',
              d.depends_on::pg_catalog.text,
                                                        'onFailure', d.on_failure)
                                      order by d.depends_on)
                        from ${s}.job_dependencies d where d.job_id
                          operator(pg_catalog.=) j.id), '[]') as depends_on
       from ${s}.jobs j where j.flow_id operator(pg_catalog.=) $1::bigint order by j.id`,
    [flowId],
  );
  const steps = rows.map((r): FlowStepSummary => ({
    ...fieldsOf("step", r),
    dependsOn: r.depends_on as FlowStepSummary["dependsOn"],
  }));
  return inDependencyOrder(steps);
}

/**
 * `steps` (in id order) with each step after the steps of the flow it depends on (the order
 * a flow is enqueued in: ids already are, except a running job's children, which come
 * before the job that waits for them).
 */
function inDependencyOrder(steps: FlowStepSummary[]): FlowStepSummary[] {
  const byId = new Map(steps.map((step) => [step.id, step]));
  const deps = new Map(
    steps.map((step) => [step.id, step.dependsOn.map((d) => d.id).filter((id) => byId.has(id))]),
  );
  return dependencyOrder([...byId.keys()], deps).map((id) => byId.get(id)!);
}

/**
 * The jobs of `ids` (normalized) that exist, by id, read from schema `s` (quoted) as
 * {@linkcode getJob} returns them: {@linkcode getJob} and the app's waiters read through it.
 */
export async function readJobDetails(
  sql: Sql,
  s: string,
  ids: readonly string[],
  options: { includeArgs?: boolean; includeResult?: boolean } = {},
): Promise<Map<string, JobDetail>> {
  const rows = await sql.unsafe(
    `select ${SUMMARY_COLUMNS}, ${DETAIL_COLUMNS} from ${s}.jobs j where j.id
      operator(pg_catalog.=) any($1::bigint[])`,
    [ids as string[]],
  );
  const jobs = new Map<string, JobDetail>();
  for (const row of rows) {
    const detail: JobDetail = {
      ...toSummary(row),
      snoozes: row.snoozes,
      errors: row.errors,
      progress: row.progress,
    };
    if (options.includeArgs) detail.args = row.args;
    if (options.includeResult) detail.result = row.result;
    jobs.set(detail.id, detail);
  }
  return jobs;
}

/** A job id as the database takes it; `AkadzeError` for anything but a decimal id. */
export function normalizeId(jobId: string | number | bigint): string {
  const id = String(jobId);
  if (!/^[1-9]\d{0,18}$/.test(id) || BigInt(id) > 9223372036854775807n) {
    throw new AkadzeError(`job id must be a positive decimal integer, got ${JSON.stringify(id)}`);
  }
  return id;
}

function toSummary(r: Record<string, unknown>): JobSummary {
  const summary = fieldsOf("summary", r);
  return { ...summary, attempt: attemptNumber(summary.attempt, summary.state) };
}
