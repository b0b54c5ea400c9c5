// The benchmark's child processes: each runs in its own process group (spawned with
// `detached: true`), killed whole when it is done, on a timeout, or on Ctrl-C / SIGTERM,
// so that nothing outlives the run.

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
