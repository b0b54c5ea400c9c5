/**
 * The `akadze` command: migrate the schema, run workers (`worker`, or `dev` on a
 * throwaway PostgreSQL) and operate queues, jobs, limits and schedules. Every command
 * reads the database from `AKADZE_DATABASE_URL` (never a flag, so it does not show in
 * `ps`); `akadze --help` lists the commands and `akadze COMMAND --help` their options.
 *
 * Install it as a command (the permissions cover every subcommand; `dev` is what needs
 * `--allow-run`, `--allow-write` and `--allow-sys=uid`):
 *
 * ```sh
 * deno install -g -n akadze --allow-net --allow-env --allow-sys=hostname,uid \
 *   --allow-read --allow-write --allow-run jsr:@akadze/akadze/cli
 * export AKADZE_DATABASE_URL=postgres://app:secret@localhost:5432/app
 * akadze migrate
 * akadze worker ./app.ts --queue default --slots 4
 * ```
 *
 * @example Run it from your own script, e.g. a deploy step that migrates first
 * ```ts
 * import { main } from "@akadze/akadze/cli";
 *
 * const code = await main(["migrate"]); // prints "applied ..." or "schema up to date"
 * if (code !== 0) Deno.exit(code);
 * ```
 *
 * @module
 */
import denoJson from "./deno.json" with { type: "json" };
import { reportError, UsageError } from "./src/cli/common.ts";
import { compileCommand } from "./src/cli/compile.ts";
import { devCommand } from "./src/cli/dev.ts";
import { healthCommand } from "./src/cli/health.ts";
import { jobsCommand } from "./src/cli/jobs.ts";
import { limitsCommand } from "./src/cli/limits.ts";
import { metricsCommand } from "./src/cli/metrics.ts";
import { migrateCommand } from "./src/cli/migrate.ts";
import { pruneCommand } from "./src/cli/prune.ts";
import { queuesCommand } from "./src/cli/queues.ts";
import { schedulesCommand } from "./src/cli/schedules.ts";
import { workerCommand } from "./src/cli/worker.ts";
import { workersCommand } from "./src/cli/workers.ts";

/** The package version, from deno.json. */
export const VERSION: string = denoJson.version;

const HELP = `akadze ${VERSION}: a PostgreSQL-backed task queue

Usage: akadze <command> [options]

Commands:
  migrate [--status]   create or update the schema
  worker APP           run jobs of the app exported by the module APP[:export]
  dev APP              the same on a throwaway PostgreSQL (no database needed)
  compile APP          build a worker binary for the app (deno compile, -o PATH)
  health               exit 0/1: heartbeat files fresh (--heartbeat-file, no database)
                       or queue lag and ready counts under thresholds
  jobs list|show|requeue|cancel
                       list and inspect jobs, requeue a failed one, cancel one
  queues list|pause|resume
                       queue counts and lag; stop and resume claims from a queue
  workers list         registered worker processes and their heartbeats
  limits list|set|clear
                       concurrency and rate limits of limit keys
  metrics              print the Prometheus metrics text
  prune                delete old finished jobs (--older-than, --include-failed, --dry-run)
  schedules list APP   the app's periodic schedules and their next fire times
  beat                 (none needed: schedules run inside the worker)

Options:
  -h, --help           show help (also after a command)
  -V, --version        print the version

Environment:
  AKADZE_DATABASE_URL  postgres://user:password@host:port/database`;

const BEAT_MESSAGE = "akadze has no beat process: periodic schedules run inside every worker " +
  "(akadze worker APP), each fire enqueued once across all workers.";

/**
 * Run the CLI with the given arguments and return its exit code (0 ok, 1 failure,
 * 2 usage error; `worker` and `dev` exit with 130 themselves on a second signal).
 *
 * @example
 * ```ts ignore
 * import { main } from "@akadze/akadze/cli";
 * Deno.exit(await main(["migrate", "--status"]));
 * ```
 */
export async function main(args: string[]): Promise<number> {
  const [command, ...rest] = args;
  try {
    switch (command) {
      case undefined:
      case "-h":
      case "--help":
      case "help":
        console.log(HELP);
        return command === undefined ? 2 : 0;
      case "-V":
      case "--version":
        console.log(VERSION);
        return 0;
      case "migrate":
        return await migrateCommand(rest);
      case "worker":
        return await workerCommand(rest);
      case "dev":
        return await devCommand(rest);
      case "compile":
        return await compileCommand(rest);
      case "health":
        return await healthCommand(rest);
      case "jobs":
        return await jobsCommand(rest);
      case "queues":
        return await queuesCommand(rest);
      case "workers":
        return await workersCommand(rest);
      case "limits":
        return await limitsCommand(rest);
      case "metrics":
        return await metricsCommand(rest);
      case "prune":
        return await pruneCommand(rest);
      case "schedules":
        return await schedulesCommand(rest);
      case "beat":
        if (rest.includes("--help") || rest.includes("-h")) {
          console.log(`Usage: akadze beat\n\n${BEAT_MESSAGE}`);
          return 0;
        }
        console.error(BEAT_MESSAGE);
        return 1;
      default:
        throw new UsageError(`unknown command "${command}" (see akadze --help)`);
    }
  } catch (error) {
    return reportError(error);
  }
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
