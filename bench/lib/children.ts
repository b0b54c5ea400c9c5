// The benchmark's child processes: each runs in its own process group (spawned with
// `detached: true`), killed whole when it is done, on a timeout, or on Ctrl-C / SIGTERM,
// so that nothing outlives the run.

import { LineReader } from "./lines.ts";

const running = new Set<Deno.ChildProcess>();
let interrupted = false;
let listening = false;

/** Kill a child's whole process group (the child itself when it has none). */
export function killGroup(child: Deno.ChildProcess): void {
  try {
    Deno.kill(-child.pid, "SIGKILL");
  } catch {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
}

/** Whether the run was interrupted (SIGINT or SIGTERM): stop what is running and exit. */
export function wasInterrupted(): boolean {
  return interrupted;
}

/**
 * Keep track of `child` until {@linkcode release}: an interrupt kills its process group.
 * The first call installs the signal listeners.
 */
export function track(child: Deno.ChildProcess): void {
  if (!listening) {
    listening = true;
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      Deno.addSignalListener(signal, () => {
        interrupted = true;
        for (const c of running) killGroup(c);
      });
    }
  }
  running.add(child);
}

/** Kill `child`'s process group (should anything of it linger) and stop tracking it. */
export function release(child: Deno.ChildProcess): void {
  killGroup(child);
  running.delete(child);
}

/**
 * Run a driver in a process group of its own (its stderr passed through, its other stdout
 * lines prefixed with `name`); resolves to the object of its `BENCH_RESULT {json}` line.
 * Fails when it times out, exits non-zero or prints no result; kills the group afterwards.
 */
export async function runDriver<T>(
  name: string,
  command: string,
  options: { args: string[]; env: Record<string, string>; cwd: string; timeoutMs: number },
): Promise<T> {
  const child = new Deno.Command(command, {
    args: options.args,
    env: options.env,
    cwd: options.cwd,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
    detached: true,
  }).spawn();
  track(child);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    killGroup(child);
  }, options.timeoutMs);
  let result: T | null = null;
  try {
    const lines = new LineReader(child.stdout);
    for (let line = await lines.next(); line !== null; line = await lines.next()) {
      if (line.startsWith("BENCH_RESULT ")) result = JSON.parse(line.slice(13));
      else if (line.trim()) console.error(`  [${name}] ${line}`);
    }
    const status = await child.status;
    if (wasInterrupted()) throw new Error("interrupted");
    if (timedOut) throw new Error(`${name} did not finish within ${options.timeoutMs / 1000} s`);
    if (!status.success) throw new Error(`${name} exited with code ${status.code}`);
    if (!result) throw new Error(`${name} printed no result`);
    return result;
  } finally {
    clearTimeout(timer);
    release(child); // its worker process too, should it linger
  }
}
