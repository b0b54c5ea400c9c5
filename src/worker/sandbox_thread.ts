/**
 * The inside of a sandbox thread (a Web Worker): runs one job at a time with the handler
 * the sandbox module exports, and reports progress, the result or the error to the main
 * worker (sandbox_pool.ts). The thread's entry imports this module first, then the
 * handler's module, then calls {@linkcode serve}. The entry is the same for every task of
 * a module (loaded, and type-checked under `deno test`, once).
 *
 * @module
 */
import { type JobContext, runWithContext } from "../context.ts";
import { AkadzeError, controlKind } from "../errors.ts";
import type { JobInfo } from "../job.ts";
import { progressText } from "../rules.ts";
import { type DependencyOutcome, resultOf } from "../dependencies.ts";

/** A job to run, from the main worker. */
export interface RunMessage {
  /** The message kind. */
  type: "run";
  /** The name of the handler's export. */
  export: string;
  /** The validated arguments. */
  args: unknown;
  /** The job. */
  job: JobInfo;
  /** The deadline (epoch ms), or null. */
  deadline: number | null;
}

/**
 * The outcomes of the running job's dependencies, read by the worker while the run starts
 * (or why they could not be read).
 */
export interface DependenciesMessage {
  /** The message kind. */
  type: "dependencies";
  /** The outcomes by step name. */
  value?: Record<string, DependencyOutcome>;
  /** Why they could not be read. */
  error?: SentError;
}

/** Abort the running job's signal, from the main worker. */
export interface AbortMessage {
  /** The message kind. */
  type: "abort";
  /** Why. */
  reason: SentError;
}

/** An error as it crosses from the thread to the worker. */
export interface SentError {
  /** Its name. */
  name: string;
  /** Its message. */
  message: string;
  /** Its stack, if any. */
  stack?: string;
  /** The control exception it is (Retry, Snooze, Fail, Cancel), if any. */
  control?: string;
  /** A Retry's or Snooze's delay. */
  delay?: unknown;
}

/** What the thread tells the main worker. */
export type ThreadMessage =
  | { type: "progress"; value: unknown }
  | { type: "done"; ok: true; value: unknown }
  | { type: "done"; ok: false; error: SentError }
  | { type: "exit"; code: number; close?: boolean };

/** An error (or any thrown value) in a form that crosses threads. */
export function sendableError(error: unknown): SentError {
  try {
    if (typeof error === "object" && error !== null) {
      const e = error as { name?: unknown; message?: unknown; stack?: unknown; delay?: unknown };
      const sent: SentError = {
        name: typeof e.name === "string" && e.name ? e.name : "Error",
        message: typeof e.message === "string" ? e.message : String(e.message ?? ""),
      };
      if (typeof e.stack === "string") sent.stack = e.stack;
      const control = controlKind(error);
      if (control) {
        sent.control = control;
        sent.delay = typeof e.delay === "number"
          ? e.delay
          : e.delay === undefined
          ? undefined
          : NaN;
      }
      return sent;
    }
    return { name: "Error", message: `non-Error thrown: ${String(error)}` };
  } catch {
    return { name: "Error", message: "non-Error thrown: a value that cannot be read" };
  }
}

const scope = globalThis as unknown as SandboxPort & { close(): void };

// Deno.exit (or process.exit, or close()) in a Web Worker stops the thread without a word to
// its parent: say it first, with the exit code.
if ("WorkerGlobalScope" in globalThis) {
  let told = false;
  const tell = (code: number, close?: boolean) => {
    if (told) return;
    told = true;
    scope.postMessage({ type: "exit", code, ...(close ? { close } : {}) });
    // A thread that ends at once may take its last message with it: wait (without using
    // the CPU) for the worker to terminate the thread on that message, at most a second.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1_000);
  };
  const exit = Deno.exit;
  Deno.exit = ((code?: number) => {
    tell(code ?? Deno.exitCode);
    return exit(code);
  }) as typeof Deno.exit;
  // process.exit of node:process does not go through Deno.exit, but unloads the thread.
  addEventListener("unload", () => tell(Deno.exitCode));
  const close = scope.close;
  scope.close = () => {
    tell(Deno.exitCode, true);
    close.call(globalThis);
  };
}

/**
 * How a sandbox and the worker exchange messages: a thread's own scope, or a process's
 * standard input and output (sandbox_process.ts).
 */
export interface SandboxPort {
  /** Send a message to the worker. */
  postMessage(message: ThreadMessage): void;
  /** Set by {@linkcode serve}: called with each message from the worker. */
  onmessage:
    | ((event: { data: RunMessage | AbortMessage | DependenciesMessage }) => void)
    | null;
}

/**
 * Serve runs with the exports of `module` as their handlers (each run names its export),
 * over `port` (default: the thread's scope).
 *
 * @example
 * ```ts ignore
 * import * as handlers from "./render.ts";
 * serve(handlers);
 * ```
 */
export function serve(module: Record<string, unknown>, port: SandboxPort = scope): void {
  let controller: AbortController | null = null;
  // The running job's dependencies, settled by the worker's "dependencies" message.
  let dependencies = Promise.withResolvers<Record<string, DependencyOutcome>>();
  port.onmessage = (event) => {
    const message = event.data;
    if (message.type === "abort") {
      controller?.abort(Object.assign(new Error(message.reason.message), {
        name: message.reason.name,
      }));
      return;
    }
    if (message.type === "dependencies") {
      if (message.error) {
        dependencies.reject(Object.assign(new Error(message.error.message), {
          name: message.error.name,
        }));
      } else dependencies.resolve(message.value!);
      return;
    }
    const run = new AbortController();
    controller = run;
    const gotDependencies = Promise.withResolvers<Record<string, DependencyOutcome>>();
    // Read only when asked for: a rejection nobody awaits is not an error of the run.
    gotDependencies.promise.catch(() => {});
    dependencies = gotDependencies;
    const deadline = message.deadline === null ? null : new Date(message.deadline);
    const ctx: JobContext = {
      job: message.job,
      signal: run.signal,
      deadline,
      remaining: () => deadline === null ? null : Math.max(0, deadline.getTime() - Date.now()),
      progress(value: unknown) {
        progressText(value); // throws here, in the handler, for a value that cannot be stored
        port.postMessage({ type: "progress", value });
      },
      completeTx() {
        throw new AkadzeError(
          "completeTx is not available in a sandboxed task: the transaction would live on the " +
            "worker's own connection, which the sandbox cannot use; return the result instead",
        );
      },
      // Read by the worker before the run started (they are terminal, or continued after).
      dependencies: () => gotDependencies.promise,
      resultOf: (task, step) => gotDependencies.promise.then((deps) => resultOf(deps, task, step)),
      waitForChildren() {
        throw new AkadzeError(
          "waitForChildren is not available in a sandboxed task: the children are inserted in " +
            "the transaction of the job's outcome, on the worker's own connection, which the " +
            "sandbox cannot use; add them from a task that runs in the worker",
        );
      },
    };
    const finish = (reply: ThreadMessage) => {
      if (controller === run) controller = null;
      try {
        port.postMessage(reply);
      } catch (error) {
        port.postMessage({
          type: "done",
          ok: false,
          error: {
            name: "ResultNotStorable",
            message: `the result cannot be sent from the sandbox: ${sendableError(error).message}`,
          },
        });
      }
    };
    new Promise((resolve) => {
      const name = message.export;
      const handler = module[name];
      if (typeof handler !== "function") {
        const exports = Object.keys(module).join(", ") || "none";
        throw new AkadzeError(
          `the sandbox module has no function export "${name}" (its exports: ${exports})`,
        );
      }
      resolve(runWithContext(ctx, () => handler(message.args, ctx)));
    }).then(
      (value) => finish({ type: "done", ok: true, value: value === undefined ? null : value }),
      (error) => finish({ type: "done", ok: false, error: sendableError(error) }),
    );
  };
}
