/**
 * `akadze worker APP[:export] [options]`: run a worker for an application module.
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import { describeError, isTransientError } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { logger } from "../log.ts";
import { pendingVersions } from "../migrate.ts";
import { POOL_SIZE_ENV, readEnv } from "../env.ts";
import { WORKER_DEFAULTS } from "../worker/config.ts";
import { budgetWarning, measureConnectionBudget } from "../worker/connection_budget.ts";
import { installProcessGuard } from "../worker/process_guard.ts";
import { Worker } from "../worker/worker.ts";
import { rerunParent, runUnderAppConfig } from "./app_config.ts";
import { UsageError } from "./common.ts";
import { slotHeartbeatFile } from "./heartbeat_files.ts";
import { assertAppModuleExists, loadApp, type LoadedApp, parseAppTarget } from "./load_app.ts";
import { configureCliLogging } from "./logging.ts";
import { safeText } from "./output.ts";
import { handleStopSignals, unlessStopped } from "./signals.ts";
import { slotWorkerId, superviseWorkers, watchSupervisor } from "./supervisor.ts";
import {
  DEFAULT_WORKER_POOL_SIZE,
  parseWorkerCommandLine,
  type WorkerCommandLine,
  workerFlagsHelp,
} from "./worker_flags.ts";

/** Help text of `akadze worker`. */
export function workerHelp(): string {
  return `Usage: akadze worker APP[:export] [options]

Run jobs of the Akadze app exported by the module APP: a path relative to the current
directory, or a file: URL. The export is the one named after the colon, else "app",
else the default export. The app opens its own connection (typically from
AKADZE_DATABASE_URL); its schema must be migrated (akadze migrate).

${workerFlagsHelp()}`;
}

/** Run `akadze worker`; returns the exit code. */
export async function workerCommand(args: string[]): Promise<number> {
  const line = parseWorkerCommandLine(args, "worker");
  if (line.help) {
    console.log(workerHelp());
    return 0;
  }
  const target = parseAppTarget(line.app);
  const rerun = await runUnderAppConfig(target);
  if (rerun !== undefined) return rerun;
  if (line.processes > 1) {
    // Fail fast on a wrong path; the supervisor itself never imports the app.
    await assertAppModuleExists(target);
    return await superviseWorkers(line, rerunParent());
  }
  if (line.slot !== undefined) {
    line.worker.id = slotWorkerId(hostname(), Deno.pid, line.slot);
    if (line.previousExit) {
      const { pid, end } = line.previousExit;
      line.worker.previousProcess = { id: slotWorkerId(hostname(), pid, line.slot), ...end };
    }
    if (line.worker.heartbeatFile) {
      line.worker.heartbeatFile = slotHeartbeatFile(line.worker.heartbeatFile, line.slot);
    }
    // One endpoint per worker process: the supervisor's port plus the slot.
    if (line.worker.metricsPort) line.worker.metricsPort += line.slot;
  }
  applyPoolSize(line);
  const stop = new AbortController();
  const removeSignals = stopOnSignals(stop);
  try {
    const loaded = await loadApp(target);
    return await runAppWorker(loaded, line, stop.signal);
  } finally {
    removeSignals();
  }
}

/**
 * Before the app module is loaded: set AKADZE_POOL_SIZE, which an app whose code gives no
 * `max` takes as its pool size, to `--pool-size`, or to the worker's default when the
 * environment has none. A process that may not set it (no --allow-env for it) leaves it.
 */
export function applyPoolSize(line: WorkerCommandLine): void {
  const granted =
    Deno.permissions.querySync({ name: "env", variable: POOL_SIZE_ENV }).state === "granted";
  if (line.poolSize !== undefined) {
    if (!granted) {
      throw new UsageError(
        `--pool-size reaches the app through ${POOL_SIZE_ENV}: allow it (--allow-env=AKADZE_*)`,
      );
    }
    Deno.env.set(POOL_SIZE_ENV, String(line.poolSize));
  } else if (granted && readEnv(POOL_SIZE_ENV) === undefined) {
    Deno.env.set(POOL_SIZE_ENV, String(DEFAULT_WORKER_POOL_SIZE));
  }
}

/**
 * Listen for SIGINT/SIGTERM: the first aborts `controller` (a graceful stop), a second
 * exits with 130. Returns a function that removes the listeners.
 */
export function stopOnSignals(controller: AbortController): () => void {
  const log = logger("cli");
  return handleStopSignals({
    onFirst(signal) {
      log.info("{signal}: stopping gracefully (send it again to exit at once)", {
        event: "stop_requested",
        signal,
      });
      controller.abort();
    },
    onForce(signal) {
      log.warn("{signal} again: exiting now, running jobs are left to the lease", {
        event: "stop_forced",
        signal,
      });
    },
  });
}

/**
 * Configure logging, check that the app's schema is migrated, run a worker until it
 * stops (or `signal` aborts), close the app and return the worker's exit code.
 */
export async function runAppWorker(
  loaded: LoadedApp,
  line: WorkerCommandLine,
  signal: AbortSignal,
): Promise<number> {
  const { app } = loaded;
  const log = logger("cli");
  const secrets = appSecrets(app);
  let unwatch = () => {};
  try {
    await configureCliLogging(line.logging);
    if (!loaded.sameCopy) {
      log.warn(
        "the app imports another copy of akadze than this CLI's; run the CLI of the same " +
          "package and version so that Retry, Snooze, Fail, Cancel and current() work",
        { event: "app_other_copy" },
      );
    }
    // A supervisor's worker, or a command re-run under the app's deno.json: stop when the
    // process that started it is gone.
    const parentPid = line.supervisorPid ?? rerunParent();
    if (parentPid !== undefined) {
      const watch = drainWhenOrphaned(parentPid, line);
      unwatch = watch.unwatch;
      signal = AbortSignal.any([signal, watch.signal]);
    }
    let worker: Worker;
    try {
      worker = new Worker(app, line.worker);
    } catch (error) {
      if (error instanceof AkadzeError) throw new UsageError(error.message);
      throw error;
    }
    if (app.tasks.size === 0) {
      log.warn("the app registers no tasks: nothing can run", { event: "app_without_tasks" });
    }
    // A stop during these checks (a database that does not answer) goes straight to the
    // worker's own stop.
    await unlessStopped(assertMigrated(app, secrets), signal);
    warnPoolSizeIgnored(app, line);
    // One check per start: a lone worker's, or the first start of a supervisor's slot 0,
    // for all its processes.
    // Not with a listenUrl: the rest then goes through a pooler, whose clients are not the
    // server's connections.
    const processes = line.slot === undefined ? 1 : line.budgetProcesses;
    if (processes !== undefined && app.listenUrl === undefined) {
      await unlessStopped(checkConnectionBudget(app, processes), signal);
    }
    const exit = await worker.run({ signal });
    if (exit.code !== 0) {
      console.error(`error: ${safeText(describeError(exit.message ?? exit.reason, secrets))}`);
    }
    return exit.code;
  } catch (error) {
    if (error instanceof UsageError) throw error;
    throw new Error(describeError(error, secrets), { cause: error });
  } finally {
    unwatch();
    await closeApp(app);
  }
}

/**
 * In a worker process started by `parentPid` (its supervisor, or the `akadze` command that
 * re-ran it under the app's deno.json): a signal that aborts when that process is gone
 * (checked now and every poll interval), so the worker drains instead of running on as an
 * orphan.
 */
function drainWhenOrphaned(
  parentPid: number,
  line: WorkerCommandLine,
): { signal: AbortSignal; unwatch: () => void } {
  const orphaned = new AbortController();
  const unwatch = watchSupervisor(
    parentPid,
    line.worker.pollInterval ?? WORKER_DEFAULTS.pollInterval,
    () => {
      logger("cli").warn(
        "process {parentPid}, which started this worker, is gone: stopping gracefully",
        {
          event: "worker_orphaned",
          parentPid,
          slot: line.slot,
        },
      );
      orphaned.abort();
    },
  );
  return { signal: orphaned.signal, unwatch };
}

/** Say so when the app's code sets a pool size other than the one asked for. */
function warnPoolSizeIgnored(app: Akadze, line: WorkerCommandLine): void {
  const asked = readEnv(POOL_SIZE_ENV);
  const max = (app.sql.options as { max?: unknown } | undefined)?.max;
  if (asked === undefined || typeof max !== "number" || String(max) === asked) return;
  if (line.poolSize === undefined && asked === String(DEFAULT_WORKER_POOL_SIZE)) return;
  logger("cli").warn(
    "the app sets its own pool size ({max}: max, or its own sql, in its code), so " +
      `${line.poolSize === undefined ? POOL_SIZE_ENV : "--pool-size"} {asked} does not ` +
      "apply: remove max from new Akadze({...}) to size the pool from the command line",
    { event: "pool_size_ignored", max, asked: Number(asked) },
  );
}

/**
 * Warn once when what the worker processes being started may open does not fit in what the
 * server has free. Only a warning, never a failure: the numbers are an estimate.
 */
async function checkConnectionBudget(app: Akadze, processes: number): Promise<void> {
  const log = logger("cli");
  try {
    // Connections of this app opened since shortly before this process started are its
    // own or its siblings' (started together).
    const budget = await measureConnectionBudget(app, processes, performance.now() + 5_000);
    const props = { event: "connection_budget", ...budget };
    if (budget.needed > budget.free) log.warn(budgetWarning(budget), props);
    else {
      log.debug(
        "connection budget: {needed} connections at most, {free} free on the server",
        props,
      );
    }
  } catch (error) {
    log.debug("could not check the connection budget: {message}", {
      event: "connection_budget_unknown",
      message: describeError(error),
    });
  }
}

/** A one-line failure when the schema is missing or behind; a database that is down is not. */
async function assertMigrated(app: Akadze, secrets: string[]): Promise<void> {
  let pending: string[];
  try {
    pending = await pendingVersions(app.sql, { schema: app.schema });
  } catch (error) {
    // The worker starts while the database is down and keeps retrying.
    if (isTransientError(error)) return;
    throw new Error(`cannot use the app's database: ${describeError(error, secrets)}`);
  }
  if (pending.length > 0) {
    throw new Error(
      `schema "${app.schema}" is not migrated (pending: ${pending.join(", ")}): run akadze migrate`,
    );
  }
}

/**
 * End the app's pool on the way out. The process is about to exit: a pool that does not end
 * cleanly changes nothing, and neither does a stray socket error of a connection killed
 * earlier, which may land even after the pool has ended, nor a task left running past the
 * shutdown that rejects where nothing handles it (so the guard stays installed, and prints
 * neither's text).
 */
async function closeApp(app: Akadze): Promise<void> {
  installProcessGuard({ onDriverError: () => {}, onStray: () => {} });
  await app.close().catch(() => {});
}

function appSecrets(app: Akadze): string[] {
  const password = (app.sql?.options as { pass?: unknown } | undefined)?.pass;
  return typeof password === "string" && password ? [password] : [];
}

function hostname(): string {
  try {
    return Deno.hostname();
  } catch {
    return "unknown-host";
  }
}
