/**
 * The worker's own metrics, kept in memory: jobs finished per task, queue and outcome, and a
 * histogram of run durations per task and queue, rendered as Prometheus text. Tasks are the
 * app's registered ones and queues the worker's, so the series are bounded; no job id,
 * argument or error text ever becomes a label.
 *
 * @module
 */

/** How a run ended, as the database recorded it: the `outcome` label. */
export type FinishedOutcome =
  | "succeeded"
  | "retried"
  | "failed"
  | "cancelled"
  | "snoozed"
  | "released";

const OUTCOMES: readonly FinishedOutcome[] = [
  "succeeded",
  "retried",
  "failed",
  "cancelled",
  "snoozed",
  "released",
];
const OUTCOME_INDEX: Readonly<Record<FinishedOutcome, number>> = {
  succeeded: 0,
  retried: 1,
  failed: 2,
  cancelled: 3,
  snoozed: 4,
  released: 5,
};

/** Upper bounds (seconds) of the run-duration buckets: 5 ms to 5 minutes. */
export const DURATION_BUCKETS: readonly number[] = [
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
  120,
  300,
];

/** The counters of one task on one queue. */
interface Series {
  /** `task="…",queue="…"`, escaped once. */
  labels: string;
  finished: Float64Array;
  /** Per bucket (not cumulative; summed when rendered), the last one for +Inf. */
  buckets: Float64Array;
  sum: number;
  count: number;
}

/**
 * In-memory metrics of one worker. Recording is a lookup in two maps and a few
 * increments; rendering builds the text on demand.
 *
 * @example
 * ```ts ignore
 * const worker = new Worker(app);
 * Deno.serve({ port: 9465 }, () => new Response(worker.metrics.render()));
 * ```
 */
export class WorkerMetrics {
  /** queue → task → series. */
  #series = new Map<string, Map<string, Series>>();
  #busy: () => ReadonlyMap<string, number>;
  #queues: readonly string[];
  #onDuration: ((seconds: number, task: string, queue: string) => void) | null = null;

  /**
   * Make the metrics of a worker (the Worker makes its own: `worker.metrics`).
   *
   * @param queues The worker's queues (each gets a busy-slots gauge).
   * @param busy Running jobs per queue now.
   * @param tasks Task names with their default queue: those series start at zero.
   */
  constructor(
    queues: readonly string[],
    busy: () => ReadonlyMap<string, number>,
    tasks: Iterable<{ name: string; queue: string }> = [],
  ) {
    this.#queues = queues;
    this.#busy = busy;
    // Series that exist from the start let rate() and increase() see the first job.
    for (const task of tasks) if (queues.includes(task.queue)) this.#get(task.name, task.queue);
  }

  /** Count a finished job by the outcome the database recorded. */
  finished(task: string, queue: string, outcome: FinishedOutcome): void {
    this.#get(task, queue).finished[OUTCOME_INDEX[outcome]]++;
  }

  /** Record one run's duration (from its start to its handler's outcome), in milliseconds. */
  observe(task: string, queue: string, ms: number): void {
    const series = this.#get(task, queue);
    const seconds = ms / 1000;
    let i = 0;
    while (i < DURATION_BUCKETS.length && seconds > DURATION_BUCKETS[i]) i++;
    series.buckets[i]++;
    series.sum += seconds;
    series.count++;
    this.#onDuration?.(seconds, task, queue);
  }

  /**
   * Also give each run's duration (seconds) to `fn` (the OpenTelemetry meter's histogram,
   * while one is registered); null stops it.
   */
  reportDurations(fn: ((seconds: number, task: string, queue: string) => void) | null): void {
    this.#onDuration = fn;
  }

  /** Call `fn` with each finished count: task, queue, outcome and the count. */
  eachFinished(
    fn: (task: string, queue: string, outcome: FinishedOutcome, n: number) => void,
  ): void {
    for (const [queue, byTask] of this.#series) {
      for (const [task, series] of byTask) {
        OUTCOMES.forEach((outcome, i) => fn(task, queue, outcome, series.finished[i]));
      }
    }
  }

  /** Running jobs now, for each of the worker's queues. */
  busyByQueue(): [string, number][] {
    const busy = this.#busy();
    return this.#queues.map((queue) => [queue, busy.get(queue) ?? 0]);
  }

  /** The metrics as Prometheus text (exposition format 0.0.4), ending in a newline. */
  render(): string {
    const all: Series[] = [];
    for (const byTask of this.#series.values()) all.push(...byTask.values());
    const out: string[] = [
      "# HELP akadze_worker_jobs_finished_total Jobs this worker ran, by the outcome recorded.",
      "# TYPE akadze_worker_jobs_finished_total counter",
    ];
    for (const s of all) {
      OUTCOMES.forEach((outcome, i) => {
        out.push(
          `akadze_worker_jobs_finished_total{${s.labels},outcome="${outcome}"} ${s.finished[i]}`,
        );
      });
    }
    out.push(
      "# HELP akadze_worker_job_duration_seconds How long this worker's runs took, " +
        "from their start to the handler's outcome.",
      "# TYPE akadze_worker_job_duration_seconds histogram",
    );
    for (const s of all) {
      let cumulative = 0;
      DURATION_BUCKETS.forEach((le, i) => {
        cumulative += s.buckets[i];
        out.push(`akadze_worker_job_duration_seconds_bucket{${s.labels},le="${le}"} ${cumulative}`);
      });
      cumulative += s.buckets[DURATION_BUCKETS.length];
      out.push(`akadze_worker_job_duration_seconds_bucket{${s.labels},le="+Inf"} ${cumulative}`);
      out.push(`akadze_worker_job_duration_seconds_sum{${s.labels}} ${s.sum}`);
      out.push(`akadze_worker_job_duration_seconds_count{${s.labels}} ${s.count}`);
    }
    out.push(
      "# HELP akadze_worker_slots_busy Jobs this worker is running now, per queue.",
      "# TYPE akadze_worker_slots_busy gauge",
    );
    const busy = this.#busy();
    for (const queue of this.#queues) {
      out.push(`akadze_worker_slots_busy{queue="${escape(queue)}"} ${busy.get(queue) ?? 0}`);
    }
    return out.join("\n") + "\n";
  }

  #get(task: string, queue: string): Series {
    let byTask = this.#series.get(queue);
    if (!byTask) this.#series.set(queue, byTask = new Map());
    let series = byTask.get(task);
    if (!series) {
      series = {
        labels: `task="${escape(task)}",queue="${escape(queue)}"`,
        finished: new Float64Array(OUTCOMES.length),
        buckets: new Float64Array(DURATION_BUCKETS.length + 1),
        sum: 0,
        count: 0,
      };
      byTask.set(task, series);
    }
    return series;
  }
}

/** The outcome label of a job written back to `state` by an outcome of `kind`. */
export function finishedOutcome(state: string, kind: string): FinishedOutcome | null {
  switch (state) {
    case "succeeded":
    case "failed":
    case "cancelled":
      return state;
    case "queued":
      return kind === "snooze" ? "snoozed" : kind === "release" ? "released" : "retried";
    default:
      return null;
  }
}

/** A label value in the exposition format's escaping. */
function escape(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}
