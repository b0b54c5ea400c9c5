/**
 * Operating queues from code. Writes take a `session` (a postgres.js instance or the
 * caller's transaction) and run in it; reads take the app or a postgres.js instance and
 * never change anything. Admin writes do not run the app's hooks.
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
} from "./db.ts";
import { checkQueueName } from "./enqueue.ts";
import { AkadzeError, DuplicateJob } from "./errors.ts";
import type { JobState } from "./job.ts";
import { jsonProblem } from "./json.ts";
import { deleteOldJobsStatement, oldJobsCondition } from "./worker/pruner.ts";

/** Options of the admin functions. */
export interface AdminOptions {
  /** The schema of akadze's tables. Default `"akadze"` (or the app's, when given the app). */
  schema?: string;
}

/** Where reads go: the app (its pool and schema) or a postgres.js instance. */
export type Database = Sql | { readonly sql: Sql; readonly schema: string };

/** A write session: a postgres.js instance or a transaction of one. */
export type Session = Sql | TransactionSql;

const STATES: readonly JobState[] = ["queued", "running", "succeeded", "failed", "cancelled"];
const KEY_MAX = 500;

/**
 * Request the cancellation of a queued or running job, in the caller's transaction. A
 * queued job is cancelled by the next claim pass; a running job's worker aborts its
 * signal (NOTIFY at commit, or at its next heartbeat) and the job ends cancelled. Other
 * states and unknown ids are a no-op. Returns whether a job was marked.
 *
 * @example
 * ```ts ignore
 * import { requestCancel } from "@akadze/akadze";
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
         update ${s}.jobs set cancel_requested_at = coalesce(cancel_requested_at, now())
          where id = $1::bigint and state in ('queued', 'running')
         returning id, state)
       select m.id, (select pg_notify($2, m.id::text) where m.state = 'running') from marked m`,
      [id, cancelChannel(schema)],
    ));
  return rows.length > 0;
}

/**
 * Put a `failed` job back to `queued`, in the caller's transaction. It keeps its attempt
 * count, errors and arguments; `maxAttempts` is raised to `attempt + 1` when needed (so it
 * gets one more run), and `expiresAt` is cleared only if it has passed. A conflicting
 * active `uniqueKey` raises `DuplicateJob`, the job stays failed and the caller's
 * transaction stays usable. Any other state, or an unknown id, is an `AkadzeError`.
 *
 * @example
 * ```ts ignore
 * import { requeue } from "@akadze/akadze";
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
      select id, state from ${s}.jobs where id = $1::bigint for update
    ),
    moved as (
      update ${s}.jobs j set
        state = 'queued', run_at = now(), finished_at = null, worker_id = null, result = null,
        cancel_requested_at = null,
        max_attempts = greatest(j.max_attempts, j.attempt + 1),
        expires_at = case when j.expires_at <= now() then null else j.expires_at end
        from target where j.id = target.id and target.state = 'failed'
      returning j.queue)
    select (select state from target) as state,
           (select pg_notify($2, queue) from moved) as notified,
           (select count(*) from moved)::int as moved`;
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
        `job ${id} cannot be requeued: another job with its uniqueKey is queued or running`,
      );
    }
    throw error;
  }
  if (row.state === null) throw new AkadzeError(`job ${id} does not exist`);
  if (row.moved === 0) throw new AkadzeError(`job ${id} is not failed (it is ${row.state})`);
}

/**
 * Stop claims from a queue (running jobs finish; enqueue still works). Returns false when
 * it was already paused.
 *
 * @example
 * ```ts ignore
 * import { pauseQueue } from "@akadze/akadze";
 * await pauseQueue(app.sql, "mail");
 * ```
 */
export async function pauseQueue(
  session: Session,
  queue: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const name = checkQueueName(queue);
  const rows = await explainMissingSchema(schema, () =>
    session.unsafe(
      `insert into ${s}.queue_pauses (queue) values ($1) on conflict do nothing returning queue`,
      [name],
    ));
  return rows.length > 0;
}

/**
 * Resume claims from a paused queue and wake its workers. Returns false when it was not
 * paused.
 *
 * @example
 * ```ts ignore
 * import { resumeQueue } from "@akadze/akadze";
 * await resumeQueue(app.sql, "mail");
 * ```
 */
export async function resumeQueue(
  session: Session,
  queue: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const name = checkQueueName(queue);
  const rows = await explainMissingSchema(schema, () =>
    session.unsafe(
      `with resumed as (delete from ${s}.queue_pauses where queue = $1 returning queue)
       select queue, pg_notify($2, queue) from resumed`,
      [name, jobsChannel(schema)],
    ));
  return rows.length > 0;
}

/** Limits of one key; `undefined` keeps the stored value, `null` removes it. */
export interface LimitOptions {
  /** At most this many jobs with the key run at once, cluster-wide. */
  maxRunning?: number | null;
  /** At most this many jobs with the key start per `window`. */
  maxStarts?: number | null;
  /** The rate window in milliseconds (with `maxStarts`). */
  window?: number | null;
}

/**
 * Set the limits of a `limitKey`, in the caller's transaction. Omitted fields keep their
 * previous values; `null` removes one. `maxStarts` and `window` go together.
 *
 * @example
 * ```ts ignore
 * import { setLimit } from "@akadze/akadze";
 * await setLimit(app.sql, "smtp", { maxRunning: 5, maxStarts: 100, window: 60_000 });
 * ```
 */
export async function setLimit(
  session: Session,
  key: string,
  limits: LimitOptions,
  options: AdminOptions = {},
): Promise<LimitSummary> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  checkKey(key);
  if (typeof limits !== "object" || limits === null) {
    throw new AkadzeError("setLimit needs { maxRunning?, maxStarts?, window? }");
  }
  for (const name of Object.keys(limits)) {
    if (!["maxRunning", "maxStarts", "window"].includes(name)) {
      throw new AkadzeError(`unknown limit "${name}" (limits: maxRunning, maxStarts, window)`);
    }
  }
  const { maxRunning, maxStarts, window } = limits;
  if (maxRunning === undefined && maxStarts === undefined && window === undefined) {
    throw new AkadzeError("setLimit needs at least one of maxRunning, maxStarts, window");
  }
  for (const [name, value] of [["maxRunning", maxRunning], ["maxStarts", maxStarts]] as const) {
    if (value != null && (!Number.isInteger(value) || value < 1 || value > 2147483647)) {
      throw new AkadzeError(`${name} must be an integer from 1 to 2147483647, got ${value}`);
    }
  }
  if (window != null && (!Number.isInteger(window) || window < 1 || window > 366 * 86_400_000)) {
    throw new AkadzeError(
      `window must be a whole number of milliseconds up to a year, got ${window}`,
    );
  }
  const keep = (value: unknown) => value === undefined;
  const [row] = await explainMissingSchema(schema, () =>
    atomically(session, (tx) =>
      tx.unsafe(
        `insert into ${s}.limits as l (key, max_running, max_starts, "window")
       values ($1, $2::int, $4::int, $6::float8 * interval '1 millisecond')
       on conflict (key) do update set
         max_running = case when $3 then l.max_running else excluded.max_running end,
         max_starts = case when $5 then l.max_starts else excluded.max_starts end,
         "window" = case when $7 then l."window" else excluded."window" end,
         updated_at = now()
       returning ${limitColumns(s)}`,
        [
          key,
          maxRunning ?? null,
          keep(maxRunning),
          maxStarts ?? null,
          keep(maxStarts),
          window ?? null,
          keep(window),
        ],
      ).catch((error) => {
        if ((error as { code?: unknown }).code === "23514") {
          throw new AkadzeError(
            `limit "${key}": maxStarts and window must be set together (and removed together)`,
          );
        }
        throw error;
      })));
  return toLimit(row);
}

/**
 * Remove a key's limits and its start marks (idempotent): the key becomes unlimited, and a
 * later `setLimit` counts starts from zero. Returns whether a limits row existed.
 *
 * @example
 * ```ts ignore
 * import { clearLimit } from "@akadze/akadze";
 * await clearLimit(app.sql, "smtp");
 * ```
 */
export async function clearLimit(
  session: Session,
  key: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  checkKey(key);
  const [row] = await explainMissingSchema(schema, () =>
    session.unsafe(
      `with gone as (delete from ${s}.limits where key = $1 returning key),
            marks as (delete from ${s}.limit_starts where key = $1)
       select count(*)::int as n from gone`,
      [key],
    ));
  return row.n > 0;
}

/** Counts of one queue, from {@linkcode queueSnapshot}. */
export interface QueueSnapshot {
  /** The queue. */
  queue: string;
  /** Jobs per state (every state present, 0 when none). */
  counts: Record<JobState, number>;
  /** Seconds the oldest ready queued job has waited (0 when none). */
  lagSeconds: number;
  /** Ready queued jobs (run_at passed). */
  ready: number;
  /** Running jobs. */
  busy: number;
  /** Whether claims are paused. */
  paused: boolean;
}

/**
 * Per queue and state counts, the lag of the oldest ready job and the running count, all
 * from one consistent snapshot. Queues with no jobs but a pause are included.
 *
 * @example
 * ```ts ignore
 * import { queueSnapshot } from "@akadze/akadze";
 * for (const q of await queueSnapshot(app)) console.log(q.queue, q.lagSeconds);
 * ```
 */
export async function queueSnapshot(
  db: Database,
  options: AdminOptions = {},
): Promise<QueueSnapshot[]> {
  const [sql, s, schema] = target(db, options);
  const rows = await explainMissingSchema(
    schema,
    () =>
      sql.begin("isolation level repeatable read read only", async (tx) => {
        const counts = await tx.unsafe(
          `select queue, state, count(*)::int as n,
              count(*) filter (where state = 'queued' and run_at <= now())::int as ready,
              coalesce(extract(epoch from now() - min(run_at)
                filter (where state = 'queued' and run_at <= now())), 0)::float8 as lag
         from ${s}.jobs group by queue, state`,
        );
        const pauses = await tx.unsafe(`select queue from ${s}.queue_pauses`);
        return { counts, pauses };
      }),
  );
  const paused = new Set(rows.pauses.map((r) => r.queue as string));
  const byQueue = new Map<string, QueueSnapshot>();
  const entry = (queue: string): QueueSnapshot => {
    let q = byQueue.get(queue);
    if (!q) {
      q = {
        queue,
        counts: Object.fromEntries(STATES.map((st) => [st, 0])) as Record<JobState, number>,
        lagSeconds: 0,
        ready: 0,
        busy: 0,
        paused: paused.has(queue),
      };
      byQueue.set(queue, q);
    }
    return q;
  };
  for (const r of rows.counts) {
    const q = entry(r.queue);
    q.counts[r.state as JobState] = r.n;
    q.ready += r.ready;
    q.lagSeconds = Math.max(q.lagSeconds, Math.max(0, r.lag));
    if (r.state === "running") q.busy = r.n;
  }
  for (const queue of paused) entry(queue);
  return [...byQueue.values()].sort((a, b) => a.queue.localeCompare(b.queue));
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
  /** Attempts spent. */
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
  /** The worker running it. */
  workerId: string | null;
  /** Unique key. */
  uniqueKey: string | null;
  /** Limit key. */
  limitKey: string | null;
  /** Expiry. */
  expiresAt: Date | null;
  /** Whether a cancel was requested. */
  cancelRequested: boolean;
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
}

/** Options of {@linkcode listJobs}. */
export interface ListJobsOptions extends JobFilter {
  /** At most this many, 1..1000. Default 50. */
  limit?: number;
}

const SUMMARY_COLUMNS = `id::text as id, task, queue, state, priority, attempt, max_attempts,
  run_count, run_at, created_at, started_at, finished_at, worker_id, unique_key, limit_key,
  expires_at, cancel_requested_at is not null as cancel_requested`;

/**
 * Job summaries (no arguments, result or errors), newest first (by id: the order in which
 * they were enqueued, latest first), filtered by task, state, queue and enqueue time.
 *
 * @example
 * ```ts ignore
 * import { listJobs } from "@akadze/akadze";
 * const failed = await listJobs(app, { state: "failed", limit: 20 });
 * ```
 */
export async function listJobs(db: Database, options: ListJobsOptions = {}): Promise<JobSummary[]> {
  const [sql, s, schema] = target(db, options);
  const limit = options.limit ?? 50;
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
    throw new AkadzeError(`limit must be an integer from 1 to 1000, got ${limit}`);
  }
  const rows = await explainMissingSchema(schema, () =>
    sql.unsafe(
      `select ${SUMMARY_COLUMNS} from ${s}.jobs j where ${FILTER}
        order by j.id desc limit $5`,
      [...filterParams(options), limit],
    ));
  return rows.map(toSummary);
}

/**
 * The WHERE condition of a {@linkcode JobFilter} on `jobs j`: parameters $1 task, $2
 * state, $3 queue, $4 since (each null for no condition).
 */
const FILTER = `($1::text is null or j.task = $1) and ($2::text is null or j.state = $2)
  and ($3::text is null or j.queue = $3) and ($4::timestamptz is null or j.created_at >= $4)`;

/** The four parameters of {@linkcode FILTER}, validated; `AkadzeError` when one is wrong. */
function filterParams(
  filter: JobFilter,
): [string | null, string | null, string | null, Date | null] {
  const { task, state, queue, since } = filter;
  if (task !== undefined && (typeof task !== "string" || task.length < 1 || task.length > 200)) {
    throw new AkadzeError(
      `task must be a task name of 1 to 200 characters, got ${JSON.stringify(task)}`,
    );
  }
  if (state !== undefined && !STATES.includes(state)) {
    throw new AkadzeError(`state must be one of ${STATES.join(", ")}, got ${state}`);
  }
  if (queue !== undefined) checkQueueName(queue);
  if (since !== undefined && (!(since instanceof Date) || Number.isNaN(since.getTime()))) {
    throw new AkadzeError("since must be a valid Date");
  }
  return [task ?? null, state ?? null, queue ?? null, since ?? null];
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
 * when the budget was spent). A `state` other than `failed` is an `AkadzeError`. A job whose
 * `uniqueKey` is held by a queued or running job stays failed and is reported in
 * `skipped` (of several matching jobs with one key, the newest is requeued): one conflict
 * does not stop the others. An empty filter takes every failed job.
 *
 * @example
 * ```ts ignore
 * import { requeueJobs } from "@akadze/akadze";
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
          exists (select 1 from ${s}.jobs a where a.unique_key = m.unique_key
                   and a.state in ('queued', 'running'))
          or row_number() over (partition by m.unique_key order by m.id desc) > 1
        ) as held
        from matched m
    )`;
  const run = async (tx: TransactionSql): Promise<RequeueJobsResult> => {
    const rows = options.dryRun
      ? await tx.unsafe(`${select} select id::text as id, held from ranked`, params)
      : await tx.unsafe(
        `${select},
         moved as (
           update ${s}.jobs j set
             state = 'queued', run_at = now(), finished_at = null, worker_id = null,
             result = null, cancel_requested_at = null,
             max_attempts = greatest(j.max_attempts, j.attempt + 1),
             expires_at = case when j.expires_at <= now() then null else j.expires_at end
             from ranked r where j.id = r.id and not r.held
           returning j.queue),
         notified as (
           select pg_notify($5, q.queue) from (select distinct queue from moved) q)
         select r.id::text as id, r.held, (select count(*) from notified) as n from ranked r`,
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
        "failed jobs cannot be requeued now: a job with one of their uniqueKeys was enqueued " +
          "meanwhile; try again",
      );
    }
    throw error;
  }
}

/**
 * Request the cancellation of every queued or running job matching `filter`, in the
 * caller's transaction, each as {@linkcode requestCancel} does it. Jobs whose cancel was
 * already requested are left as they are. A `state` other than `queued` or `running` is an
 * `AkadzeError`. Returns how many jobs were marked (with `dryRun`: would be). An empty
 * filter takes every queued and running job.
 *
 * @example
 * ```ts ignore
 * import { cancelJobs } from "@akadze/akadze";
 * const marked = await app.sql.begin((tx) => cancelJobs(tx, { queue: "reports" }));
 * ```
 */
export async function cancelJobs(
  session: Session,
  filter: JobFilter = {},
  options: BulkOptions = {},
): Promise<number> {
  if (filter.state !== undefined && filter.state !== "queued" && filter.state !== "running") {
    throw new AkadzeError(
      `only queued or running jobs can be cancelled, got state ${filter.state}`,
    );
  }
  const schema = filter.schema ?? "akadze";
  const s = quoteSchema(schema);
  const params = filterParams(filter);
  const where = `${FILTER} and j.state in ('queued', 'running') and j.cancel_requested_at is null`;
  const [row] = await explainMissingSchema(
    schema,
    () =>
      options.dryRun
        ? session.unsafe(`select count(*)::int as n from ${s}.jobs j where ${where}`, params)
        : session.unsafe(
          `with marked as (
           update ${s}.jobs j set cancel_requested_at = now() where ${where}
           returning j.id, j.state),
         notified as (select pg_notify($5, m.id::text) from marked m where m.state = 'running')
         select (select count(*)::int from marked) as n,
                (select count(*)::int from notified) as notified`,
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
  errors: { error: string; message: string; at: string; stack?: string }[];
  /** The arguments (only with `includeArgs`). */
  args?: Record<string, unknown>;
  /** The result (only with `includeResult`). */
  result?: unknown;
}

/** Options of {@linkcode getJob}. */
export interface GetJobOptions extends AdminOptions {
  /** Include the arguments. Default false. */
  includeArgs?: boolean;
  /** Include the result. Default false. */
  includeResult?: boolean;
}

/**
 * One job with its error history (arguments and result only when asked), or null.
 *
 * @example
 * ```ts ignore
 * import { getJob } from "@akadze/akadze";
 * const job = await getJob(app, "42");
 * console.log(job?.state, job?.errors.at(-1)?.message);
 * ```
 */
export async function getJob(
  db: Database,
  jobId: string,
  options: GetJobOptions = {},
): Promise<JobDetail | null> {
  const [sql, s, schema] = target(db, options);
  const id = normalizeId(jobId);
  const [row] = await explainMissingSchema(schema, () =>
    sql.unsafe(
      `select ${SUMMARY_COLUMNS}, snoozes, errors, args, result from ${s}.jobs where id = $1::bigint`,
      [id],
    ));
  if (!row) return null;
  const detail: JobDetail = { ...toSummary(row), snoozes: row.snoozes, errors: row.errors };
  if (options.includeArgs) detail.args = row.args;
  if (options.includeResult) detail.result = row.result;
  return detail;
}

/** A worker row, as `listWorkers` returns it. */
export interface WorkerSummary {
  /** Worker id. */
  id: string;
  /** Host name. */
  hostname: string;
  /** Process id. */
  pid: number;
  /** Its queues. */
  queues: string[];
  /** Started at. */
  startedAt: Date;
  /** Last heartbeat. */
  heartbeatAt: Date;
  /** Its heartbeat TTL (ms). */
  heartbeatTtl: number;
  /** Whether its heartbeat is within its TTL. */
  alive: boolean;
  /** Jobs it runs now. */
  running: number;
}

/**
 * Registered workers, most recent heartbeat first.
 *
 * @example
 * ```ts ignore
 * import { listWorkers } from "@akadze/akadze";
 * console.table(await listWorkers(app));
 * ```
 */
export async function listWorkers(
  db: Database,
  options: AdminOptions = {},
): Promise<WorkerSummary[]> {
  const [sql, s, schema] = target(db, options);
  const rows = await explainMissingSchema(schema, () =>
    sql.unsafe(
      `select w.id, w.hostname, w.pid, w.queues, w.started_at, w.heartbeat_at, w.heartbeat_ttl_ms,
            w.heartbeat_at >= now() - w.heartbeat_ttl_ms * interval '1 millisecond' as alive,
            (select count(*) from ${s}.jobs j where j.worker_id = w.id and j.state = 'running')::int
              as running
       from ${s}.workers w order by w.heartbeat_at desc, w.id`,
    ));
  return rows.map((r) => ({
    id: r.id,
    hostname: r.hostname,
    pid: r.pid,
    queues: r.queues,
    startedAt: r.started_at,
    heartbeatAt: r.heartbeat_at,
    heartbeatTtl: r.heartbeat_ttl_ms,
    alive: r.alive,
    running: r.running,
  }));
}

/** A limits row with its current usage. */
export interface LimitSummary {
  /** The limit key. */
  key: string;
  /** Max running, or null. */
  maxRunning: number | null;
  /** Max starts per window, or null. */
  maxStarts: number | null;
  /** The window (ms), or null. */
  window: number | null;
  /** Jobs with the key running now. */
  running: number;
  /** Starts within the current window. */
  starts: number;
}

/** The columns of a {@linkcode LimitSummary}, for a limits row aliased `l`. */
function limitColumns(s: string): string {
  return `l.key, l.max_running, l.max_starts,
    (extract(epoch from l."window") * 1000)::float8 as window_ms,
    (select count(*) from ${s}.jobs j where j.state = 'running' and j.limit_key = l.key)::int
      as running,
    (select count(*) from ${s}.limit_starts m
      where m.key = l.key and m.started_at > now() - l."window")::int as starts`;
}

/**
 * Every limits row with its usage, by key.
 *
 * @example
 * ```ts ignore
 * import { listLimits } from "@akadze/akadze";
 * console.table(await listLimits(app));
 * ```
 */
export async function listLimits(
  db: Database,
  options: AdminOptions = {},
): Promise<LimitSummary[]> {
  const [sql, s, schema] = target(db, options);
  const rows = await explainMissingSchema(
    schema,
    () => sql.unsafe(`select ${limitColumns(s)} from ${s}.limits l order by l.key`),
  );
  return rows.map(toLimit);
}

/** A known queue, as `listQueues` returns it. */
export interface QueueSummary {
  /** The queue. */
  queue: string;
  /** Whether claims are paused. */
  paused: boolean;
  /** Queued jobs. */
  queued: number;
  /** Running jobs. */
  running: number;
  /** Failed jobs (kept until pruned). */
  failed: number;
}

/**
 * Every queue that has jobs or a pause, with its paused flag and counts.
 *
 * @example
 * ```ts ignore
 * import { listQueues } from "@akadze/akadze";
 * console.table(await listQueues(app));
 * ```
 */
export async function listQueues(
  db: Database,
  options: AdminOptions = {},
): Promise<QueueSummary[]> {
  return (await queueSnapshot(db, options)).map((q) => ({
    queue: q.queue,
    paused: q.paused,
    queued: q.counts.queued,
    running: q.counts.running,
    failed: q.counts.failed,
  }));
}

/** A job id as the database takes it; `AkadzeError` for anything but a decimal id. */
export function normalizeId(jobId: string | number | bigint): string {
  const id = String(jobId);
  if (!/^[1-9]\d{0,18}$/.test(id) || BigInt(id) > 9223372036854775807n) {
    throw new AkadzeError(`job id must be a positive decimal integer, got ${JSON.stringify(id)}`);
  }
  return id;
}

function checkKey(key: string): void {
  if (typeof key !== "string" || key.length === 0 || key.length > KEY_MAX) {
    throw new AkadzeError(`limit key must be a non-empty string of at most ${KEY_MAX} characters`);
  }
  // As enqueue checks limitKey: NUL cannot be stored, a lone surrogate would be mangled.
  const problem = jsonProblem(key, "limit key");
  if (problem) throw new AkadzeError(problem);
}

/** The pool, the quoted schema and the schema name of a read. */
function target(db: Database, options: AdminOptions): [Sql, string, string] {
  const schema = options.schema ?? (typeof db === "function" ? "akadze" : db.schema);
  return [typeof db === "function" ? db : db.sql, quoteSchema(schema), schema];
}

function toSummary(r: Record<string, unknown>): JobSummary {
  return {
    id: r.id as string,
    task: r.task as string,
    queue: r.queue as string,
    state: r.state as JobState,
    priority: r.priority as number,
    attempt: r.attempt as number,
    maxAttempts: r.max_attempts as number,
    runCount: r.run_count as number,
    runAt: r.run_at as Date,
    createdAt: r.created_at as Date,
    startedAt: r.started_at as Date | null,
    finishedAt: r.finished_at as Date | null,
    workerId: r.worker_id as string | null,
    uniqueKey: r.unique_key as string | null,
    limitKey: r.limit_key as string | null,
    expiresAt: r.expires_at as Date | null,
    cancelRequested: r.cancel_requested as boolean,
  };
}

function toLimit(r: Record<string, unknown>): LimitSummary {
  return {
    key: r.key as string,
    maxRunning: r.max_running as number | null,
    maxStarts: r.max_starts as number | null,
    window: r.window_ms === null ? null : Math.round(r.window_ms as number),
    running: r.running as number,
    starts: r.starts as number,
  };
}

/** Options of {@linkcode pruneJobs}. */
export interface PruneJobsOptions extends AdminOptions {
  /** Delete jobs finished more than this many milliseconds ago. Default 7 days. */
  olderThan?: number;
  /** Delete `failed` jobs too (by default only `succeeded` and `cancelled`). Default false. */
  includeFailed?: boolean;
  /** Count what would be deleted, delete nothing. Default false. */
  dryRun?: boolean;
  /** Rows per DELETE statement. Default 1000. */
  batchSize?: number;
}

/**
 * Delete terminal jobs finished more than `olderThan` ago: `succeeded` and `cancelled`
 * ones, and `failed` ones only with `includeFailed` (they are what `requeue` needs). Runs
 * bounded DELETE statements of `batchSize` rows until none are left (each its own
 * transaction on a pool, or all in the caller's transaction when `session` is one), and
 * skips rows another session holds locked (e.g. a worker's pruner). Returns how many jobs
 * it deleted, or with `dryRun` how many it would delete. The worker already prunes with
 * the app's `retention`; this is for one-off cleanups and for keeping failed jobs shorter
 * or longer than that.
 *
 * @example
 * ```ts ignore
 * import { pruneJobs } from "@akadze/akadze";
 * const deleted = await pruneJobs(app.sql, { olderThan: 86_400_000, includeFailed: true });
 * console.log(`deleted ${deleted} jobs`);
 * ```
 */
export async function pruneJobs(
  session: Session,
  options: PruneJobsOptions = {},
): Promise<number> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const olderThan = options.olderThan ?? 7 * 86_400_000;
  if (typeof olderThan !== "number" || !Number.isFinite(olderThan) || olderThan < 0) {
    throw new AkadzeError(
      `olderThan must be a non-negative number of milliseconds, got ${olderThan}`,
    );
  }
  const batchSize = options.batchSize ?? 1000;
  if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 100_000) {
    throw new AkadzeError(`batchSize must be an integer from 1 to 100000, got ${batchSize}`);
  }
  for (const name of ["includeFailed", "dryRun"] as const) {
    if (options[name] !== undefined && typeof options[name] !== "boolean") {
      throw new AkadzeError(`${name} must be a boolean, got ${options[name]}`);
    }
  }
  const includeFailed = options.includeFailed ?? false;
  return await explainMissingSchema(schema, async () => {
    if (options.dryRun) {
      const [row] = await session.unsafe(
        `select count(*)::float8 as n from ${s}.jobs where ${oldJobsCondition(includeFailed)}`,
        [olderThan],
      );
      return Number(row.n);
    }
    const statement = deleteOldJobsStatement(s, includeFailed);
    let total = 0;
    for (;;) {
      const { count } = await session.unsafe(statement, [olderThan, batchSize]);
      total += count;
      if (count < batchSize) return total;
    }
  });
}
