/**
 * Logging through LogTape: the library only obtains loggers under the `["akadze", ...]`
 * category; the application (or the CLI) configures sinks. Every record carries a stable
 * `event` property and ids, never task arguments or results.
 *
 * @module
 */
import { getLogger, type Logger } from "@logtape/logtape";

/** The logger of a part of akadze, e.g. `logger("worker")`. */
export function logger(...category: string[]): Logger {
  return getLogger(["akadze", ...category]);
}
