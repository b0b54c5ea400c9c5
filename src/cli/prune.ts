/**
 * `akadze prune [--older-than S] [--include-failed] [--dry-run]`.
 *
 * @module
 */
import { pruneJobs } from "../admin/prune.ts";
import { DATABASE_FOOTER, parseSubcommand, SCHEMA_OPTION, secondsFlag, withSql } from "./ops.ts";

const DEFAULT_OLDER_THAN_S = 7 * 86_400;
const MAX_OLDER_THAN_MS = 100 * 366 * 86_400_000;

/** Help text of `akadze prune`. */
export const PRUNE_HELP = `Usage: akadze prune [--older-than S] [--include-failed] [--dry-run]

Delete finished jobs (succeeded and cancelled; failed ones only with --include-failed)
that finished more than --older-than seconds ago, in batches of 1000 rows. Workers
already prune with the app's retention; this is for one-off cleanups. Prints
"deleted N jobs (STATES; finished more than S s ago)", or with --dry-run
"would delete N jobs (...)".

Options:
  --older-than S     seconds since the job finished, decimals allowed, 0 for every
                     finished job (default ${DEFAULT_OLDER_THAN_S}, 7 days)
  --include-failed   delete failed jobs too (they can no longer be requeued)
  --dry-run          count what would be deleted, delete nothing
${SCHEMA_OPTION}
  -h, --help         show this help

${DATABASE_FOOTER}`;

/** Run `akadze prune`; returns the exit code. */
export async function pruneCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    "older-than": { type: "string" },
    "include-failed": { type: "boolean" },
    "dry-run": { type: "boolean" },
  }, {
    help: PRUNE_HELP,
    positionals: [],
    usage: "akadze prune [--older-than S] [--include-failed] [--dry-run]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const olderThan = values["older-than"] === undefined
    ? DEFAULT_OLDER_THAN_S * 1000
    : secondsFlag("--older-than", values["older-than"], 0, MAX_OLDER_THAN_MS);
  const includeFailed = !!values["include-failed"];
  const dryRun = !!values["dry-run"];
  const n = await withSql((sql) => pruneJobs(sql, { olderThan, includeFailed, dryRun, schema }));
  const states = includeFailed ? "succeeded, failed, cancelled" : "succeeded, cancelled";
  console.log(
    `${dryRun ? "would delete" : "deleted"} ${n} ${n === 1 ? "job" : "jobs"} ` +
      `(${states}; finished more than ${olderThan / 1000} s ago)`,
  );
  return 0;
}
