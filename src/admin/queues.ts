/**
 * Operating queues from code (pause, resume) and reading their state: the per-queue and
 * per-state job counts, the ready jobs and their lag, and the pauses. `queueSnapshot`,
 * `listQueues`, the Prometheus metrics and `akadze health` all read through the readers
 * here.
 *
 * @module
 */
import { explainMissingSchema, jobsChannel, quoteSchema, type TransactionSql } from "../db.ts";
import { JOB_STATES, type JobState } from "../job.ts";
import { checkQueueName } from "../rules.ts";
import { readyCondition } from "../ready_rule.ts";
import { type AdminOptions, type Database, readTarget, type Session } from "./database.ts";

/**
 * Stop claims from a queue (running jobs finish; enqueue still works). Returns false when
 * it was already paused.
 *
 * @example
 * ```ts ignore
 * import { pauseQueue } from "@akadze/akadze/admin";
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
 * Whether a queue is known to the database: some job (in any state) is in it, a worker
 * registered to serve it, or it is paused. A pause of an unknown queue is most likely a
 * typo, which `akadze queues pause` refuses without `--force`.
 *
 * @example
 * ```ts ignore
 * import { queueKnown } from "@akadze/akadze/admin";
 * if (!await queueKnown(app.sql, "mail")) console.warn("no job or worker uses queue mail");
 * ```
 */
export async function queueKnown(
  session: Session,
  queue: string,
  options: AdminOptions = {},
): Promise<boolean> {
  const schema = options.schema ?? "akadze";
  const s = quoteSchema(schema);
  const name = checkQueueName(queue);
  const [row] = await explainMissingSchema(schema, () =>
    session.unsafe(
      `select exists (select 1 from ${s}.jobs where queue operator(pg_catalog.=) $1)
           or exists (select 1 from ${s}.workers where $1 operator(pg_catalog.=) any (queues))
           or exists (select 1 from ${s}.queue_pauses where queue operator(pg_catalog.=)
             $1) as known`,
      [name],
    ));
  return row.known === true;
}

/**
 * Resume claims from a paused queue and wake its workers. Returns false when it was not
 * paused.
 *
 * @example
 * ```ts ignore
 * import { resumeQueue } from "@akadze/akadze/admin";
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
      `with resumed as (delete from ${s}.queue_pauses where queue operator(pg_catalog.=)
        $1 returning queue)
       select queue, pg_catalog.pg_notify($2, queue) from resumed`,
      [name, jobsChannel(schema)],
    ));
  return rows.length > 0;
}

/** Jobs of one queue in one state, from {@linkcode readJobCounts}. */
export interface JobCountRow {
  /** The queue. */
  queue: string;
  /** The state. */
  state: JobState;
  /** Jobs of the queue in the state (more than 0). */
  n: number;
}

/**
 * Jobs per queue and state (only pairs that have jobs), ordered by queue and state, in
 * schema `s` (quoted). For a consistent picture, read it in the same repeatable-read
 * transaction as the other queue-state readers.
 */
export async function readJobCounts(tx: TransactionSql, s: string): Promise<JobCountRow[]> {
  const rows = await tx.unsafe(
    `select queue, state, pg_catalog.count(*)::bigint as n from ${s}.jobs
      group by queue, state order by queue, state`,
  );
  return rows.map((r) => ({ queue: r.queue, state: r.state, n: Number(r.n) }));
}

/** The ready jobs of one queue, from {@linkcode readReadyJobs}. */
export interface ReadyJobsRow {
  /** The queue. */
  queue: string;
  /** Queued jobs whose run_at has passed (more than 0). */
  ready: number;
  /** Seconds the oldest of them has waited (never negative). */
  lag: number;
}

/**
 * Per queue with ready jobs (as a claim sees them: queued, run_at passed, no cancel request,
 * not expired): how many, and how long the oldest has waited, ordered by queue, in schema
 * `s` (quoted); only the given `queues` when there are some.
 */
export async function readReadyJobs(
  tx: TransactionSql,
  s: string,
  queues: readonly string[] | null = null,
): Promise<ReadyJobsRow[]> {
  const rows = await tx.unsafe(
    // A run_at of -infinity (possible from SQL) waits since the job was enqueued: now()
    // minus an infinite timestamp is an error that would fail health and metrics.
    `select queue, pg_catalog.count(*)::bigint as ready,
            greatest(extract(epoch from pg_catalog.now() operator(pg_catalog.-)
              pg_catalog.min(case when pg_catalog.isfinite(run_at) then run_at
                                  else created_at end)), 0)::pg_catalog.float8 as lag
       from ${s}.jobs c
      where ${readyCondition()}
        and ($1::pg_catalog.text[] is null or queue
          operator(pg_catalog.=) any($1::pg_catalog.text[]))
      group by queue order by queue`,
    [queues as never],
  );
  return rows.map((r) => ({ queue: r.queue, ready: Number(r.ready), lag: Math.max(0, r.lag) }));
}

/** The paused queues, by name, in schema `s` (quoted). */
export async function readPausedQueues(tx: TransactionSql, s: string): Promise<string[]> {
  const rows = await tx.unsafe(`select queue from ${s}.queue_pauses order by queue`);
  return rows.map((r) => r.queue as string);
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
 * import { queueSnapshot } from "@akadze/akadze/admin";
 * for (const q of await queueSnapshot(app)) console.log(q.queue, q.lagSeconds);
 * ```
 */
export async function queueSnapshot(
  db: Database,
  options: AdminOptions = {},
): Promise<QueueSnapshot[]> {
  const [sql, s, schema] = readTarget(db, options);
  const state = await explainMissingSchema(
    schema,
    () => sql.begin("isolation level repeatable read read only", (tx) => readQueueState(tx, s)),
  );
  return queueSnapshots(state);
}

/** What {@linkcode readQueueState} reads: the rows of the three queue-state readers. */
export interface QueueState {
  /** {@linkcode readJobCounts}. */
  counts: JobCountRow[];
  /** {@linkcode readReadyJobs} of every queue. */
  ready: ReadyJobsRow[];
  /** {@linkcode readPausedQueues}. */
  pauses: string[];
}

/**
 * The job counts, ready jobs and pauses of every queue in schema `s` (quoted); in a
 * repeatable-read transaction they are one consistent picture.
 */
export async function readQueueState(tx: TransactionSql, s: string): Promise<QueueState> {
  return {
    counts: await readJobCounts(tx, s),
    ready: await readReadyJobs(tx, s),
    pauses: await readPausedQueues(tx, s),
  };
}

/**
 * One {@linkcode QueueSnapshot} per queue that has jobs or a pause, ordered by name
 * (`localeCompare`).
 */
export function queueSnapshots(rows: QueueState): QueueSnapshot[] {
  const paused = new Set(rows.pauses);
  const byQueue = new Map<string, QueueSnapshot>();
  const entry = (queue: string): QueueSnapshot => {
    let q = byQueue.get(queue);
    if (!q) {
      q = {
        queue,
        counts: Object.fromEntries(JOB_STATES.map((st) => [st, 0])) as Record<JobState, number>,
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
    q.counts[r.state] = r.n;
    if (r.state === "running") q.busy = r.n;
  }
  for (const r of rows.ready) {
    const q = entry(r.queue);
    q.ready = r.ready;
    q.lagSeconds = r.lag;
  }
  for (const queue of paused) entry(queue);
  return [...byQueue.values()].sort((a, b) => a.queue.localeCompare(b.queue));
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
 * import { listQueues } from "@akadze/akadze/admin";
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
