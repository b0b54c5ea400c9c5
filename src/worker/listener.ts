/**
 * The listener: LISTEN on a dedicated connection (postgres.js keeps one per instance for
 * listening and reconnects it) for new jobs in this worker's queues and for cancel
 * requests, so the worker reacts at once instead of at its next poll. A LISTEN the server
 * refuses for now leaves the worker polling and is tried again; the first that works is
 * probed once, so a pooler that drops notifications is reported.
 *
 * @module
 */
import { cancelChannel, isTransientError, jobsChannel, listenConnection, type Sql } from "../db.ts";
import {
  logListenFailed,
  logListenProbed,
  logListenStarted,
  logListenUnavailable,
} from "./log_events.ts";
import { settleWithin } from "./settle.ts";

/** How long after a failed LISTEN it is tried again (ms); the worker polls meanwhile. */
export const LISTEN_RETRY_DEFAULT = 5_000;
/**
 * How long the worker's loop waits for a LISTEN (ms); past it the LISTEN finishes on its own
 * and the worker polls meanwhile.
 */
export const LISTEN_TIMEOUT_DEFAULT = 5_000;
/** How long the probe notification may take before LISTEN counts as not working (ms). */
export const PROBE_TIMEOUT_DEFAULT = 10_000;

/** The start of a probe's payload (a space: never part of a queue name). */
const PROBE_PREFIX = "akadze probe ";

/** Settings of a {@linkcode Listener}: what it listens for and whom it tells. */
export interface ListenerConfig {
  /** The schema name (the channels are per schema). */
  schema: string;
  /** The worker's queues: a new job in another queue is ignored. */
  queues: readonly string[];
  /** A job was enqueued in one of the worker's queues. */
  onJobs(): void;
  /** A cancel was requested for this job id. */
  onCancel(jobId: string): void;
  /** For the log lines of {@linkcode Listener.ensure}. */
  workerId?: string;
  /** The worker's poll interval (the log lines say it). */
  pollInterval?: number;
  /** Whether `sql` is the app's `listenUrl` connection (the advice differs). */
  viaListenUrl?: boolean;
  /** The connection a probe notification is sent on (as an enqueue would). */
  probeSql?: Sql;
  /** Whether the worker is stopping: an unanswered probe then says nothing. */
  stopping?: () => boolean;
  /** See {@linkcode LISTEN_RETRY_DEFAULT}. */
  listenRetry?: number;
  /** See {@linkcode PROBE_TIMEOUT_DEFAULT}. */
  probeTimeout?: number;
  /** See {@linkcode LISTEN_TIMEOUT_DEFAULT}. */
  listenTimeout?: number;
  /**
   * Listen on a connection of its own to this address (the app's `listenUrl`), ended by
   * {@linkcode Listener.close}, instead of on `sql`.
   */
  listenUrl?: string;
}

/** Listens for one worker. */
export class Listener {
  #sql: Sql;
  #config: ListenerConfig;
  #queues: Set<string>;
  #unlisten: (() => Promise<void>)[] = [];
  #probes = new Map<string, () => void>();
  #nextListen = 0;
  #failing = false;
  #probed = false;
  #probeStop = new AbortController();
  #own: Sql | null;
  /** A LISTEN is under way (ensure() does not start another). */
  #starting = false;
  /** An error of a LISTEN that ended after ensure() stopped waiting, for the next call. */
  #failed: unknown = null;
  /** close() was called: a LISTEN that ends later is undone. */
  #closed = false;

  /**
   * Make a listener (nothing is listened to until `start` or `ensure`); with `listenUrl`,
   * its connection is made now (connect's errors are thrown).
   */
  constructor(sql: Sql, config: ListenerConfig) {
    this.#own = config.listenUrl === undefined ? null : listenConnection(sql, config.listenUrl);
    this.#sql = this.#own ?? sql;
    this.#config = config;
    this.#queues = new Set(config.queues);
  }

  /**
   * LISTEN unless listening, not sooner than `listenRetry` after a failure. A connection
   * the server refuses for now (too many clients, say) is logged once (`listen_failed`)
   * and tried again later; other errors are thrown. The first success is probed. A LISTEN
   * that has no answer after `listenTimeout` is logged the same way and left to finish on
   * its own: the worker's loop (its claims and heartbeat) must not wait for it.
   */
  async ensure(): Promise<void> {
    if (this.#failed !== null) {
      const error = this.#failed;
      this.#failed = null;
      throw error;
    }
    if (this.listening || this.#starting || performance.now() < this.#nextListen) return;
    const { workerId = "", pollInterval = 0 } = this.#config;
    this.#starting = true;
    const attempt = this.#attempt();
    const timeout = this.#config.listenTimeout ?? LISTEN_TIMEOUT_DEFAULT;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const answered = await Promise.race([
      attempt.then(() => true),
      new Promise<false>((resolve) => timer = setTimeout(() => resolve(false), timeout)),
    ]);
    clearTimeout(timer);
    if (answered) {
      const error = this.#failed;
      this.#failed = null;
      if (error !== null) throw error;
      return;
    }
    if (!this.#failing) {
      logListenFailed(
        workerId,
        pollInterval,
        new Error(`LISTEN got no answer in ${Math.round(timeout)} ms`),
      );
    }
    this.#failing = true;
  }

  /** One LISTEN attempt (see `ensure`): never rejects; an error to throw goes to #failed. */
  async #attempt(): Promise<void> {
    const { workerId = "", pollInterval = 0 } = this.#config;
    try {
      await this.start();
    } catch (error) {
      if (!isTransientError(error)) {
        this.#failed = error;
        return;
      }
      this.#nextListen = performance.now() + (this.#config.listenRetry ?? LISTEN_RETRY_DEFAULT);
      if (!this.#failing) logListenFailed(workerId, pollInterval, error);
      this.#failing = true;
      return;
    } finally {
      this.#starting = false;
    }
    if (this.#closed) return void this.stop();
    if (this.#failing) logListenStarted(workerId);
    this.#failing = false;
    if (!this.#probed && this.#config.probeSql) {
      this.#probed = true;
      void this.#probeOnce(this.#config.probeSql);
    }
  }

  /**
   * Check once that a notification sent through the app's connection arrives; when it does
   * not (a pooler in transaction mode), say so once: the worker then only polls.
   */
  async #probeOnce(sql: Sql): Promise<void> {
    const { workerId = "", pollInterval = 0 } = this.#config;
    const stop = this.#probeStop.signal;
    let arrived: boolean;
    try {
      arrived = await this.probe(
        (channel, payload) => sql`select pg_catalog.pg_notify(${channel}, ${payload})`,
        this.#config.probeTimeout ?? PROBE_TIMEOUT_DEFAULT,
        stop,
      );
    } catch {
      return; // the database is unreachable now: nothing to conclude
    }
    if (arrived) return logListenProbed(workerId);
    if (stop.aborted || this.#config.stopping?.()) return;
    logListenUnavailable(workerId, pollInterval, this.#config.viaListenUrl ?? false);
  }

  /** The run ends: end a probe still waiting, UNLISTEN, end the `listenUrl` connection. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#probeStop.abort();
    await this.stop();
    if (this.#own) await this.#own.end({ timeout: 1 }).catch(() => {});
  }

  /** Whether both channels are being listened to. */
  get listening(): boolean {
    return this.#unlisten.length === 2;
  }

  /** LISTEN on both channels (idempotent). Throws when the database is unreachable. */
  async start(): Promise<void> {
    if (this.listening) return;
    await this.stop();
    const { schema } = this.#config;
    const jobs = await this.#sql.listen(jobsChannel(schema), (payload) => {
      if (payload.startsWith(PROBE_PREFIX)) return this.#probes.get(payload)?.();
      if (payload.split(",").some((queue) => this.#queues.has(queue))) this.#config.onJobs();
    });
    this.#unlisten.push(jobs.unlisten);
    const cancel = await this.#sql.listen(
      cancelChannel(schema),
      (payload) => this.#config.onCancel(payload),
    );
    this.#unlisten.push(cancel.unlisten);
  }

  /**
   * Whether a notification sent with `send` (on another connection, as an enqueue would)
   * reaches this listener within `timeoutMs` (false when `signal` aborts first). The probe's payload is no queue name (those
   * have no space), so other workers ignore it.
   */
  async probe(
    send: (channel: string, payload: string) => Promise<unknown>,
    timeoutMs: number,
    signal?: AbortSignal,
  ): Promise<boolean> {
    const payload = `${PROBE_PREFIX}${crypto.randomUUID()}`;
    let arrived!: () => void;
    const received = new Promise<boolean>((resolve) => arrived = () => resolve(true));
    this.#probes.set(payload, arrived);
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort = () => {};
    try {
      await send(jobsChannel(this.#config.schema), payload);
      return await Promise.race([
        received,
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(false), timeoutMs);
          onAbort = () => resolve(false);
          if (signal?.aborted) onAbort();
          signal?.addEventListener("abort", onAbort, { once: true });
        }),
      ]);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      this.#probes.delete(payload);
    }
  }

  /**
   * UNLISTEN (errors ignored: the connection may already be gone), waiting at most
   * `timeoutMs`: an unanswering database must not hold up a stop.
   */
  async stop(timeoutMs = 2_000): Promise<void> {
    const unlisten = this.#unlisten.splice(0);
    await settleWithin(Promise.all(unlisten.map((fn) => fn().catch(() => {}))), timeoutMs);
  }
}
