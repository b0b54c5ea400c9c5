/**
 * Prometheus text exposition of akadze's queue state: jobs per queue and state, queue
 * lag, paused queues, busy slots, live workers, limit usage, and what holds back the
 * cleanup of the jobs table (see `docs/operating.md`), with {@linkcode renderMetrics}; and
 * {@linkcode WorkerMetrics}, a worker's own counters (`worker.metrics`). The library stays
 * HTTP-free: serve the text from your own endpoint.
 *
 * @example A metrics endpoint: save as `metrics.ts`, run with
 * `deno run --allow-net --allow-env metrics.ts` and scrape `http://localhost:9464/metrics`
 * ```ts
 * import { connect } from "@akadze/akadze";
 * import { renderMetrics } from "@akadze/akadze/metrics";
 *
 * const sql = connect(Deno.env.get("AKADZE_DATABASE_URL")!, { max: 1 });
 * Deno.serve({ port: 9464 }, async (request) => {
 *   if (new URL(request.url).pathname !== "/metrics") {
 *     return new Response("not found", { status: 404 });
 *   }
 *   return new Response(await renderMetrics(sql), {
 *     headers: { "content-type": "text/plain; version=0.0.4" },
 *   });
 * });
 * ```
 *
 * @module
 */
import { readLimits } from "./admin/limits.ts";
import { queueSnapshots, readQueueState } from "./admin/queues.ts";
import { DEFAULT_SCHEMA, explainMissingSchema, quoteSchema, type Sql } from "./db.ts";
import { horizonGauges, readHorizon } from "./horizon.ts";
import { JOB_STATES } from "./job.ts";

export { type FinishedOutcome, WorkerMetrics } from "./worker/worker_metrics.ts";

/** Options of {@linkcode renderMetrics}. */
export interface RenderMetricsOptions {
  /** The schema holding akadze's tables. Default `"akadze"`. */
  schema?: string;
}

/**
 * Render the queue gauges as Prometheus text, read from one consistent snapshot: jobs per
 * queue and state, lag of the oldest ready job per queue, running jobs, live workers,
 * paused queues and limit usage; then the oldest transactions holding back cleanup and the
 * jobs table's dead rows. Never includes arguments, results, error texts, or other
 * sessions' queries or users.
 *
 * @example
 * ```ts ignore
 * import { renderMetrics } from "@akadze/akadze/metrics";
 * console.log(await renderMetrics(sql));
 * ```
 */
export async function renderMetrics(sql: Sql, options: RenderMetricsOptions = {}): Promise<string> {
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const s = quoteSchema(schema);
  const read = await explainMissingSchema(
    schema,
    () =>
      sql.begin("isolation level repeatable read read only", async (tx) => ({
        queues: await readQueueState(tx, s),
        workers: await tx.unsafe(`select pg_catalog.count(*)::int as n from ${s}.workers`),
        limits: await readLimits(tx, s),
      })),
  );
  // In code-unit order of the queue names, as Prometheus tools sort them.
  const queues = queueSnapshots(read.queues).sort((a, b) =>
    a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0
  );
  const out: string[] = [];
  const gauge = (name: string, help: string, rows: [Record<string, string>, number][]) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
    for (const [labels, value] of rows) out.push(`${name}${formatLabels(labels)} ${value}`);
  };
  gauge(
    "akadze_jobs",
    "Jobs by queue and state.",
    queues.flatMap((q) =>
      JOB_STATES.map((state) =>
        [{ queue: q.queue, state }, q.counts[state]] as [Record<string, string>, number]
      )
    ),
  );
  gauge(
    "akadze_queue_lag_seconds",
    "Seconds the oldest ready job of the queue has waited (0 when none).",
    queues.map((q) => [{ queue: q.queue }, q.lagSeconds]),
  );
  gauge(
    "akadze_queue_paused",
    "1 when claims from the queue are paused.",
    queues.map((q) => [{ queue: q.queue }, q.paused ? 1 : 0]),
  );
  const busy = queues.reduce((sum, q) => sum + q.busy, 0);
  gauge("akadze_worker_busy", "Jobs running now, across all workers.", [[{}, busy]]);
  gauge("akadze_workers", "Registered worker processes.", [[{}, Number(read.workers[0].n)]]);
  gauge(
    "akadze_limit_running",
    "Running jobs per limit key.",
    read.limits.map((r) => [{ key: r.key }, r.running]),
  );
  gauge(
    "akadze_limit_max_running",
    "maxRunning of each limit key that has one.",
    read.limits.flatMap((r) => r.maxRunning === null ? [] : [[{ key: r.key }, r.maxRunning]]),
  );
  gauge(
    "akadze_limit_starts",
    "Starts within the current window per rate-limited key.",
    read.limits.filter((r) => r.maxStarts !== null).map((r) => [{ key: r.key }, r.starts]),
  );
  gauge(
    "akadze_limit_max_starts",
    "maxStarts per window of each rate-limited key.",
    read.limits.flatMap((r) => r.maxStarts === null ? [] : [[{ key: r.key }, r.maxStarts]]),
  );
  // Statements of their own, after the snapshot: a statistics view the role may not read
  // must not fail the queue's gauges, and they need no snapshot of the queue's tables.
  out.push(...horizonGauges(await readHorizon(sql, { schema })));
  return out.join("\n") + "\n";
}

function formatLabels(labels: Record<string, string>): string {
  const parts = Object.entries(labels).map(([k, v]) =>
    `${k}="${String(v).replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`
  );
  return parts.length ? `{${parts.join(",")}}` : "";
}
