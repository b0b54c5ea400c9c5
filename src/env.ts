/**
 * The `AKADZE_*` environment variables an app reads for settings its code leaves open, so
 * that the CLI (and a deployment) can set them for an app it did not construct.
 *
 * @module
 */
import { AkadzeError } from "./errors.ts";

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

/** Parse a pool size given as text (`source` names where it came from, for the error). */
export function parsePoolSize(text: string, source: string): number {
  const n = /^\d+$/.test(text.trim()) ? Number(text.trim()) : NaN;
  if (!(n >= 1 && n <= MAX_POOL_SIZE)) {
    throw new AkadzeError(
      `${source} must be an integer from 1 to ${MAX_POOL_SIZE}, got "${text}"`,
    );
  }
  return n;
}

/** The pool size `AKADZE_POOL_SIZE` asks for, or undefined when it is unset or unreadable. */
export function poolSizeFromEnv(): number | undefined {
  const text = readEnv(POOL_SIZE_ENV);
  return text === undefined ? undefined : parsePoolSize(text, POOL_SIZE_ENV);
}
