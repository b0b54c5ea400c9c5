/**
 * `akadze migrate [--status]`.
 *
 * @module
 */
import { appliedVersions, knownVersions, migrate } from "../migrate.ts";
import { databaseUrl, parseFlags } from "./common.ts";
import { schemaFlag } from "./ops.ts";

/** Help text of `akadze migrate`. */
export const MIGRATE_HELP = `Usage: akadze migrate [--status]

Create or update akadze's schema in the database of AKADZE_DATABASE_URL.
Prints "applied <version>" for each version applied, or "schema up to date".

Options:
  --status        list each known version as applied or pending; change nothing
  --schema NAME   schema name (default akadze)
  -h, --help      show this help`;

/** Run `akadze migrate`; returns the exit code. */
export async function migrateCommand(args: string[]): Promise<number> {
  const { values } = parseFlags(args, {
    status: { type: "boolean" },
    schema: { type: "string" },
    help: { type: "boolean", short: "h" },
  });
  if (values.help) {
    console.log(MIGRATE_HELP);
    return 0;
  }
  const schema = schemaFlag(values.schema);
  const url = databaseUrl();
  if (values.status) {
    const applied = new Set(await appliedVersions(url, { schema }));
    for (const version of knownVersions()) {
      console.log(`${applied.has(version) ? "applied" : "pending"} ${version}`);
    }
    return 0;
  }
  const applied = await migrate(url, { schema });
  for (const version of applied) console.log(`applied ${version}`);
  if (applied.length === 0) console.log("schema up to date");
  return 0;
}
