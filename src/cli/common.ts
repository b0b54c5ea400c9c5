/**
 * What every CLI command shares: usage errors, the database URL from the environment,
 * and one-line, credential-free error output.
 *
 * @module
 */
import { parseArgs, type ParseArgsConfig } from "node:util";
import { describeError, urlPassword } from "../db.ts";
import { parseIntegerText } from "../rules.ts";
import { safeText } from "./output.ts";

/** A command-line usage error: printed as one line, exit code 2. */
export class UsageError extends Error {
  /** @param message What is wrong with the command line. */
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** The environment variable every command reads the database URL from. */
export const DATABASE_URL_ENV = "AKADZE_DATABASE_URL";

/** The database URL from `AKADZE_DATABASE_URL`; a usage error when unset. */
export function databaseUrl(): string {
  const url = Deno.env.get(DATABASE_URL_ENV);
  if (!url) {
    throw new UsageError(
      `${DATABASE_URL_ENV} is not set (export ${DATABASE_URL_ENV}=postgres://user:pass@host/db)`,
    );
  }
  if (!/^postgres(ql)?:\/\//.test(url)) {
    // Never echo it: it may hold a password.
    throw new UsageError(`${DATABASE_URL_ENV} must be a postgres:// or postgresql:// URL`);
  }
  return url;
}

/**
 * Parse a command's flags strictly; unknown flags and missing values are usage errors in
 * akadze's words, pointing at the `--help` of `command` (e.g. `"akadze jobs list"`).
 */
export function parseFlags<T extends NonNullable<ParseArgsConfig["options"]>>(
  args: string[],
  options: T,
  allowPositionals = false,
  command?: string,
): ReturnType<typeof parseArgs<{ args: string[]; options: T; allowPositionals: boolean }>> {
  try {
    return parseArgs({ args, options, allowPositionals, strict: true });
  } catch (error) {
    throw new UsageError(`${flagProblem(error)} (see ${command ? `${command} ` : ""}--help)`);
  }
}

/** What `parseArgs` refused, without its wording (which speaks of Node's API). */
function flagProblem(error: unknown): string {
  const code = (error as { code?: unknown } | null)?.code;
  const message = error instanceof Error ? error.message : String(error);
  const quoted = /'([^']*)'/.exec(message)?.[1] ?? "";
  const flag = quoted.replace(/ <value>$/, "");
  switch (code) {
    case "ERR_PARSE_ARGS_UNKNOWN_OPTION":
      return `unknown option ${flag}`;
    case "ERR_PARSE_ARGS_INVALID_OPTION_VALUE":
      if (message.includes("ambiguous")) {
        // Only the long form takes `=VALUE` (`-o=x` would be the value "=x"); the message
        // names it in its own advice ("use '--output=-XYZ' or '-o-XYZ'").
        return `${flag} needs a value; for one that starts with "-", write ` +
          `${/'(--[\w-]+)=/.exec(message)?.[1] ?? flag}=VALUE`;
      }
      return message.includes("does not take") ? `${flag} takes no value` : `${flag} needs a value`;
    case "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL":
      return `unexpected argument "${flag}"`;
    default:
      return message;
  }
}

/** Print an error as one line on stderr and return its exit code (2 usage, 1 failure). */
export function reportError(error: unknown): number {
  let url: string | undefined;
  try {
    url = Deno.env.get(DATABASE_URL_ENV);
  } catch {
    // no env permission (e.g. a file-only health probe): nothing to redact
  }
  const password = url ? urlPassword(url) : undefined;
  console.error(`error: ${safeText(describeError(error, password ? [password] : []))}`);
  return error instanceof UsageError ? 2 : 1;
}

/** An integer flag within `[min, max]` (a usage error otherwise). */
export function integerFlag(flag: string, text: string, min: number, max: number): number {
  return parseIntegerText(flag, text, { min, max, error: UsageError });
}

/** The number a seconds flag's text says (decimals allowed, no sign or exponent), else NaN. */
export function secondsText(text: string): number {
  return /^(?:\d+(?:\.\d*)?|\.\d+)$/.test(text) ? Number(text) : NaN;
}
