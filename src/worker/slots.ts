/**
 * The worker's slots: which jobs run now, how many per queue, and how many more each queue
 * may claim (per queue, or one pool of `slots` shared by all queues with `fair`).
 *
 * @module
 */
import type { ClaimRequest } from "./claimer.ts";
import type { Execution } from "./executor.ts";

/** Settings of {@linkcode Slots}: the worker's `queues`, `slots` and `fair`. */
export interface SlotsConfig {
  /** The queues claimed from. */
  readonly queues: readonly string[];
  /** Concurrent runs per queue (or in total with `fair`). */
  readonly slots: number;
  /** One pool of `slots` for all queues. */
  readonly fair: boolean;
}

/** A run in a slot; `execution` is null only while its start() has not returned. */
export interface Running {
  /** The run, to interrupt it. */
  execution: Execution | null;
  /** Its queue. */
  queue: string;
}

/** Counts the runs of one worker. */
export class Slots {
  #config: SlotsConfig;
  #runs = new Map<string, Running>();
  /** Running jobs per queue (kept beside #runs: counting it per finish is O(slots)). */
  #busy = new Map<string, number>();

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

  /** Every run, to interrupt them all. */
  runs(): Running[] {
    return [...this.#runs.values()];
  }

  /** The run of a job, if it runs here. */
  get(jobId: string): Running | undefined {
    return this.#runs.get(jobId);
  }

  /** Take a slot for a job. */
  add(jobId: string, run: Running): void {
    this.#runs.set(jobId, run);
    this.#busy.set(run.queue, (this.#busy.get(run.queue) ?? 0) + 1);
  }

  /** Free a job's slot. */
  delete(jobId: string, queue: string): void {
    this.#runs.delete(jobId);
    this.#busy.set(queue, this.#busy.get(queue)! - 1);
  }

  /** Whether `queue` has no free slot. */
  isFull(queue: string): boolean {
    if (this.#config.fair) return this.#runs.size >= this.#config.slots;
    return (this.#busy.get(queue) ?? 0) >= this.#config.slots;
  }

  /**
   * How many outcomes may wait for their write before claiming stops: twice the slots,
   * room for one claim to overlap the write of the previous one.
   */
  get writeLimit(): number {
    const { slots, fair, queues } = this.#config;
    return 2 * slots * (fair ? 1 : queues.length);
  }

  /** The free slots per queue, and how many jobs that makes in all. */
  free(): { requests: ClaimRequest[]; total: number } {
    const { queues, slots, fair } = this.#config;
    if (fair) {
      const total = slots - this.#runs.size;
      return { requests: queues.map((queue) => ({ queue, slots: total })), total };
    }
    const requests = queues.map((queue) => ({ queue, slots: slots - (this.#busy.get(queue) ?? 0) }))
      .filter((r) => r.slots > 0);
    return { requests, total: requests.reduce((sum, r) => sum + r.slots, 0) };
  }
}
