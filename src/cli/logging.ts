/**
 * The CLI's LogTape set-up: one console sink on stderr for the `["akadze"]` category, as
 * readable text or as JSON lines. The library itself never configures logging.
 *
 * @module
 */
import {
  configure,
  getConfig,
  getConsoleSink,
  getJsonLinesFormatter,
  getTextFormatter,
  type LogLevel,
} from "@logtape/logtape";
import { UsageError } from "./common.ts";

/** The log formats of `--log-format`. */
export const LOG_FORMATS: readonly LogFormat[] = ["text", "json"];
/** The levels of `--log-level`, lowest first. */
export const LOG_LEVELS: readonly LogLevel[] = [
  "trace",
  "debug",
  "info",
  "warning",
  "error",
  "fatal",
];

/** `text`: one human-readable line per record; `json`: one JSON object per line. */
export type LogFormat = "text" | "json";

/** How the CLI logs. */
export interface LoggingOptions {
  /** Line format. */
  format: LogFormat;
  /** The lowest level shown. */
  level: LogLevel;
}

/** Parse `--log-format`. */
export function parseLogFormat(text: string): LogFormat {
  if ((LOG_FORMATS as string[]).includes(text)) return text as LogFormat;
  throw new UsageError(`--log-format must be ${LOG_FORMATS.join(" or ")}, got "${text}"`);
}

/** Parse `--log-level` (`warn` is accepted for `warning`). */
export function parseLogLevel(text: string): LogLevel {
  const level = text.toLowerCase() === "warn" ? "warning" : text.toLowerCase();
  if ((LOG_LEVELS as string[]).includes(level)) return level as LogLevel;
  throw new UsageError(`--log-level must be one of ${LOG_LEVELS.join(", ")}, got "${text}"`);
}

/**
 * Send akadze's log records to stderr. Returns false and changes nothing when the
 * application already configured LogTape (its set-up wins).
 */
export async function configureCliLogging(options: LoggingOptions): Promise<boolean> {
  if (getConfig() !== null) return false;
  const formatter = options.format === "json"
    ? getJsonLinesFormatter({ categorySeparator: ".", message: "rendered", properties: "flatten" })
    : getTextFormatter({ timestamp: "date-time-tz", category: ".", value: "bare" });
  // console.error for every level: logs go to stderr, stdout stays for command output.
  const levelMap = Object.fromEntries(LOG_LEVELS.map((level) => [level, "error"])) as Record<
    LogLevel,
    "error"
  >;
  await configure({
    sinks: { stderr: getConsoleSink({ formatter, levelMap }) },
    loggers: [
      { category: ["akadze"], sinks: ["stderr"], lowestLevel: options.level },
      // LogTape's own warnings only (it otherwise prints a notice about this logger).
      { category: ["logtape", "meta"], sinks: ["stderr"], lowestLevel: "warning" },
    ],
  });
  return true;
}
