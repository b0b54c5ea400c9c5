/**
 * The worker's metrics endpoint (`--metrics-port`): serves its {@linkcode WorkerMetrics},
 * and with `metricsQueueState` the queue gauges of `renderMetrics` too. Apart from the
 * metrics themselves so that `@akadze/akadze/metrics` can export both without a cycle.
 *
 * @module
 */
import type { Sql } from "../db.ts";
import { renderMetrics } from "../metrics.ts";
import { logMetricsListening, logMetricsQueueStateFailed } from "./log_events.ts";
import type { WorkerMetrics } from "./worker_metrics.ts";

/** A running metrics endpoint. */
export interface MetricsServer {
  /** The address it listens on (the port the system chose for port 0). */
  readonly hostname: string;
  /** The port it listens on. */
  readonly port: number;
  /** Stop listening; resolves once open requests are answered. */
  shutdown(): Promise<void>;
}

/**
 * Serve `render()` at `GET /metrics` on `hostname:port` (needs `--allow-net` for it);
 * anything else is a 404. Resolves once listening; rejects when the address is taken.
 */
export async function serveMetrics(options: {
  hostname: string;
  port: number;
  render: () => Promise<string>;
}): Promise<MetricsServer> {
  let listening!: (addr: Deno.NetAddr) => void;
  const listened = new Promise<Deno.NetAddr>((resolve) => listening = resolve);
  const server = Deno.serve({
    hostname: options.hostname,
    port: options.port,
    onListen: (addr) => listening(addr as Deno.NetAddr),
  }, async (request) => {
    if (new URL(request.url).pathname !== "/metrics") {
      return new Response("not found: the metrics are at /metrics\n", { status: 404 });
    }
    if (request.method !== "GET" && request.method !== "HEAD") {
      return new Response("method not allowed\n", { status: 405, headers: { allow: "GET" } });
    }
    return new Response(await options.render(), {
      headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
    });
  });
  // A taken address throws from Deno.serve itself; onListen runs before it returns.
  const addr = await listened;
  return { hostname: addr.hostname, port: addr.port, shutdown: () => server.shutdown() };
}

/**
 * Serve a worker's metrics at `GET /metrics` when `metricsPort` is set (null otherwise);
 * with `metricsQueueState`, each scrape adds the queue gauges of `renderMetrics`, read on
 * the app's pool. Rejects when the address is taken.
 */
export async function serveWorkerMetrics(
  metrics: WorkerMetrics,
  options: {
    metricsHost: string;
    metricsPort?: number;
    metricsQueueState: boolean;
    app: { sql: Sql; schema: string };
  },
): Promise<MetricsServer | null> {
  const { metricsHost: host, metricsPort: port, metricsQueueState: queueState } = options;
  const { sql, schema } = options.app;
  if (port === undefined) return null;
  const server = await serveMetrics({
    hostname: host,
    port,
    render: async () => {
      const own = metrics.render();
      if (!queueState) return own;
      try {
        return own + await renderMetrics(sql, { schema });
      } catch (error) {
        // The worker's own series matter most while the database is unreachable.
        logMetricsQueueStateFailed(error);
        return own;
      }
    },
  });
  logMetricsListening(server.hostname, server.port);
  return server;
}
