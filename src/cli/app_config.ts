/**
 * Run a command that imports APP under the app's own deno.json. An installed `akadze`
 * runs with the config it was installed with, so the app's bare imports ("ms", "zod", …)
 * would not resolve; when the app's project has its own deno.json (the nearest one above
 * the app module, as `deno run` would find it) and this process does not run under it,
 * the same command runs again as a child process with `--config` set to it. The child
 * gets this process's runtime flags (permissions included), its stdio and every stop
 * signal, and its exit code is the command's.
 *
 * @module
 */
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { countSignals } from "./signals.ts";
import { commandPrefix, ownCommandLine } from "./supervisor.ts";
import type { AppTarget } from "./load_app.ts";

/** Set in the child to the config it runs under, so that it does not start another child. */
export const APP_CONFIG_ENV = "AKADZE_APP_CONFIG";
/** Set in the child to the pid of the process that started it (see {@linkcode rerunParent}). */
export const APP_PARENT_ENV = "AKADZE_APP_PARENT_PID";

const CONFIG_NAMES = ["deno.json", "deno.jsonc"];
/** The signals forwarded to the child (SIGHUP too: a closed terminal stops it as well). */
const FORWARDED: readonly Deno.Signal[] = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"];
/** Runtime flags that name the config or the lock file: the child gets the app's instead. */
const CONFIG_FLAGS_WITH_VALUE = ["--config", "-c", "--import-map"];
const CONFIG_FLAGS = ["--no-config", "--lock", "--no-lock", "--frozen"];

/** The nearest deno.json or deno.jsonc in the directory of `file` or above it. */
export async function findConfig(file: string): Promise<string | undefined> {
  let dir = dirname(file);
  for (;;) {
    for (const name of CONFIG_NAMES) {
      const path = join(dir, name);
      const info = await Deno.stat(path).catch(() => undefined);
      if (info?.isFile) return path;
    }
    const parent = dirname(dir);
    if (parent === dir) return undefined;
    dir = parent;
  }
}

/**
 * The runtime flags of `deno run FLAGS… SCRIPT` (`prefix` without "run" and the script)
 * without those that choose a config, an import map or a lock file.
 */
export function withoutConfigFlags(flags: readonly string[]): string[] {
  const kept: string[] = [];
  for (let i = 0; i < flags.length; i++) {
    const flag = flags[i];
    const name = flag.split("=")[0];
    if (CONFIG_FLAGS_WITH_VALUE.includes(name)) {
      if (!flag.includes("=")) i++; // its value is the next argument
      continue;
    }
    if (CONFIG_FLAGS.includes(name)) continue;
    kept.push(flag);
  }
  return kept;
}

/**
 * The config `deno run FLAGS… SCRIPT` runs under, started in `cwd`: the one `--config`
 * names, none with `--no-config`, else the nearest one above a local SCRIPT (Deno looks
 * beside the script, not in the working directory), or above `cwd` for a remote one.
 */
export async function configOfFlags(
  flags: readonly string[],
  script: string,
  cwd: string,
): Promise<string | undefined> {
  for (let i = 0; i < flags.length; i++) {
    const [name, value] = flags[i].split(/=(.*)/s);
    if (name === "--no-config") return undefined;
    if (name === "--config" || name === "-c") {
      const path = value ?? flags[i + 1];
      return path === undefined ? undefined : resolve(cwd, path);
    }
  }
  if (script.startsWith("file:")) return await findConfig(fileURLToPath(script));
  if (/^[a-z][a-z0-9+.-]+:/i.test(script)) return await findConfig(join(cwd, "script"));
  return await findConfig(resolve(cwd, script));
}

/**
 * The argv (after the runtime) of the child that runs `args` under `config`: `run`, this
 * process's runtime flags without its config, `--config CONFIG`, the script and `args`.
 */
export function childArgv(prefix: readonly string[], config: string, args: string[]): string[] {
  const [run, ...rest] = prefix;
  const script = rest.at(-1)!;
  return [run, ...withoutConfigFlags(rest.slice(0, -1)), "--config", config, script, ...args];
}

/**
 * When APP's project has a deno.json this process does not run under, run this process's
 * command again under it and return the child's exit code; otherwise `undefined` (the
 * caller loads APP itself). Nothing changes for an app without a deno.json, in a child
 * started here, in a compiled binary, or when `main()` is called from another script.
 */
export async function runUnderAppConfig(target: AppTarget): Promise<number | undefined> {
  if (Deno.build.standalone) return undefined;
  const config = await findConfig(fileURLToPath(target.url));
  if (config === undefined) return undefined;
  // Without access to the marker a child could not tell it is one: never start one then.
  if (Deno.permissions.querySync({ name: "env", variable: APP_CONFIG_ENV }).state !== "granted") {
    return undefined;
  }
  if (Deno.env.get(APP_CONFIG_ENV)) return undefined;
  const cliModule = new URL("../../cli.ts", import.meta.url).href;
  if (Deno.mainModule !== cliModule) return undefined;
  const runtime = Deno.execPath();
  if ((await Deno.permissions.query({ name: "run", command: runtime })).state !== "granted") {
    return undefined;
  }
  let prefix: string[];
  try {
    prefix = commandPrefix(await ownCommandLine(runtime), Deno.args);
  } catch {
    // No /proc (not Linux): the runtime flags are unknown, load APP here.
    return undefined;
  }
  if (prefix[0] !== "run") return undefined;
  const current = await configOfFlags(prefix.slice(1, -1), prefix.at(-1)!, Deno.cwd());
  if (current !== undefined && await samePath(current, config)) return undefined;
  return await runChild(runtime, childArgv(prefix, config, Deno.args), config);
}

async function runChild(runtime: string, args: string[], config: string): Promise<number> {
  const child = new Deno.Command(runtime, {
    args,
    env: { [APP_CONFIG_ENV]: config, [APP_PARENT_ENV]: String(Deno.pid) },
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
    // Its own process group: a terminal's Ctrl-C reaches it once, through this process.
    detached: true,
  }).spawn();
  const removeSignals = countSignals(FORWARDED, (signal) => {
    try {
      child.kill(signal);
    } catch {
      // It has exited already.
    }
  });
  try {
    const status = await child.status;
    // A child ended by a signal: Deno's code is already 128 + its number, as a shell's.
    return status.code;
  } finally {
    removeSignals();
  }
}

async function samePath(a: string, b: string): Promise<boolean> {
  const real = (path: string) => Deno.realPath(path).catch(() => resolve(path));
  return await real(a) === await real(b);
}

/**
 * In a command that {@linkcode runUnderAppConfig} started: the pid of the `akadze` process
 * that started it, else `undefined`. The child runs in its own process group, so a SIGKILL
 * of that process does not reach it: it must watch for it and stop, as a supervisor's
 * worker does, instead of running on as an orphan.
 */
export function rerunParent(): number | undefined {
  const granted = Deno.permissions.querySync({ name: "env", variable: APP_PARENT_ENV });
  if (granted.state !== "granted") return undefined;
  const pid = Number(Deno.env.get(APP_PARENT_ENV));
  return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
}
