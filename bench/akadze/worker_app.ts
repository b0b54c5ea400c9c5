// The app a benchmark worker runs, the same wherever the worker runs (its own process or
// the driver's): the configuration's pool, prepare and retention.
import postgres from "postgres";
import { Akadze } from "../../mod.ts";

/**
 * Options of the worker's app. `jit: false` opens the pool itself (postgres.js, with
 * connect()'s defaults) with the session setting jit=off and hands it to the app as `sql`.
 */
export interface WorkerAppSpec {
  max?: number;
  prepare?: boolean;
  jit?: boolean;
  retention?: number;
}

/** The worker's app on `url`, as the configuration asks, and how to close its pool. */
export function workerApp(
  url: string,
  spec: WorkerAppSpec,
): { app: Akadze; close: () => Promise<void> } {
  const { jit, retention, ...options } = spec;
  if (jit !== false) {
    const app = new Akadze({ databaseUrl: url, ...options, retention });
    return { app, close: () => app.close() };
  }
  const sql = postgres(url, {
    max: options.max ?? 10,
    prepare: options.prepare ?? false,
    idle_timeout: 30,
    connect_timeout: 10,
    max_lifetime: 60 * 30,
    onnotice: () => {},
    connection: { application_name: "akadze", jit: "off" },
  });
  // An adopted pool is the caller's to close: app.close() leaves it open.
  return { app: new Akadze({ sql, retention }), close: () => sql.end({ timeout: 5 }) };
}
