/**
 * The names of the liveness files of `--heartbeat-file PATH`, shared by the worker, the
 * supervisor and `akadze health`: one process touches `PATH`; with `--processes N` the
 * supervisor touches `PATH.supervisor` and the worker of slot K touches `PATH.K`.
 *
 * @module
 */

/** The file the supervisor of `--processes N` touches every second. */
export function supervisorHeartbeatFile(path: string): string {
  return `${path}.supervisor`;
}

/** The file the worker process of slot `slot` touches on every loop pass. */
export function slotHeartbeatFile(path: string, slot: number): string {
  return `${path}.${slot}`;
}

/**
 * Every file a deployment of `processes` worker processes keeps fresh: `[PATH]` for one,
 * else `PATH.supervisor` and `PATH.0` … `PATH.N-1`.
 */
export function heartbeatFiles(path: string, processes: number): string[] {
  if (processes <= 1) return [path];
  const files = [supervisorHeartbeatFile(path)];
  for (let slot = 0; slot < processes; slot++) files.push(slotHeartbeatFile(path, slot));
  return files;
}

/** Write the current time (ms since the epoch) to `path`, which updates its mtime. */
export async function touchHeartbeatFile(path: string): Promise<void> {
  await Deno.writeTextFile(path, `${Date.now()}\n`);
}
