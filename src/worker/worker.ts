/**
 * The worker: a short loop over named services, each made as `new X(sql, config)` with a
 * `runOnce()`. Each pass: heartbeat when due (heartbeat.ts), rescue (rescuer.ts), start a
 * prune about once a minute beside the loop (pruner.ts), run due schedules (scheduler.ts),
 * claim into the free slots (claimer.ts, slots.ts), then cancel queued jobs with a cancel
 * request or expiry (canceller.ts). Claimed jobs run in the executor (executor.ts); their
 * outcomes go to the batch completer (batch_completer.ts). Log wording: log_events.ts.
 * See docs/architecture.md.
 *
 * @module
 */
import { deadLetterTargets } from "../dead_letter.ts";
import type { Akadze } from "../app.ts";
import { describeError, isReadOnlyError, isTransientError, jobsChannel, type Sql } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { activeTracer, readTraceContexts } from "../tracing.ts";
import { LoopConnection } from "../loop_connection.ts";
import { BatchCompleter } from "./batch_completer.ts";
import { Canceller } from "./canceller.ts";
import { type ClaimedJob, Claimer, type ClaimRequest } from "./claimer.ts";
import type { HandOffer } from "./completer.ts";
import { resolveWorkerConfig, type WorkerConfig, type WorkerOptions } from "./config.ts";
import { Executor } from "./executor.ts";
import { HandOffSlots } from "./hand_off_slots.ts";
import { Heartbeat, hostName, touchHeartbeatFile } from "./heartbeat.ts";
import { LISTEN_TIMEOUT_DEFAULT, Listener } from "./listener.ts";
import * as log from "./log_events.ts";
import { LoopBlocks } from "./loop_blocks.ts";
import { installProcessGuard } from "./process_guard.ts";
import {
  describeProcessEnd,
  exitProcess,
  guardProcessExit,
  type ProcessExited,
} from "./process_end.ts";
import { reportThroughMeter } from "./otel_metrics.ts";
import { Pruner } from "./pruner.ts";
import { Rescuer } from "./rescuer.ts";
import { Scheduler } from "./scheduler.ts";
import { neededSettings } from "./session_settings.ts";
import { Slots } from "./slots.ts";
import { withinTime } from "./settle.ts";
import { Wake } from "./wake.ts";
import { fatalExit, type WorkerExit } from "./worker_exit.ts";
import { type MetricsServer, serveWorkerMetrics } from "./metrics_server.ts";
import { WorkerMetrics } from "./worker_metrics.ts";

export type { WorkerExit } from "./worker_exit.ts";

/** The longest wait after a failed loop pass (ms); it doubles from 250 per failure. */
const DB_BACKOFF_MAX = 30_000;
/** How long the last writes (and a prune) may take once the loop is done (ms). */
const RELEASE_TIMEOUT = 5_000;
/**
 * How late a loop pass's bound may fire before it counts as the event loop held (not a
 * statement without an answer); it then looks again this much later.
 */
const PASS_GUARD_LATE = 250;
/** A worker process that ended with jobs running (see `WorkerOptions.previousProcess`). */
type PreviousProcess = NonNullable<WorkerOptions["previousProcess"]>;
/** The fixed worker ids that ran in this process (a later run under one is no restart). */
const RAN_HERE = new Set<string>();

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
  /** The loop's own connection (heartbeat, rescue, claim, cancel, schedules). */
  #connection: LoopConnection;
  #heartbeat: Heartbeat;
  #rescuer: Rescuer;
  #pruner: Pruner;
  #scheduler: Scheduler | null;
  #claimer: Claimer;
  #canceller: Canceller;
  #completer: BatchCompleter;
  #slots: Slots;
  #blocks: LoopBlocks;
  /** The claim being started (a block in one of its runs holds up the rest). */
  #starting: readonly ClaimedJob[] = [];
  /** Jobs handed to this worker by an outcome write, not started yet (tracing's read). */
  #handing = new Set<ClaimedJob>();
  /**
   * Which successes keep their slot for the hand-off (see {@linkcode Slots}): of the tasks of
   * which a job that finished here had dependents, while their writes hand jobs over; other
   * jobs free theirs at once, as before.
   */
  #keeping = new HandOffSlots();
  /** Whether outcome writes may hand jobs over (not with onTransition hooks or retention 0). */
  #handOffs: boolean;
  /** The loop has returned (a drain or the last writes follow): nothing more is taken. */
  #loopEnded = false;
  #wake = new Wake();
  #claims = 0;
  #offset = 0;
  #running = false;
  #stopRequested = false;
  /** When the first stop was requested (performance.now()): the stop's deadline counts from it. */
  #stopAt: number | null = null;
  /** Set by run(): starts the stop's bound on a stop requested while it runs. */
  #onStop: (() => void) | null = null;
  #executor: Executor;
  /** The run ended while its loop was stuck in a query (the watchdog): it runs nothing more. */
  #loopLeft = false;
  /** The app's tasks when this worker was made: the only ones it claims. */
  #tasks: ReadonlySet<string>;
  /** Tasks registered later, already warned of. */
  #lateTasks = new Set<string>();
  #draining = false;
  /** The process this worker replaces, until the jobs it left running are settled. */
  #previous: PreviousProcess | null = null;
  #ranBefore = false;
  /** A handler called `Deno.exit` with this code: the process exits once the jobs are put back. */
  #exitCode: number | null = null;

  /**
   * Make a worker for an app; options are validated now (`AkadzeError`).
   *
   * @param app The application whose tasks it runs.
   * @param options See {@linkcode WorkerOptions}.
   */
  constructor(app: Akadze, options: WorkerOptions = {}) {
    const config = this.config = resolveWorkerConfig(options);
    this.#app = app;
    const host = hostName();
    this.id = config.id ?? `${host}:${Deno.pid}:${crypto.randomUUID().slice(0, 8)}`;
    const { schema, hooks: { onTransition: hooks } } = app;
    this.metrics = new WorkerMetrics(config.queues, () => this.#slots.busy, app.tasks.values());
    // Not from the pool: tasks holding every pooled connection must not hold up the loop
    // and its heartbeat (the lease). The pruner runs beside the loop, so it stays on the pool.
    this.#connection = new LoopConnection(app.sql);
    const loopSql = this.#connection.sql;
    this.#heartbeat = new Heartbeat(loopSql, {
      ...config,
      schema,
      id: this.id,
      hostname: host,
      pid: Deno.pid,
      giveUpUnregistered: config.batch,
      // A hung connection (a partition) or one on a standby: the next beat takes a new one.
      onBadConnection: () => this.#connection.reset(),
    });
    const deadLetters = deadLetterTargets(app.tasks);
    this.#rescuer = new Rescuer(loopSql, {
      schema,
      hooks,
      interval: config.heartbeatInterval,
      deadLetters,
    });
    const prune = { schema, retention: app.retention, grace: app.grace };
    this.#pruner = new Pruner(app.sql, { ...prune, interval: config.pruneInterval });
    this.#scheduler = config.schedules ? new Scheduler(loopSql, { app }) : null;
    const tasks = [...app.tasks.keys()];
    this.#tasks = new Set(tasks);
    this.#claimer = new Claimer(loopSql, { schema, workerId: this.id, tasks, hooks });
    this.#handOffs = hooks.length === 0 && app.retention !== 0;
    // Every pass in batch mode (a batch run ends when nothing is left to do).
    const interval = config.batch ? 0 : undefined;
    this.#canceller = new Canceller(loopSql, { schema, queues: config.queues, hooks, interval });
    this.#completer = new BatchCompleter(app.sql, {
      schema,
      hooks,
      deleteSucceeded: app.retention === 0,
      // The last writes go on the loop's connection (see #abandonRuns).
      finalSql: loopSql,
      metrics: this.metrics,
      deadLetters,
      // An outcome or release not written may leave its job running under this id.
      onUnwritten: () => this.#heartbeat.orphansMayExist(),
      onSettled: () => {
        if (this.#slots.writeRoom() === 1 || config.batch) this.#wake.up();
      },
      // A key at its maxRunning has room again: claim now rather than at the next poll; and
      // where this worker has no free slot, tell the others, whose claim may take it.
      onLimitFreed: (queues) => {
        this.#claimer.limitFreed();
        this.#wake.up();
        const full = queues.filter((q) => this.#slots.isFull(q));
        if (app.notify && full.length > 0) this.#notifyLimitFreed(full);
      },
      offer: (queues, keyed) => this.#offer(queues, tasks, keyed),
      onHandOff: (queues, handed, lost, jobs, written) => {
        this.#keeping.settle(jobs, written ? handed.length : null);
        void this.#takeHanded(queues, handed, lost);
      },
      onDependents: (task) => this.#keeping.learn(task),
    });
    this.#blocks = new LoopBlocks({
      ...config,
      jobs: () => {
        const runs = this.#slots.runs();
        const ids = new Set(runs.map((r) => r.id));
        for (const row of [...this.#starting, ...this.#handing]) {
          if (!ids.has(row.id)) runs.push({ id: row.id, runCount: row.run_count, task: row.task });
        }
        return runs;
      },
      sandboxed: (run) => app.tasks.get(run.task)?.sandbox !== undefined,
    });
    const executor = this.#executor = new Executor(app, this.#completer.writer, {
      blockWarn: this.#blocks.warnAfter,
      onBlocked: (job, ms) => this.#blocks.report(job, ms),
    });
    this.#slots = new Slots({
      ...config,
      executor,
      completer: this.#completer,
      metrics: this.metrics,
      // A freed slot matters to a full queue, to batch mode and to a drain waiting for it.
      onFreed: (wasFull) => {
        if (wasFull || config.batch || this.#draining) this.#wake.up();
      },
      // A success of a task others depend on, or of a job whose key has a limits row: its
      // write may hand this worker a dependent, or its key's next job.
      keepFor: (row) => {
        if (!this.#handOffs || this.#stopRequested || this.#loopEnded) return false;
        return this.#keeping.keep(row.task, row.id) || row.limited === true;
      },
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
    return this.#slots.size;
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
    this.#stopAt ??= performance.now();
    this.#onStop?.();
    this.#wake.up();
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
  async run(options: {
    /** Aborting it starts a graceful stop, like `worker.stop()`. */
    signal?: AbortSignal;
  } = {}): Promise<WorkerExit> {
    if (this.#running) throw new AkadzeError("this worker is already running");
    this.#running = true;
    let metricsServer: MetricsServer | null;
    try {
      metricsServer = await serveWorkerMetrics(this.metrics, { ...this.config, app: this.#app });
    } catch (error) {
      this.#running = false;
      const { metricsHost: host, metricsPort: port } = this.config;
      const message = `cannot serve metrics on ${host}:${port}: ${describeError(error)}`;
      log.logStopped(this.id, { code: 1, reason: "fatal", message });
      return { code: 1, reason: "fatal", message };
    }
    this.#heartbeat.begin();
    this.#completer.writeFinalOn(false);
    this.#previous = this.#previousProcess();
    let listener: Listener;
    try {
      // Made per run: on a connection of its own to app.listenUrl when given, else on the pool.
      listener = new Listener(this.#app.sql, {
        ...this.config,
        schema: this.#app.schema,
        onJobs: () => this.#wake.up(),
        onCancel: (id) => this.#slots.cancel(id),
        workerId: this.id,
        viaListenUrl: this.#app.listenUrl !== undefined,
        listenUrl: this.#app.notify ? this.#app.listenUrl : undefined,
        probeSql: this.#connection.sql,
        stopping: () => this.#stopRequested,
        // Well inside a pass's bound (half the TTL): the loop's heartbeat comes after it.
        listenTimeout: Math.min(LISTEN_TIMEOUT_DEFAULT, this.config.heartbeatTtl / 4),
      });
    } catch (error) {
      // Nothing else has started but the metrics server: stop it, or it keeps the process.
      await metricsServer?.shutdown();
      this.#running = false;
      throw error;
    }
    // A stop ends the loop within shutdownTimeout, whatever the database does: a statement
    // of the loop that has not answered by then (a server that never replies) is left, as
    // the watchdog leaves a stuck one, and the worker goes on to put its jobs back.
    let stopTimer: ReturnType<typeof setTimeout> | undefined;
    const stopBound = new Promise<WorkerExit>((resolve) => {
      this.#onStop = () => {
        if (stopTimer !== undefined || this.#loopEnded) return;
        const left = this.#stopAt! + this.config.shutdownTimeout - performance.now();
        stopTimer = setTimeout(() => {
          this.#loopLeft = true;
          log.logLoopLeftOnStop(this.id, this.config.shutdownTimeout);
          resolve({ code: 0, reason: "stopped" });
        }, Math.max(0, left));
      };
    });
    if (this.#stopRequested) this.#onStop!();
    const onAbort = () => this.stop();
    options.signal?.addEventListener("abort", onAbort);
    if (options.signal?.aborted) this.stop();
    const removeGuard = installProcessGuard({
      onDriverError: log.logDriverError,
      onStray: (stray) => log.logStray(this.id, stray),
    });
    const stopReporting = reportThroughMeter(this.metrics);
    const unguardExit = guardProcessExit((jobId, error) => this.#handlerExit(jobId, error));
    log.logStarted(this.id, this.config.queues, this.config.slots);
    this.#warnLateTasks();
    let exit: WorkerExit;
    // The lease is lost all the same when the loop is stuck: stop as the heartbeat rule says.
    const watch = this.#heartbeat.watch();
    this.#blocks.start();
    const stalled = watch.stalled.then((): WorkerExit => {
      this.#stopRequested = true;
      this.#loopLeft = true;
      return { code: 1, reason: "heartbeat_lost", message: "the worker loop stalled" };
    });
    // A prune stuck on an unanswering database is waited for at most RELEASE_TIMEOUT from
    // the loop's end, alongside the release of the runs, then left to the pool's end.
    let pruned: Promise<void> | undefined;
    const loop = this.#loop(listener);
    let ended = false;
    try {
      exit = await Promise.race([loop, stalled, stopBound]);
      this.#loopEnded = true;
      clearTimeout(stopTimer);
      watch.stop();
      pruned = this.#pruner.settle(RELEASE_TIMEOUT);
      if (this.#exitCode !== null) {
        exit = {
          code: 1,
          reason: "fatal",
          message: `a handler called Deno.exit(${this.#exitCode})`,
        };
      }
      if (exit.code === 0) await this.#drain(exit.reason !== "stopped");
      else await this.#abandonRuns();
      ended = true;
    } finally {
      clearTimeout(stopTimer);
      this.#onStop = null;
      watch.stop();
      this.#blocks.stop();
      // Every run has settled: the sandbox threads go (a busy one would keep the process).
      this.#executor.close();
      options.signal?.removeEventListener("abort", onAbort);
      await Promise.all([
        pruned ?? this.#pruner.settle(RELEASE_TIMEOUT),
        listener.close(),
        metricsServer?.shutdown(),
      ]);
      this.#running = false;
      stopReporting();
      unguardExit();
      // Thrown out of the loop: nothing below runs, so the guard goes now.
      if (!ended) removeGuard();
    }
    try {
      // After a handler's Deno.exit too: its jobs are back, the process is about to end.
      // Bounded, and not tried when no beat ever got an answer: a worker row left behind
      // expires with its lease and another worker removes it.
      const registered = this.#heartbeat.lastSuccess !== null;
      if (registered && (exit.code === 0 || this.#exitCode !== null)) {
        await withinTime(this.#heartbeat.remove(), RELEASE_TIMEOUT).catch(() => false);
      }
      // A loop left stuck in a statement (the watchdog) keeps its connection until that
      // statement returns: cutting it could leave a claim committed that no one puts back.
      if (this.#loopLeft) void loop.catch(() => {}).finally(() => this.#connection.close());
      // Still guarded: ending a connection the server killed can raise the driver's errors.
      else await this.#connection.close();
    } finally {
      removeGuard();
    }
    log.logStopped(this.id, exit);
    if (this.#exitCode !== null) exitProcess(this.#exitCode);
    return exit;
  }

  /**
   * A handler called `Deno.exit` during the run of `jobId`: if it runs here, that run fails
   * with `error` (an attempt spent), and the worker stops at once, putting its other jobs
   * back without spending theirs; the run then ends the process with the handler's code.
   */
  #handlerExit(jobId: string, error: ProcessExited): boolean {
    if (!this.#slots.interrupt(jobId, "exit", error)) return false;
    if (this.#exitCode !== null) return true; // the first call's code stands
    this.#exitCode = error.code;
    log.logHandlerExit(this.id, jobId, error.code);
    this.stop();
    // The other runs go back now, not after a drain: the process is to end.
    this.#slots.interruptAll("shutdown");
    // The handler asked to end the process: the writes get their time, not more.
    setTimeout(() => exitProcess(error.code), 2 * RELEASE_TIMEOUT);
    return true;
  }

  /**
   * The process this run replaces, if any: the one `previousProcess` names (on the first
   * run), or a previous process under this worker's fixed id. Jobs left running under an id
   * that already ran in this process were not left by a dead process (a claim whose reply
   * was lost, a release not written): the first beat puts those back unspent.
   */
  #previousProcess(): PreviousProcess | null {
    const { previousProcess, id } = this.config;
    const first = !this.#ranBefore;
    this.#ranBefore = true;
    const restart = id !== undefined && !RAN_HERE.has(id);
    if (id !== undefined) RAN_HERE.add(id);
    if (!first) return null;
    return previousProcess ?? (restart && id !== undefined ? { id } : null);
  }

  /**
   * Settle what the process this worker replaces left running: each job is charged an
   * attempt, with an error saying how that process ended (see `Rescuer.settleWorker`).
   */
  async #settlePrevious(previous: PreviousProcess): Promise<void> {
    const { id, code, signal } = previous;
    const [name, ended] = code === undefined
      ? ["WorkerLost", `the previous process of worker ${id} ended (how is unknown)`]
      : ["ProcessExited", `the worker process ${id} ${describeProcessEnd({ code, signal })}`];
    const rows = await this.#rescuer.settleWorker(id, name, ended);
    if (rows.length > 0) log.logPreviousSettled(this.id, id, rows.length);
  }

  async #loop(listener: Listener): Promise<WorkerExit> {
    const { config } = this;
    let dbBackoff = 0;
    for (const service of [this.#rescuer, this.#pruner, this.#canceller]) service.begin();
    while (!this.#stopRequested) {
      await touchHeartbeatFile(config.heartbeatFile);
      const beat = await this.#beatIfDue();
      if (beat) return beat;
      if (!this.#heartbeat.ok) {
        await this.#wake.sleep(this.#heartbeat.nextBeat - performance.now());
        continue;
      }
      let [full, foundNothing, idle] = [false, false, false];
      // A statement that never answers (a connection the server dropped without the driver
      // noticing) would hold the loop, and so its heartbeat, until the lease is lost.
      const guard = this.#guardPass();
      try {
        if (this.#app.notify) await listener.ensure();
        // Before the first claim: the jobs a dead process left go back now, not after its lease.
        if (this.#previous) {
          await this.#settlePrevious(this.#previous);
          this.#previous = null;
        }
        await this.#rescuer.runIfDue();
        this.#pruner.startIfDue();
        await this.#scheduler?.runOnce();
        // Idle before the claim: no outcome written during it can have made a job ready.
        idle = this.#slots.size + this.#completer.unwritten === 0;
        if (!this.#stopRequested) [full, foundNothing] = await this.#claimPass();
        // After the claim, so it never delays a job.
        await this.#canceller.runIfDue();
        guard.clear();
        dbBackoff = 0;
      } catch (error) {
        guard.clear();
        if (!isTransientError(error)) return fatalExit(error, this.#app.schema);
        // A connection on a standby stays there: a new one tries the URL's hosts again.
        if (isReadOnlyError(error)) this.#connection.reset();
        // A claim may have committed (in part, with hooks) while its reply was lost: the
        // next beat looks for jobs running under this id that the worker does not know of.
        this.#heartbeat.orphansMayExist();
        dbBackoff = Math.min(Math.max(dbBackoff * 2, 250), DB_BACKOFF_MAX);
        log.logLoopRetry(dbBackoff, error);
        // Not past the next heartbeat: a backoff longer than the lease would cost it.
        await this.#wake.sleep(Math.min(dbBackoff, this.#heartbeat.nextBeat - performance.now()));
        continue;
      }
      if (config.maxJobs !== undefined && this.#claims >= config.maxJobs) {
        return { code: 0, reason: "max_jobs" };
      }
      if (config.batch && foundNothing && idle && this.#slots.size === 0) {
        return { code: 0, reason: "batch_done" };
      }
      if (full) continue;
      const poll = config.pollInterval * (0.5 + 0.5 * Math.random());
      await this.#wake.sleep(Math.min(poll, this.#heartbeat.nextBeat - performance.now()));
    }
    return { code: 0, reason: "stopped" };
  }

  /**
   * Arm the bound of one pass of the loop (its claim, rescue, schedule and cancel statements
   * on the loop's connection): half the heartbeat TTL, as a beat has. Past it the connection
   * is replaced, which fails the statement waiting on it; the loop handles that as any failed
   * statement (a claim that committed meanwhile is found by the next beat and put back), and
   * the next beat still comes within the lease. Returns the guard to clear once the pass ends.
   */
  #guardPass(): { clear(): void } {
    const bound = this.config.heartbeatTtl / 2;
    this.#connection.forget();
    const startedAt = performance.now();
    let timer: ReturnType<typeof setTimeout>;
    const arm = (ms: number) => {
      const due = performance.now() + ms;
      timer = setTimeout(() => {
        // A timer that fires late means the event loop itself was held (a handler computing),
        // and a reply that came meanwhile is not read yet: look again once the loop has
        // turned, instead of replacing a connection that answered.
        if (performance.now() - due > PASS_GUARD_LATE) return arm(PASS_GUARD_LATE);
        log.logLoopConnectionReplaced(this.id, Math.round(performance.now() - startedAt));
        this.#connection.reset();
      }, ms);
    };
    arm(bound);
    return { clear: () => clearTimeout(timer) };
  }

  /**
   * Wake the workers of `queues` (as an enqueue does): a limit key there has room again. On
   * the pool, after the outcome's commit, so that a woken claim counts it. A failure only
   * costs them their next poll.
   */
  #notifyLimitFreed(queues: string[]): void {
    const channel = jobsChannel(this.#app.schema);
    this.#app.sql.unsafe("select pg_catalog.pg_notify($1, $2)", [channel, queues.join(",")])
      .catch(() => {});
  }

  /**
   * Warn (once per task) of tasks the app registered after this worker was made: it does not
   * run them, and their jobs would wait for another worker.
   */
  #warnLateTasks(): void {
    if (this.#app.tasks.size === this.#tasks.size + this.#lateTasks.size) return;
    for (const name of this.#app.tasks.keys()) {
      if (this.#tasks.has(name) || this.#lateTasks.has(name)) continue;
      this.#lateTasks.add(name);
      log.logTaskAfterWorker(this.id, name);
    }
  }

  /** Heartbeat when due; returns an exit when the lease is lost or the error is fatal. */
  async #beatIfDue(): Promise<WorkerExit | null> {
    if (!this.#heartbeat.due()) return null;
    this.#warnLateTasks();
    // No claim runs during a beat, so what it reports running and this worker does not
    // know of is not its to finish: a claim whose reply was lost, an unwritten outcome.
    const running = [...this.#slots.ids()];
    const handing = [...this.#handing].map((row) => row.id);
    const known = new Set([...running, ...handing, ...this.#completer.ids()]);
    let lease;
    try {
      lease = await this.#heartbeat.beat({ running });
    } catch (error) {
      return fatalExit(error, this.#app.schema);
    }
    if (lease.kind === "lost") return { code: 1, reason: "heartbeat_lost", message: lease.message };
    if (lease.kind === "failed") return null;
    // Session defaults the worker's statements cannot work with (session_settings.ts): the
    // loop's connection is reopened with them set, before the first claim (the first beat
    // comes first); outcome writes run in transactions that set them.
    const settings = neededSettings(lease.beat.session);
    const refused = (name: string) => log.logSessionSettingRefused(this.id, name);
    if (this.#connection.use(settings, refused)) {
      this.#completer.writer.use(settings);
      log.logSessionSettings(this.id, lease.beat.session, settings);
    }
    for (const id of lease.beat.cancelRequested) this.#slots.cancel(id);
    // After a beat: no worker rescues this one's jobs any more, so what a block cost is known.
    for (const block of this.#blocks.take()) {
      await this.#rescuer.chargeBlock(this.id, block).catch(log.logBlockChargeFailed);
    }
    // Every job running under this id, on a beat that looked for orphans (heartbeat.ts);
    // those of a previous process under this id are settled by #settlePrevious instead.
    if (this.#previous?.id !== this.id) {
      this.#completer.release(lease.beat.running?.filter((r) => !known.has(r.id)) ?? []);
    }
    return null;
  }

  /** Claim into the free slots; returns [every requested slot filled, nothing claimable]. */
  async #claimPass(): Promise<[boolean, boolean]> {
    const { maxJobs } = this.config;
    const { requests, total: free } = this.#slots.free();
    let total = Math.min(free, this.#slots.writeRoom());
    if (maxJobs !== undefined) total = Math.min(total, maxJobs - this.#claims);
    if (total <= 0) return [false, false];
    const { claimed } = await this.#claimer.claim(requests, total, this.#offset++);
    if (claimed.length > 0 && activeTracer() !== null) await this.#readTraceContexts(claimed);
    if (this.#loopLeft) {
      // A claim that comes back after the run gave up on its loop: the lease is lost, so
      // nothing may start; put the jobs back (fenced, no attempt spent) if the database lets us.
      this.#completer.release(claimed.map((row) => ({ id: row.id, runCount: row.run_count })));
      return [false, false];
    }
    if (log.debugEnabled()) claimed.forEach(log.logClaimed);
    this.#claims += claimed.length;
    this.#starting = claimed;
    for (const row of claimed) this.#slots.start(row);
    this.#starting = [];
    return [claimed.length === total, claimed.length === 0];
  }

  /**
   * What an outcome write may hand this worker (slots kept for it, one per queue in
   * `queues`): as many jobs, of its tasks, with the next jobs of the ended runs' limit keys
   * when one of them had a key (`keyed`); nothing once it is stopping.
   */
  #offer(
    queues: readonly string[],
    tasks: readonly string[],
    keyed: boolean,
  ): HandOffer | null {
    if (this.#stopRequested || this.#loopEnded || this.#loopLeft) return null;
    let total = queues.length;
    const { maxJobs, fair } = this.config;
    if (maxJobs !== undefined) total = Math.min(total, maxJobs - this.#claims);
    if (total <= 0) return null;
    let requests: ClaimRequest[];
    if (fair) requests = this.config.queues.map((queue) => ({ queue, slots: total }));
    else {
      const slots = new Map<string, number>();
      for (const q of queues) slots.set(q, (slots.get(q) ?? 0) + 1);
      requests = [...slots].map(([queue, n]) => ({ queue, slots: n }));
    }
    return { workerId: this.id, requests, total, tasks, keys: keyed };
  }

  /**
   * The end of an outcome write that kept slots: free them and start the jobs it handed to
   * this worker in them, as a claim's (counted, logged, traced). Once the loop has returned
   * they are put back instead (a stop requested meanwhile drains them, as a claim's that was
   * under way). `lost`: a try of the write failed, and may have committed a hand-off all the
   * same (the next beat looks for such jobs).
   */
  async #takeHanded(queues: string[], handed: ClaimedJob[], lost: boolean): Promise<void> {
    if (lost) this.#heartbeat.orphansMayExist();
    if (handed.length > 0 && activeTracer() !== null) {
      for (const row of handed) this.#handing.add(row);
      await this.#readTraceContexts(handed, this.#app.sql);
      for (const row of handed) this.#handing.delete(row);
    }
    this.#slots.release(queues);
    if (this.#loopEnded || this.#loopLeft) {
      this.#completer.release(handed.map((row) => ({ id: row.id, runCount: row.run_count })));
      handed = [];
    }
    if (log.debugEnabled()) handed.forEach(log.logClaimed);
    this.#claims += handed.length;
    this.#starting = handed;
    for (const row of handed) this.#slots.start(row);
    this.#starting = [];
    // A kept slot left free: the loop may claim into it now.
    if (handed.length < queues.length) this.#wake.up();
  }

  /**
   * Tracing only: add each claimed job's stored trace context, so that its run joins the
   * enqueue's trace. A failed read leaves the runs without (they start traces of their own).
   */
  async #readTraceContexts(
    claimed: ClaimedJob[],
    sql: Sql = this.#connection.sql,
  ): Promise<void> {
    try {
      const contexts = await readTraceContexts(
        sql,
        this.#app.schema,
        claimed.map((r) => r.id),
      );
      for (const row of claimed) row.trace_context = contexts.get(row.id);
    } catch (error) {
      log.logTraceContextsFailed(error);
    }
  }

  /** Graceful drain: wait for running jobs, then put the rest back without spending attempts. */
  async #drain(untilDone: boolean): Promise<void> {
    this.#draining = true;
    // Counted from the stop request: running jobs get shutdownTimeout from then.
    const fromStop = () => (this.#stopAt ?? performance.now()) + this.config.shutdownTimeout;
    let deadline = untilDone ? Infinity : fromStop();
    while (this.#slots.size > 0 && performance.now() < deadline) {
      if (untilDone && this.#stopRequested && deadline === Infinity) deadline = fromStop();
      await touchHeartbeatFile(this.config.heartbeatFile);
      // A beat the database does not answer is not waited for past the deadline; the loop's
      // connection it holds is then closed, and the last writes go through the pool.
      const beat = await withinTime(this.#beatIfDue(), deadline - performance.now()).catch(() => {
        this.#loopLeft = true;
        return null;
      });
      if (beat) break;
      await this.#wake.sleep(Math.min(deadline, this.#heartbeat.nextBeat) - performance.now());
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
    this.#completer.writeFinalOn(!this.#loopLeft);
    // An interrupt settles its run at once: every outcome is then waiting for its write.
    this.#slots.interruptAll("shutdown");
    await this.#completer.finish(RELEASE_TIMEOUT);
  }
}
