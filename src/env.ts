/**
 * The `AKADZE_*` environment variables an app reads for settings its code leaves open, so
 * that the CLI (and a deployment) can set them for an app it did not construct.
 *
 * @module
 */
import { AkadzeError } from "./errors.ts";
import { parseIntegerText } from "./rules.ts";

/** The pool size of an app whose code gives no `max` (see `AkadzeOptions.max`). */
export const POOL_SIZE_ENV = "AKADZE_POOL_SIZE";
/** The URL of the LISTEN connection of an app whose code gives no `listenUrl`. */
export const LISTEN_URL_ENV = "AKADZE_LISTEN_URL";
/** The largest pool size accepted. */
export const MAX_POOL_SIZE = 10_000;

/**
 * An environment variable when the process may read it (a read without leave throws),
 * undefined when unset, empty or not readable.
 */
export function readEnv(name: string): string | undefined {
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
    return undefined;
  }
  return Deno.env.get(name) || undefined;
}

/**
 * Parse a pool size given as text: `source` names where it came from (a variable, a flag)
 * for the error, an `error` (`AkadzeError` by default).
 */
export function parsePoolSize(
  text: string,
  source: string,
  error: new (message: string) => Error = AkadzeError,
): number {
  return parseIntegerText(source, text, { min: 1, max: MAX_POOL_SIZE, error });
}

/** The pool size `AKADZE_POOL_SIZE` asks for, or undefined when it is unset or unreadable. */
export function poolSizeFromEnv(): number | undefined {
  const text = readEnv(POOL_SIZE_ENV);
  // A value in an environment file may carry stray whitespace.
  return text === undefined ? undefined : parsePoolSize(text.trim(), POOL_SIZE_ENV);
}
