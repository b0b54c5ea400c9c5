/**
 * The worker's slots: which jobs run now, how many per queue, how many more each queue may
 * claim (per queue, or one pool of `slots` shared by all queues with `fair`). A claimed job
 * starts here in the executor; when its run ends, its slot is freed and its outcome goes
 * to the batch completer, so the next claim overlaps the write.
 *
 * @module
 */
import type { BatchCompleter } from "./batch_completer.ts";
import type { ClaimedJob, ClaimRequest } from "./claimer.ts";
import type { Execution, Executor, Interrupt } from "./executor.ts";
import { logCancelRequested } from "./log_events.ts";
import type { RunRef } from "./loop_blocks.ts";
import type { WorkerMetrics } from "./worker_metrics.ts";

/** Settings of {@linkcode Slots}: the worker's `queues`, `slots` and `fair`, and its parts. */
export interface SlotsConfig {
  /** The queues claimed from. */
  readonly queues: readonly string[];
  /** Concurrent runs per queue (or in total with `fair`). */
  readonly slots: number;
  /** One pool of `slots` for all queues. */
  readonly fair: boolean;
  /** Runs the jobs. */
  readonly executor: Executor;
  /** Writes their outcomes. */
  readonly completer: BatchCompleter;
  /** Observes the run durations. */
  readonly metrics?: WorkerMetrics;
  /** A slot was freed; `wasFull`: its queue had no room (or the writes none) before. */
  readonly onFreed?: (wasFull: boolean) => void;
  /**
   * Whether a run of `row` that succeeded keeps its slot until its outcome is written, for
   * the dependents the write may hand to this worker (see {@linkcode Slots.release}).
   */
  readonly keepFor?: (row: ClaimedJob) => boolean;
}

/** A run in a slot; `execution` is null only while its start() has not returned. */
interface Running {
  /** The run, to interrupt it. */
  execution: Execution | null;
  /** Its queue. */
  queue: string;
  /** Its task. */
  task: string;
  /** Its claim's run_count. */
  runCount: number;
}

/** Counts the runs of one worker. */
export class Slots {
  #config: SlotsConfig;
  #runs = new Map<string, Running>();
  /** Running jobs per queue (kept beside #runs: counting it per finish is O(slots)). */
  #busy = new Map<string, number>();
  /** Slots kept for a hand-off per queue (finished runs whose outcome is being written). */
  #kept = new Map<string, number>();
  #keptTotal = 0;

  /** Make empty slots. */
  constructor(config: SlotsConfig) {
    this.#config = config;
  }

  /** How many jobs run now. */
  get size(): number {
    return this.#runs.size;
  }

  /** Running jobs per queue (for the metrics). */
  get busy(): ReadonlyMap<string, number> {
    return this.#busy;
  }

  /** The ids of the running jobs. */
  ids(): IterableIterator<string> {
    return this.#runs.keys();
  }

  /** The running jobs by their claim (for the bystanders of a loop block). */
  runs(): RunRef[] {
    return [...this.#runs].map(([id, run]) => ({ id, runCount: run.runCount, task: run.task }));
  }

  /** Take a slot for a claimed job and start its run. */
  start(row: ClaimedJob): void {
    const run: Running = {
      execution: null,
      queue: row.queue,
      task: row.task,
      runCount: row.run_count,
    };
    this.#runs.set(row.id, run);
    this.#busy.set(row.queue, (this.#busy.get(row.queue) ?? 0) + 1);
    // The outcome may come before start() returns (a synchronous handler).
    const execution = this.#config.executor.start(row, (outcome, durationMs, span) => {
      const wasFull = this.isFull(row.queue) || this.writeRoom() <= 0;
      this.#config.metrics?.observe(row.task, row.queue, durationMs);
      this.#runs.delete(row.id);
      this.#busy.set(row.queue, this.#busy.get(row.queue)! - 1);
      const keep = outcome?.kind === "succeeded" && this.#config.keepFor?.(row) === true;
      if (keep) {
        // Still taken for the claims: its write may hand this worker a job to run in it.
        this.#kept.set(row.queue, (this.#kept.get(row.queue) ?? 0) + 1);
        this.#keptTotal++;
      } else this.#config.onFreed?.(wasFull);
      // With tracing on, the log record of the outcome carries the run's span.
      const job = span === undefined ? row : { ...row, span };
      if (outcome) this.#config.completer.complete(outcome, job, keep);
      else this.#config.completer.completedInTx(row.id, job);
    });
    if (this.#runs.get(row.id) === run) run.execution = execution;
  }

  /** Free slots kept for a hand-off, one per queue given (each as many times as kept). */
  release(queues: readonly string[]): void {
    for (const queue of queues) {
      this.#kept.set(queue, this.#kept.get(queue)! - 1);
      this.#keptTotal--;
    }
  }

  /** A running job's cancel request (listener, heartbeat): interrupt its run. */
  cancel(jobId: string): void {
    const run = this.#runs.get(jobId);
    if (!run) return;
    logCancelRequested(jobId);
    run.execution?.interrupt("cancel");
  }

  /**
   * Interrupt the run of `jobId` (see `Execution.interrupt`); false when it does not run
   * here.
   */
  interrupt(jobId: string, reason: Interrupt, error?: Error): boolean {
    const run = this.#runs.get(jobId);
    if (!run) return false;
    run.execution?.interrupt(reason, error);
    return true;
  }

  /** Interrupt every run: each settles its outcome at once. */
  interruptAll(reason: Interrupt): void {
    for (const run of [...this.#runs.values()]) run.execution?.interrupt(reason);
  }

  /**
   * How many more jobs may be claimed before the outcomes waiting for their write exceed
   * twice the slots: room for one claim to overlap the write of the previous one, while a
   * stalled write path still stops the claiming.
   */
  writeRoom(): number {
    const { slots, fair, queues, completer } = this.#config;
    return 2 * slots * (fair ? 1 : queues.length) - completer.unwritten;
  }

  /** Whether `queue` has no free slot. */
  isFull(queue: string): boolean {
    if (this.#config.fair) return this.#runs.size + this.#keptTotal >= this.#config.slots;
    return (this.#busy.get(queue) ?? 0) + (this.#kept.get(queue) ?? 0) >= this.#config.slots;
  }

  /** The free slots per queue (not those kept for a hand-off), and how many jobs in all. */
  free(): { requests: ClaimRequest[]; total: number } {
    const { queues, slots, fair } = this.#config;
    if (fair) {
      const total = slots - this.#runs.size - this.#keptTotal;
      return { requests: queues.map((queue) => ({ queue, slots: total })), total };
    }
    const requests = queues.map((queue) => ({
      queue,
      slots: slots - (this.#busy.get(queue) ?? 0) - (this.#kept.get(queue) ?? 0),
    })).filter((r) => r.slots > 0);
    return { requests, total: requests.reduce((sum, r) => sum + r.slots, 0) };
  }
}
