/**
 * What the operations commands (`jobs`, `queues`, `workers`, `limits`, `metrics`,
 * `prune`) share: subcommand dispatch, a short-lived pool on `AKADZE_DATABASE_URL`, and
 * strict parsing of ids, names, numbers and durations into usage errors.
 *
 * @module
 */
import { connect, quoteSchema, type Sql } from "../db.ts";
import { normalizeId } from "../admin/jobs.ts";
import { QUEUE_NAME, QUEUE_NAME_RULE } from "../rules.ts";
import type { ParseArgsConfig } from "node:util";
import { databaseUrl, parseFlags, secondsText, UsageError } from "./common.ts";

/** The `--schema` line of every operations command's help. */
export const SCHEMA_OPTION = "  --schema NAME   schema of akadze's tables (default akadze)";

/** The usual footer of an operations command's help. */
export const DATABASE_FOOTER = `The database is AKADZE_DATABASE_URL's (never a flag).
Exit codes: 0 ok, 1 failure (database, state), 2 usage error or AKADZE_DATABASE_URL unset.`;

/** A subcommand: its arguments in, exit code out. */
export type Subcommand = (args: string[]) => Promise<number>;

/**
 * Run the subcommand named by `args[0]`. No subcommand prints the help and exits 2;
 * `-h`, `--help` and `help` print it and exit 0; an unknown one is a usage error.
 */
export async function dispatch(
  command: string,
  args: string[],
  help: string,
  subcommands: Record<string, Subcommand>,
): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined) {
    console.log(help);
    return 2;
  }
  if (name === "-h" || name === "--help" || name === "help") {
    console.log(help);
    return 0;
  }
  const run = Object.hasOwn(subcommands, name) ? subcommands[name] : undefined;
  if (!run) {
    throw new UsageError(
      `unknown ${command} command "${name}" (commands: ${
        Object.keys(subcommands).join(", ")
      }; see akadze ${command} --help)`,
    );
  }
  return await run(rest);
}

/** The `--schema` value, validated (a usage error when it is not a valid schema name). */
export function schemaFlag(value: string | undefined): string {
  const schema = value ?? "akadze";
  try {
    quoteSchema(schema);
  } catch (error) {
    throw new UsageError(`--schema: ${(error as Error).message}`);
  }
  return schema;
}

/**
 * Open a one-connection pool on `AKADZE_DATABASE_URL`, run `fn`, close the pool. A missing
 * URL is a usage error (before anything else); a schema that is not there is explained by
 * the admin functions themselves (they say to migrate).
 */
export async function withSql<T>(fn: (sql: Sql) => Promise<T>): Promise<T> {
  const url = databaseUrl();
  const sql = connect(url, {
    max: 1,
    applicationName: "akadze-cli",
    idleTimeout: 5,
    // postgres.js reads timestamps in the ISO style only (a database's `SQL, DMY` would show
    // the 7th of December as the 12th of July); the CLI sends none but ISO ones.
    settings: { DateStyle: "ISO" },
  });
  try {
    return await fn(sql);
  } finally {
    try {
      await sql.end({ timeout: 1 });
    } catch {
      // Exiting anyway.
    }
  }
}

/** Exactly `names.length` positional arguments, else a usage error naming what is missing. */
export function positionalArgs(positionals: string[], names: string[], usage: string): string[] {
  if (positionals.length < names.length) {
    throw new UsageError(`missing ${names[positionals.length]}: ${usage}`);
  }
  if (positionals.length > names.length) {
    throw new UsageError(
      `unexpected argument "${positionals[names.length]}": ${usage}`,
    );
  }
  return positionals;
}

/** A job id: a positive decimal integer that fits a bigint (a usage error otherwise). */
export function jobIdArg(text: string): string {
  try {
    return normalizeId(text);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

/** A queue name: 1-64 characters of letters, digits, `_ . : -`. */
export function queueArg(text: string, what = "queue name"): string {
  if (!QUEUE_NAME.test(text)) {
    throw new UsageError(
      `${what} must be ${QUEUE_NAME_RULE}, got "${text}"`,
    );
  }
  return text;
}

/**
 * A duration flag in seconds (decimals allowed) as whole milliseconds within
 * `[minMs, maxMs]`.
 */
export function secondsFlag(flag: string, text: string, minMs: number, maxMs: number): number {
  const ms = Math.round(secondsText(text) * 1000);
  if (!(ms >= minMs && ms <= maxMs)) {
    throw new UsageError(
      `${flag} must be a number of seconds from ${minMs / 1000} to ${maxMs / 1000} ` +
        `(decimals allowed), got "${text}"`,
    );
  }
  return ms;
}

/** The flags every operations subcommand takes besides its own. */
const SUBCOMMAND_FLAGS = {
  schema: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** What {@linkcode parseSubcommand} needs besides the flags. */
export interface SubcommandSpec {
  /** Printed for `--help`. */
  help: string;
  /** Names of the required positional arguments (exactly these many). */
  positionals: string[];
  /** The usage line quoted by positional-argument errors. */
  usage: string;
  /** The positionals may also be left out altogether (then none are returned). */
  optionalPositionals?: boolean;
}

/**
 * Parse an operations subcommand: its own `options` plus `--schema` and `--help`, and
 * exactly the positional arguments of `spec`. Prints the help and returns null for
 * `--help`; otherwise the values, the positionals and the validated schema name.
 */
export function parseSubcommand<T extends NonNullable<ParseArgsConfig["options"]>>(
  args: string[],
  options: T,
  spec: SubcommandSpec,
): {
  values: ReturnType<typeof parseFlags<T & typeof SUBCOMMAND_FLAGS>>["values"];
  positionals: string[];
  schema: string;
} | null {
  // "akadze jobs show ID" → "akadze jobs show": the command whose --help to point at.
  const words = spec.usage.split(" ");
  const end = words.findIndex((word) => !/^[a-z]+$/.test(word));
  const command = (end === -1 ? words : words.slice(0, end)).join(" ");
  const { values, positionals } = parseFlags(
    args,
    { ...options, ...SUBCOMMAND_FLAGS },
    true,
    command,
  );
  const common = values as { help?: boolean; schema?: string };
  if (common.help) {
    console.log(spec.help);
    return null;
  }
  return {
    values,
    positionals: spec.optionalPositionals && positionals.length === 0
      ? []
      : positionalArgs(positionals, spec.positionals, spec.usage),
    schema: schemaFlag(common.schema),
  };
}
