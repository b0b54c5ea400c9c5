/**
 * Prometheus text exposition of akadze's queue state: jobs per queue and state, queue
 * lag, paused queues, busy slots, live workers, limit usage, and what holds back the
 * cleanup of the jobs table (see `docs/operating.md`). The library stays
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
import { DEFAULT_SCHEMA, explainMissingSchema, quoteSchema, type Sql } from "./db.ts";
import { horizonGauges, readHorizon } from "./horizon.ts";

/** Options of {@linkcode renderMetrics}. */
export interface RenderMetricsOptions {
  /** The schema holding akadze's tables. Default `"akadze"`. */
  schema?: string;
}

const STATES = ["queued", "running", "succeeded", "failed", "cancelled"] as const;

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
        counts: await tx.unsafe(`select queue, state, count(*)::bigint as n from ${s}.jobs
                              group by queue, state order by queue, state`),
        lags: await tx.unsafe(`select queue, extract(epoch from now() - min(run_at))::float8 as lag
                            from ${s}.jobs where state = 'queued' and run_at <= now()
                            group by queue order by queue`),
        pauses: await tx.unsafe(`select queue from ${s}.queue_pauses order by queue`),
        workers: await tx.unsafe(`select count(*)::int as n from ${s}.workers`),
        limits: await tx.unsafe(`
      select l.key, l.max_running, l.max_starts,
             (select count(*) from ${s}.jobs j where j.state = 'running' and j.limit_key = l.key)::int
               as running,
             (select count(*) from ${s}.limit_starts m
               where m.key = l.key and m.started_at > now() - l."window")::int as starts
        from ${s}.limits l order by l.key`),
      })),
  );
  const queues = new Set<string>();
  for (const r of read.counts) queues.add(r.queue);
  for (const r of read.pauses) queues.add(r.queue);
  const count = new Map(read.counts.map((r) => [`${r.queue}\u0000${r.state}`, Number(r.n)]));
  const out: string[] = [];
  const gauge = (name: string, help: string, rows: [Record<string, string>, number][]) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
    for (const [labels, value] of rows) out.push(`${name}${formatLabels(labels)} ${value}`);
  };
  const sorted = [...queues].sort();
  gauge(
    "akadze_jobs",
    "Jobs by queue and state.",
    sorted.flatMap((queue) =>
      STATES.map((state) =>
        [{ queue, state }, count.get(`${queue}\u0000${state}`) ?? 0] as [
          Record<string, string>,
          number,
        ]
      )
    ),
  );
  const lag = new Map(read.lags.map((r) => [r.queue as string, Number(r.lag)]));
  gauge(
    "akadze_queue_lag_seconds",
    "Seconds the oldest ready job of the queue has waited (0 when none).",
    sorted.map((queue) => [{ queue }, Math.max(0, lag.get(queue) ?? 0)]),
  );
  const paused = new Set(read.pauses.map((r) => r.queue as string));
  gauge(
    "akadze_queue_paused",
    "1 when claims from the queue are paused.",
    sorted.map((queue) => [{ queue }, paused.has(queue) ? 1 : 0]),
  );
  const busy = read.counts.filter((r) => r.state === "running").reduce(
    (a, r) => a + Number(r.n),
    0,
  );
  gauge("akadze_worker_busy", "Jobs running now, across all workers.", [[{}, busy]]);
  gauge("akadze_workers", "Registered worker processes.", [[{}, Number(read.workers[0].n)]]);
  gauge(
    "akadze_limit_running",
    "Running jobs per limit key.",
    read.limits.map((r) => [{ key: r.key }, Number(r.running)]),
  );
  gauge(
    "akadze_limit_max_running",
    "maxRunning of each limit key that has one.",
    read.limits.filter((r) => r.max_running !== null).map((r) => [{ key: r.key }, r.max_running]),
  );
  gauge(
    "akadze_limit_starts",
    "Starts within the current window per rate-limited key.",
    read.limits.filter((r) => r.max_starts !== null).map((r) => [{ key: r.key }, Number(r.starts)]),
  );
  gauge(
    "akadze_limit_max_starts",
    "maxStarts per window of each rate-limited key.",
    read.limits.filter((r) => r.max_starts !== null).map((r) => [{ key: r.key }, r.max_starts]),
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
