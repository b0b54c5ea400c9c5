/**
 * `akadze migrate [--status [--json] | --print-sql]`.
 *
 * @module
 */
import { migrate, migrationSql, type MigrationStatus, migrationStatus } from "../migrate.ts";
import { databaseUrl, parseFlags, UsageError } from "./common.ts";
import { schemaFlag } from "./ops.ts";
import { type Column, isoTime, printJson, printTable } from "./output.ts";

/** Help text of `akadze migrate`. */
export const MIGRATE_HELP = `Usage: akadze migrate [--status [--json] | --print-sql]

Create or update akadze's schema in the database of AKADZE_DATABASE_URL.
Prints "applied <version>" for each version applied, or "schema up to date".

Options:
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
  const { values } = parseFlags(args, {
    status: { type: "boolean" },
    json: { type: "boolean" },
    "print-sql": { type: "boolean" },
    schema: { type: "string" },
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(MIGRATE_HELP);
    return 0;
  }
  if (values.json && !values.status) throw new UsageError("--json goes with --status");
  if (values["print-sql"] && values.status) {
    throw new UsageError("--print-sql and --status cannot be combined");
  }
  const schema = schemaFlag(values.schema);
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
  const applied = await migrate(url, { schema });
  for (const version of applied) console.log(`applied ${version}`);
  if (applied.length === 0) console.log("schema up to date");
  return 0;
}
