// Turning raw per-round driver results into metrics, medians and ranges, and the
// markdown report.

/** One driver's raw result line (fields as the drivers print them). */
export interface RawResult {
  system: string;
  bulk_ms: number;
  bulk_wal_bytes: number;
  drain_ms: number;
  drain_handler_ms: number;
  drain_wal_bytes: number;
  drain_worker_cpu_ms: number;
  drain_pg_cpu_ms: number;
  rss_kb: number;
  completed: number;
  dead_tuples: number;
  single_ms?: number;
  single_n?: number;
  single_wal_bytes?: number;
  latency?: { n: number; p50: number; p95: number; max: number };
  [key: string]: unknown;
}

/** The metrics of one run, all numbers (NaN when not measured). */
export type Metrics = Record<MetricName, number>;

/** How each metric is derived, labelled and rounded; `better` says which way is good. */
export const METRICS = {
  drain_jobs_per_s: { label: "drain, jobs/s", digits: 0, better: "higher" },
  drain_handler_jobs_per_s: {
    label: "drain to N-th handler start, jobs/s",
    digits: 0,
    better: "higher",
  },
  bulk_rows_per_s: { label: "bulk enqueue (5,000-row calls), rows/s", digits: 0, better: "higher" },
  single_rows_per_s: { label: "single-row enqueue, rows/s", digits: 0, better: "higher" },
  lat_p50_ms: { label: "latency p50, ms", digits: 2, better: "lower" },
  lat_p95_ms: { label: "latency p95, ms", digits: 2, better: "lower" },
  lat_max_ms: { label: "latency max, ms", digits: 1, better: "lower" },
  wal_enqueue_per_job: { label: "WAL bytes/job, bulk enqueue", digits: 0, better: "lower" },
  wal_drain_per_job: { label: "WAL bytes/job, drain", digits: 0, better: "lower" },
  wal_total_per_job: { label: "WAL bytes/job, enqueue + drain", digits: 0, better: "lower" },
  wal_single_per_job: { label: "WAL bytes/job, single-row enqueue", digits: 0, better: "lower" },
  dead_tuples: { label: "dead tuples in the jobs table after drain", digits: 0, better: "lower" },
  rss_mb: { label: "peak worker RSS, MiB", digits: 0, better: "lower" },
  worker_cpu_ms_per_1k: {
    label: "worker CPU ms per 1,000 jobs (drain)",
    digits: 0,
    better: "lower",
  },
  pg_cpu_ms_per_1k: {
    label: "PostgreSQL CPU ms per 1,000 jobs (drain)",
    digits: 0,
    better: "lower",
  },
  foreign_cpu_pct: {
    label: "other processes' CPU during the run, % of machine",
    digits: 0,
    better: "lower",
  },
} as const;

export type MetricName = keyof typeof METRICS;

/** Derive the metrics of one raw result (foreign CPU share comes from the orchestrator). */
export function metricsOf(raw: RawResult, n: number, foreignCpuPct: number): Metrics {
  const per = (count: number | undefined, ms: number | undefined) =>
    count && ms ? count / ms * 1000 : NaN;
  const walEnqueue = raw.bulk_wal_bytes / n;
  const walDrain = raw.drain_wal_bytes / n;
  return {
    drain_jobs_per_s: per(n, raw.drain_ms),
    drain_handler_jobs_per_s: per(n, raw.drain_handler_ms),
    bulk_rows_per_s: per(n, raw.bulk_ms),
    single_rows_per_s: per(raw.single_n, raw.single_ms),
    lat_p50_ms: raw.latency?.p50 ?? NaN,
    lat_p95_ms: raw.latency?.p95 ?? NaN,
    lat_max_ms: raw.latency?.max ?? NaN,
    wal_enqueue_per_job: walEnqueue,
    wal_drain_per_job: walDrain,
    wal_total_per_job: walEnqueue + walDrain,
    wal_single_per_job: raw.single_n ? (raw.single_wal_bytes ?? NaN) / raw.single_n : NaN,
    dead_tuples: raw.dead_tuples,
    rss_mb: raw.rss_kb / 1024,
    worker_cpu_ms_per_1k: raw.drain_worker_cpu_ms / n * 1000,
    pg_cpu_ms_per_1k: raw.drain_pg_cpu_ms / n * 1000,
    foreign_cpu_pct: foreignCpuPct,
  };
}

/** Median, min and max of the finite values (null when there are none). */
export interface Summary {
  median: number | null;
  min: number | null;
  max: number | null;
  values: (number | null)[];
}

export function summarize(values: number[]): Summary {
  const finite = values.filter(Number.isFinite).sort((a, b) => a - b);
  const mid = finite.length >> 1;
  const median = finite.length === 0
    ? null
    : finite.length % 2
    ? finite[mid]
    : (finite[mid - 1] + finite[mid]) / 2;
  return {
    median,
    min: finite.length ? finite[0] : null,
    max: finite.length ? finite[finite.length - 1] : null,
    values: values.map((v) => Number.isFinite(v) ? v : null),
  };
}

/** Format a number with thousands separators. */
export function fmt(value: number | null, digits = 0): string {
  if (value === null || !Number.isFinite(value)) return "–";
  return value.toLocaleString("en-US", {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

/** "median (min–max)" or "median" when all rounds agree or there is one round. */
export function cell(summary: Summary | undefined, digits: number): string {
  if (!summary || summary.median === null) return "–";
  const m = fmt(summary.median, digits);
  const lo = fmt(summary.min, digits), hi = fmt(summary.max, digits);
  return lo === hi ? m : `${m} (${lo}–${hi})`;
}
