/**
 * The heartbeat: one statement per worker (not per job) that registers the worker row or
 * renews its `heartbeat_at`, and reports which of its running jobs have a cancel request.
 * It keeps the worker's lease: when it is due, whether the last beat worked, when the
 * lease is lost, and the watchdog for a loop stuck in a statement.
 *
 * @module
 */
import { describeError, isReadOnlyError, isTransientError, quoteSchema, type Sql } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import type { SessionReport } from "./session_settings.ts";
import {
  logHeartbeatFailed,
  logHeartbeatFileFailed,
  logRegistered,
  logServerChanged,
} from "./log_events.ts";

/** How often a worker beats, by default (ms): `WORKER_DEFAULTS.heartbeatInterval`. */
export const HEARTBEAT_INTERVAL_DEFAULT = 5_000;
/** How soon a failed beat is tried again at most (ms). */
export const HEARTBEAT_RETRY = 1_000;
/**
 * How often a beat looks for orphans at least (ms): jobs running under this worker's id that
 * it does not know of. Otherwise only the first beat and the beats after a write that may
 * have committed unseen (see {@linkcode Heartbeat.orphansMayExist}) look, for the look scans
 * every running job of this worker id, and under an old snapshot that holds cleanup back,
 * every job the worker ever ran.
 */
export const ORPHAN_SCAN_EVERY = 60_000;

/** Settings of a {@linkcode Heartbeat}: who this worker is, as stored in the workers table. */
export interface HeartbeatConfig {
  /** The schema name. */
  schema: string;
  /** Unique per process. */
  id: string;
  /** Host name. */
  hostname: string;
  /** Process id. */
  pid: number;
  /** Queues it claims from. */
  queues: readonly string[];
  /** Its heartbeatTtl in ms (others rescue its jobs after that long without a beat). */
  heartbeatTtl: number;
  /** How often it beats (ms). Default {@linkcode HEARTBEAT_INTERVAL_DEFAULT}. */
  heartbeatInterval?: number;
  /** Give up after heartbeatTtl without a first beat (a batch run). Default false. */
  giveUpUnregistered?: boolean;
  /**
   * Called when a beat's connection is no use: it timed out (it may hang) or reached a
   * read-only server (a standby); the next beat needs a new connection.
   */
  onBadConnection?: () => void;
  /** How often a beat looks for orphans at least (ms). Default {@linkcode ORPHAN_SCAN_EVERY}. */
  orphanScanEvery?: number;
}

/** What the worker runs, for one beat. */
export interface BeatRequest {
  /** The jobs running in its slots: the beat reports which of them have a cancel request. */
  running: readonly string[];
  /**
   * Whether to list every job running under this worker id (to find orphans); by default,
   * when {@linkcode Heartbeat.orphanScanDue} says so.
   */
  scanOrphans?: boolean;
}

/** A due beat's lease: the beat, or no beat (retried soon), or the lease lost. */
export type Lease =
  | { kind: "beat"; beat: BeatResult }
  | { kind: "failed" }
  | { kind: "lost"; message: string };

/** What one beat found. */
export interface BeatResult {
  /** The row was (re-)inserted: first beat, or someone removed it. */
  registered: boolean;
  /** Ids of the requested running jobs whose cancellation was requested. */
  cancelRequested: string[];
  /**
   * Every job running under this worker id as the database sees them (with their claim's
   * run_count), when the beat looked for orphans; null when it did not.
   */
  running: { id: string; runCount: number }[] | null;
  /**
   * The server that answered: its address (`host:port`, or `local` over a Unix socket) and
   * when its postmaster started, so a failover or restart the driver absorbed can be told.
   */
  server: { address: string; startedAt: string };
  /** The settings of the beat's session the worker depends on (session_settings.ts). */
  session: SessionReport;
}

/** Keeps one worker's row alive. */
export class Heartbeat {
  /** The server the last beat reached. */
  #server: BeatResult["server"] | null = null;
  #sql: Sql;
  #config: Required<HeartbeatConfig>;
  #beat: string;
  #beatScan: string;
  #remove: string;
  #ok = false;
  /** Whether a job may run under this worker id that it does not know of (a first beat). */
  #orphansMayExist = true;
  #orphanScanAt = -Infinity;
  #startedAt = 0;
  /** `performance.now()` of the last successful beat, or null before the first. */
  lastSuccess: number | null = null;
  /** `performance.now()` when the next beat is due. */
  nextBeat = 0;

  /** Make a heartbeat on a connection (the worker gives it its loop's own). */
  constructor(sql: Sql, config: HeartbeatConfig) {
    const heartbeatInterval = config.heartbeatInterval ?? HEARTBEAT_INTERVAL_DEFAULT;
    if (!(heartbeatInterval > 0 && config.heartbeatTtl > heartbeatInterval)) {
      throw new AkadzeError(
        `heartbeatTtl (${config.heartbeatTtl} ms) must be longer than heartbeatInterval (${heartbeatInterval} ms)`,
      );
    }
    this.#sql = sql;
    this.#config = {
      ...config,
      heartbeatInterval,
      giveUpUnregistered: config.giveUpUnregistered ?? false,
      onBadConnection: config.onBadConnection ?? (() => {}),
      orphanScanEvery: config.orphanScanEvery ?? ORPHAN_SCAN_EVERY,
    };
    const s = quoteSchema(config.schema);
    // Cancel requests by primary key, for the jobs the worker runs (at most its slots): a
    // scan by worker id would visit every dead index entry an old snapshot keeps. OFFSET 0
    // keeps the worker id out of the lookup, or the planner may pick the worker id index.
    const beat = (scan: boolean) => `
      with hb as (
        insert into ${s}.workers (id, hostname, pid, queues, heartbeat_ttl_ms)
        values ($1, $2, $3, $4::pg_catalog.text[], $5)
        on conflict (id) do update set heartbeat_at = pg_catalog.now()
        returning (xmax operator(pg_catalog.=) 0) as registered)
      select hb.registered,
             array(select k.id::pg_catalog.text
                     from (select id, worker_id, state, cancel_requested_at from ${s}.jobs
                            where id operator(pg_catalog.=) any($6::bigint[]) offset 0) k
                    where k.worker_id operator(pg_catalog.=) $1 and k.state
                      operator(pg_catalog.=) 'running'
                      and k.cancel_requested_at is not null) as cancel,
             ${
      scan
        ? `array(select id::pg_catalog.text operator(pg_catalog.||) ':'
          operator(pg_catalog.||) run_count from ${s}.jobs
                    where worker_id operator(pg_catalog.=) $1 and state
                      operator(pg_catalog.=) 'running')`
        : "null::pg_catalog.text[]"
    } as running,
             coalesce(pg_catalog.host(pg_catalog.inet_server_addr()) operator(pg_catalog.||) ':'
               operator(pg_catalog.||)
               pg_catalog.inet_server_port(), 'local') as server_address,
             pg_catalog.pg_postmaster_start_time()::pg_catalog.text as server_started_at,
             pg_catalog.current_setting('transaction_isolation') as isolation,
             pg_catalog.current_setting('DateStyle') as date_style,
             pg_catalog.current_setting('extra_float_digits') as float_digits
        from hb`;
    this.#beat = beat(false);
    this.#beatScan = beat(true);
    this.#remove = `delete from ${s}.workers w where w.id operator(pg_catalog.=) $1
      and not exists (select 1 from ${s}.jobs j where j.worker_id operator(pg_catalog.=) w.id
        and j.state operator(pg_catalog.=) 'running')`;
  }

  /**
   * Beat once; records the time of success. A beat that takes longer than `timeoutMs`
   * (a connection hanging in a network partition) fails as a transient timeout, so the
   * lease clock keeps running.
   */
  async runOnce(
    request: BeatRequest = { running: [] },
    timeoutMs: number = this.#config.heartbeatTtl / 2,
  ): Promise<BeatResult> {
    const { id, hostname, pid, queues, heartbeatTtl } = this.#config;
    const scan = request.scanOrphans ?? this.orphanScanDue();
    let timer: ReturnType<typeof setTimeout> | undefined;
    // Taken before the statement: a write that fails while it runs sets it again.
    if (scan) this.#orphansMayExist = false;
    const [row] = await Promise.race([
      this.#sql.unsafe(scan ? this.#beatScan : this.#beat, [
        id,
        hostname,
        pid,
        queues as string[],
        Math.round(heartbeatTtl),
        request.running as string[],
      ]),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(Object.assign(new Error(`heartbeat took over ${timeoutMs} ms`), {
              name: "HeartbeatTimeout",
              code: "ETIMEDOUT",
            })),
          timeoutMs,
        );
      }),
    ]).catch((error) => {
      if (scan) this.#orphansMayExist = true;
      throw error;
    }).finally(() => clearTimeout(timer));
    this.lastSuccess = performance.now();
    if (scan) this.#orphanScanAt = this.lastSuccess;
    const running = (row.running as string[] | null)?.map((item) => {
      const [id, runCount] = item.split(":");
      return { id, runCount: Number(runCount) };
    }) ?? null;
    return {
      registered: row.registered,
      cancelRequested: row.cancel,
      running,
      server: { address: row.server_address, startedAt: row.server_started_at },
      session: {
        isolation: row.isolation,
        dateStyle: row.date_style,
        floatDigits: Number(row.float_digits),
      },
    };
  }

  /**
   * A write may have committed without this worker learning of it (a claim whose reply was
   * lost, an outcome or release that could not be written): the next beat looks for orphans.
   */
  orphansMayExist(): void {
    this.#orphansMayExist = true;
  }

  /** Whether the next beat looks for orphans: one may exist, or the last look is old. */
  orphanScanDue(): boolean {
    return this.#orphansMayExist ||
      performance.now() - this.#orphanScanAt >= this.#config.orphanScanEvery;
  }

  /** Whether the last beat worked (the loop claims only then). */
  get ok(): boolean {
    return this.#ok;
  }

  /** A run begins: a batch run counts its time without a first beat from now. */
  begin(): void {
    this.#startedAt = performance.now();
    // A process that ran under this id before (a restart with a fixed id) may have left jobs.
    this.#orphansMayExist = true;
  }

  /** Whether a beat is due now. */
  due(): boolean {
    return performance.now() >= this.nextBeat;
  }

  /**
   * Beat now and schedule the next one. A transient failure is logged and retried within
   * {@linkcode HEARTBEAT_RETRY}; the lease is lost after heartbeatTtl without a beat. Any
   * other error is thrown (fatal).
   */
  async beat(request: BeatRequest = { running: [] }): Promise<Lease> {
    const now = performance.now();
    const { id, heartbeatInterval, heartbeatTtl } = this.#config;
    try {
      const beat = await this.runOnce(request);
      if (beat.registered && !this.#ok) logRegistered(id);
      const was = this.#server;
      if (was && (was.address !== beat.server.address || was.startedAt !== beat.server.startedAt)) {
        logServerChanged(id, beat.server.address, was.address);
      }
      this.#server = beat.server;
      this.#ok = true;
      this.nextBeat = now + heartbeatInterval;
      return { kind: "beat", beat };
    } catch (error) {
      if (!isTransientError(error)) throw error;
      if ((error as { name?: unknown }).name === "HeartbeatTimeout" || isReadOnlyError(error)) {
        this.#config.onBadConnection();
      }
      this.#ok = false;
      this.nextBeat = now + Math.min(heartbeatInterval, HEARTBEAT_RETRY);
      logHeartbeatFailed(id, error);
      const last = this.lastSuccess;
      if (last !== null && now - last >= heartbeatTtl) {
        return {
          kind: "lost",
          message: `no heartbeat succeeded for ${Math.round((now - last) / 1000)} s`,
        };
      }
      // A long-running worker waits for a database that is down; a batch run
      // (cron, CI) must end, so it gives up after heartbeatTtl without a first beat.
      const waited = now - this.#startedAt;
      if (last === null && this.#config.giveUpUnregistered && waited >= heartbeatTtl) {
        return {
          kind: "lost",
          message: `could not reach the database for ${
            Math.round(waited / 1000)
          } s (a batch run gives up after heartbeatTtl): ${describeError(error)}`,
        };
      }
      return { kind: "failed" };
    }
  }

  /**
   * A backstop for a loop stuck in a statement that never returns (a network partition):
   * `stalled` resolves once no beat succeeded for heartbeatTtl + heartbeatInterval, until
   * `stop()`. A tick that comes late by more than heartbeatInterval means the event loop
   * itself was held (a handler computing): the time counts from then, so the loop gets its
   * chance to beat and to write what ran during the block.
   */
  watch(): { stalled: Promise<void>; stop(): void } {
    const { heartbeatInterval, heartbeatTtl } = this.#config;
    const tick = Math.min(1_000, heartbeatInterval);
    let timer: ReturnType<typeof setInterval> | undefined;
    let tickAt = performance.now();
    let resumedAt = -Infinity;
    const stalled = new Promise<void>((resolve) => {
      timer = setInterval(() => {
        const now = performance.now();
        if (now - tickAt > tick + heartbeatInterval) resumedAt = now;
        tickAt = now;
        const last = this.lastSuccess;
        if (last !== null && now - Math.max(last, resumedAt) > heartbeatTtl + heartbeatInterval) {
          resolve();
        }
      }, tick);
    });
    return { stalled, stop: () => clearInterval(timer) };
  }

  /** Remove the worker row (on a clean stop), unless jobs still run under it. */
  async remove(): Promise<boolean> {
    const result = await this.#sql.unsafe(this.#remove, [this.#config.id]);
    return result.count > 0;
  }
}

/** Write the time to the heartbeat file (a liveness probe without database access). */
export async function touchHeartbeatFile(path: string | undefined): Promise<void> {
  if (!path) return;
  try {
    await Deno.writeTextFile(path, `${Date.now()}\n`);
  } catch (error) {
    logHeartbeatFileFailed(error);
  }
}

/** This machine's host name, as the workers table records it. */
export function hostName(): string {
  try {
    return Deno.hostname();
  } catch {
    return "unknown-host";
  }
}
