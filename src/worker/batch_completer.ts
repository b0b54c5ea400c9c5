/**
 * The batch completer: the queue of run outcomes waiting for their write. Outcomes that
 * settle while a write is in flight go together in the next statement (up to
 * `batchSize`); a transient failure is retried with the same outcomes; a batch that still
 * fails is split into single writes, and an outcome the database refuses for its values is
 * replaced by one that ends the job (`ResultNotStorable`, `OutcomeNotStorable`), so the run
 * is not put back and run again and again. An outcome whose onTransition hook rolled back
 * is queued again. Once abandoned (the worker gives up on its last writes), what is left
 * goes to the lease: other workers rescue those jobs.
 *
 * @module
 */
import { setImmediate } from "node:timers";
import type { Sql } from "../db.ts";
import type { DeadLetterTarget } from "../dead_letter.ts";
import { AkadzeError } from "../errors.ts";
import type { OnTransitionHook } from "../job.ts";
import type { ClaimedJob } from "./claimer.ts";
import {
  Completer,
  type CompleteResult,
  type HandOffer,
  type Outcome,
  retryTransient,
  unstorableOutcome,
  type WrittenRow,
} from "./completer.ts";
import {
  infoEnabled,
  type LoggedJob,
  logJobState,
  logOrphanReleased,
  logOutcomeDiscarded,
  logOutcomeNotStorable,
  logOutcomeRetry,
  logOutcomeWriteFailed,
  logTransitionRolledBack,
} from "./log_events.ts";
import { finishedOutcome, type WorkerMetrics } from "./worker_metrics.ts";

/** Outcomes one statement writes at most, by default. */
export const OUTCOME_BATCH_DEFAULT = 500;
/** How long an outcome whose onTransition hook failed waits before its next write (ms). */
export const ROLLED_BACK_RETRY_DEFAULT = 1_000;

/** Settings of a {@linkcode BatchCompleter}. */
export interface BatchCompleterConfig {
  /** The schema name. */
  schema: string;
  /** `onTransition` hooks (each outcome then gets its own transaction). */
  hooks: readonly OnTransitionHook[];
  /** Delete a succeeded job's row instead of marking it (the app's `retention: 0`). */
  deleteSucceeded?: boolean;
  /**
   * The connection of the last writes, after {@linkcode BatchCompleter.writeFinalOn}: the
   * loop's own, when the pool may be held by the very runs being put back.
   */
  finalSql?: Sql;
  /** Counts finished jobs by outcome. */
  metrics?: WorkerMetrics;
  /** The dead-letter targets of the app's tasks, by task name. */
  deadLetters?: ReadonlyMap<string, DeadLetterTarget>;
  /**
   * Called when a job's outcome or release could not be written (left to the lease): the
   * job may still be running under this worker id.
   */
  onUnwritten?: (jobId: string) => void;
  /** Called when a job's outcome is written, discarded or left to the lease. */
  onSettled?: (jobId: string) => void;
  /**
   * Called after a write that ended runs of jobs with a limit key, with their queues: each
   * freed a place under its key's `maxRunning`, which a claim may take now.
   */
  onLimitFreed?: (queues: string[]) => void;
  /**
   * The hand-off: what a write of successes that kept their slots (`complete(..., true)`) may
   * take for this worker, given one queue per kept slot and whether one of those runs had a
   * limit key (`keyed`: its key's next job may be handed); null to take nothing (stopping).
   */
  offer?: (queues: readonly string[], keyed: boolean) => HandOffer | null;
  /**
   * Called once per write with kept slots, after it: the kept slots (one queue each) are
   * free again, and `handed` are the jobs claimed for this worker in the write's transaction,
   * to start in them. `lost`: a try of the write that offered slots failed, and may have
   * committed a hand-off all the same (a job running under this worker that it does not know).
   * `jobs`: the kept slots' jobs, id and task (as `queues`, one per slot); `written`: the write
   * succeeded (else `handed` is empty because it failed).
   */
  onHandOff?: (
    queues: string[],
    handed: ClaimedJob[],
    lost: boolean,
    jobs: { id: string; task: string }[],
    written: boolean,
  ) => void;
  /** Called per written outcome of a job of `task` on which other jobs depend. */
  onDependents?: (task: string) => void;
  /** Outcomes per statement at most. Default {@linkcode OUTCOME_BATCH_DEFAULT}. */
  batchSize?: number;
  /** Wait before rewriting a rolled-back outcome. Default {@linkcode ROLLED_BACK_RETRY_DEFAULT}. */
  rolledBackRetry?: number;
}

/** What the writes did (see {@linkcode BatchCompleter.runOnce}). */
export interface BatchCounts {
  /** Outcomes written (the job changed state). */
  written: number;
  /** Outcomes discarded: the run no longer owned the job. */
  discarded: number;
  /** Outcomes replaced because the database refused their values. */
  unstorable: number;
  /** Outcomes that could not be written (left to the lease). */
  failed: number;
  /** Outcomes queued again after an onTransition hook rolled them back. */
  rolledBack: number;
  /** Batches split into single writes after a failure. */
  split: number;
}

/** A finished run's job, as the writes need it: for the log, and its limit key. */
export interface CompletedJob extends LoggedJob {
  /** The job's limit key, if any. */
  limit_key?: string | null;
}

interface Pending {
  outcome: Outcome;
  /** The run's slot is kept for the jobs this write may hand to the worker. */
  kept?: boolean;
  /** For the log lines and metrics (absent for an orphan release). */
  job?: CompletedJob;
  /** Called once the outcome is written, discarded or left to the lease. */
  done: () => void;
}

/** Writes one worker's outcomes in batches. */
export class BatchCompleter {
  /** The single-statement writer on the pool (also `ctx.completeTx`'s). */
  readonly writer: Completer;
  #final: Completer;
  #config:
    & Required<
      Omit<
        BatchCompleterConfig,
        | "finalSql"
        | "metrics"
        | "onLimitFreed"
        | "deadLetters"
        | "offer"
        | "onHandOff"
        | "onDependents"
      >
    >
    & Pick<
      BatchCompleterConfig,
      "metrics" | "onLimitFreed" | "offer" | "onHandOff" | "onDependents"
    >;
  #deadLetters: ReadonlyMap<string, DeadLetterTarget>;
  #writeFinal = false;
  #pending: Pending[] = [];
  #unwritten = new Set<string>();
  #allWritten: (() => void)[] = [];
  #releasing = new Set<string>();
  #flushing: Promise<void> | null = null;
  #abandon = new AbortController();
  #counts: BatchCounts = zeroCounts();
  /** Tasks a written job of which had dependents. */
  #withDependents = new Set<string>();

  /** Make a batch completer on a pool; settings are validated now (`AkadzeError`). */
  constructor(sql: Sql, config: BatchCompleterConfig) {
    const batchSize = config.batchSize ?? OUTCOME_BATCH_DEFAULT;
    const rolledBackRetry = config.rolledBackRetry ?? ROLLED_BACK_RETRY_DEFAULT;
    if (!Number.isInteger(batchSize) || batchSize < 1) {
      throw new AkadzeError(`batchSize must be a positive integer, got ${batchSize}`);
    }
    if (!(rolledBackRetry >= 0)) {
      throw new AkadzeError(
        `rolledBackRetry must be a number of milliseconds, got ${rolledBackRetry}`,
      );
    }
    const options = { deleteSucceeded: config.deleteSucceeded ?? false };
    this.#deadLetters = config.deadLetters ?? new Map();
    this.writer = new Completer(sql, config.schema, config.hooks, options);
    this.#final = config.finalSql
      ? new Completer(config.finalSql, config.schema, config.hooks, options)
      : this.writer;
    this.#config = {
      schema: config.schema,
      hooks: config.hooks,
      deleteSucceeded: options.deleteSucceeded,
      metrics: config.metrics,
      onSettled: config.onSettled ?? (() => {}),
      onUnwritten: config.onUnwritten ?? (() => {}),
      onLimitFreed: config.onLimitFreed,
      offer: config.offer,
      onHandOff: config.onHandOff,
      onDependents: config.onDependents,
      batchSize,
      rolledBackRetry,
    };
  }

  /** How many jobs' outcomes wait for their write. */
  get unwritten(): number {
    return this.#unwritten.size;
  }

  /** The jobs whose outcome waits for its write. */
  ids(): IterableIterator<string> {
    return this.#unwritten.keys();
  }

  /**
   * Queue a run's outcome; it is written with the others that settle in the same turn. With
   * `kept`, the run's slot is kept for the hand-off of its write (`onHandOff` frees it).
   */
  complete(outcome: Outcome, job: CompletedJob, kept = false): void {
    const dead = this.#deadLetters.get(job.task);
    if (dead) outcome.deadLetter = dead;
    this.#unwritten.add(outcome.id);
    const pending: Pending = { outcome, job, kept, done: () => this.#settled(outcome.id) };
    this.#push(pending);
  }

  /**
   * Log and count a success that `ctx.completeTx` wrote in its own transaction, as an
   * outcome written here is: every outcome, however written, is logged and counted once.
   */
  completedInTx(id: string, job: CompletedJob): void {
    this.#record({ id, state: "succeeded", attempt: job.attempt }, infoEnabled(), undefined, job);
    if (job.limit_key != null) this.#config.onLimitFreed?.([job.queue]);
  }

  /** The log line and the metrics of one written outcome. */
  #record(row: WrittenRow, log: boolean, outcome?: Outcome, job?: LoggedJob): void {
    if (log || row.state === "failed") logJobState(row, "running", outcome, job);
    const finished = job && finishedOutcome(row.state, outcome?.kind ?? "succeeded");
    if (finished) this.#config.metrics?.finished(job.task, job.queue, finished);
  }

  /**
   * Put jobs back that the database says this worker runs but it does not (fenced on their
   * run_count, no attempt spent); each once at a time, logged `orphan_released`.
   */
  release(orphans: readonly { id: string; runCount: number }[]): void {
    for (const { id, runCount } of orphans) {
      if (this.#releasing.has(id)) continue;
      this.#releasing.add(id);
      logOrphanReleased(id, runCount);
      new Promise<void>((done) => this.#push({ outcome: { id, runCount, kind: "release" }, done }))
        .finally(() => this.#releasing.delete(id));
    }
  }

  /** Write what is queued now; resolves with what the writes since the last call did. */
  async runOnce(): Promise<BatchCounts> {
    const before = { ...this.#counts };
    await this.#flushing;
    await this.#flush();
    const counts = zeroCounts();
    for (const key of Object.keys(counts) as (keyof BatchCounts)[]) {
      counts[key] = this.#counts[key] - before[key];
    }
    return counts;
  }

  /** Resolves once no outcome waits for its write. */
  untilAllWritten(): Promise<void> {
    if (this.#unwritten.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#allWritten.push(resolve));
  }

  /**
   * Wait until every outcome is written, abandoning the rest after `timeoutMs`: a write can
   * be stuck in the driver (its reconnect backoff while the database is down) long after.
   */
  async finish(timeoutMs: number): Promise<void> {
    const timer = setTimeout(() => this.abandon(), timeoutMs);
    const signal = this.#abandon.signal;
    await Promise.race([
      this.untilAllWritten(),
      new Promise((resolve) =>
        signal.aborted ? resolve(null) : signal.addEventListener("abort", resolve, { once: true })
      ),
    ]);
    clearTimeout(timer);
  }

  /** Write on `finalSql` from now on (true), or on the pool again (false: a new run). */
  writeFinalOn(final: boolean): void {
    this.#writeFinal = final;
  }

  /** Stop retrying: what is not written yet is left to the lease. */
  abandon(): void {
    this.#abandon.abort();
  }

  #settled(jobId: string): void {
    this.#unwritten.delete(jobId);
    this.#config.onSettled(jobId);
    if (this.#unwritten.size === 0) {
      for (const resolve of this.#allWritten.splice(0)) resolve();
    }
  }

  #push(pending: Pending): void {
    this.#pending.push(pending);
    this.#scheduleFlush();
  }

  #scheduleFlush(): void {
    if (this.#flushing) return;
    // Start one macrotask later, so outcomes settling in the same turn share a statement.
    // Not setTimeout(0): from a timer's turn (a handler that waited on one) it fires 2-4 ms
    // later, which every outcome would wait.
    this.#flushing = new Promise((r) => setImmediate(r))
      .then(() => this.#flush())
      .finally(() => {
        this.#flushing = null;
        // An outcome queued between the flush's last look and now would wait forever.
        if (this.#pending.length > 0) this.#scheduleFlush();
      });
  }

  async #flush(): Promise<void> {
    while (this.#pending.length > 0) {
      // Outcomes that finished while the previous write was in flight go in one statement.
      await this.#writeBatch(this.#pending.splice(0, this.#config.batchSize));
    }
  }

  async #writeBatch(batch: Pending[]): Promise<void> {
    const signal = this.#abandon.signal;
    const completer = this.#writeFinal ? this.#final : this.writer;
    const kept = batch.filter((p) => p.kept);
    // The update alone when no job of the batch is of a task seen with dependents (a flow's
    // steps are counted down per statement by the full write).
    const plain = batch.every((p) => p.job !== undefined && !this.#withDependents.has(p.job.task));
    let lost = false;
    let result: CompleteResult;
    try {
      result = await retryTransient(() => {
        // Asked again on every try: the worker may have begun to stop meanwhile.
        const offer = kept.length > 0 && this.#config.offer
          ? this.#config.offer(
            kept.map((p) => p.job!.queue),
            kept.some((p) => p.job!.limit_key != null),
          )
          : null;
        const write = completer.write(batch.map((p) => p.outcome), offer ?? undefined, { plain });
        if (!offer) return write;
        return write.catch((error) => {
          lost = true;
          throw error;
        });
      }, {
        signal,
        onRetry: (error, delay) => logOutcomeRetry(delay, error),
      });
    } catch (error) {
      this.#handOff(kept, [], lost, false);
      if (signal.aborted) {
        for (const p of batch) {
          this.#config.onUnwritten(p.outcome.id);
          p.done(); // left to the lease
        }
        return;
      }
      if (batch.length > 1) {
        this.#counts.split++;
        for (const p of batch) await this.#writeBatch([p]);
        return;
      }
      return await this.#writeAlone(batch[0], error);
    }
    const byId = new Map(batch.map((p) => [p.outcome.id, p]));
    const log = infoEnabled();
    const onDependents = this.#config.onDependents;
    // Per limit key, the queues of the runs written: each freed a place under the key, which a
    // job the write handed from that key took already (no claim needs waking for it).
    let freed: Map<string, string[]> | null = null;
    for (const row of result.written) {
      const p = byId.get(row.id);
      this.#record(row, log, p?.outcome, p?.job);
      this.#counts.written++;
      const key = p?.job?.limit_key;
      if (key != null) {
        const queues = (freed ??= new Map()).get(key);
        if (queues) queues.push(p!.job!.queue);
        else freed.set(key, [p!.job!.queue]);
      }
      if (row.hasDependents && p?.job) {
        this.#withDependents.add(p.job.task);
        onDependents?.(p.job.task);
      }
      p?.done();
    }
    if (freed) {
      for (const job of result.handed) {
        if (job.limit_key != null) freed.get(job.limit_key)?.pop();
      }
      const queues = new Set([...freed.values()].flat());
      if (queues.size > 0) this.#config.onLimitFreed?.([...queues]);
    }
    for (const outcome of result.stale) {
      logOutcomeDiscarded(outcome);
      this.#counts.discarded++;
      byId.get(outcome.id)?.done();
    }
    // The kept slots, and the jobs handed to start in them.
    this.#handOff(kept, result.handed, lost, true);
    for (const { item, error } of result.rolledBack) {
      logTransitionRolledBack(item.id, error);
      const p = byId.get(item.id);
      if (!p) continue;
      this.#counts.rolledBack++;
      await new Promise((r) => setTimeout(r, this.#config.rolledBackRetry));
      if (signal.aborted) {
        this.#config.onUnwritten(item.id);
        p.done();
      } else this.#pending.push(p);
    }
  }

  /** Free the slots kept for a write's hand-off, with the jobs it handed (see `onHandOff`). */
  #handOff(kept: Pending[], handed: ClaimedJob[], lost: boolean, written: boolean): void {
    const queues: string[] = [];
    const jobs: { id: string; task: string }[] = [];
    for (const p of kept) {
      if (!p.kept) continue;
      p.kept = false;
      queues.push(p.job!.queue);
      jobs.push({ id: p.outcome.id, task: p.job!.task });
    }
    if (queues.length === 0 && handed.length === 0 && !lost) return;
    this.#config.onHandOff?.(queues, handed, lost, jobs, written);
  }

  /** A single outcome whose write failed for good: store a replacement, or give up. */
  async #writeAlone(p: Pending, error: unknown): Promise<void> {
    const replacement = unstorableOutcome(p.outcome, error);
    if (replacement) {
      // The database refused the values themselves: record that, do not run the job again.
      logOutcomeNotStorable(p.outcome, error);
      this.#counts.unstorable++;
      replacement.durationMs = p.outcome.durationMs;
      p.outcome = replacement;
      return await this.#writeBatch([p]);
    }
    logOutcomeWriteFailed(p.outcome, error);
    this.#counts.failed++;
    this.#config.onUnwritten(p.outcome.id);
    p.done();
  }
}

function zeroCounts(): BatchCounts {
  return { written: 0, discarded: 0, unstorable: 0, failed: 0, rolledBack: 0, split: 0 };
}
