/**
 * `akadze limits list|set|clear`.
 *
 * @module
 */
import {
  clearLimit,
  type LimitOptions,
  type LimitSummary,
  listLimits,
  setLimit,
} from "../admin/limits.ts";
import { isSchemaMissing } from "../db.ts";
import { AkadzeError } from "../errors.ts";
import { INT4_MAX, isKeyLength, KEY_MAX_LENGTH, LIMIT_WINDOW_MAX } from "../rules.ts";
import { integerFlag, UsageError } from "./common.ts";
import {
  DATABASE_FOOTER,
  dispatch,
  parseSubcommand,
  SCHEMA_OPTION,
  secondsFlag,
  withSql,
} from "./ops.ts";
import { type Column, msToSeconds, printJson, printTable, safeText } from "./output.ts";

/** Help text of `akadze limits`. */
export const LIMITS_HELP = `Usage: akadze limits <command> [options]

Limits apply to jobs enqueued with a limitKey; a key without limits is unlimited.

Commands:
  list [--json]        every limit key with its limits and current usage
  set KEY [--max-running N|none] [--max-starts N|none] [--window S|none]
                       set (or change) the limits of a key
  clear KEY            remove a key's limits (it becomes unlimited)

Run akadze limits <command> --help for a command's options.`;

const LIST_HELP = `Usage: akadze limits list [--json]

Every limit key, by key, with its limits and usage: RUNNING jobs with the key now, and
STARTS within the current window.

Options:
  --json          a JSON array of objects with the keys key, maxRunning, maxStarts,
                  windowSeconds, running, starts (null for a limit that is not set)
${SCHEMA_OPTION}
  -h, --help      show this help

Output: a header line, then one line per key; columns separated by a tab:
  KEY MAX_RUNNING MAX_STARTS WINDOW_SECONDS RUNNING STARTS
"-" stands for a limit that is not set.

${DATABASE_FOOTER}`;

const SET_HELP = `Usage: akadze limits set KEY [--max-running N|none] [--max-starts N --window S]

Set the limits of the limit key KEY. Options not given keep their current values; the
value "none" removes a limit. --max-starts and --window go together (a rate of N starts
per S seconds). Prints the key's row in the format of akadze limits list.

Options:
  --max-running N|none   at most N jobs with the key run at once, cluster-wide
  --max-starts N|none    at most N jobs with the key start per window
  --window S|none        the rate window in seconds (decimals allowed, up to a year)
  --json                 print the row as a JSON object (keys of limits list --json)
${SCHEMA_OPTION}
  -h, --help             show this help

Example: akadze limits set smtp --max-running 5 --max-starts 100 --window 60

${DATABASE_FOOTER}`;

const CLEAR_HELP = `Usage: akadze limits clear KEY

Remove the limits of KEY and its start marks: the key becomes unlimited. Prints
"cleared limit KEY", or "no limit KEY (nothing cleared)"; both exit 0.

Options:
${SCHEMA_OPTION}
  -h, --help      show this help

${DATABASE_FOOTER}`;

/** Run `akadze limits`; returns the exit code. */
export function limitsCommand(args: string[]): Promise<number> {
  return dispatch("limits", args, LIMITS_HELP, {
    list: listCommand,
    set: setCommand,
    clear: clearCommand,
  });
}

const COLUMNS: Column<LimitSummary>[] = [
  { header: "KEY", value: (l) => l.key },
  { header: "MAX_RUNNING", value: (l) => l.maxRunning },
  { header: "MAX_STARTS", value: (l) => l.maxStarts },
  { header: "WINDOW_SECONDS", value: (l) => msToSeconds(l.window) },
  { header: "RUNNING", value: (l) => l.running },
  { header: "STARTS", value: (l) => l.starts },
];

function limitJson(l: LimitSummary): Record<string, unknown> {
  return {
    key: l.key,
    maxRunning: l.maxRunning,
    maxStarts: l.maxStarts,
    windowSeconds: msToSeconds(l.window),
    running: l.running,
    starts: l.starts,
  };
}

async function listCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    json: { type: "boolean" },
  }, {
    help: LIST_HELP,
    positionals: [],
    usage: "akadze limits list [--json]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const limits = await withSql((sql) => listLimits(sql, { schema }));
  if (values.json) printJson(limits.map(limitJson));
  else printTable(COLUMNS, limits);
  return 0;
}

async function setCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    "max-running": { type: "string" },
    "max-starts": { type: "string" },
    window: { type: "string" },
    json: { type: "boolean" },
  }, {
    help: SET_HELP,
    positionals: ["KEY"],
    usage: "akadze limits set KEY [options]",
  });
  if (!parsed) return 0;
  const { values, positionals: [key], schema } = parsed;
  checkKey(key);
  const limits: LimitOptions = {};
  const orNone = <T>(text: string | undefined, parse: (t: string) => T) =>
    text === undefined ? undefined : text === "none" ? null : parse(text);
  limits.maxRunning = orNone(
    values["max-running"],
    (t) => integerFlag("--max-running", t, 1, INT4_MAX),
  );
  limits.maxStarts = orNone(
    values["max-starts"],
    (t) => integerFlag("--max-starts", t, 1, INT4_MAX),
  );
  limits.window = orNone(values.window, (t) => secondsFlag("--window", t, 1, LIMIT_WINDOW_MAX));
  for (const name of ["maxRunning", "maxStarts", "window"] as const) {
    if (limits[name] === undefined) delete limits[name];
  }
  if (Object.keys(limits).length === 0) {
    throw new UsageError("give at least one of --max-running, --max-starts, --window");
  }
  const row = await withSql(async (sql) => {
    try {
      return await setLimit(sql, key, limits, { schema });
    } catch (error) {
      // setLimit's own errors are about the values asked for (e.g. a rate without a window),
      // except the one saying the schema is missing.
      if (error instanceof AkadzeError && !isSchemaMissing(error, schema)) {
        throw new UsageError(error.message);
      }
      throw error;
    }
  });
  if (values.json) printJson(limitJson(row));
  else printTable(COLUMNS, [row]);
  return 0;
}

async function clearCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {}, {
    help: CLEAR_HELP,
    positionals: ["KEY"],
    usage: "akadze limits clear KEY",
  });
  if (!parsed) return 0;
  const { positionals: [key], schema } = parsed;
  checkKey(key);
  const existed = await withSql((sql) => clearLimit(sql, key, { schema }));
  console.log(safeText(existed ? `cleared limit ${key}` : `no limit ${key} (nothing cleared)`));
  return 0;
}

function checkKey(key: string): void {
  if (!isKeyLength(key)) {
    throw new UsageError(
      `KEY must be a non-empty limit key of at most ${KEY_MAX_LENGTH} characters`,
    );
  }
}
