/**
 * `akadze migrate [--lock-timeout S] [--retry-for S] [--status [--json] | --print-sql]`.
 *
 * @module
 */
import {
  migrate,
  MIGRATE_DEFAULT,
  migrationSql,
  type MigrationStatus,
  migrationStatus,
} from "../migrate.ts";
import { databaseUrl, parseFlags, secondsText, UsageError } from "./common.ts";
import { schemaFlag } from "./ops.ts";
import { type Column, isoTime, printJson, printTable } from "./output.ts";

/** Help text of `akadze migrate`. */
export const MIGRATE_HELP =
  `Usage: akadze migrate [--lock-timeout S] [--retry-for S] [--status [--json] | --print-sql]

Create or update akadze's schema in the database of AKADZE_DATABASE_URL.
Prints "applied <version>" for each version applied, or "schema up to date".
Safe while workers run: each version waits at most --lock-timeout for a lock
(so enqueues and claims wait at most that long behind it), else it is rolled
back and tried again (a line on stderr each time) until --retry-for is spent;
indexes on the jobs table are built without holding back its writes.

Options:
  --lock-timeout S  the longest a version waits for a lock per try, in seconds
                  (default ${MIGRATE_DEFAULT.lockTimeout / 1000})
  --retry-for S   how long to keep trying a version whose lock wait timed out,
                  in seconds (default ${MIGRATE_DEFAULT.retryFor / 1000})
  --status        change nothing; list every version, applied or pending, as a header
                  line and one tab-separated line per version: VERSION STATE APPLIED_AT
                  (exit 0 either way; akadze health exits 1 while a version is pending)
  --json          with --status: a JSON array of objects with the keys version, state
                  ("applied" or "pending") and appliedAt (ISO 8601, or null)
  --print-sql     change nothing and connect to no database; print the SQL script of
                  every version, for a migration tool of your own: run in one
                  transaction, it applies (and records in schema_migrations) each
                  version the database lacks, like akadze migrate
  --schema NAME   schema name (default akadze)
  -h, --help      show this help`;

const COLUMNS: Column<MigrationStatus>[] = [
  { header: "VERSION", value: (m) => m.version },
  { header: "STATE", value: (m) => m.state },
  { header: "APPLIED_AT", value: (m) => m.appliedAt },
];

/** Run `akadze migrate`; returns the exit code. */
export async function migrateCommand(args: string[]): Promise<number> {
  const { values } = parseFlags(
    args,
    {
      status: { type: "boolean" },
      json: { type: "boolean" },
      "print-sql": { type: "boolean" },
      "lock-timeout": { type: "string" },
      "retry-for": { type: "string" },
      schema: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    false,
    "akadze migrate",
  );
  if (values.help) {
    console.log(MIGRATE_HELP);
    return 0;
  }
  if (values.json && !values.status) throw new UsageError("--json goes with --status");
  if (values["print-sql"] && values.status) {
    throw new UsageError("--print-sql and --status cannot be combined");
  }
  const schema = schemaFlag(values.schema);
  const lockTimeout = seconds("--lock-timeout", values["lock-timeout"]);
  const retryFor = seconds("--retry-for", values["retry-for"]);
  if (
    (lockTimeout !== undefined || retryFor !== undefined) && (values.status || values["print-sql"])
  ) {
    throw new UsageError(
      "--lock-timeout and --retry-for go with a migration, not --status or --print-sql",
    );
  }
  if (values["print-sql"]) {
    console.log(migrationSql({ schema }).trimEnd());
    return 0;
  }
  const url = databaseUrl();
  if (values.status) {
    const status = await migrationStatus(url, { schema });
    if (values.json) {
      printJson(status.map((m) => ({ ...m, appliedAt: isoTime(m.appliedAt) })));
    } else {
      printTable(COLUMNS, status);
    }
    return 0;
  }
  const applied = await migrate(url, {
    schema,
    lockTimeout,
    retryFor,
    onRetry: (retry) =>
      console.error(
        `${retry.version}: ${retry.reason}; rolled back, trying again in ${
          (retry.delay / 1000).toFixed(1)
        } s (try ${retry.attempt + 1})`,
      ),
  });
  for (const version of applied) console.log(`applied ${version}`);
  if (applied.length === 0) console.log("schema up to date");
  return 0;
}

/** A seconds flag as whole milliseconds (at least 1 ms), or undefined when not given. */
function seconds(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const ms = Math.round(secondsText(text) * 1000);
  if (!(ms >= 1) || ms > 2_147_483_647) {
    throw new UsageError(`${flag} must be a positive number of seconds, got "${text}"`);
  }
  return ms;
}
