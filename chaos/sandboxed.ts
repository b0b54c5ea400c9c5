// The handlers of the chaos soak's sandboxed tasks (chaos/tasks.ts): each runs in a sandbox
// of the worker, a thread or a process, named by its task's `sandbox.export`. They have no
// database connection; the worker records their start in a `beforeRun` hook.
import type { SandboxHandler } from "../mod.ts";

/**
 * Compute without ever yielding for `ms` (longer than the soak's heartbeat TTL: on the
 * worker's loop this would cost the lease), then say how long it spun and which run it was.
 */
export const spin: SandboxHandler<{ ms: number }, { runCount: number; spunMs: number }> = (
  { ms },
  ctx,
) => {
  const from = performance.now();
  let turns = 0;
  while (performance.now() - from < ms) turns++;
  return { runCount: ctx.job.runCount, spunMs: Math.round(performance.now() - from) };
};

/**
 * Crash the sandbox process after `ms` (so that the worker's other jobs run beside it): with
 * `Deno.exit(3)`, or with `oom` by filling the heap past the process's `maxHeapMb`. (A
 * boolean: a string argument such as "exit" would be masked in the stored error's words,
 * as every argument value of four characters or more is.)
 */
export const crash: SandboxHandler<{ oom: boolean; ms: number }, never> = async (
  { oom, ms },
) => {
  await new Promise((resolve) => setTimeout(resolve, ms));
  if (!oom) Deno.exit(3);
  const kept: number[][] = [];
  for (;;) kept.push(new Array(100_000).fill(kept.length));
};
