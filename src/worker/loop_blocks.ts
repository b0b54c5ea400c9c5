/**
 * Loop blocks: a handler that computes without awaiting holds the worker's event loop, and
 * with it the heartbeat, every other run and the outcome writes. The executor measures the
 * synchronous part of each handler call and reports it here; a lag timer catches a block
 * in a later part of a run (after an `await`). A block above `warnAfter` is logged with the
 * task and job that caused it; a block long enough to cost the lease is kept until the
 * loop's next beat, when the worker writes down what the block did (see
 * `Rescuer.chargeBlock`): other workers may have rescued its jobs meanwhile.
 *
 * @module
 */
import { checkInteger } from "./config.ts";
import { logLoopBlocked, type LoopBlock, type RunRef } from "./log_events.ts";

/** How long (ms) a handler may hold the event loop before a `loop_blocked` warning, by default. */
export const LOOP_BLOCK_WARN_DEFAULT = 1_000;
/** How often the lag timer looks (ms). */
const LAG_TICK = 250;

// The shapes live beside the log record that prints them (no import cycle).
export type { LoopBlock, RunRef } from "./log_events.ts";

/** Settings of {@linkcode LoopBlocks}. */
export interface LoopBlocksConfig {
  /** The worker's heartbeatTtl (ms): a block that long may have cost the lease. */
  heartbeatTtl: number;
  /** The worker's heartbeatInterval (ms): the last beat may be that old when a block starts. */
  heartbeatInterval: number;
  /** Warn from this long (ms). Default {@linkcode LOOP_BLOCK_WARN_DEFAULT}. */
  warnAfter?: number;
  /** The jobs of the worker now (for the bystanders of a block). */
  jobs: () => RunRef[];
  /**
   * Whether a job's handler runs off the loop (a sandboxed task's): such a job is never
   * taken for the one that blocked it. Default: none does.
   */
  sandboxed?: (job: RunRef) => boolean;
}

/** Notices, logs and keeps the blocks of one worker's event loop. */
export class LoopBlocks {
  #config: Required<LoopBlocksConfig>;
  #pending: LoopBlock[] = [];
  #timer: ReturnType<typeof setInterval> | undefined;
  #tickAt = 0;
  /** When the executor last reported a block (a late tick then needs no second report). */
  #reportedAt = -Infinity;

  /** Make the block keeper of a worker; `warnAfter` is validated now. */
  constructor(config: LoopBlocksConfig) {
    const warnAfter = checkInteger(
      "loopBlockWarning",
      config.warnAfter ?? LOOP_BLOCK_WARN_DEFAULT,
      1,
      2 ** 31 - 1,
    );
    this.#config = { sandboxed: () => false, ...config, warnAfter };
  }

  /** The warning threshold (ms). */
  get warnAfter(): number {
    return this.#config.warnAfter;
  }

  /**
   * The executor's report: job `culprit` held the loop for `ms` in one synchronous part of
   * its run. Only called above the threshold, so the fast path costs a clock read.
   */
  report(culprit: RunRef, ms: number): void {
    this.#reportedAt = performance.now();
    const others = this.#config.jobs().filter((job) => job.id !== culprit.id);
    this.#add({ culprit, ms, ...this.#split(others) });
  }

  /** Start the lag timer (a block after an `await` of a handler). */
  start(): void {
    this.stop();
    this.#tickAt = performance.now();
    this.#timer = setInterval(() => {
      const now = performance.now();
      const lag = now - this.#tickAt - LAG_TICK;
      this.#tickAt = now;
      // The executor already named this block.
      if (lag < this.#config.warnAfter || now - this.#reportedAt < LAG_TICK) return;
      const { bystanders, outside } = this.#split(this.#config.jobs());
      // One job running on the loop: it blocked the loop. Several: the worker cannot tell
      // which. A sandboxed job's handler runs off the loop: it cannot have.
      const culprit = bystanders.length === 1 ? bystanders[0] : null;
      this.#add({ culprit, ms: lag, bystanders: culprit ? [] : bystanders, outside });
    }, LAG_TICK);
  }

  /** Stop the lag timer. */
  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** The blocks that may have cost the lease, since the last call (for `chargeBlock`). */
  take(): LoopBlock[] {
    return this.#pending.splice(0);
  }

  /** Jobs whose handlers run on the loop, and sandboxed ones. */
  #split(jobs: RunRef[]): { bystanders: RunRef[]; outside: RunRef[] } {
    const { sandboxed } = this.#config;
    return {
      bystanders: jobs.filter((job) => !sandboxed(job)),
      outside: jobs.filter((job) => sandboxed(job)),
    };
  }

  #add(block: LoopBlock): void {
    logLoopBlocked(block, this.#config.heartbeatTtl);
    const { heartbeatTtl, heartbeatInterval } = this.#config;
    if (block.ms + heartbeatInterval >= heartbeatTtl) this.#pending.push(block);
  }
}
