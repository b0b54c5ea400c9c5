/**
 * The `akadze` command: migrate the schema, run workers and operate queues.
 * Every command reads the database from `AKADZE_DATABASE_URL` (never a flag, so it does
 * not show in `ps`).
 *
 * @example
 * ```sh
 * export AKADZE_DATABASE_URL=postgres://app:secret@localhost:5432/app
 * deno run --allow-net --allow-env --allow-sys=hostname --allow-read jsr:@akadze/akadze/cli migrate
 * ```
 *
 * @module
 */
import denoJson from "./deno.json" with { type: "json" };
import { reportError, UsageError } from "./src/cli/common.ts";
import { devCommand } from "./src/cli/dev.ts";
import { migrateCommand } from "./src/cli/migrate.ts";
import { workerCommand } from "./src/cli/worker.ts";

/** The package version, from deno.json. */
export const VERSION: string = denoJson.version;

const HELP = `akadze ${VERSION}: a PostgreSQL-backed task queue

Usage: akadze <command> [options]

Commands:
  migrate [--status]   create or update the schema
  worker APP           run jobs of the app exported by the module APP[:export]
  dev APP              the same on a throwaway PostgreSQL (no database needed)
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
