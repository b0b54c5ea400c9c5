/**
 * The threads of one sandboxed task in one worker: Web Workers that each run one job at a
 * time (sandbox_thread.ts). A run that is aborted (timeout, cancel, shutdown) gets its
 * signal aborted in the thread, then the thread is terminated and replaced if the run has
 * not ended within {@linkcode SANDBOX_ABORT_GRACE}; a thread that crashes (an uncaught
 * error, `Deno.exit`) fails its run with a {@linkcode SandboxCrashed} error and is replaced.
 *
 * @module
 */
import { Cancel, Fail, Retry, Snooze } from "../errors.ts";
import type { JobInfo } from "../job.ts";
import type { SandboxSpec } from "../sandbox.ts";
import type { DependencyOutcome } from "../dependencies.ts";
import {
  type DependenciesMessage,
  type RunMessage,
  sendableError,
  type SentError,
  type ThreadMessage,
} from "./sandbox_thread.ts";

/** Milliseconds an aborted run's thread may take to end before it is terminated. */
export const SANDBOX_ABORT_GRACE = 1_000;

const THREAD_MODULE = import.meta.resolve("./sandbox_thread.ts");

/** One job for a thread. */
export interface SandboxRequest {
  /** The validated arguments. */
  args: unknown;
  /** The job. */
  job: JobInfo;
  /** The run's deadline, or null. */
  deadline: Date | null;
  /**
   * The outcomes of its dependencies (`ctx.dependencies()` in the thread), being read: sent
   * to the thread when they arrive, so the run does not wait for them to start.
   */
  dependencies: Promise<Record<string, DependencyOutcome>>;
}

/** How a run is followed. */
export interface SandboxRunOptions {
  /** Aborted to stop the run (its thread is terminated after the grace). */
  signal: AbortSignal;
  /** A progress value the handler reported. */
  onProgress(value: unknown): void;
}

/** The name of the error a run ends with when its thread crashed. */
export const SANDBOX_CRASHED = "SandboxCrashed";

/** What a thread's current run is told. */
interface Listener {
  message(message: ThreadMessage): void;
  crash(error: Error): void;
}

/** One Web Worker. */
class Thread {
  readonly worker: Worker;
  listener: Listener | null = null;
  dead = false;

  constructor(entry: string, spec: SandboxSpec, name: string, onDeath: (t: Thread) => void) {
    const options: WorkerOptions = { type: "module", name };
    // Only a restriction needs Deno's worker options ("inherit" is the default without them).
    if (spec.permissions !== "inherit") options.deno = { permissions: spec.permissions };
    this.worker = new Worker(entry, options);
    const die = (error: Error) => {
      if (this.dead) return;
      this.dead = true;
      this.worker.terminate();
      const listener = this.listener;
      this.listener = null;
      onDeath(this);
      listener?.crash(error);
    };
    this.worker.onmessage = (event: MessageEvent<ThreadMessage>) => {
      const message = event.data;
      if (message.type === "exit") {
        die(crashed(
          message.close
            ? "the handler closed its thread (close())"
            : `the handler exited its thread with code ${message.code} (Deno.exit(${message.code}))`,
        ));
      } else this.listener?.message(message);
    };
    this.worker.onerror = (event) => {
      // Handled here: unhandled, it would end the whole worker process.
      event.preventDefault();
      die(crashed(`the handler's thread stopped on an error: ${event.message}`));
    };
    this.worker.onmessageerror = () => {
      die(crashed("a message from the handler's thread could not be read"));
    };
  }

  post(message: RunMessage | DependenciesMessage | { type: "abort"; reason: SentError }): void {
    this.worker.postMessage(message);
  }

  terminate(): void {
    this.dead = true;
    this.listener = null;
    this.worker.terminate();
  }
}

/** The threads of one sandboxed task. */
export class SandboxPool {
  #spec: SandboxSpec;
  #task: string;
  #entry: string;
  #idle: Thread[] = [];
  #all = new Set<Thread>();
  #count = 0;
  #waiting: { take: (thread: Thread) => void }[] = [];
  #closed = false;

  /** A pool for `task`; threads start on demand. */
  constructor(task: string, spec: SandboxSpec) {
    this.#spec = spec;
    this.#task = task;
    this.#entry = "data:application/javascript," + encodeURIComponent(
      `import { serve } from ${JSON.stringify(THREAD_MODULE)};\n` +
        `import * as handlers from ${JSON.stringify(spec.module)};\n` +
        "serve(handlers);\n",
    );
  }

  /** How many threads are alive (idle or running). */
  get threads(): number {
    return this.#count;
  }

  /** Run one job in a thread: resolves to the handler's value, rejects with its error. */
  async run(request: SandboxRequest, options: SandboxRunOptions): Promise<unknown> {
    const { signal } = options;
    signal.throwIfAborted();
    const thread = await this.#acquire(signal);
    return await new Promise((resolve, reject) => {
      let grace: ReturnType<typeof setTimeout> | undefined;
      const onAbort = () => {
        thread.post({ type: "abort", reason: sendableError(signal.reason) });
        grace = setTimeout(() => {
          end(false);
          reject(signal.reason);
        }, SANDBOX_ABORT_GRACE);
      };
      const end = (healthy: boolean) => {
        signal.removeEventListener("abort", onAbort);
        if (grace !== undefined) clearTimeout(grace);
        thread.listener = null;
        if (healthy) this.#release(thread);
        else if (!thread.dead) {
          thread.terminate();
          this.#died(thread);
        }
      };
      thread.listener = {
        message: (message) => {
          if (message.type === "progress") {
            if (signal.aborted) return;
            try {
              options.onProgress(message.value);
            } catch {
              // The thread checked the value; a write problem is the reporter's to log.
            }
          } else if (message.type === "done") {
            end(true);
            if (message.ok) resolve(message.value);
            else reject(revive(message.error));
          }
        },
        crash: (error) => {
          end(false);
          reject(error);
        },
      };
      signal.addEventListener("abort", onAbort, { once: true });
      const { args, job, deadline, dependencies } = request;
      try {
        thread.post({
          type: "run",
          export: this.#spec.export,
          args,
          job,
          deadline: deadline?.getTime() ?? null,
        });
        const listener = thread.listener;
        const send = (message: DependenciesMessage) => {
          // Only to the thread still running this job.
          if (thread.listener === listener && !thread.dead) thread.post(message);
        };
        dependencies.then(
          (value) => send({ type: "dependencies", value }),
          (error) => send({ type: "dependencies", error: sendableError(error) }),
        );
      } catch (error) {
        end(true);
        reject(error);
      }
    });
  }

  /** Terminate every thread (the worker has settled its runs); a run still going rejects. */
  close(): void {
    this.#closed = true;
    for (const thread of this.#all) {
      const listener = thread.listener;
      thread.terminate();
      listener?.crash(Object.assign(new Error("the worker stopped"), { name: "AbortError" }));
    }
    this.#all.clear();
    this.#idle = [];
    this.#count = 0;
  }

  #acquire(signal: AbortSignal): Promise<Thread> {
    const idle = this.#idle.pop();
    if (idle) return Promise.resolve(idle);
    if (this.#spec.pool === null || this.#count < this.#spec.pool) {
      return Promise.resolve(this.#spawn());
    }
    return new Promise((resolve, reject) => {
      const waiter = {
        take: (thread: Thread) => {
          signal.removeEventListener("abort", onAbort);
          resolve(thread);
        },
      };
      const onAbort = () => {
        this.#waiting.splice(this.#waiting.indexOf(waiter), 1);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.#waiting.push(waiter);
    });
  }

  #spawn(): Thread {
    this.#count++;
    const name = `akadze sandbox ${this.#task}`;
    const thread = new Thread(this.#entry, this.#spec, name, (thread) => {
      const at = this.#idle.indexOf(thread);
      if (at >= 0) this.#idle.splice(at, 1);
      this.#died(thread);
    });
    this.#all.add(thread);
    return thread;
  }

  #release(thread: Thread): void {
    if (thread.dead) return;
    const waiter = this.#waiting.shift();
    if (waiter) waiter.take(thread);
    else if (this.#closed) thread.terminate();
    else this.#idle.push(thread);
  }

  /** A thread is gone: a run waiting for one gets a new one. */
  #died(thread: Thread): void {
    if (!this.#all.delete(thread)) return;
    this.#count--;
    const waiter = this.#waiting.shift();
    if (waiter && !this.#closed) waiter.take(this.#spawn());
  }
}

function crashed(what: string): Error {
  return Object.assign(
    new Error(`${what}; the run failed and its sandbox thread was replaced`),
    { name: SANDBOX_CRASHED },
  );
}

/** The thread's error as an Error of the main worker (control exceptions keep their kind). */
function revive(sent: SentError): Error {
  let error: Error;
  if (sent.control === "Retry") {
    error = new Retry({ delay: sent.delay as number | undefined });
  } else if (sent.control === "Snooze") error = new Snooze(sent.delay as number);
  else if (sent.control === "Fail") error = new Fail(sent.message);
  else if (sent.control === "Cancel") error = new Cancel(sent.message);
  else error = new Error(sent.message);
  error.name = sent.name;
  error.message = sent.message;
  if (sent.stack !== undefined) error.stack = sent.stack;
  return error;
}
