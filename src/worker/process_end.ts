/**
 * A worker process that ends while its jobs run: how it ended, in words for the stored
 * error, and the guard that lets the worker settle its jobs when a handler calls
 * `Deno.exit` (or `process.exit`, which goes through it).
 *
 * The accounting (docs/worker.md, "When a handler ends its process"): a handler that calls
 * `Deno.exit(n)` is charged an attempt (`ProcessExited`) and the worker's other jobs go back
 * to the queue without spending theirs, before the process exits with `n`. A process that
 * dies where the worker cannot tell which job did it (out of memory, a signal) leaves its
 * jobs running; the next process of its slot (or under its fixed id) settles them as soon as
 * it starts: each is charged an attempt, with an error saying how the process ended.
 *
 * @module
 */
import { activeContext } from "../context.ts";

/** How a worker process ended, as its parent saw it. */
export interface ProcessEnd {
  /** The exit code (128 + the signal's number when a signal ended it). */
  code: number;
  /** The signal that ended it, if one did. */
  signal?: string | null;
}

/**
 * How a process ended, in words: "exited with code 3", "ran out of memory (…)", "was
 * killed by SIGKILL (…)". Deno ends a process whose JavaScript heap is full with V8's fatal
 * error: SIGTRAP (exit code 133).
 */
export function describeProcessEnd(end: ProcessEnd): string {
  const { code, signal } = end;
  if (signal === "SIGTRAP" || (!signal && code === 133)) {
    return "ran out of memory (V8's fatal error on a full heap: SIGTRAP, exit code 133)";
  }
  if (signal === "SIGABRT" || (!signal && code === 134)) {
    return "aborted on a fatal runtime error (SIGABRT, exit code 134)";
  }
  if (signal === "SIGKILL") {
    return `was killed by SIGKILL (exit code ${code}: kill -9, or the system's ` +
      "out-of-memory killer)";
  }
  if (signal) return `was killed by ${signal} (exit code ${code})`;
  return `exited with code ${code}`;
}

/** Parse the hidden `--previous-exit CODE[:SIGNAL]` of a restarted worker process. */
export function parseProcessEnd(text: string): ProcessEnd | null {
  const match = /^(\d{1,3})(?::(SIG[A-Z0-9]+))?$/.exec(text);
  if (!match) return null;
  return { code: Number(match[1]), signal: match[2] ?? null };
}

/** The hidden `--previous-exit` text of an exit status (see {@linkcode parseProcessEnd}). */
export function formatProcessEnd(end: ProcessEnd): string {
  return end.signal ? `${end.code}:${end.signal}` : String(end.code);
}

/**
 * The failure of a run whose handler called `Deno.exit(code)`: thrown out of that call
 * (made there, so its stack shows where) and stored as the run's error.
 */
export class ProcessExited extends Error {
  /** The exit code the handler asked for. */
  readonly code: number;

  /** @param code The exit code the handler asked for. */
  constructor(code: number) {
    super(
      `the handler called Deno.exit(${code}), which ends the worker process: this run's ` +
        "attempt is spent, the other jobs of the process go back to the queue without " +
        `spending theirs, then it exits with code ${code}`,
    );
    this.name = "ProcessExited";
    this.code = code;
  }
}

/**
 * Called by the guard when a handler calls `Deno.exit` during the run of job `jobId`;
 * returns whether this worker runs that job (it then settles its jobs and exits itself).
 */
export type ExitClaim = (jobId: string, error: ProcessExited) => boolean;

const claims = new Set<ExitClaim>();
let realExit: typeof Deno.exit | null = null;

/**
 * While a worker runs: route a handler's `Deno.exit` to `claim` (see {@linkcode ExitClaim})
 * instead of ending the process at once. A call outside any run, or of a job no running
 * worker claims, exits as usual. Returns the function that removes the claim (the real
 * `Deno.exit` comes back with the last one).
 */
export function guardProcessExit(claim: ExitClaim): () => void {
  if (realExit === null) {
    const exit = realExit = Deno.exit;
    Deno.exit = ((code?: number) => {
      const job = activeContext()?.job;
      const status = code ?? Deno.exitCode;
      if (job) {
        const error = new ProcessExited(status);
        // The handler unwinds; the worker exits once the jobs are written.
        for (const claim of claims) if (claim(job.id, error)) throw error;
      }
      return exit(status);
    }) as typeof Deno.exit;
  }
  claims.add(claim);
  return () => {
    claims.delete(claim);
    if (claims.size === 0 && realExit !== null) {
      Deno.exit = realExit;
      realExit = null;
    }
  };
}

/** End the process with `code` now (the real `Deno.exit`, even while guarded). */
export function exitProcess(code: number): never {
  return (realExit ?? Deno.exit)(code);
}
