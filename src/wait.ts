/**
 * Awaiting outcomes from outside a worker: `app.waitForJob` and `app.waitForJobs`. One
 * waiter set per app shares one LISTEN (opened on first use, closed by `app.close()`): a
 * waiter marks its jobs `awaited`, and the trigger of migrations/0007_await_progress.sql
 * notifies when such a job finishes or reports progress. A poll of the pending jobs every
 * `pollInterval` covers a pooler that drops notifications, a LISTEN that failed, and a
 * notification lost while the LISTEN connection reconnected.
 *
 * @module
 */
import { type JobDetail, normalizeId, readJobDetails } from "./admin/jobs.ts";
import {
  describeError,
  doneChannel,
  isTransientError,
  listenConnection,
  quoteSchema,
  type Sql,
} from "./db.ts";
import { AkadzeError, JobNotFound, JobWaitTimeout } from "./errors.ts";
import { TERMINAL_STATES } from "./job.ts";
import { logger } from "./log.ts";

/**
 * How often the jobs being waited for are read, by default (ms): the upper bound of the
 * delay when notifications do not arrive (behind a pooler in transaction mode without
 * `listenUrl`, or with `listen: false`).
 */
export const WAIT_POLL_DEFAULT = 1_000;
/** How long after a failed LISTEN it is tried again (ms); waiters poll meanwhile. */
export const WAIT_LISTEN_RETRY = 5_000;
/** The longest timeout of a wait (ms): the largest timer delay. */
export const WAIT_TIMEOUT_MAX = 2_147_483_647;

/** Options of `app.waitForJob` and `app.waitForJobs`. */
export interface WaitOptions {
  /** Give up after this many milliseconds with a `JobWaitTimeout`. Required. */
  timeout: number;
  /** Stop waiting when aborted: the wait rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Called with a job's progress (what its handler passed to `ctx.progress`) each time a
   * new value is seen, and once at the start when the job already has one.
   */
  onProgress?: (progress: unknown, jobId: string) => void;
  /**
   * Listen for notifications (default true). false: find the outcome by polling only,
   * every `pollInterval`.
   */
  listen?: boolean;
  /** How often the jobs are read while waiting (ms). Default 1000. */
  pollInterval?: number;
}

const TERMINAL = new Set<string>(TERMINAL_STATES);

/** One call of `wait`. */
interface Waiter {
  ids: ReadonlySet<string>;
  done: Map<string, JobDetail>;
  states: Map<string, string>;
  progress: Map<string, string>;
  listen: boolean;
  pollInterval: number;
  nextPoll: number;
  onProgress?: (progress: unknown, jobId: string) => void;
  timer?: ReturnType<typeof setTimeout>;
  settle(error: unknown): void;
}

/** The waiters of one app. */
export class JobWaiters {
  #sql: Sql;
  #s: string;
  #schema: string;
  #listenUrl: string | undefined;
  #own: Sql | null = null;
  #unlisten: (() => Promise<void>) | null = null;
  #listening: Promise<void> | null = null;
  #nextListen = 0;
  #byId = new Map<string, Set<Waiter>>();
  #waiters = new Set<Waiter>();
  #dirty = new Set<string>();
  #flush: ReturnType<typeof setTimeout> | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timerAt = Infinity;
  #closed = false;

  /** Make the waiter set of an app (nothing is opened until the first wait). */
  constructor(sql: Sql, schema: string, listenUrl?: string) {
    this.#sql = sql;
    this.#schema = schema;
    this.#s = quoteSchema(schema);
    this.#listenUrl = listenUrl;
  }

  /**
   * Wait until every job of `ids` is terminal; the jobs in the order of `ids`, with their
   * results. See {@linkcode WaitOptions}.
   */
  async wait(ids: readonly string[], options: WaitOptions): Promise<JobDetail[]> {
    if (this.#closed) throw new AkadzeError("the app was closed: it cannot wait for jobs");
    const { timeout, signal, onProgress, listen = true, pollInterval = WAIT_POLL_DEFAULT } =
      checkOptions(options);
    if (!Array.isArray(ids) || ids.length === 0) {
      throw new AkadzeError("waitForJobs takes a non-empty array of job ids");
    }
    const unique = [...new Set(ids.map(normalizeId))];
    signal?.throwIfAborted();
    if (listen) await this.#ensureListening();
    let settle!: (error: unknown) => void;
    const result = new Promise<void>((resolve, reject) => {
      settle = (error) => error === null ? resolve() : reject(error);
    });
    // It may settle (abort, close) before it is awaited below.
    result.catch(() => {});
    const onAbort = () => waiter.settle(signal!.reason);
    const waiter: Waiter = {
      ids: new Set(unique),
      done: new Map(),
      states: new Map(),
      progress: new Map(),
      listen,
      pollInterval,
      nextPoll: performance.now() + pollInterval,
      onProgress,
      settle: (error) => {
        if (!this.#waiters.delete(waiter)) return;
        for (const id of waiter.ids) {
          const set = this.#byId.get(id);
          set?.delete(waiter);
          if (set?.size === 0) this.#byId.delete(id);
        }
        clearTimeout(waiter.timer);
        signal?.removeEventListener("abort", onAbort);
        settle(error);
      },
    };
    // Registered before the jobs are marked: a notification right after the mark is seen.
    this.#waiters.add(waiter);
    for (const id of unique) {
      let set = this.#byId.get(id);
      if (!set) this.#byId.set(id, set = new Set());
      set.add(waiter);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    waiter.timer = setTimeout(() => void this.#timeOut(waiter, timeout), timeout);
    try {
      await this.#sql.unsafe(
        `update ${this.#s}.jobs set awaited = true where id
          operator(pg_catalog.=) any($1::bigint[]) and not awaited`,
        [unique],
      );
      // A new statement, so a new snapshot: it sees every state change that committed
      // before the mark, and every later one notifies.
      await this.#read([waiter], unique);
    } catch (error) {
      waiter.settle(error);
    }
    this.#schedule();
    await result;
    return ids.map((id) => waiter.done.get(normalizeId(id))!);
  }

  /** Stop waiting: pending waits reject, the LISTEN ends. */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#flush);
    for (const waiter of [...this.#waiters]) {
      waiter.settle(new AkadzeError("the app was closed while waiting for jobs"));
    }
    await this.#listening?.catch(() => {});
    const unlisten = this.#unlisten;
    this.#unlisten = null;
    await unlisten?.().catch(() => {});
    await this.#own?.end({ timeout: 1 }).catch(() => {});
    this.#own = null;
  }

  /** LISTEN unless listening, not sooner than {@linkcode WAIT_LISTEN_RETRY} after a failure. */
  async #ensureListening(): Promise<void> {
    if (this.#unlisten || performance.now() < this.#nextListen) return;
    this.#listening ??= (async () => {
      try {
        if (this.#listenUrl !== undefined) {
          this.#own ??= listenConnection(this.#sql, this.#listenUrl);
        }
        const sql = this.#own ?? this.#sql;
        const { unlisten } = await sql.listen(
          doneChannel(this.#schema),
          (payload) => this.#notified(payload),
        );
        if (this.#closed) return void await unlisten().catch(() => {});
        this.#unlisten = unlisten;
      } catch (error) {
        if (!isTransientError(error)) throw error;
        // Polling finds the outcomes meanwhile.
        this.#nextListen = performance.now() + WAIT_LISTEN_RETRY;
        logger("app").warn(
          "cannot LISTEN for finished jobs now, waiting by polling: {message}",
          { event: "wait_listen_failed", message: describeError(error) },
        );
      } finally {
        this.#listening = null;
      }
    })();
    await this.#listening;
  }

  /** A notification: read the job soon (notifications of one turn are read together). */
  #notified(payload: string): void {
    const set = this.#byId.get(payload);
    if (!set || ![...set].some((w) => w.listen)) return;
    this.#dirty.add(payload);
    this.#flush ??= setTimeout(() => {
      this.#flush = undefined;
      const ids = [...this.#dirty];
      this.#dirty.clear();
      const waiters = [...this.#waiters].filter((w) => w.listen);
      this.#read(waiters, ids).catch(() => {}); // the poll tries again
    }, 0);
  }

  /** Read `ids` and hand each waiter of `waiters` what it waits for. */
  async #read(waiters: readonly Waiter[], ids: readonly string[]): Promise<void> {
    if (ids.length === 0) return;
    const jobs = await readJobDetails(this.#sql, this.#s, ids, { includeResult: true });
    for (const waiter of waiters) {
      if (!this.#waiters.has(waiter)) continue;
      for (const id of ids) {
        if (!waiter.ids.has(id) || waiter.done.has(id)) continue;
        const job = jobs.get(id);
        if (!job) {
          waiter.settle(
            new JobNotFound(
              id,
              waiter.states.has(id)
                ? `job ${id} was deleted while it was awaited (it was ${waiter.states.get(id)})`
                : `job ${id} does not exist (or it finished and was already deleted by retention)`,
            ),
          );
          break;
        }
        waiter.states.set(id, job.state);
        this.#progress(waiter, job);
        if (TERMINAL.has(job.state)) waiter.done.set(id, job);
      }
      if (this.#waiters.has(waiter) && waiter.done.size === waiter.ids.size) waiter.settle(null);
    }
  }

  #progress(waiter: Waiter, job: JobDetail): void {
    if (!waiter.onProgress || job.progress === null || job.progress === undefined) return;
    const text = JSON.stringify(job.progress);
    if (waiter.progress.get(job.id) === text) return;
    waiter.progress.set(job.id, text);
    try {
      waiter.onProgress(job.progress, job.id);
    } catch (error) {
      waiter.settle(error);
    }
  }

  /** The timeout passed: one last read, then reject with what is still unfinished. */
  async #timeOut(waiter: Waiter, timeout: number): Promise<void> {
    const pending = () => [...waiter.ids].filter((id) => !waiter.done.has(id));
    try {
      await this.#read([waiter], pending());
    } catch {
      // the states last seen are reported
    }
    const unfinished = pending().map((id) => ({ id, state: waiter.states.get(id) ?? "unknown" }));
    waiter.settle(new JobWaitTimeout(unfinished, timeout));
  }

  /** Arm the poll timer for the earliest waiter due. */
  #schedule(): void {
    if (this.#closed) return;
    let next = Infinity;
    for (const waiter of this.#waiters) next = Math.min(next, waiter.nextPoll);
    if (next === Infinity || next >= this.#timerAt) return;
    clearTimeout(this.#timer);
    this.#timerAt = next;
    this.#timer = setTimeout(() => void this.#poll(), Math.max(0, next - performance.now()));
  }

  /** Read the unfinished jobs of the waiters due, in one statement. */
  async #poll(): Promise<void> {
    this.#timerAt = Infinity;
    const now = performance.now();
    const due = [...this.#waiters].filter((w) => w.nextPoll <= now + 5);
    const ids = new Set<string>();
    for (const waiter of due) {
      waiter.nextPoll = now + waiter.pollInterval;
      for (const id of waiter.ids) if (!waiter.done.has(id)) ids.add(id);
    }
    try {
      if (this.#unlisten === null && due.some((w) => w.listen)) await this.#ensureListening();
      await this.#read(due, [...ids]);
    } catch {
      // unreachable now: the next poll tries again (until each waiter's timeout)
    }
    this.#schedule();
  }
}

/** `options` when valid; else an `AkadzeError` naming the bad one. */
function checkOptions(options: WaitOptions): WaitOptions {
  if (typeof options !== "object" || options === null) {
    throw new AkadzeError("wait options must be an object with a timeout (ms)");
  }
  const { timeout, pollInterval, signal, onProgress, listen } = options;
  if (typeof timeout !== "number" || !(timeout >= 0 && timeout <= WAIT_TIMEOUT_MAX)) {
    throw new AkadzeError(
      `timeout must be a number of milliseconds from 0 to ${WAIT_TIMEOUT_MAX}, got ${timeout}`,
    );
  }
  if (
    pollInterval !== undefined &&
    (typeof pollInterval !== "number" || !(pollInterval >= 10 && pollInterval <= WAIT_TIMEOUT_MAX))
  ) {
    throw new AkadzeError(
      `pollInterval must be a number of milliseconds from 10 to ${WAIT_TIMEOUT_MAX}, got ${pollInterval}`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new AkadzeError("signal must be an AbortSignal");
  }
  if (onProgress !== undefined && typeof onProgress !== "function") {
    throw new AkadzeError("onProgress must be a function");
  }
  if (listen !== undefined && typeof listen !== "boolean") {
    throw new AkadzeError("listen must be a boolean");
  }
  return options;
}
