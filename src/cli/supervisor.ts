/**
 * `akadze worker APP --processes N`: a supervisor that starts N worker processes (the
 * same command with `--processes 1 --slot K`), restarts a dead one with backoff, stops
 * with exit 1 when one keeps dying, and forwards stop signals once. It opens no database
 * connection and never imports the app: a restarted worker process is told which process
 * ran its slot before and how it ended (`--previous-exit`), and settles the jobs that one
 * left running as it starts. The restart policy and the exit code are pure functions,
 * exported for the tests.
 *
 * @module
 */
import { describeError } from "../db.ts";
import { logger } from "../log.ts";
import { UsageError } from "./common.ts";
import { supervisorHeartbeatFile, touchHeartbeatFile } from "./heartbeat_files.ts";
import { configureCliLogging } from "./logging.ts";
import { countSignals, FORCED_EXIT_CODE } from "./signals.ts";
import type { WorkerCommandLine } from "./worker_flags.ts";
import { formatProcessEnd, type ProcessEnd } from "../worker/process_end.ts";

/** The delay before the first restart of a slot, ms. */
export const RESTART_DELAY_MIN = 1_000;
/** The longest delay between restarts of a slot, ms. */
export const RESTART_DELAY_MAX = 30_000;
/** A worker process that ran this long (ms) starts the delay sequence over. */
export const RESTART_RESET_UPTIME = 60_000;
/** The window (ms) in which deaths of one slot are counted against the cap. */
export const RESTART_WINDOW = 60_000;
/** More deaths than this of one slot within the window stop the supervisor (exit 1). */
export const RESTART_CAP = 5;
/** After a forced stop (second signal), how long (ms) before the workers are killed. */
export const KILL_AFTER = 5_000;
/** How often (ms) the supervisor touches `PATH.supervisor`. */
export const SUPERVISOR_HEARTBEAT_INTERVAL = 1_000;
/** The signals the supervisor stops on (SIGHUP too: a closed terminal drains the workers). */
export const SUPERVISOR_SIGNALS: readonly Deno.Signal[] = ["SIGINT", "SIGTERM", "SIGHUP"];

/** The restart bookkeeping of one slot. */
export interface RestartHistory {
  /** The delay (ms) of the last restart; 0 before the first. */
  readonly delay: number;
  /** When (ms, any monotonic clock) the slot's recent deaths happened, oldest first. */
  readonly deaths: readonly number[];
}

/** A slot that never died. */
export const NO_RESTARTS: RestartHistory = { delay: 0, deaths: [] };

/** What to do after a death: see {@linkcode planRestart}. */
export interface RestartPlan {
  /** The slot's history including this death. */
  history: RestartHistory;
  /** How long (ms) to wait before starting the slot again. */
  delay: number;
  /** More than {@linkcode RESTART_CAP} deaths within {@linkcode RESTART_WINDOW}: stop. */
  capped: boolean;
}

/**
 * Plan the restart of a slot whose worker process started at `startedAt` and died at
 * `now`: 1 s after a first death or after an uptime of 60 s, else double the last delay,
 * at most 30 s; capped when this is the sixth death within 60 s.
 */
export function planRestart(history: RestartHistory, startedAt: number, now: number): RestartPlan {
  const deaths = [...history.deaths.filter((at) => now - at < RESTART_WINDOW), now];
  const delay = history.delay === 0 || now - startedAt >= RESTART_RESET_UPTIME
    ? RESTART_DELAY_MIN
    : Math.min(history.delay * 2, RESTART_DELAY_MAX);
  return { history: { delay, deaths }, delay, capped: deaths.length > RESTART_CAP };
}

/** How a supervised run ended, for {@linkcode supervisorExitCode}. */
export interface SupervisorOutcome {
  /** A slot hit the restart cap. */
  capped: boolean;
  /** A second (or third) signal forced the stop. */
  forced: boolean;
  /** The exit codes of the worker processes that exited after the stop began, in order. */
  exits: readonly number[];
}

/**
 * The supervisor's exit code: 1 after the restart cap (whatever the workers' codes), 130
 * after a forced stop, else the first non-zero code of a worker process, else 0.
 */
export function supervisorExitCode(outcome: SupervisorOutcome): number {
  if (outcome.capped) return 1;
  if (outcome.forced) return FORCED_EXIT_CODE;
  return outcome.exits.find((code) => code !== 0) ?? 0;
}

/**
 * The `akadze` arguments of the worker process of `slot`: `worker`, the supervisor's own
 * flags and APP (without `--processes`), and `--processes 1 --slot K --supervisor-pid P`
 * in front of them (so that a `--` among them cannot turn these into positionals).
 */
export function childArguments(
  passthrough: string[],
  slot: number,
  supervisorPid: number,
  budgetProcesses?: number,
  previous?: PreviousProcess,
): string[] {
  return [
    "worker",
    "--processes",
    "1",
    "--slot",
    String(slot),
    "--supervisor-pid",
    String(supervisorPid),
    ...(budgetProcesses === undefined ? [] : ["--budget-processes", String(budgetProcesses)]),
    ...(previous === undefined
      ? []
      : ["--previous-exit", `${previous.pid}:${formatProcessEnd(previous.end)}`]),
    ...passthrough,
  ];
}

/**
 * The runtime arguments of a command line: `argv` (the executable first) without the
 * executable and without `scriptArgs` (`Deno.args`), which must be its tail. For
 * `deno run --allow-net … cli.ts worker app.ts` that is `["run", "--allow-net", …, "cli.ts"]`.
 */
export function commandPrefix(argv: readonly string[], scriptArgs: readonly string[]): string[] {
  const start = argv.length - scriptArgs.length;
  if (start < 1 || scriptArgs.some((arg, i) => argv[start + i] !== arg)) {
    throw new Error(
      `the command line of this process (${argv.length} arguments) does not end with its ` +
        "script arguments",
    );
  }
  return argv.slice(1, start);
}

/** Whether the supervisor `supervisorPid` is gone: this process has another parent now. */
export function supervisorGone(supervisorPid: number, parentPid: number): boolean {
  return parentPid !== supervisorPid;
}

/** The worker process that ran a slot before a restart, and how it ended. */
export interface PreviousProcess {
  /** Its pid (its worker id is {@linkcode slotWorkerId} of it). */
  pid: number;
  /** Its exit status. */
  end: ProcessEnd;
}

/** The worker id of the worker process `pid` of a supervisor's slot: `host:pid:slot`. */
export function slotWorkerId(host: string, pid: number, slot: number): string {
  return `${host}:${pid}:${slot}`;
}

/** How to start a worker process. */
export interface ChildCommand {
  /** The executable. */
  command: string;
  /**
   * Its arguments for a slot; `first`: the first start of all (slot 0's, not a restart), the
   * one that checks the connection budget of every process; `previous`: on a restart, the
   * process that ran the slot before.
   */
  args(slot: number, first?: boolean, previous?: PreviousProcess): string[];
}

/**
 * The command that starts the worker process of a slot the way this process was started:
 * the same runtime flags (permissions, config, lock file, …) and script, with
 * {@linkcode childArguments}. Usage errors when this process may not start it.
 */
export async function resolveChildCommand(
  passthrough: string[],
  processes?: number,
): Promise<ChildCommand> {
  if (Deno.args[0] !== "worker") {
    throw new UsageError(
      "--processes starts each worker process with this process's command line, so it needs " +
        "the akadze CLI as the main module (deno run … cli.ts worker APP --processes N)",
    );
  }
  const command = await childRunner();
  const prefix = Deno.build.standalone
    ? []
    : commandPrefix(await ownCommandLine(command), Deno.args);
  const pid = Deno.pid;
  return {
    command,
    args: (slot, first, previous) => [
      ...prefix,
      ...childArguments(passthrough, slot, pid, first ? processes : undefined, previous),
    ],
  };
}

/** The executable of the worker processes: this runtime, if `--allow-run` allows it. */
async function childRunner(): Promise<string> {
  const exec = Deno.execPath();
  const candidates = Deno.build.standalone ? [exec] : [exec, "deno"];
  for (const command of candidates) {
    const { state } = await Deno.permissions.query({ name: "run", command });
    if (state === "granted") return command;
  }
  throw new UsageError(
    `--processes starts worker processes: allow it with --allow-run=${exec}` +
      (Deno.build.standalone
        ? " when compiling"
        : " (or --allow-run=deno when the deno on PATH is this runtime)"),
  );
}

/**
 * This process's command line, from `/proc` (Linux). Deno reserves `/proc/self` to
 * `--allow-all`; without it, a one-line `deno eval` (which runs with all permissions)
 * reads it. That uses nothing beyond the `--allow-run` of the runtime, which starting the
 * workers needs anyway and which already allows as much.
 */
export async function ownCommandLine(runtime: string): Promise<string[]> {
  let text: string;
  try {
    text = await Deno.readTextFile("/proc/self/cmdline");
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new UsageError(
        "--processes reads its command line from /proc (Linux) to start the worker processes " +
          "the same way; elsewhere run one akadze worker per process",
      );
    }
    if (!(error instanceof Deno.errors.NotCapable)) throw error;
    const code =
      `console.log(JSON.stringify(await Deno.readTextFile("/proc/${Deno.pid}/cmdline")))`;
    const out = await new Deno.Command(runtime, {
      args: ["eval", "--no-config", "--quiet", code],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      const detail = new TextDecoder().decode(out.stderr).trim().split("\n")[0];
      throw new Error(`could not read the command line of this process: ${detail}`);
    }
    text = JSON.parse(new TextDecoder().decode(out.stdout));
  }
  const argv = text.split("\0");
  if (argv.at(-1) === "") argv.pop(); // each argument ends with a NUL
  return argv;
}

/** Options of {@linkcode Supervisor}. */
export interface SupervisorOptions {
  /** How many worker processes. */
  processes: number;
  /** How to start one. */
  child: ChildCommand;
  /** The `--heartbeat-file` base path: the supervisor touches `PATH.supervisor`. */
  heartbeatFile?: string;
}

interface Slot {
  index: number;
  child: Deno.ChildProcess | null;
  startedAt: number;
  history: RestartHistory;
  timer?: ReturnType<typeof setTimeout>;
  /** The process that ran the slot last, once it died (its successor settles its jobs). */
  previous?: PreviousProcess;
}

/** The stop stages: running, draining (first signal or cap), forced, killed. */
type Stage = 0 | 1 | 2 | 3;

/**
 * Runs and restarts the worker processes; see the module documentation. `run()` resolves
 * with the exit code once every worker process has exited after a stop.
 */
export class Supervisor {
  #options: SupervisorOptions;
  #log = logger("supervisor");
  #slots: Slot[];
  #stage: Stage = 0;
  #capped = false;
  #exits: number[] = [];
  #done = Promise.withResolvers<void>();
  #killTimer?: ReturnType<typeof setTimeout>;
  #heartbeatFailing = false;

  /** @param options See {@linkcode SupervisorOptions}. */
  constructor(options: SupervisorOptions) {
    this.#options = options;
    this.#slots = Array.from({ length: options.processes }, (_, index) => ({
      index,
      child: null,
      startedAt: 0,
      history: NO_RESTARTS,
    }));
  }

  /** Start the worker processes and supervise them until they have all stopped. */
  async run(): Promise<number> {
    const { processes, heartbeatFile } = this.#options;
    this.#log.info("supervisor {pid} starting {processes} worker processes", {
      event: "supervisor_started",
      pid: Deno.pid,
      processes,
      ...(heartbeatFile ? { heartbeatFile } : {}),
    });
    let heartbeat: ReturnType<typeof setInterval> | undefined;
    if (heartbeatFile) {
      const file = supervisorHeartbeatFile(heartbeatFile);
      await this.#touch(file);
      heartbeat = setInterval(() => this.#touch(file), SUPERVISOR_HEARTBEAT_INTERVAL);
    }
    try {
      for (const slot of this.#slots) this.#spawn(slot);
      await this.#done.promise;
    } finally {
      clearInterval(heartbeat);
      clearTimeout(this.#killTimer);
    }
    const code = supervisorExitCode({
      capped: this.#capped,
      forced: this.#stage >= 2,
      exits: this.#exits,
    });
    const reason = this.#capped ? "restart_cap" : this.#stage >= 2 ? "forced" : "stopped";
    this.#log[code === 0 ? "info" : "error"]("supervisor {pid} stopped: {reason}", {
      event: "supervisor_stopped",
      pid: Deno.pid,
      reason,
      code,
    });
    return code;
  }

  /**
   * A stop signal: the first is forwarded once to every worker process (they drain), a
   * second forwards it again (they exit at once, 130; those that do not are killed after
   * 5 s), a third kills them.
   */
  signal(signal: Deno.Signal): void {
    const stage = Math.min(this.#stage + 1, 3) as Stage;
    const action = ["", "drain", "force", "kill"][stage];
    this.#log[stage === 1 ? "info" : stage === 2 ? "warn" : "error"](
      "{signal}: {action} the worker processes" +
        (stage === 1 ? " (send it again to force them)" : ""),
      { event: "supervisor_signal", signal, action, live: this.#live().length },
    );
    this.#escalate(stage);
  }

  #escalate(stage: Stage): void {
    if (stage <= this.#stage) return;
    this.#stage = stage;
    for (const slot of this.#slots) {
      clearTimeout(slot.timer);
      slot.timer = undefined;
    }
    const kill = (signal: Deno.Signal) => {
      for (const slot of this.#live()) {
        try {
          slot.child?.kill(signal);
        } catch {
          // It exited in the meantime.
        }
      }
    };
    if (stage === 3) {
      kill("SIGKILL");
    } else {
      kill("SIGTERM");
      if (stage === 2) {
        this.#killTimer = setTimeout(() => {
          const live = this.#live();
          if (live.length === 0) return;
          this.#log.error("worker processes still running {after} s after a forced stop: killed", {
            event: "supervisor_killed_workers",
            after: KILL_AFTER / 1000,
            slots: live.map((slot) => slot.index).join(","),
          });
          kill("SIGKILL");
        }, KILL_AFTER);
      }
    }
    this.#checkDone();
  }

  #live(): Slot[] {
    return this.#slots.filter((slot) => slot.child !== null);
  }

  #spawn(slot: Slot, restart?: { delay: number; code: number }): void {
    if (this.#stage > 0) return;
    const { child: command } = this.#options;
    let child: Deno.ChildProcess;
    slot.startedAt = performance.now();
    try {
      child = new Deno.Command(command.command, {
        args: command.args(slot.index, slot.index === 0 && !restart, slot.previous),
        stdin: "null",
        stdout: "inherit",
        stderr: "inherit",
        // Its own process group: a terminal's Ctrl-C reaches it once, through this process.
        detached: true,
      }).spawn();
    } catch (error) {
      this.#log.error("could not start the worker process of slot {slot}: {message}", {
        event: "worker_process_spawn_failed",
        slot: slot.index,
        message: describeError(error),
      });
      this.#died(slot, 1);
      return;
    }
    slot.child = child;
    if (restart) {
      this.#log.warn("worker process of slot {slot} restarted as pid {pid}", {
        event: "worker_process_restarted",
        slot: slot.index,
        pid: child.pid,
        delay: restart.delay / 1000,
        previousCode: restart.code,
        deaths: slot.history.deaths.length,
      });
    } else {
      this.#log.info("worker process of slot {slot} started as pid {pid}", {
        event: "worker_process_started",
        slot: slot.index,
        pid: child.pid,
      });
    }
    child.status.then((status) => this.#exited(slot, child, status));
  }

  #exited(slot: Slot, child: Deno.ChildProcess, status: Deno.CommandStatus): void {
    slot.child = null;
    const uptime = Math.round(performance.now() - slot.startedAt) / 1000;
    const props = {
      slot: slot.index,
      pid: child.pid,
      code: status.code,
      ...(status.signal ? { signal: status.signal } : {}),
      uptime,
    };
    if (this.#stage > 0) {
      // A worker process that dies of the forwarded SIGTERM had not installed its handler
      // yet (it exits by itself once it has): it was still starting and claimed nothing.
      const early = this.#stage === 1 && status.signal === "SIGTERM";
      if (early) {
        this.#log.info("worker process of slot {slot} stopped while starting", {
          event: "worker_process_stopped_early",
          ...props,
        });
      } else {
        this.#log[status.code === 0 ? "info" : "warn"](
          "worker process of slot {slot} exited with {code}",
          { event: "worker_process_exited", ...props },
        );
      }
      this.#exits.push(early ? 0 : status.code);
      this.#checkDone();
      return;
    }
    this.#log.warn("worker process of slot {slot} exited with {code}", {
      event: "worker_process_exited",
      ...props,
    });
    slot.previous = { pid: child.pid, end: { code: status.code, signal: status.signal } };
    this.#died(slot, status.code);
  }

  /** A death while running: restart the slot after its delay, or stop at the cap. */
  #died(slot: Slot, code: number): void {
    const plan = planRestart(slot.history, slot.startedAt, performance.now());
    slot.history = plan.history;
    if (plan.capped) {
      this.#capped = true;
      this.#log.error(
        "worker process of slot {slot} died {deaths} times within {window} s: stopping",
        {
          event: "supervisor_restart_cap",
          slot: slot.index,
          deaths: plan.history.deaths.length,
          window: RESTART_WINDOW / 1000,
          code,
        },
      );
      this.#escalate(1);
      return;
    }
    slot.timer = setTimeout(() => {
      slot.timer = undefined;
      this.#spawn(slot, { delay: plan.delay, code });
    }, plan.delay);
  }

  #checkDone(): void {
    if (this.#stage > 0 && this.#live().length === 0) this.#done.resolve();
  }

  async #touch(file: string): Promise<void> {
    try {
      await touchHeartbeatFile(file);
      this.#heartbeatFailing = false;
    } catch (error) {
      if (this.#heartbeatFailing) return; // once per failing streak, not every second
      this.#heartbeatFailing = true;
      this.#log.warn("could not touch the heartbeat file: {message}", {
        event: "heartbeat_file_failed",
        message: describeError(error),
      });
    }
  }
}

/**
 * Run `akadze worker APP --processes N` (N > 1) from its parsed command line: configure
 * logging, work out the workers' command, supervise until stopped; returns the exit code.
 */
export async function superviseWorkers(
  line: WorkerCommandLine,
  parentPid?: number,
): Promise<number> {
  await configureCliLogging(line.logging);
  const supervisor = new Supervisor({
    processes: line.processes,
    child: await resolveChildCommand(line.passthrough, line.processes),
    heartbeatFile: line.worker.heartbeatFile,
  });
  const removeSignals = countSignals(SUPERVISOR_SIGNALS, (signal) => supervisor.signal(signal));
  // Started by an `akadze` command that re-ran itself under the app's deno.json: when that
  // process is gone (a SIGKILL does not reach this process group), drain as on SIGTERM.
  const unwatch = parentPid === undefined
    ? () => {}
    : watchSupervisor(parentPid, 1_000, () => supervisor.signal("SIGTERM"));
  try {
    return await supervisor.run();
  } finally {
    unwatch();
    removeSignals();
  }
}

/**
 * In a worker process of the supervisor `supervisorPid`: call `onGone` once, now or
 * within `intervalMs`, when that supervisor is no longer this process's parent (it died:
 * the process was reparented). Returns a function that stops watching.
 */
export function watchSupervisor(
  supervisorPid: number,
  intervalMs: number,
  onGone: () => void,
): () => void {
  let timer: ReturnType<typeof setInterval> | undefined;
  const check = () => {
    if (!supervisorGone(supervisorPid, Deno.ppid)) return false;
    clearInterval(timer);
    onGone();
    return true;
  };
  if (!check()) timer = setInterval(check, Math.max(intervalMs, 10));
  return () => clearInterval(timer);
}
