/**
 * The worker's own counters through the OpenTelemetry meter, beside its Prometheus endpoint:
 * `akadze.worker.jobs.finished` (an observable counter, read from each worker's
 * {@linkcode WorkerMetrics} when the meter collects), `akadze.worker.slots.busy` (an
 * observable gauge) and `akadze.worker.job.duration` (a histogram, seconds, recorded per run).
 * With no meter provider registered (Deno registers one under `OTEL_DENO=true`) none of this
 * exists and a run records nothing more. Decided on a worker's first start.
 *
 * @module
 */
import {
  type BatchObservableResult,
  createNoopMeter,
  type Histogram,
  metrics,
  type ObservableCounter,
  type ObservableGauge,
} from "@opentelemetry/api";
import type { WorkerMetrics } from "./worker_metrics.ts";

interface Instruments {
  finished: ObservableCounter;
  busy: ObservableGauge;
  duration: Histogram;
}

let instruments: Instruments | null | undefined;
/** The metrics of the workers running in this process. */
const live = new Set<WorkerMetrics>();

/** The meter's instruments, made once; null when no meter provider is registered. */
function meterInstruments(): Instruments | null {
  if (instruments !== undefined) return instruments;
  const meter = metrics.getMeter("akadze");
  if (meter === createNoopMeter()) return instruments = null;
  const made: Instruments = {
    finished: meter.createObservableCounter("akadze.worker.jobs.finished", {
      description: "Jobs this worker ran, by the outcome recorded.",
      unit: "{job}",
    }),
    busy: meter.createObservableGauge("akadze.worker.slots.busy", {
      description: "Jobs this worker is running now, per queue.",
      unit: "{job}",
    }),
    duration: meter.createHistogram("akadze.worker.job.duration", {
      description: "How long this worker's runs took, from their start to the handler's outcome.",
      unit: "s",
    }),
  };
  meter.addBatchObservableCallback(observe, [made.finished, made.busy]);
  return instruments = made;
}

/** Report every live worker's counts (summed when two workers share a process). */
function observe(result: BatchObservableResult): void {
  const { finished, busy } = instruments!;
  const totals = new Map<string, { attributes: Record<string, string>; value: number }>();
  const add = (key: string, attributes: Record<string, string>, value: number) => {
    const entry = totals.get(key);
    if (entry) entry.value += value;
    else totals.set(key, { attributes, value });
  };
  const slots = new Map<string, number>();
  for (const worker of live) {
    worker.eachFinished((task, queue, outcome, value) => {
      add(JSON.stringify([task, queue, outcome]), { task, queue, outcome }, value);
    });
    for (const [queue, n] of worker.busyByQueue()) slots.set(queue, (slots.get(queue) ?? 0) + n);
  }
  for (const { attributes, value } of totals.values()) {
    result.observe(finished, value, attributes);
  }
  for (const [queue, n] of slots) result.observe(busy, n, { queue });
}

/**
 * While a worker runs: report its metrics through the meter. Returns the function that
 * stops it (a no-op when no meter provider is registered).
 */
export function reportThroughMeter(workerMetrics: WorkerMetrics): () => void {
  const made = meterInstruments();
  if (made === null) return () => {};
  live.add(workerMetrics);
  workerMetrics.reportDurations((seconds, task, queue) => {
    made.duration.record(seconds, { task, queue });
  });
  return () => {
    live.delete(workerMetrics);
    workerMetrics.reportDurations(null);
  };
}
