/**
 * The listener: LISTEN on a dedicated connection (postgres.js keeps one per instance for
 * listening and reconnects it) for new jobs in this worker's queues and for cancel
 * requests, so the worker reacts at once instead of at its next poll.
 *
 * @module
 */
import { cancelChannel, jobsChannel, type Sql } from "../db.ts";
import { settleWithin } from "./settle.ts";

/** The start of a probe's payload (a space: never part of a queue name). */
const PROBE_PREFIX = "akadze probe ";

/** What the listener calls. */
export interface ListenerHandlers {
  /** A job was enqueued in one of the worker's queues. */
  onJobs(): void;
  /** A cancel was requested for this job id. */
  onCancel(jobId: string): void;
}

/** Listens for one worker. */
export class Listener {
  #sql: Sql;
  #schema: string;
  #queues: Set<string>;
  #handlers: ListenerHandlers;
  #unlisten: (() => Promise<void>)[] = [];
  #probes = new Map<string, () => void>();

  /** Make a listener (nothing happens until `start`). */
  constructor(sql: Sql, schema: string, queues: readonly string[], handlers: ListenerHandlers) {
    this.#sql = sql;
    this.#schema = schema;
    this.#queues = new Set(queues);
    this.#handlers = handlers;
  }

  /** Whether both channels are being listened to. */
  get listening(): boolean {
    return this.#unlisten.length === 2;
  }

  /** LISTEN on both channels (idempotent). Throws when the database is unreachable. */
  async start(): Promise<void> {
    if (this.listening) return;
    await this.stop();
    const jobs = await this.#sql.listen(jobsChannel(this.#schema), (payload) => {
      if (payload.startsWith(PROBE_PREFIX)) return this.#probes.get(payload)?.();
      if (payload.split(",").some((queue) => this.#queues.has(queue))) this.#handlers.onJobs();
    });
    this.#unlisten.push(jobs.unlisten);
    const cancel = await this.#sql.listen(
      cancelChannel(this.#schema),
      (payload) => this.#handlers.onCancel(payload),
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
      await send(jobsChannel(this.#schema), payload);
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
