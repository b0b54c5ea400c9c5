/**
 * Find the application of `akadze worker APP[:export]`: resolve the module, import it and
 * pick the export, with one-line usage errors for every way that can go wrong.
 *
 * @module
 */
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Akadze } from "../app.ts";
import { describeError } from "../db.ts";
import { DATABASE_URL_ENV, UsageError } from "./common.ts";

/** A parsed `APP[:export]` argument. */
export interface AppTarget {
  /** The argument as given, for messages. */
  spec: string;
  /** The module, as given (without the export). */
  module: string;
  /** Its file URL. */
  url: URL;
  /** The export named after the colon, if any. */
  exportName?: string;
}

/** A loaded app and whether it is an instance of this copy of akadze. */
export interface LoadedApp {
  /** The application. */
  app: Akadze;
  /**
   * False when the module's akadze is another copy than the CLI's (e.g. from JSR while the
   * CLI runs from a checkout); the CLI then relies on the app's shape only.
   */
  sameCopy: boolean;
}

const EXPORT_SUFFIX = /^(.+):([A-Za-z_$][\w$]*)$/;
// A URL scheme has two or more characters; a Windows drive letter ("C:") is a path.
const URL_SCHEME = /^[a-zA-Z][a-zA-Z0-9+.-]+:/;
const ANSI = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, "g");

/**
 * Parse `APP[:export]`: a path relative to `cwd` or a `file:` URL, optionally followed by
 * `:name` (a JavaScript identifier).
 */
export function parseAppTarget(spec: string, cwd: string = Deno.cwd()): AppTarget {
  const match = EXPORT_SUFFIX.exec(spec);
  const module = match ? match[1] : spec;
  const exportName = match ? match[2] : undefined;
  if (module === "") throw new UsageError("APP must be a module path, e.g. ./app.ts");
  let url: URL;
  if (URL_SCHEME.test(module)) {
    try {
      url = new URL(module);
    } catch {
      throw new UsageError(`APP "${module}" is not a valid URL`);
    }
    if (url.protocol !== "file:") {
      throw new UsageError(`APP must be a local module path or a file: URL, got "${module}"`);
    }
  } else {
    url = pathToFileURL(resolve(cwd, module));
  }
  return { spec, module, url, exportName };
}

/** Fail with a usage error unless the module of `target` is an existing file. */
export async function assertAppModuleExists(target: AppTarget): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(target.url);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new UsageError(`app module not found: ${target.module}`);
    }
    throw new UsageError(`cannot read app module ${target.module}: ${describeError(error)}`);
  }
  if (!info.isFile) throw new UsageError(`app module ${target.module} is not a file`);
}

/**
 * Import the module and return its app: the named export, else `app`, else the default
 * export. Usage errors when the module or export is missing or is not an Akadze app; a
 * module that throws while loading is a failure (exit 1), or a usage error when
 * `AKADZE_DATABASE_URL` is not set (the usual cause).
 */
export async function loadApp(target: AppTarget): Promise<LoadedApp> {
  await assertAppModuleExists(target);
  // The one warning of `deno publish --dry-run` (unanalyzable-dynamic-import) is this line,
  // and it is expected: the module is the user's app, known only at run time.
  return await importApp(target, () => import(target.url.href));
}

/**
 * Import the app module with `load` (e.g. a static `import()` compiled into a binary) and
 * pick its app, with the errors of {@linkcode loadApp}.
 */
export async function importApp(
  target: Pick<AppTarget, "module" | "exportName">,
  load: () => Promise<Record<string, unknown>>,
): Promise<LoadedApp> {
  let module: Record<string, unknown>;
  try {
    module = await load();
  } catch (error) {
    // Deno colours the locations in its module errors; the CLI prints plain text.
    const message = `could not load ${target.module}: ${describeError(error).replace(ANSI, "")}`;
    if (!envSet(DATABASE_URL_ENV)) {
      throw new UsageError(`${message} (${DATABASE_URL_ENV} is not set)`);
    }
    throw new Error(message, { cause: error });
  }
  const names = Object.keys(module);
  const listed = names.length ? names.join(", ") : "none";
  let name = target.exportName;
  if (name === undefined) {
    name = "app" in module ? "app" : "default" in module ? "default" : undefined;
    if (name === undefined) {
      throw new UsageError(
        `${target.module} exports neither "app" nor a default (exports: ${listed}); ` +
          `name one: ${target.module}:NAME`,
      );
    }
  } else if (!(name in module)) {
    throw new UsageError(`${target.module} has no export "${name}" (exports: ${listed})`);
  }
  const value = module[name];
  if (value instanceof Akadze) return { app: value, sameCopy: true };
  if (looksLikeApp(value)) return { app: value as Akadze, sameCopy: false };
  throw new UsageError(
    `export "${name}" of ${target.module} is not an Akadze app (got ${kindOf(value)})`,
  );
}

/** An app from another copy of akadze (JSR, another version) has the same shape. */
function looksLikeApp(value: unknown): boolean {
  if (typeof value !== "object" || value === null) return false;
  const app = value as Record<string, unknown>;
  const tasks = app.tasks as { get?: unknown; keys?: unknown } | undefined;
  return typeof app.sql === "function" && typeof app.schema === "string" &&
    typeof tasks?.get === "function" && typeof tasks?.keys === "function" &&
    typeof app.hooks === "object" && app.hooks !== null;
}

function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "function") return `function ${value.name || "(anonymous)"}`;
  if (typeof value === "object") return value.constructor?.name ?? "object";
  return typeof value;
}

function envSet(name: string): boolean {
  try {
    return !!Deno.env.get(name);
  } catch {
    return false;
  }
}
