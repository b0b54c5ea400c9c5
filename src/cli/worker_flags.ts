/**
 * The flags `akadze worker` and `akadze dev` share: parsed strictly, durations in seconds
 * (decimals allowed) turned into the milliseconds of {@linkcode WorkerOptions}.
 *
 * @module
 */
import { WORKER_DEFAULTS, type WorkerOptions } from "../worker/config.ts";
import { parseFlags, UsageError } from "./common.ts";
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
  "heartbeat-file": { type: "string" },
  processes: { type: "string" },
  "log-format": { type: "string" },
  "log-level": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

const MS_MAX = 2147483647;
const SECONDS = /^(?:\d+(?:\.\d*)?|\.\d+)$/;
const INTEGER = /^\d+$/;

/** The options part of the help of `worker` and `dev` (defaults from the Worker's). */
export function workerFlagsHelp(): string {
  const s = (ms: number) => `${ms / 1000}`;
  const d = WORKER_DEFAULTS;
  return `Worker options (durations in seconds, decimals allowed):
  -q, --queue Q             a queue to work on; repeat it or separate names with commas
                            (default: ${d.queues.join(",")})
  --slots N                 concurrent jobs per queue, or in total with --fair (default ${d.slots})
  --fair                    one pool of --slots shared by all queues, claimed round-robin
  --batch                   exit 0 once nothing is claimable and nothing is running
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
  --heartbeat-file PATH     touch PATH on every loop pass (liveness probe without the database)
  --processes N             worker processes; only 1 for now (run more with your supervisor)
  --log-format F            ${LOG_FORMATS.join(" or ")} log lines on stderr (default text)
  --log-level L             ${LOG_LEVELS.join(", ")} (default info)
  -h, --help                show this help

Signals: SIGINT or SIGTERM stops gracefully: no new claims, running jobs get
--shutdown-timeout to finish, the rest go back to the queue without spending an
attempt. A second signal exits at once (130) and leaves running jobs to the lease.

Exit codes: 0 stopped, batch done or --max-jobs reached; 1 failure (database, schema
not migrated, lost heartbeat); 2 usage error; 130 forced by a second signal.`;
}

/** Parse the arguments of `akadze worker` or `akadze dev`; usage errors name the flag. */
export function parseWorkerCommandLine(args: string[], command: string): WorkerCommandLine {
  const { values, positionals } = parseFlags(args, FLAGS, true);
  const logging: LoggingOptions = { format: "text", level: "info" };
  if (values.help) return { help: true, app: "", worker: {}, logging };
  if (positionals.length === 0) {
    throw new UsageError(`missing APP: akadze ${command} ./app.ts[:export] (see --help)`);
  }
  if (positionals.length > 1) {
    throw new UsageError(`one APP expected, got ${positionals.length}: ${positionals.join(" ")}`);
  }
  if (values.processes !== undefined) {
    const n = integer("--processes", values.processes, 1, 10_000);
    if (n !== 1) {
      throw new UsageError(
        "--processes above 1 is not supported yet: start several `akadze worker` processes " +
          "(systemd, containers); they share the database safely",
      );
    }
  }
  const worker: WorkerOptions = {};
  if (values.queue) worker.queues = values.queue.flatMap((q) => q.split(",")).map((q) => q.trim());
  if (values.slots !== undefined) worker.slots = integer("--slots", values.slots, 1, 10_000);
  if (values.fair) worker.fair = true;
  if (values.batch) worker.batch = true;
  if (values["max-jobs"] !== undefined) {
    worker.maxJobs = integer("--max-jobs", values["max-jobs"], 1, Number.MAX_SAFE_INTEGER);
  }
  const durations = [
    ["shutdown-timeout", "shutdownTimeout"],
    ["heartbeat-interval", "heartbeatInterval"],
    ["heartbeat-ttl", "heartbeatTtl"],
    ["poll-interval", "pollInterval"],
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
  if (values["heartbeat-file"] !== undefined) {
    if (values["heartbeat-file"] === "") throw new UsageError("--heartbeat-file needs a path");
    worker.heartbeatFile = values["heartbeat-file"];
  }
  if (values["log-format"] !== undefined) logging.format = parseLogFormat(values["log-format"]);
  if (values["log-level"] !== undefined) logging.level = parseLogLevel(values["log-level"]);
  return { help: false, app: positionals[0], worker, logging };
}

/** Seconds (decimals allowed) as whole milliseconds, at least 1 ms. */
function seconds(flag: string, text: string): number {
  const ms = SECONDS.test(text) ? Math.round(Number(text) * 1000) : NaN;
  if (!(ms >= 1) || ms > MS_MAX) {
    throw new UsageError(
      `${flag} must be a positive number of seconds (decimals allowed, at most ${
        MS_MAX / 1000
      }), got "${text}"`,
    );
  }
  return ms;
}

function integer(flag: string, text: string, min: number, max: number): number {
  const n = INTEGER.test(text) ? Number(text) : NaN;
  if (!(n >= min && n <= max)) {
    throw new UsageError(`${flag} must be an integer from ${min} to ${max}, got "${text}"`);
  }
  return n;
}
