/**
 * The worker: a loop around small services (heartbeat, rescuer, pruner, claimer,
 * executor, completer, listener). Each pass: heartbeat when due, rescue, start a prune
 * about once a minute (it runs beside the loop), run due schedules, claim up to the free
 * slots. See SPEC §6.
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import {
  connect,
  describeError,
  isSchemaMissing,
  isTransientError,
  schemaMissingMessage,
  type Sql,
} from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { logger } from "../log.ts";
import { type ClaimedJob, Claimer, type ClaimRequest } from "./claimer.ts";
import { Completer, type CompleteResult, type Outcome, retryTransient } from "./completer.ts";
import { resolveWorkerConfig, type WorkerConfig, type WorkerOptions } from "./config.ts";
import { type Execution, Executor } from "./executor.ts";
import { Heartbeat } from "./heartbeat.ts";
import type { JobRow } from "./job_row.ts";
import type { WrittenRow } from "./completer.ts";
import { unstorableOutcome } from "./completer.ts";
import { Listener } from "./listener.ts";
import { LoopConnection } from "./loop_connection.ts";
import { installProcessGuard, type Stray } from "./process_guard.ts";
import { Pruner } from "./pruner.ts";
import { Rescuer } from "./rescuer.ts";
import { Scheduler } from "./scheduler.ts";
import { settleWithin } from "./settle.ts";
import { renderMetrics } from "../metrics.ts";
import {
  finishedOutcome,
  type MetricsServer,
  serveMetrics,
  WorkerMetrics,
} from "./worker_metrics.ts";

/** Why `worker.run()` returned, with the process exit code it implies. */
export interface WorkerExit {
  /** 0: graceful stop, batch done or maxJobs reached; 1: fatal error or lost heartbeat. */
  code: 0 | 1;
  /** What ended the run. */
  reason: "stopped" | "batch_done" | "max_jobs" | "heartbeat_lost" | "fatal";
  /** For `fatal` and `heartbeat_lost`: what went wrong (credential-free). */
  message?: string;
}

/** Options of `worker.run()`. */
export interface WorkerRunOptions {
  /** Aborting it starts a graceful stop, like `worker.stop()`. */
  signal?: AbortSignal;
}

/** Something the loop runs between claims (the scheduler). */
interface LoopService {
  /** Do one pass; errors are handled like the worker's own database errors. */
  runOnce(): Promise<unknown>;
}

const OUTCOME_BATCH = 500;
const DB_BACKOFF_MAX = 30_000;
const RELEASE_TIMEOUT = 5_000;
/** How often the claim pass also cancels queued jobs with a cancel request or expiry. */
const CANCEL_EVERY = 1_000;
/** How long after a failed LISTEN the worker tries again (it polls meanwhile). */
const LISTEN_RETRY = 5_000;
/** How long the listener's probe notification may take before LISTEN counts as not working. */
const PROBE_TIMEOUT = 10_000;

interface Running {
  /** Null only while its start() has not returned. */
  execution: Execution | null;
  queue: string;
  /** `performance.now()` at its start: the run duration of the metrics. */
  startedAt: number;
}

interface PendingOutcome {
  outcome: Outcome;
  /** For the log lines (absent for an orphan release). */
  job?: { task: string; queue: string; attempt: number; max_attempts: number };
  /** Called once the outcome is written, discarded or left to the lease. */
  done: () => void;
}

/**
 * A worker process's engine: claims jobs of its queues and runs them.
 *
 * @example
 * ```ts ignore
 * import { Worker } from "@akadze/akadze";
 * import { app } from "./app.ts";
 *
 * const worker = new Worker(app, { queues: ["default", "mail"], slots: 4 });
 * Deno.addSignalListener("SIGTERM", () => worker.stop());
 * const exit = await worker.run();
 * Deno.exit(exit.code);
 * ```
 */
export class Worker {
  /** This worker's id (hostname:pid:random unless given). */
  readonly id: string;
  /** The validated options. */
  readonly config: WorkerConfig;
  /** This worker's jobs finished and run durations (served with `metricsPort`). */
  readonly metrics: WorkerMetrics;
  #app: Akadze;
  #log = logger("worker");
  #heartbeat: Heartbeat;
  #rescuer: Rescuer;
  #pruner: Pruner;
  #claimer: Claimer;
  #completer: Completer;
  /** Writes outcomes on the loop's connection once the loop is done (see #abandonRuns). */
  #finalCompleter: Completer;
  #writeOnLoop = false;
  #executor: Executor;
  #listener: Listener;
  /** The instance of `app.listenUrl` the listener runs on, while a run has one open. */
  #listenSql: Sql | null = null;
  #nextListen = 0;
  #listenFailing = false;
  #probed = false;
  /** Ends a probe still waiting when the run ends. */
  #probeStop = new AbortController();
  /** The loop's own connection (heartbeat, rescue, claim, cancel, schedules). */
  #connection: LoopConnection;
  #services: LoopService[] = [];
  #inflight = new Map<string, Running>();
  /** Running jobs per queue (kept beside #inflight: counting it per finish is O(slots)). */
  #busy = new Map<string, number>();
  #pending: PendingOutcome[] = [];
  /**
   * Jobs whose handler is done but whose outcome is not written yet. Their slots are free
   * (the next claim overlaps the write), but they still run in the database's eyes.
   */
  #unwritten = new Set<string>();
  #allWritten: (() => void)[] = [];
  #releasing = new Set<string>();
  #flushing: Promise<void> | null = null;
  #pruning: Promise<void> | null = null;
  #claims = 0;
  #offset = 0;
  #running = false;
  #stopRequested = false;
  /** The run ended while its loop was stuck in a query (the watchdog): it runs nothing more. */
  #loopLeft = false;
  #abandon = new AbortController();
  #wakeFlag = false;
  #wake: () => void = () => {};
  #beatOk = false;
  #draining = false;
  #nextBeat = 0;
  /** `performance.now()` when run() began: a batch run counts its lease clock from there. */
  #startedAt = 0;

  /**
   * Make a worker for an app; options are validated now (`AkadzeError`).
   *
   * @param app The application whose tasks it runs.
   * @param options See {@linkcode WorkerOptions}.
   */
  constructor(app: Akadze, options: WorkerOptions = {}) {
    this.config = resolveWorkerConfig(options);
    this.#app = app;
    const host = hostname();
    this.id = this.config.id ?? `${host}:${Deno.pid}:${crypto.randomUUID().slice(0, 8)}`;
    const hooks = app.hooks.onTransition;
    this.metrics = new WorkerMetrics(this.config.queues, () => this.#busy, app.tasks.values());
    // Not from the pool: tasks holding every pooled connection must not hold up the loop
    // and its heartbeat (the lease). The pruner runs beside the loop, so it stays on the pool.
    this.#connection = new LoopConnection(app.sql);
    const loopSql = this.#connection.sql;
    this.#heartbeat = new Heartbeat(loopSql, app.schema, {
      id: this.id,
      hostname: host,
      pid: Deno.pid,
      queues: this.config.queues,
      heartbeatTtl: this.config.heartbeatTtl,
    });
    this.#rescuer = new Rescuer(loopSql, app.schema, hooks);
    this.#pruner = new Pruner(app.sql, {
      schema: app.schema,
      retention: app.retention,
      grace: app.grace,
    });
    this.#claimer = new Claimer(loopSql, {
      schema: app.schema,
      workerId: this.id,
      tasks: [...app.tasks.keys()],
      hooks,
    });
    this.#completer = new Completer(app.sql, app.schema, hooks, {
      deleteSucceeded: app.retention === 0,
    });
    this.#finalCompleter = new Completer(loopSql, app.schema, hooks, {
      deleteSucceeded: app.retention === 0,
    });
    const password = (app.sql.options as { pass?: unknown }).pass;
    this.#executor = new Executor(
      app,
      this.#completer,
      typeof password === "string" && password ? [password] : [],
    );
    if (this.config.schedules) this.#services.push(new Scheduler(app, loopSql));
    this.#listener = this.#makeListener(app.sql);
  }

  #makeListener(sql: Sql): Listener {
    return new Listener(sql, this.#app.schema, this.config.queues, {
      onJobs: () => this.#wakeUp(),
      onCancel: (id) => this.#cancel(id),
    });
  }

  /**
   * How many jobs this worker has claimed so far.
   *
   * @example
   * ```ts ignore
   * const worker = new Worker(app, { batch: true });
   * await worker.run();
   * console.log(`ran ${worker.claimed} jobs`);
   * ```
   */
  get claimed(): number {
    return this.#claims;
  }

  /**
   * How many jobs this worker is running now.
   *
   * @example
   * ```ts ignore
   * setInterval(() => console.log(`${worker.busy} of ${worker.config.slots} slots busy`), 5_000);
   * ```
   */
  get busy(): number {
    return this.#inflight.size;
  }

  /**
   * Start a graceful stop: no new claims, running jobs get `shutdownTimeout` to finish.
   *
   * @example
   * ```ts ignore
   * Deno.addSignalListener("SIGTERM", () => worker.stop());
   * ```
   */
  stop(): void {
    this.#stopRequested = true;
    this.#wakeUp();
  }

  /**
   * Run until stopped (see {@linkcode WorkerExit} for why it returns). Never rejects for
   * database errors: transient ones are retried, others end the run with code 1.
   *
   * @example
   * ```ts ignore
   * const controller = new AbortController();
   * Deno.addSignalListener("SIGINT", () => controller.abort());
   * const exit = await new Worker(app).run({ signal: controller.signal });
   * if (exit.code !== 0) console.error(exit.reason, exit.message);
   * ```
   */
  async run(options: WorkerRunOptions = {}): Promise<WorkerExit> {
    if (this.#running) throw new AkadzeError("this worker is already running");
    this.#running = true;
    let metricsServer: MetricsServer | null;
    try {
      metricsServer = await this.#serveMetrics();
    } catch (error) {
      this.#running = false;
      const { metricsHost, metricsPort } = this.config;
      const message = `cannot serve metrics on ${metricsHost}:${metricsPort}: ${
        describeError(error)
      }`;
      this.#log.error("worker {workerId} stopped: {reason}: {message}", {
        event: "worker_stopped",
        workerId: this.id,
        reason: "fatal",
        code: 1,
        message,
      });
      return { code: 1, reason: "fatal", message };
    }
    this.#startedAt = performance.now();
    this.#writeOnLoop = false;
    this.#nextListen = 0;
    this.#listenFailing = false;
    this.#probed = false;
    this.#probeStop = new AbortController();
    if (this.#app.notify && this.#app.listenUrl !== undefined) {
      // Its own instance of one connection: the LISTEN goes to listenUrl, nothing else does.
      const options = this.#app.sql.options as { connection?: { application_name?: unknown } };
      const name = options.connection?.application_name;
      try {
        this.#listenSql = connect(this.#app.listenUrl, {
          max: 1,
          applicationName: typeof name === "string" ? name : undefined,
        });
      } catch (error) {
        // Nothing else has started but the metrics server: stop it, or it keeps the process.
        await metricsServer?.shutdown();
        this.#running = false;
        throw error;
      }
      this.#listener = this.#makeListener(this.#listenSql);
    }
    const onAbort = () => this.stop();
    options.signal?.addEventListener("abort", onAbort);
    if (options.signal?.aborted) this.stop();
    const removeGuard = installProcessGuard({
      onDriverError: (error) =>
        this.#log.warn("database driver error ignored: {message}", {
          event: "db_error_transient",
          message: describeError(error),
        }),
      onStray: (stray) => this.#logStray(stray),
    });
    this.#log.info("worker {workerId} started on {queues}", {
      event: "worker_started",
      workerId: this.id,
      queues: this.config.queues.join(","),
      slots: this.config.slots,
    });
    let exit: WorkerExit;
    // A backstop for a loop stuck in a query that never returns (network partition): the
    // lease is lost all the same, so stop as the heartbeat rule says.
    let watchdog: ReturnType<typeof setInterval> | undefined;
    const stalled = new Promise<WorkerExit>((resolve) => {
      const { heartbeatInterval, heartbeatTtl } = this.config;
      watchdog = setInterval(() => {
        const last = this.#heartbeat.lastSuccess;
        if (last !== null && performance.now() - last > heartbeatTtl + heartbeatInterval) {
          this.#stopRequested = true;
          this.#loopLeft = true;
          resolve({ code: 1, reason: "heartbeat_lost", message: "the worker loop stalled" });
        }
      }, Math.min(1_000, heartbeatInterval));
    });
    // A prune stuck on an unanswering database is waited for at most RELEASE_TIMEOUT from
    // the loop's end, alongside the release of the runs, then left to the pool's end.
    let pruned: Promise<void> | undefined;
    const loop = this.#loop();
    let ended = false;
    try {
      exit = await Promise.race([loop, stalled]);
      clearInterval(watchdog);
      pruned = settleWithin(this.#pruning, RELEASE_TIMEOUT);
      if (exit.code === 0) {
        await this.#drain(exit.reason !== "stopped");
      } else {
        await this.#abandonRuns();
      }
      ended = true;
    } finally {
      clearInterval(watchdog);
      this.#probeStop.abort();
      options.signal?.removeEventListener("abort", onAbort);
      await Promise.all([
        pruned ?? settleWithin(this.#pruning, RELEASE_TIMEOUT),
        this.#listener.stop(),
        metricsServer?.shutdown(),
      ]);
      if (this.#listenSql) {
        await this.#listenSql.end({ timeout: 1 }).catch(() => {});
        this.#listenSql = null;
        this.#listener = this.#makeListener(this.#app.sql);
      }
      this.#running = false;
      // Thrown out of the loop: nothing below runs, so the guard goes now.
      if (!ended) removeGuard();
    }
    try {
      if (exit.code === 0) await this.#heartbeat.remove().catch(() => false);
      // A loop left stuck in a statement (the watchdog) keeps its connection until that
      // statement returns: cutting it could leave a claim committed that no one puts back.
      if (this.#loopLeft) void loop.catch(() => {}).finally(() => this.#connection.close());
      // Still guarded: ending a connection the server killed can raise the driver's errors.
      else await this.#connection.close();
    } finally {
      removeGuard();
    }
    const level = exit.code === 0 ? "info" : "error";
    this.#log[level](`worker {workerId} stopped: {reason}${exit.message ? ": {message}" : ""}`, {
      event: "worker_stopped",
      workerId: this.id,
      reason: exit.reason,
      code: exit.code,
      ...(exit.message ? { message: exit.message } : {}),
    });
    return exit;
  }

  async #loop(): Promise<WorkerExit> {
    const { config } = this;
    let nextRescue = 0;
    let nextCancel = 0;
    let nextPrune = performance.now() + Math.random() * config.pruneInterval;
    let dbBackoff = 0;
    while (!this.#stopRequested) {
      await this.#touchHeartbeatFile();
      const beat = await this.#beatIfDue();
      if (beat) return beat;
      if (!this.#beatOk) {
        await this.#sleep(this.#nextBeat - performance.now());
        continue;
      }
      let full = false;
      let foundNothing = false;
      let idle = false;
      try {
        await this.#listen();
        const now = performance.now();
        if (now >= nextRescue) {
          nextRescue = now + config.heartbeatInterval;
          this.#logRescue(await this.#rescuer.runOnce());
        }
        if (now >= nextPrune && this.#pruning === null) {
          nextPrune = now + config.pruneInterval * (0.9 + 0.2 * Math.random());
          this.#pruning = this.#prune().finally(() => this.#pruning = null);
        }
        for (const service of this.#services) await service.runOnce();
        // Idle before the claim: no outcome written during it can have made a job ready.
        idle = this.#inflight.size + this.#unwritten.size === 0;
        if (!this.#stopRequested) [full, foundNothing] = await this.#claimPass();
        // After the claim, so it never delays a job, and at most once a second (every pass
        // in batch mode), so it does not hold up the claim that the next NOTIFY asks for.
        if (config.batch || performance.now() >= nextCancel) {
          nextCancel = performance.now() + CANCEL_EVERY;
          const result = await this.#claimer.cancel(config.queues);
          for (const row of result.cancelled) this.#logState(row, "queued");
        }
        dbBackoff = 0;
      } catch (error) {
        if (!isTransientError(error)) return this.#fatal(error);
        dbBackoff = Math.min(Math.max(dbBackoff * 2, 250), DB_BACKOFF_MAX);
        this.#log.warn("database error, retrying in {delay} ms: {message}", {
          event: "db_error_transient",
          delay: dbBackoff,
          message: describeError(error),
        });
        // Not past the next heartbeat: a backoff longer than the lease would cost it.
        await this.#sleep(Math.min(dbBackoff, this.#nextBeat - performance.now()));
        continue;
      }
      if (config.maxJobs !== undefined && this.#claims >= config.maxJobs) {
        return { code: 0, reason: "max_jobs" };
      }
      if (config.batch && foundNothing && idle && this.#inflight.size === 0) {
        return { code: 0, reason: "batch_done" };
      }
      if (full) continue;
      const poll = config.pollInterval * (0.5 + 0.5 * Math.random());
      await this.#sleep(Math.min(poll, this.#nextBeat - performance.now()));
    }
    return { code: 0, reason: "stopped" };
  }

  /**
   * LISTEN when notify is on and the listener is not listening. A connection the server
   * refuses for now (too many clients, say) leaves the worker polling: it keeps claiming
   * and heartbeating, and tries again a few seconds later. The first success is probed.
   */
  async #listen(): Promise<void> {
    if (!this.#app.notify || this.#listener.listening) return;
    if (performance.now() < this.#nextListen) return;
    try {
      await this.#listener.start();
    } catch (error) {
      if (!isTransientError(error)) throw error;
      this.#nextListen = performance.now() + LISTEN_RETRY;
      if (!this.#listenFailing) {
        this.#listenFailing = true;
        this.#log.warn(
          "could not LISTEN for new jobs, finding them by polling every {pollInterval} ms " +
            "until it works: {message}",
          {
            event: "listen_failed",
            workerId: this.id,
            pollInterval: this.config.pollInterval,
            message: describeError(error),
          },
        );
      }
      return;
    }
    if (this.#listenFailing) {
      this.#listenFailing = false;
      this.#log.info("listening for new jobs again", {
        event: "listen_started",
        workerId: this.id,
      });
    }
    if (!this.#probed) {
      this.#probed = true;
      void this.#probeListen();
    }
  }

  /**
   * Check once that a notification sent through the app's connection reaches the listener;
   * when it does not (a pooler in transaction mode), say so once: the worker then finds
   * new jobs by polling only.
   */
  async #probeListen(): Promise<void> {
    const sql = this.#connection.sql;
    const stop = this.#probeStop.signal;
    let arrived: boolean;
    try {
      arrived = await this.#listener.probe(
        (channel, payload) => sql`select pg_notify(${channel}, ${payload})`,
        PROBE_TIMEOUT,
        stop,
      );
    } catch {
      return; // the database is unreachable now: nothing to conclude
    }
    if (arrived) {
      this.#log.debug("notifications reach this worker", {
        event: "listen_probed",
        workerId: this.id,
      });
      return;
    }
    if (stop.aborted || this.#stopRequested) return;
    const via = this.#app.listenUrl === undefined
      ? "LISTEN does not work through a connection pooler in transaction mode (such as " +
        "PgBouncer). Give the worker a direct connection to PostgreSQL for LISTEN (the app " +
        "option listenUrl, or AKADZE_LISTEN_URL), or set notify: false to silence this"
      : "check that listenUrl (AKADZE_LISTEN_URL) reaches the same PostgreSQL database " +
        "directly, not through a pooler in transaction mode";
    this.#log.warn(
      "notifications do not reach this worker: it finds new jobs only by polling every " +
        `{pollInterval} ms, and notices cancel requests at its heartbeat. ${via}`,
      { event: "listen_unavailable", workerId: this.id, pollInterval: this.config.pollInterval },
    );
  }

  /**
   * One prune, off the claim path: deleting thousands of old rows takes a while and no
   * claim needs to wait for it. A failure is logged; the next prune comes an interval later.
   */
  async #prune(): Promise<void> {
    try {
      const pruned = await this.#pruner.runOnce();
      if (pruned.jobs + pruned.periodicRuns + pruned.limitStarts > 0) {
        this.#log.debug("pruned {jobs} jobs", { event: "pruned", ...pruned });
      }
    } catch (error) {
      this.#log.warn("prune failed: {message}", {
        event: "prune_failed",
        message: describeError(error),
      });
    }
  }

  /** Start the metrics endpoint when `metricsPort` is set (rejects when the port is taken). */
  async #serveMetrics(): Promise<MetricsServer | null> {
    const { metricsPort, metricsHost, metricsQueueState } = this.config;
    if (metricsPort === undefined) return null;
    const app = this.#app;
    const server = await serveMetrics({
      hostname: metricsHost,
      port: metricsPort,
      render: async () => {
        const own = this.metrics.render();
        if (!metricsQueueState) return own;
        try {
          return own + await renderMetrics(app.sql, { schema: app.schema });
        } catch (error) {
          // The worker's own series matter most while the database is unreachable.
          this.#log.warn("metrics: could not read the queue state: {message}", {
            event: "metrics_queue_state_failed",
            message: describeError(error),
          });
          return own;
        }
      },
    });
    this.#log.info("metrics served at http://{host}:{port}/metrics", {
      event: "metrics_listening",
      host: server.hostname,
      port: server.port,
    });
    return server;
  }

  /** Heartbeat when due; returns an exit when the lease is lost or the error is fatal. */
  async #beatIfDue(): Promise<WorkerExit | null> {
    const now = performance.now();
    if (now < this.#nextBeat) return null;
    const { heartbeatInterval, heartbeatTtl } = this.config;
    try {
      // No claim runs during a beat, so what it reports running and this set lacks is
      // not ours to finish (see #releaseOrphans).
      const known = new Set([...this.#inflight.keys(), ...this.#unwritten]);
      const beat = await this.#heartbeat.runOnce();
      if (beat.registered && this.#beatOk === false && this.#heartbeat.lastSuccess !== null) {
        this.#log.debug("worker {workerId} registered", {
          event: "worker_registered",
          workerId: this.id,
        });
      }
      this.#beatOk = true;
      this.#nextBeat = now + heartbeatInterval;
      for (const id of beat.cancelRequested) this.#cancel(id);
      this.#releaseOrphans(beat.running.filter((r) => !known.has(r.id)));
      return null;
    } catch (error) {
      if (!isTransientError(error)) return this.#fatal(error);
      // The connection may hang (a partition, a dead peer): the next beat takes a new one.
      if ((error as { name?: unknown }).name === "HeartbeatTimeout") this.#connection.reset();
      this.#beatOk = false;
      this.#nextBeat = now + Math.min(heartbeatInterval, 1_000);
      this.#log.warn("heartbeat failed: {message}", {
        event: "heartbeat_failed",
        workerId: this.id,
        message: describeError(error),
      });
      const last = this.#heartbeat.lastSuccess;
      if (last !== null && now - last >= heartbeatTtl) {
        return {
          code: 1,
          reason: "heartbeat_lost",
          message: `no heartbeat succeeded for ${Math.round((now - last) / 1000)} s`,
        };
      }
      // A long-running worker waits for a database that is down (SPEC §5.10); a batch run
      // (cron, CI) must end, so it gives up after heartbeatTtl without a first beat.
      if (last === null && this.config.batch && now - this.#startedAt >= heartbeatTtl) {
        return {
          code: 1,
          reason: "heartbeat_lost",
          message: `could not reach the database for ${
            Math.round((now - this.#startedAt) / 1000)
          } s (a batch run gives up after heartbeatTtl): ${describeError(error)}`,
        };
      }
      return null;
    }
  }

  /** Claim into the free slots; returns [every requested slot filled, nothing claimable]. */
  async #claimPass(): Promise<[boolean, boolean]> {
    const { queues, slots, fair, maxJobs } = this.config;
    let requests: ClaimRequest[];
    let total: number;
    if (fair) {
      total = slots - this.#inflight.size;
      requests = queues.map((queue) => ({ queue, slots: total }));
    } else {
      requests = queues.map((queue) => ({ queue, slots: slots - (this.#busy.get(queue) ?? 0) }))
        .filter((r) => r.slots > 0);
      total = requests.reduce((sum, r) => sum + r.slots, 0);
    }
    total = Math.min(total, this.#writeRoom());
    if (maxJobs !== undefined) total = Math.min(total, maxJobs - this.#claims);
    if (total <= 0) return [false, false];
    const result = await this.#claimer.claim(requests, total, this.#offset++);
    if (this.#loopLeft) {
      // A claim that comes back after the run gave up on its loop: the lease is lost, so
      // nothing may start; put the jobs back (fenced, no attempt spent) if the database lets us.
      this.#releaseOrphans(result.claimed.map((row) => ({ id: row.id, runCount: row.run_count })));
      return [false, false];
    }
    if (result.claimed.length > 0 && this.#log.isEnabledFor("debug")) {
      for (const row of result.claimed) {
        this.#log.debug("job {jobId} claimed", {
          event: "job_claimed",
          jobId: row.id,
          task: row.task,
          queue: row.queue,
          attempt: row.attempt,
          runCount: row.run_count,
        });
      }
    }
    for (const row of result.claimed) this.#start(row);
    return [result.claimed.length === total, result.claimed.length === 0];
  }

  /**
   * How many more jobs may be claimed before the outcomes waiting for their write exceed
   * twice the slots: room for one claim to overlap the write of the previous one, while a
   * stalled write path still stops the claiming.
   */
  #writeRoom(): number {
    const limit = 2 * this.config.slots * (this.config.fair ? 1 : this.config.queues.length);
    return limit - this.#unwritten.size;
  }

  #start(row: ClaimedJob): void {
    this.#claims++;
    const run: Running = { execution: null, queue: row.queue, startedAt: performance.now() };
    this.#inflight.set(row.id, run);
    this.#busy.set(row.queue, (this.#busy.get(row.queue) ?? 0) + 1);
    // The outcome may come before start() returns (a synchronous handler).
    const execution = this.#executor.start(row, (outcome) => this.#finished(row, outcome));
    if (this.#inflight.get(row.id) === run) run.execution = execution;
  }

  /** A run is over: free its slot and queue its outcome (the next claim overlaps the write). */
  #finished(row: ClaimedJob, outcome: Outcome | null): void {
    const wasFull = this.#isFull(row.queue) || this.#writeRoom() <= 0;
    const run = this.#inflight.get(row.id);
    if (run) this.metrics.observe(row.task, row.queue, performance.now() - run.startedAt);
    this.#inflight.delete(row.id);
    this.#busy.set(row.queue, this.#busy.get(row.queue)! - 1);
    // A freed slot matters to a full queue, to batch mode and to a drain waiting for it.
    if (wasFull || this.config.batch || this.#draining) this.#wakeUp();
    if (!outcome) return;
    this.#unwritten.add(row.id);
    this.#pending.push({ outcome, job: row, done: () => this.#written(row.id) });
    this.#scheduleFlush();
  }

  /** An outcome was written (or discarded, or left to the lease). */
  #written(id: string): void {
    this.#unwritten.delete(id);
    if (this.#writeRoom() === 1 || this.config.batch) this.#wakeUp();
    if (this.#unwritten.size === 0) {
      for (const resolve of this.#allWritten.splice(0)) resolve();
    }
  }

  /** Resolves once no outcome waits for its write. */
  #untilAllWritten(): Promise<void> {
    if (this.#unwritten.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.#allWritten.push(resolve));
  }

  /**
   * Jobs the database says this worker runs but it does not: a claim that committed while
   * its reply was lost (a connection killed mid-claim), or a run whose outcome could not
   * be written. Its heartbeat keeps them from every rescuer, so put them back here, fenced
   * on their run_count, without spending an attempt.
   */
  #releaseOrphans(orphans: { id: string; runCount: number }[]): void {
    for (const { id, runCount } of orphans) {
      if (this.#releasing.has(id)) continue;
      this.#releasing.add(id);
      this.#log.warn("job {jobId} is running under this worker but not in it; releasing it", {
        event: "orphan_released",
        jobId: id,
        runCount,
      });
      this.#write({ id, runCount, kind: "release" }).finally(() => this.#releasing.delete(id));
    }
  }

  #isFull(queue: string): boolean {
    if (this.config.fair) return this.#inflight.size >= this.config.slots;
    return (this.#busy.get(queue) ?? 0) >= this.config.slots;
  }

  #cancel(jobId: string): void {
    const run = this.#inflight.get(jobId);
    if (!run) return;
    this.#log.info("job {jobId} cancel requested while running", {
      event: "job_cancel_requested",
      jobId,
    });
    run.execution?.interrupt("cancel");
  }

  /** Queue an outcome for the completer; resolves once written or discarded. */
  #write(outcome: Outcome): Promise<void> {
    return new Promise((done) => {
      this.#pending.push({ outcome, done });
      this.#scheduleFlush();
    });
  }

  #scheduleFlush(): void {
    if (this.#flushing) return;
    // Start one macrotask later, so outcomes settling in the same turn share a statement.
    this.#flushing = new Promise((r) => setTimeout(r, 0))
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
      const batch = this.#pending.splice(0, OUTCOME_BATCH);
      await this.#writeBatch(batch);
    }
  }

  async #writeBatch(batch: PendingOutcome[]): Promise<void> {
    const outcomes = batch.map((p) => p.outcome);
    const completer = this.#writeOnLoop ? this.#finalCompleter : this.#completer;
    let result: CompleteResult;
    try {
      result = await retryTransient(() => completer.write(outcomes), {
        signal: this.#abandon.signal,
        onRetry: (error, delay) =>
          this.#log.warn("outcome write failed, retrying in {delay} ms: {message}", {
            event: "db_error_transient",
            delay,
            message: describeError(error),
          }),
      });
    } catch (error) {
      if (this.#abandon.signal.aborted) {
        for (const p of batch) p.done(); // left to the lease
        return;
      }
      if (batch.length > 1) {
        for (const p of batch) await this.#writeBatch([p]);
        return;
      }
      const [p] = batch;
      const replacement = unstorableOutcome(p.outcome, error);
      if (replacement) {
        // The database refused the values themselves: record that, do not run the job again.
        this.#log.warn("the outcome of job {jobId} cannot be stored; ending the job: {message}", {
          event: "outcome_not_storable",
          jobId: p.outcome.id,
          kind: p.outcome.kind,
          message: describeError(error),
        });
        replacement.durationMs = p.outcome.durationMs;
        p.outcome = replacement;
        return await this.#writeBatch([p]);
      }
      this.#log.error("could not write the outcome of job {jobId}: {message}", {
        event: "outcome_write_failed",
        jobId: p.outcome.id,
        message: describeError(error),
      });
      p.done();
      return;
    }
    const byId = new Map(batch.map((p) => [p.outcome.id, p]));
    const log = this.#log.isEnabledFor("info");
    for (const row of result.written) {
      const p = byId.get(row.id);
      if (log || row.state === "failed") this.#logState(row, "running", p?.outcome, p?.job);
      const finished = p?.job && finishedOutcome(row.state, p.outcome.kind);
      if (finished) this.metrics.finished(p.job!.task, p.job!.queue, finished);
      p?.done();
    }
    for (const outcome of result.stale) {
      this.#log.warn("outcome of job {jobId} discarded: the run no longer owns the job", {
        event: "outcome_discarded",
        jobId: outcome.id,
        runCount: outcome.runCount,
        kind: outcome.kind,
      });
      byId.get(outcome.id)?.done();
    }
    for (const { item, error } of result.rolledBack) {
      this.#log.warn("onTransition hook failed for job {jobId}; retrying: {message}", {
        event: "transition_rolled_back",
        jobId: item.id,
        message: describeError(error),
      });
      const p = byId.get(item.id);
      if (!p) continue;
      await new Promise((r) => setTimeout(r, 1_000));
      if (this.#abandon.signal.aborted) p.done();
      else this.#pending.push(p);
    }
  }

  #logState(
    row: WrittenRow & { task?: string; queue?: string },
    from: string,
    outcome?: Outcome,
    job?: { task: string; queue: string; attempt: number; max_attempts: number },
  ): void {
    const props = {
      jobId: row.id,
      task: row.task ?? job?.task,
      queue: row.queue ?? job?.queue,
      attempt: row.attempt ?? job?.attempt,
      from,
    };
    switch (row.state) {
      case "succeeded":
        return this.#log.info("job {jobId} succeeded", { event: "job_succeeded", ...props });
      case "failed":
        return this.#log.warn(`job {jobId} ({task}) failed on ${FAILED_RUN}`, {
          event: "job_failed",
          ...props,
          ...failedRun(outcome, job),
        });
      case "cancelled":
        return this.#log.info("job {jobId} cancelled", { event: "job_cancelled", ...props });
      case "queued": {
        const event = outcome?.kind === "snooze"
          ? "job_snoozed"
          : outcome?.kind === "release"
          ? "job_released"
          : "job_retrying";
        const runAt = row.runAt === undefined ? undefined : new Date(row.runAt).toISOString();
        if (event === "job_retrying") {
          return this.#log.info(
            `job {jobId} ({task}) failed on ${FAILED_RUN}; retrying at {runAt}`,
            {
              event,
              ...props,
              ...failedRun(outcome, job),
              runAt,
            },
          );
        }
        return this.#log.info(`job {jobId} ${event.slice(4)}`, { event, ...props, runAt });
      }
    }
  }

  /** A task's error that reached the process level: its class and job, never its text. */
  #logStray(stray: Stray): void {
    const where = stray.job ? "job {jobId} (task {task}): " : "";
    const what = stray.kind === "unhandled_rejection"
      ? "a promise was rejected and nothing handled it ({error}); the worker goes on. " +
        "Await or catch every promise a task starts"
      : "an error was thrown where nothing could catch it ({error}), e.g. in a timer " +
        "callback; the worker goes on. Catch errors inside the callbacks a task schedules";
    this.#log.error(where + what, {
      event: stray.kind,
      workerId: this.id,
      error: stray.error,
      ...(stray.code ? { code: stray.code } : {}),
      ...(stray.job ? { jobId: stray.job.id, task: stray.job.task } : {}),
    });
  }

  #logRescue(result: { rescued: JobRow[]; removedWorkers: number }): void {
    for (const row of result.rescued) {
      this.#log.warn("job {jobId} rescued from a lost worker", {
        event: "job_rescued",
        jobId: row.id,
        task: row.task,
        queue: row.queue,
        attempt: row.attempt,
        state: row.state,
      });
    }
  }

  /** Graceful drain: wait for running jobs, then put the rest back without spending attempts. */
  async #drain(untilDone: boolean): Promise<void> {
    this.#draining = true;
    let deadline = untilDone ? Infinity : performance.now() + this.config.shutdownTimeout;
    while (this.#inflight.size > 0 && performance.now() < deadline) {
      if (untilDone && this.#stopRequested && deadline === Infinity) {
        deadline = performance.now() + this.config.shutdownTimeout;
      }
      await this.#touchHeartbeatFile();
      const beat = await this.#beatIfDue();
      if (beat) break;
      await this.#sleep(Math.min(deadline - performance.now(), this.#nextBeat - performance.now()));
    }
    await this.#abandonRuns();
  }

  /**
   * Put back what still runs (shutdown, fatal error, lost lease) without spending attempts,
   * waiting at most RELEASE_TIMEOUT; what cannot be written is left to the lease.
   */
  async #abandonRuns(): Promise<void> {
    // The loop has returned and no beat follows, so its connection is free for these last
    // writes; the pool may be held by the very runs that are put back. Not when the loop
    // was left stuck in a statement on it (the watchdog).
    this.#writeOnLoop = !this.#loopLeft;
    // An interrupt settles its run at once: every outcome is then waiting for its write.
    for (const run of [...this.#inflight.values()]) run.execution?.interrupt("shutdown");
    const timer = setTimeout(() => this.#abandon.abort(), RELEASE_TIMEOUT);
    await this.#untilReleased(this.#untilAllWritten());
    clearTimeout(timer);
  }

  /**
   * Wait for the release writes, but not past the abandon (RELEASE_TIMEOUT): a write can
   * be stuck in the driver (its reconnect backoff while the database is down) long after.
   */
  #untilReleased(writes: Promise<unknown>): Promise<unknown> {
    const { signal } = this.#abandon;
    return Promise.race([
      writes,
      new Promise((resolve) =>
        signal.aborted ? resolve(null) : signal.addEventListener("abort", resolve, { once: true })
      ),
    ]);
  }

  #fatal(error: unknown): WorkerExit {
    const { schema } = this.#app;
    const message = isSchemaMissing(error, schema)
      ? schemaMissingMessage(schema, error)
      : describeError(error);
    return { code: 1, reason: "fatal", message };
  }

  async #touchHeartbeatFile(): Promise<void> {
    const path = this.config.heartbeatFile;
    if (!path) return;
    try {
      await Deno.writeTextFile(path, `${Date.now()}\n`);
    } catch (error) {
      this.#log.warn("could not touch the heartbeat file: {message}", {
        event: "heartbeat_file_failed",
        message: describeError(error),
      });
    }
  }

  #wakeUp(): void {
    this.#wakeFlag = true;
    this.#wake();
  }

  #sleep(ms: number): Promise<void> {
    if (this.#wakeFlag || ms <= 0) {
      this.#wakeFlag = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = () => {};
        this.#wakeFlag = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#wake = done;
    });
  }
}

function hostname(): string {
  try {
    return Deno.hostname();
  } catch {
    return "unknown-host";
  }
}

/** A failed run in a log line: its attempt, how long it ran and its stored error. */
const FAILED_RUN = "attempt {attempt}/{maxAttempts} after {durationMs} ms: {error}: {message}";

/**
 * A failed run's log properties: the attempt budget, how long it ran and its stored
 * error entry (name and message, already redacted: never the raw error, which may quote
 * arguments). The stack stays in the database (`akadze jobs show`).
 */
function failedRun(
  outcome: Outcome | undefined,
  job: { max_attempts: number } | undefined,
): { maxAttempts?: number; durationMs?: number; error: string; message: string } {
  return {
    maxAttempts: job?.max_attempts,
    durationMs: outcome?.durationMs,
    error: outcome?.error?.error ?? "Error",
    message: outcome?.error?.message ?? "no error was recorded",
  };
}
