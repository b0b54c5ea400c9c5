/**
 * The flags `akadze worker` and `akadze dev` share: parsed strictly, durations in seconds
 * (decimals allowed) turned into the milliseconds of {@linkcode WorkerOptions}.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { parsePoolSize } from "../env.ts";
import { INT4_MAX, PORT_MAX, SLOTS_MAX } from "../rules.ts";
import { WORKER_DEFAULTS, type WorkerOptions } from "../worker/config.ts";
import { parseProcessEnd, type ProcessEnd } from "../worker/process_end.ts";
import { integerFlag, parseFlags, secondsText, UsageError } from "./common.ts";
import {
  LOG_FORMATS,
  LOG_LEVELS,
  type LoggingOptions,
  parseLogFormat,
  parseLogLevel,
} from "./logging.ts";

/** What the command line of `worker` or `dev` asks for. */
export interface WorkerCommandLine {
  /** `--help` was given: print the help, nothing else. */
  help: boolean;
  /** The `APP[:export]` argument. */
  app: string;
  /** The options for `new Worker(app, options)`. */
  worker: WorkerOptions;
  /** How the CLI logs. */
  logging: LoggingOptions;
  /** `--processes`: above 1, this process supervises that many worker processes. */
  processes: number;
  /** Under a supervisor (hidden `--slot K`): this worker process's slot, 0 … N-1. */
  slot?: number;
  /** Under a supervisor (hidden `--supervisor-pid`): the pid to watch; gone means drain. */
  supervisorPid?: number;
  /** `--pool-size`: the pool size of the app (when its code gives none). */
  poolSize?: number;
  /**
   * Under a supervisor (hidden `--budget-processes N`, on the first start of slot 0): check
   * the connection budget of all N processes. Absent under a supervisor: no check.
   */
  budgetProcesses?: number;
  /**
   * Under a supervisor, on a restart (hidden `--previous-exit`): the pid of the worker
   * process that ran this slot before and how it ended.
   */
  previousExit?: { pid: number; end: ProcessEnd };
  /**
   * The arguments without `--processes`, `--slot` and `--supervisor-pid`: what a
   * supervisor passes on to its worker processes.
   */
  passthrough: string[];
}

const FLAGS = {
  queue: { type: "string", short: "q", multiple: true },
  slots: { type: "string" },
  fair: { type: "boolean" },
  batch: { type: "boolean" },
  "max-jobs": { type: "string" },
  "shutdown-timeout": { type: "string" },
  "heartbeat-interval": { type: "string" },
  "heartbeat-ttl": { type: "string" },
  "poll-interval": { type: "string" },
  "prune-interval": { type: "string" },
  "heartbeat-file": { type: "string" },
  "metrics-port": { type: "string" },
  "metrics-host": { type: "string" },
  "metrics-queue-state": { type: "boolean" },
  processes: { type: "string" },
  "pool-size": { type: "string" },
  "worker-id": { type: "string" },
  // Hidden: set by the supervisor of --processes N on the worker processes it starts.
  slot: { type: "string" },
  "supervisor-pid": { type: "string" },
  "budget-processes": { type: "string" },
  "previous-exit": { type: "string" },
  "log-format": { type: "string" },
  "log-level": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** The most worker processes `--processes` accepts. */
export const MAX_PROCESSES = 1024;
const SUPERVISOR_FLAGS = new Set([
  "processes",
  "slot",
  "supervisor-pid",
  "budget-processes",
  "previous-exit",
]);
/**
 * The pool size of a worker's app when neither --pool-size nor AKADZE_POOL_SIZE is given (and
 * the app's code sets none): with the loop's and the LISTEN connection, 7 per process, so that
 * ten processes fit a default PostgreSQL (max_connections 100).
 */
export const DEFAULT_WORKER_POOL_SIZE = 5;
const MS_MAX = INT4_MAX;

/** The options part of the help of `worker` and `dev` (defaults from the Worker's). */
export function workerFlagsHelp(): string {
  const s = (ms: number) => `${ms / 1000}`;
  const d = WORKER_DEFAULTS;
  return `Worker options (durations in seconds, decimals allowed):
  -q, --queue Q             a queue to work on; repeat it or separate names with commas
                            (default: ${d.queues.join(",")})
  --slots N                 concurrent jobs per queue, or in total with --fair (default ${d.slots})
  --fair                    one pool of --slots shared by all queues, claimed round-robin
  --batch                   exit 0 once nothing is claimable and nothing is running;
                            exit 1 if the database stays unreachable for --heartbeat-ttl
  --max-jobs N              exit 0 after N claims (and their runs)
  --shutdown-timeout S      how long a graceful stop waits for running jobs (default ${
    s(d.shutdownTimeout)
  })
  --heartbeat-interval S    how often the worker renews its lease (default ${
    s(d.heartbeatInterval)
  })
  --heartbeat-ttl S         lease length: after this long without a heartbeat, other workers
                            rescue its jobs and it stops itself (default ${s(d.heartbeatTtl)})
  --poll-interval S         longest idle wait between claim passes (default ${s(d.pollInterval)})
  --prune-interval S        how often old finished jobs are deleted (default ${s(d.pruneInterval)})
  --worker-id ID            this worker's id, unique per process (default host:pid:random);
                            started again under the same id, it settles at once the jobs its
                            previous process left running. Not with --processes above 1
  --heartbeat-file PATH     touch PATH on every loop pass (with --processes N: PATH.supervisor
                            and PATH.0 ... PATH.N-1); check it with akadze health
  --metrics-port N          serve this worker's metrics at http://HOST:N/metrics (Prometheus
                            text; with --processes N, worker process K listens on port N+K)
  --metrics-host HOST       the address of --metrics-port (default ${d.metricsHost})
  --metrics-queue-state     add the queue gauges of akadze metrics to every scrape (one
                            database read per scrape)
  --pool-size N             database pool size of the app, when its code sets no max (also
                            AKADZE_POOL_SIZE; default ${DEFAULT_WORKER_POOL_SIZE}). A worker process opens up to N + 2
                            connections: the pool, the worker loop's and the LISTEN one
  --processes N             run N worker processes under a supervisor that restarts a dead
                            one (1 s, doubling to 30 s); more than 5 deaths of one in 60 s
                            stop it with exit 1. Not with --batch or --max-jobs (default 1)
  --log-format F            ${LOG_FORMATS.join(" or ")} log lines on stderr (default text)
  --log-level L             ${LOG_LEVELS.join(", ")} (default info)
  -h, --help                show this help

Signals: SIGINT or SIGTERM stops gracefully: no new claims, running jobs get
--shutdown-timeout to finish, the rest go back to the queue without spending an
attempt. A second signal exits at once (130) and leaves running jobs to the lease.
With --processes N, signal the supervisor only: it forwards the first signal once to
every worker process, a second forces them (130), a third kills them.

Exit codes: 0 stopped, batch done or --max-jobs reached; 1 failure (database, schema
not migrated, lost heartbeat, a worker process that keeps dying); 2 usage error; 130
forced by a second signal.`;
}

/** Parse the arguments of `akadze worker` or `akadze dev`; usage errors name the flag. */
export function parseWorkerCommandLine(args: string[], command: string): WorkerCommandLine {
  const { values, positionals } = parseFlags(args, FLAGS, true, `akadze ${command}`);
  const logging: LoggingOptions = { format: "text", level: "info" };
  if (values.help) {
    return { help: true, app: "", worker: {}, logging, processes: 1, passthrough: [] };
  }
  if (positionals.length === 0) {
    throw new UsageError(`missing APP: akadze ${command} ./app.ts[:export] (see --help)`);
  }
  if (positionals.length > 1) {
    throw new UsageError(`one APP expected, got ${positionals.length}: ${positionals.join(" ")}`);
  }
  const processes = values.processes === undefined
    ? 1
    : integerFlag("--processes", values.processes, 1, MAX_PROCESSES);
  if (processes > 1) {
    if (command !== "worker") {
      throw new UsageError(
        `akadze ${command} runs one worker process: --processes above 1 is for akadze worker`,
      );
    }
    for (const flag of ["batch", "max-jobs"] as const) {
      if (values[flag] !== undefined) {
        throw new UsageError(
          `--${flag} runs a single process and cannot be combined with --processes above 1 ` +
            "(the supervisor would restart a worker that finished): raise --slots instead",
        );
      }
    }
  }
  let slot: number | undefined;
  let supervisorPid: number | undefined;
  if (values.slot !== undefined) {
    // The supervisor always passes --slot with --supervisor-pid: alone, it is a typo.
    if (values["supervisor-pid"] === undefined) {
      throw new UsageError("unknown option --slot: did you mean --slots N (concurrent jobs)?");
    }
    if (command !== "worker" || processes > 1) {
      throw new UsageError("--slot is set by the supervisor of --processes N on its workers");
    }
    slot = integerFlag("--slot", values.slot, 0, MAX_PROCESSES - 1);
  }
  if (values["supervisor-pid"] !== undefined) {
    if (slot === undefined) throw new UsageError("--supervisor-pid goes with --slot");
    supervisorPid = integerFlag("--supervisor-pid", values["supervisor-pid"], 1, 2 ** 31 - 1);
  }
  let budgetProcesses: number | undefined;
  if (values["budget-processes"] !== undefined) {
    if (slot === undefined) throw new UsageError("--budget-processes goes with --slot");
    budgetProcesses = integerFlag(
      "--budget-processes",
      values["budget-processes"],
      1,
      MAX_PROCESSES,
    );
  }
  // On a restart (hidden `--previous-exit PID:CODE[:SIGNAL]`): the process that ran the
  // slot before and how it ended, to settle the jobs it left running.
  let previousExit: { pid: number; end: ProcessEnd } | undefined;
  if (values["previous-exit"] !== undefined) {
    if (slot === undefined) throw new UsageError("--previous-exit goes with --slot");
    const [pid, ...status] = values["previous-exit"].split(":");
    const end = parseProcessEnd(status.join(":"));
    if (!/^\d{1,10}$/.test(pid) || end === null) {
      throw new UsageError("--previous-exit is set by the supervisor: PID:CODE[:SIGNAL]");
    }
    previousExit = { pid: Number(pid), end };
  }
  const poolSize = values["pool-size"] === undefined
    ? undefined
    : parsePoolSize(values["pool-size"], "--pool-size", UsageError);
  const worker: WorkerOptions = {};
  if (values.queue) worker.queues = values.queue.flatMap((q) => q.split(",")).map((q) => q.trim());
  if (values.slots !== undefined) worker.slots = integerFlag("--slots", values.slots, 1, SLOTS_MAX);
  if (values.fair) worker.fair = true;
  if (values.batch) worker.batch = true;
  if (values["max-jobs"] !== undefined) {
    worker.maxJobs = integerFlag("--max-jobs", values["max-jobs"], 1, Number.MAX_SAFE_INTEGER);
  }
  const durations = [
    ["shutdown-timeout", "shutdownTimeout"],
    ["heartbeat-interval", "heartbeatInterval"],
    ["heartbeat-ttl", "heartbeatTtl"],
    ["poll-interval", "pollInterval"],
    ["prune-interval", "pruneInterval"],
  ] as const;
  for (const [flag, option] of durations) {
    const value = values[flag];
    if (value !== undefined) worker[option] = seconds(`--${flag}`, value);
  }
  const interval = worker.heartbeatInterval ?? WORKER_DEFAULTS.heartbeatInterval;
  const ttl = worker.heartbeatTtl ?? WORKER_DEFAULTS.heartbeatTtl;
  if (ttl <= interval) {
    throw new UsageError(
      `--heartbeat-ttl (${ttl / 1000} s) must be longer than --heartbeat-interval ` +
        `(${interval / 1000} s)`,
    );
  }
  if (values["worker-id"] !== undefined) {
    if (processes > 1) {
      throw new UsageError(
        "--worker-id names one process: with --processes N each is named after its slot",
      );
    }
    const id = values["worker-id"];
    if (id.length === 0 || id.length > 200 || [...id].some((c) => c.charCodeAt(0) < 0x20)) {
      throw new UsageError("--worker-id needs 1 to 200 printable characters");
    }
    worker.id = id;
  }
  if (values["heartbeat-file"] !== undefined) {
    if (values["heartbeat-file"] === "") throw new UsageError("--heartbeat-file needs a path");
    worker.heartbeatFile = values["heartbeat-file"];
  }
  if (values["metrics-port"] !== undefined) {
    worker.metricsPort = integerFlag("--metrics-port", values["metrics-port"], 0, PORT_MAX);
    if (worker.metricsPort + processes - 1 > PORT_MAX) {
      throw new UsageError(
        `--metrics-port ${worker.metricsPort} with --processes ${processes} needs ports up to ` +
          `${worker.metricsPort + processes - 1}: choose a port at most ${
            PORT_MAX + 1 - processes
          }`,
      );
    }
  }
  if (values["metrics-host"] !== undefined) {
    if (values["metrics-host"] === "") throw new UsageError("--metrics-host needs an address");
    if (worker.metricsPort === undefined) {
      throw new UsageError("--metrics-host goes with --metrics-port");
    }
    worker.metricsHost = values["metrics-host"];
  }
  if (values["metrics-queue-state"]) {
    if (worker.metricsPort === undefined) {
      throw new UsageError("--metrics-queue-state goes with --metrics-port");
    }
    worker.metricsQueueState = true;
  }
  if (values["log-format"] !== undefined) logging.format = parseLogFormat(values["log-format"]);
  if (values["log-level"] !== undefined) logging.level = parseLogLevel(values["log-level"]);
  return {
    help: false,
    app: positionals[0],
    worker,
    logging,
    processes,
    slot,
    supervisorPid,
    poolSize,
    budgetProcesses,
    previousExit,
    passthrough: withoutSupervisorFlags(args),
  };
}

/** `args` (already validated) without `--processes`, `--slot` and `--supervisor-pid`. */
function withoutSupervisorFlags(args: string[]): string[] {
  const { tokens } = parseArgs({
    args,
    options: FLAGS,
    allowPositionals: true,
    strict: true,
    tokens: true,
  });
  const drop = new Set<number>();
  for (const token of tokens) {
    if (token.kind !== "option" || !SUPERVISOR_FLAGS.has(token.name)) continue;
    drop.add(token.index);
    // "--processes 2" (not "--processes=2"): the value is the next argument.
    if (token.inlineValue === false) drop.add(token.index + 1);
  }
  return args.filter((_, index) => !drop.has(index));
}

/** Seconds (decimals allowed) as whole milliseconds, at least 1 ms. */
function seconds(flag: string, text: string): number {
  const ms = Math.round(secondsText(text) * 1000);
  if (!(ms >= 1) || ms > MS_MAX) {
    throw new UsageError(
      `${flag} must be a positive number of seconds (decimals allowed, at most ${
        MS_MAX / 1000
      }), got "${text}"`,
    );
  }
  return ms;
}
