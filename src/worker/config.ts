/**
 * Worker options: named defaults, validated once.
 *
 * @module
 */
import { checkQueueName, INT4_MAX, isIntegerIn, PORT_MAX, SLOTS_MAX } from "../rules.ts";
import { AkadzeError } from "../errors.ts";
import { isPlainObject } from "../json.ts";

/** Options of `new Worker(app, options)`. Durations are milliseconds. */
export interface WorkerOptions {
  /** Queues to claim from. Default `["default"]`. */
  queues?: string[];
  /** Concurrent runs per queue (or in total with `fair`). Default 1. */
  slots?: number;
  /** One pool of `slots` shared by all queues, claimed round-robin. Default false. */
  fair?: boolean;
  /** How often the worker proves it is alive. Default 5000. */
  heartbeatInterval?: number;
  /** After this long without a heartbeat, others rescue its jobs (and it stops). Default 30000. */
  heartbeatTtl?: number;
  /** Longest idle wait between claim passes (at least half of it, jittered). Default 1000. */
  pollInterval?: number;
  /**
   * How often old terminal jobs and bookkeeping rows are pruned, beside the claim loop
   * (jittered ±10 %; the first prune comes at a random point within one interval).
   * Default 60000.
   */
  pruneInterval?: number;
  /** How long a graceful stop waits for running jobs. Default 10000. */
  shutdownTimeout?: number;
  /**
   * Stop after a pass that finds nothing to claim and nothing running. Default false. A
   * batch run that reaches no database for `heartbeatTtl` stops with code 1
   * (`heartbeat_lost`) instead of waiting for it.
   */
  batch?: boolean;
  /** Stop after this many claims. */
  maxJobs?: number;
  /** Touch this file on every loop pass (a liveness probe without database access). */
  heartbeatFile?: string;
  /**
   * The worker id (unique per process); default hostname:pid:random. A worker started
   * again under the same id settles at once the jobs its previous process left running
   * (see `previousProcess`).
   */
  id?: string;
  /**
   * The worker process this one replaces, when it ended with jobs running: its worker `id`
   * and, when known, how it ended (`code`, `signal`, as `Deno.ChildProcess.status` gives
   * them). Its jobs are settled as this worker starts instead of after its
   * `heartbeatTtl`: each is charged an attempt, with a `ProcessExited` error saying how the
   * process ended (`WorkerLost` when that is unknown). The supervisor of
   * `akadze worker --processes N` passes it when it restarts a worker process. Default:
   * this worker's own `id` when one is given, ending unknown.
   */
  previousProcess?: { id: string; code?: number; signal?: string | null };
  /** Dispatch the app's schedules from this worker. Default true. */
  schedules?: boolean;
  /**
   * Serve this worker's metrics (and with `metricsQueueState` the queue gauges) as
   * Prometheus text at `GET /metrics` on this port; 0 lets the system choose. Needs
   * `--allow-net` for `metricsHost:port`. Default: no endpoint.
   */
  metricsPort?: number;
  /** The address the metrics endpoint listens on. Default `"127.0.0.1"`. */
  metricsHost?: string;
  /**
   * Add the queue gauges of `renderMetrics` to every scrape of the endpoint: one read of
   * the database per scrape, on the app's pool. Default false.
   */
  metricsQueueState?: boolean;
}

/** Validated worker settings: every option resolved (see {@linkcode WorkerOptions}). */
export type WorkerConfig =
  & Readonly<
    Required<
      Omit<WorkerOptions, "maxJobs" | "heartbeatFile" | "id" | "metricsPort" | "previousProcess">
    >
  >
  & Readonly<
    Pick<WorkerOptions, "maxJobs" | "heartbeatFile" | "id" | "metricsPort" | "previousProcess">
  >;

/** The defaults of {@linkcode WorkerOptions}. */
export const WORKER_DEFAULTS = {
  queues: ["default"],
  slots: 1,
  fair: false,
  heartbeatInterval: 5_000,
  heartbeatTtl: 30_000,
  pollInterval: 1_000,
  pruneInterval: 60_000,
  shutdownTimeout: 10_000,
  batch: false,
  schedules: true,
  metricsHost: "127.0.0.1",
  metricsQueueState: false,
} as const;

const NAMES = new Set([
  "queues",
  "slots",
  "fair",
  "heartbeatInterval",
  "heartbeatTtl",
  "pollInterval",
  "pruneInterval",
  "shutdownTimeout",
  "batch",
  "maxJobs",
  "heartbeatFile",
  "id",
  "previousProcess",
  "schedules",
  "metricsPort",
  "metricsHost",
  "metricsQueueState",
]);
const MS_MAX = INT4_MAX;

/** Validate worker options against the defaults; `AkadzeError` with a precise message. */
export function resolveWorkerConfig(options: WorkerOptions = {}): WorkerConfig {
  if (!isPlainObject(options)) throw new AkadzeError("worker options must be an object");
  for (const key of Object.keys(options)) {
    if (!NAMES.has(key)) {
      throw new AkadzeError(`unknown worker option "${key}" (options: ${[...NAMES].join(", ")})`);
    }
  }
  const queues = options.queues ?? [...WORKER_DEFAULTS.queues];
  if (!Array.isArray(queues) || queues.length === 0) {
    throw new AkadzeError("queues must be a non-empty array of queue names");
  }
  for (const queue of queues) checkQueueName(queue);
  if (new Set(queues).size !== queues.length) throw new AkadzeError("queues has duplicates");
  const slots = checkInteger("slots", options.slots ?? WORKER_DEFAULTS.slots, 1, SLOTS_MAX);
  const ms = (name: keyof typeof WORKER_DEFAULTS & keyof WorkerOptions) => {
    const value = options[name] ?? WORKER_DEFAULTS[name];
    if (typeof value !== "number" || !(value > 0) || value > MS_MAX) {
      throw new AkadzeError(`${name} must be a positive number of milliseconds, got ${value}`);
    }
    return value;
  };
  const heartbeatInterval = ms("heartbeatInterval");
  const heartbeatTtl = ms("heartbeatTtl");
  if (heartbeatTtl <= heartbeatInterval) {
    throw new AkadzeError(
      `heartbeatTtl (${heartbeatTtl} ms) must be longer than heartbeatInterval (${heartbeatInterval} ms)`,
    );
  }
  const maxJobs = options.maxJobs === undefined
    ? undefined
    : checkInteger("maxJobs", options.maxJobs, 1, Number.MAX_SAFE_INTEGER);
  const metricsPort = options.metricsPort === undefined
    ? undefined
    : checkInteger("metricsPort", options.metricsPort, 0, PORT_MAX);
  const metricsHost = options.metricsHost ?? WORKER_DEFAULTS.metricsHost;
  if (typeof metricsHost !== "string" || metricsHost.length === 0) {
    throw new AkadzeError("metricsHost must be a non-empty host name or address");
  }
  for (const name of ["fair", "batch", "schedules", "metricsQueueState"] as const) {
    if (options[name] !== undefined && typeof options[name] !== "boolean") {
      throw new AkadzeError(`${name} must be a boolean`);
    }
  }
  if (options.heartbeatFile !== undefined && typeof options.heartbeatFile !== "string") {
    throw new AkadzeError("heartbeatFile must be a path");
  }
  if (options.id !== undefined && (typeof options.id !== "string" || options.id.length === 0)) {
    throw new AkadzeError("id must be a non-empty string");
  }
  const previous = options.previousProcess;
  if (
    previous !== undefined && (
      !isPlainObject(previous) || typeof previous.id !== "string" || previous.id.length === 0 ||
      (previous.code !== undefined && !isIntegerIn(previous.code, 0, 255)) ||
      (previous.signal != null && typeof previous.signal !== "string")
    )
  ) {
    throw new AkadzeError(
      "previousProcess must be { id, code?, signal? }: a worker id, an exit code from 0 to " +
        "255, a signal name",
    );
  }
  return {
    queues: [...queues],
    slots,
    fair: options.fair ?? WORKER_DEFAULTS.fair,
    heartbeatInterval,
    heartbeatTtl,
    pollInterval: ms("pollInterval"),
    pruneInterval: ms("pruneInterval"),
    shutdownTimeout: ms("shutdownTimeout"),
    batch: options.batch ?? WORKER_DEFAULTS.batch,
    schedules: options.schedules ?? WORKER_DEFAULTS.schedules,
    maxJobs,
    heartbeatFile: options.heartbeatFile,
    id: options.id,
    previousProcess: previous && { ...previous },
    metricsPort,
    metricsHost,
    metricsQueueState: options.metricsQueueState ?? WORKER_DEFAULTS.metricsQueueState,
  };
}

/**
 * `value` as an integer from `min` to `max`, or an `AkadzeError` naming the setting: the
 * validation of the worker's options and of each service's settings.
 */
export function checkInteger(name: string, value: unknown, min: number, max: number): number {
  if (!isIntegerIn(value, min, max)) {
    throw new AkadzeError(`${name} must be an integer from ${min} to ${max}, got ${value}`);
  }
  return value as number;
}
