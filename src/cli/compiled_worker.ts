/**
 * The main of a worker binary that `akadze compile APP` builds: the worker of one app,
 * imported statically, so that `deno compile` can put the app into the binary. Its
 * command line is that of `akadze worker APP` without APP (`./worker --queue default`).
 *
 * @example The entry module `akadze compile` generates
 * ```ts ignore
 * import { runCompiledWorker } from "jsr:@akadze/akadze/compiled_worker";
 *
 * Deno.exit(
 *   await runCompiledWorker(() => import("file:///srv/app/app.ts"), { module: "./app.ts" }),
 * );
 * ```
 *
 * @module
 */
import { reportError, UsageError } from "./common.ts";
import { importApp } from "./load_app.ts";
import { applyPoolSize, runAppWorker, stopOnSignals } from "./worker.ts";
import { parseWorkerCommandLine, workerFlagsHelp } from "./worker_flags.ts";

/** Which app a compiled worker runs. */
export interface CompiledApp {
  /** The app module as given to `akadze compile`, for messages. */
  module: string;
  /** The export named after the colon of `APP:export`; default `app`, else the default export. */
  exportName?: string;
}

/**
 * Run the worker of the app that `load` imports with the command line `args` (the flags of
 * `akadze worker`, without APP) and return the exit code: 0 ok, 1 failure, 2 usage error,
 * 130 after a second stop signal.
 *
 * @example
 * ```ts ignore
 * import { runCompiledWorker } from "@akadze/akadze/compiled_worker";
 * Deno.exit(await runCompiledWorker(() => import("./app.ts"), { module: "./app.ts" }));
 * ```
 */
export async function runCompiledWorker(
  load: () => Promise<Record<string, unknown>>,
  app: CompiledApp,
  args: string[] = Deno.args,
): Promise<number> {
  try {
    const line = parseWorkerCommandLine([app.module, ...args], "worker");
    if (line.help) {
      console.log(
        `Usage: ${binaryName()} [options]\n\n` +
          `Run jobs of the Akadze app of ${app.module}, built into this binary by\n` +
          "akadze compile. The app opens its own connection (typically from\n" +
          "AKADZE_DATABASE_URL); its schema must be migrated (akadze migrate).\n\n" +
          workerFlagsHelp(),
      );
      return 0;
    }
    if (line.processes > 1) {
      throw new UsageError(
        "a compiled worker runs one worker process: start one binary per process " +
          "(--slots sets the jobs at a time of each)",
      );
    }
    applyPoolSize(line);
    const stop = new AbortController();
    const removeSignals = stopOnSignals(stop);
    try {
      return await runAppWorker(await importApp(app, load), line, stop.signal);
    } finally {
      removeSignals();
    }
  } catch (error) {
    return reportError(error);
  }
}

function binaryName(): string {
  return Deno.build.standalone ? Deno.execPath().split(/[\\/]/).pop()! : "worker";
}
