// Shared by tests/supervisor_test.ts and tests/health_test.ts: run the CLI as real
// processes (a supervisor and its worker processes), read their JSON log lines as they
// come, and make sure none is left behind.
import { passthroughEnv, waitFor } from "./_helpers.ts";

/** How long to wait for something that needs processes to start (generous: CI is loaded). */
export const SLOW = 60_000;

export const ROOT = new URL("..", import.meta.url).pathname;
export const CLI = new URL("../cli.ts", import.meta.url).pathname;
export const MOD = new URL("../mod.ts", import.meta.url).href;
/** What a worker needs. */
export const WORKER_PERMISSIONS = [
  "--allow-net",
  "--allow-env",
  "--allow-sys=hostname",
  "--allow-read",
];

/** The permissions of a supervisor writing heartbeat files into `dir`. */
export function supervisorPermissions(dir: string): string[] {
  return [...WORKER_PERMISSIONS, `--allow-write=${dir}`, `--allow-run=${Deno.execPath()}`];
}

/** A log record (`--log-format json`). */
// deno-lint-ignore no-explicit-any
export type LogRecord = Record<string, any>;

/** A running CLI process whose output is collected as it comes. */
export interface CliProcess {
  child: Deno.ChildProcess;
  stderr(): string;
  /** The JSON log records on stderr so far (other lines skipped). */
  records(): LogRecord[];
  /** The records of one event so far. */
  events(event: string): LogRecord[];
  /** Wait until `count` records of `event` (matching `match`) have been logged. */
  waitForEvent(
    event: string,
    match?: (record: LogRecord) => boolean,
    count?: number,
    timeoutMs?: number,
  ): Promise<LogRecord[]>;
  /** Wait for the exit; resolves once the output is complete too (every writer exited). */
  done(): Promise<{ code: number; stdout: string; stderr: string }>;
  /** SIGKILL it and every worker process it logged, if still running; wait for the end. */
  cleanup(): Promise<void>;
}

const running = new Set<CliProcess>();

/** Options of {@linkcode spawnCli} and {@linkcode spawnDeno}. */
export interface SpawnOptions {
  /** Permission flags (spawnCli: default WORKER_PERMISSIONS). */
  permissions?: string[];
  /** Working directory. Default the repository root. */
  cwd?: string;
  /** Its own process group. */
  detached?: boolean;
}

/** Spawn `deno run PERMISSIONS cli.ts ARGS` with a clean environment. */
export function spawnCli(
  args: string[],
  env: Record<string, string>,
  options: SpawnOptions = {},
): CliProcess {
  return spawnDeno(["run", CLI, ...args], env, {
    ...options,
    permissions: options.permissions ?? WORKER_PERMISSIONS,
  });
}

/**
 * Spawn `deno SUBCOMMAND PERMISSIONS REST` (e.g. `["task", "demo"]`) with a clean
 * environment, collecting its output as it comes.
 */
export function spawnDeno(
  args: string[],
  env: Record<string, string>,
  options: SpawnOptions = {},
): CliProcess {
  const child = new Deno.Command(Deno.execPath(), {
    args: [...args.slice(0, 1), ...(options.permissions ?? []), ...args.slice(1)],
    cwd: options.cwd ?? ROOT,
    env: { NO_COLOR: "1", ...passthroughEnv(), ...env },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    detached: options.detached ?? false,
  }).spawn();
  let stdout = "", stderr = "";
  const read = async (stream: ReadableStream<Uint8Array>, add: (text: string) => void) => {
    for await (const text of stream.pipeThrough(new TextDecoderStream())) add(text);
  };
  const reading = Promise.all([
    read(child.stdout, (t) => stdout += t),
    read(child.stderr, (t) => stderr += t),
  ]);
  const records = () =>
    stderr.split("\n").filter((line) => line.startsWith("{")).flatMap((line) => {
      try {
        return [JSON.parse(line) as LogRecord];
      } catch {
        return []; // a line still being written
      }
    });
  const events = (event: string) => records().filter((r) => r.event === event);
  const process: CliProcess = {
    child,
    stderr: () => stderr,
    records,
    events,
    waitForEvent: (event, match = () => true, count = 1, timeoutMs = SLOW) =>
      waitFor(
        () => {
          const found = events(event).filter(match);
          return found.length >= count ? found : null;
        },
        `${count} ${event} event(s) in:\n${stderr}`,
        timeoutMs,
      ) as Promise<LogRecord[]>,
    done: async () => {
      const { code } = await child.status;
      await reading;
      running.delete(process);
      return { code, stdout, stderr };
    },
    cleanup: async () => {
      const pids = records()
        .filter((r) =>
          r.event === "worker_process_started" || r.event === "worker_process_restarted"
        )
        .map((r) => Number(r.pid));
      for (const pid of [child.pid, ...pids]) await killIfOurs(pid);
      await process.done();
    },
  };
  running.add(process);
  return process;
}

/** SIGKILL `pid` if it is still a running `cli.ts` process (not a zombie, not reused). */
export async function killIfOurs(pid: number): Promise<void> {
  if (!(await isAlive(pid))) return;
  const cmdline = await Deno.readTextFile(`/proc/${pid}/cmdline`).catch(() => "");
  if (!cmdline.includes(CLI)) return;
  try {
    Deno.kill(pid, "SIGKILL");
  } catch {
    // gone meanwhile
  }
}

/** Whether `pid` is a live process (a zombie is not). */
export async function isAlive(pid: number): Promise<boolean> {
  try {
    const stat = await Deno.readTextFile(`/proc/${pid}/stat`);
    // "pid (comm) S ...": the state follows the last ")".
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** `promise`, or a rejection naming `what` after `ms`. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Run `fn`, then clean up every process spawned meanwhile (even when it throws). */
export async function withProcesses(fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } finally {
    for (const process of [...running]) await process.cleanup();
  }
}

/** Run `fn` with files written into a fresh temporary directory. */
export async function withDir(
  files: Record<string, string>,
  fn: (dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "akadze-supervisor-" });
  try {
    for (const [name, text] of Object.entries(files)) {
      await Deno.writeTextFile(`${dir}/${name}`, text);
    }
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The test app: `hello`, `sleepy` (until aborted), `sleep_first` (long only on its first run). */
export const APP_MODULE = `
import { Akadze } from ${JSON.stringify(MOD)};

export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

app.task("hello", ({ name }) => "hello " + name);

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve("slept"), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve("aborted");
    });
  });
}

// Runs until its signal aborts (shutdown, cancel) or a minute passes.
app.task("sleepy", (_args, ctx) => sleep(60_000, ctx.signal));

// Its first run sleeps (until aborted); a run after a rescue returns at once.
app.task("sleep_first", async (_args, ctx) => {
  if (ctx.job.runCount === 1) await sleep(60_000, ctx.signal);
  return "run " + ctx.job.runCount;
});
`;
