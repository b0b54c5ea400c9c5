/**
 * The sandboxes of one sandboxed task in one worker: Web Workers (sandbox_thread.ts) or
 * `deno run` subprocesses (sandbox_process.ts), each running one job at a time. A run that
 * is aborted (timeout, cancel, shutdown) gets its signal aborted in the sandbox, then the
 * sandbox is terminated and replaced if the run has not ended within
 * {@linkcode SANDBOX_ABORT_GRACE}; a sandbox that crashes (an uncaught error, `Deno.exit`,
 * a process that runs out of memory or is killed) fails its run with a
 * {@linkcode SANDBOX_CRASHED} error and is replaced.
 *
 * @module
 */
import { Cancel, Fail, Retry, Snooze } from "../errors.ts";
import type { JobInfo } from "../job.ts";
import type { SandboxSpec } from "../sandbox.ts";
import type { DependencyOutcome } from "../dependencies.ts";
import {
  type AbortMessage,
  type DependenciesMessage,
  type RunMessage,
  sendableError,
  type SentError,
  type ThreadMessage,
} from "./sandbox_thread.ts";
import { encodeMessage, readLines, splitOutputLine, writeLineSync } from "./sandbox_process.ts";

/** Milliseconds an aborted run's thread may take to end before it is terminated. */
export const SANDBOX_ABORT_GRACE = 1_000;

const THREAD_MODULE = import.meta.resolve("./sandbox_thread.ts");
const PROCESS_MODULE = import.meta.resolve("./sandbox_process.ts");

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

/** One sandbox: a thread or a process, running one job at a time. */
interface Sandbox {
  /** The current run's listener, or null when idle. */
  listener: Listener | null;
  /** Whether it crashed or was terminated. */
  readonly dead: boolean;
  /** Send a message to the sandbox. */
  post(message: RunMessage | DependenciesMessage | AbortMessage): void;
  /** Stop it now, whatever it does. */
  terminate(): void;
}

/** One Web Worker. */
class Thread implements Sandbox {
  readonly worker: Worker;
  listener: Listener | null = null;
  dead = false;

  constructor(entry: string, spec: SandboxSpec, name: string, onDeath: (t: Sandbox) => void) {
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
          "thread",
        ));
      } else this.listener?.message(message);
    };
    this.worker.onerror = (event) => {
      // Handled here: unhandled, it would end the whole worker process.
      event.preventDefault();
      die(crashed(`the handler's thread stopped on an error: ${event.message}`, "thread"));
    };
    this.worker.onmessageerror = () => {
      die(crashed("a message from the handler's thread could not be read", "thread"));
    };
  }

  post(message: RunMessage | DependenciesMessage | AbortMessage): void {
    this.worker.postMessage(message);
  }

  terminate(): void {
    this.dead = true;
    this.listener = null;
    this.worker.terminate();
  }
}

/** One `deno run` subprocess, messages as lines of its standard input and output. */
class Subprocess implements Sandbox {
  readonly #child: Deno.ChildProcess;
  #input: WritableStreamDefaultWriter<Uint8Array>;
  #writing: Promise<void> = Promise.resolve();
  listener: Listener | null = null;
  dead = false;

  constructor(args: string[], spec: SandboxSpec, onDeath: (t: Sandbox) => void) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#input = this.#child.stdin.getWriter();
    const stdout = readLines(this.#child.stdout, (line) => {
      const { text, message } = splitOutputLine(line);
      if (message === undefined) passOn(Deno.stdout, line);
      else {
        if (text !== "") passOn(Deno.stdout, text);
        this.listener?.message(message as ThreadMessage);
      }
    });
    const errors = new ProcessStderr((line) => passOn(Deno.stderr, line));
    const stderr = readLines(this.#child.stderr, (line) => errors.line(line))
      .then(() => errors.end());
    Promise.all([this.#child.status, stdout, stderr]).then(([status]) => {
      const outOfMemory = errors.outOfMemory;
      if (this.dead) return;
      this.dead = true;
      const listener = this.listener;
      this.listener = null;
      onDeath(this);
      const how = outOfMemory
        ? `ran out of memory${spec.maxHeapMb === null ? "" : ` (maxHeapMb ${spec.maxHeapMb})`}`
        : status.signal
        ? `was killed by ${status.signal}`
        : `exited with code ${status.code}`;
      listener?.crash(crashed(`the handler's process ${how}`, "process"));
    });
  }

  post(message: RunMessage | DependenciesMessage | AbortMessage): void {
    const bytes = new TextEncoder().encode(encodeMessage(message) + "\n");
    // In order; a process that is gone has its run ended by its exit, not by this write.
    this.#writing = this.#writing.then(() => this.#input.write(bytes)).catch(() => {});
  }

  terminate(): void {
    this.dead = true;
    this.listener = null;
    try {
      this.#child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
}

/**
 * The standard error of a sandbox process, line by line: passed on to the worker's own,
 * except V8's report of running out of memory (the last garbage collections, the C stack
 * trace), which says no more than the run's error ("ran out of memory") and would break a
 * worker log of JSON lines. Blank lines and lone `#` are held until the next line shows
 * whether the report starts there.
 *
 * @example
 * ```ts ignore
 * const errors = new ProcessStderr((line) => console.error(line));
 * errors.line("");
 * errors.line("<--- Last few GCs --->"); // the report: nothing is passed on from here
 * errors.end();
 * errors.outOfMemory; // true
 * ```
 */
export class ProcessStderr {
  /** Whether the process said it ran out of memory. */
  outOfMemory = false;
  #passOn: (line: string) => void;
  #held: string[] = [];
  #report = false;

  /** Lines that are not V8's report go to `passOn`. */
  constructor(passOn: (line: string) => void) {
    this.#passOn = passOn;
  }

  /** One line of the process's standard error (without its newline). */
  line(text: string): void {
    if (/out of memory/i.test(text)) this.outOfMemory = true;
    if (this.#report) return;
    if (text === "<--- Last few GCs --->" || /^# Fatal JavaScript out of memory/.test(text)) {
      // V8 is ending the process: the rest of its standard error is the report.
      this.#report = true;
      this.#held = [];
      return;
    }
    if (text === "" || text === "#") {
      this.#held.push(text);
      return;
    }
    this.#flush();
    this.#passOn(text);
  }

  /** The end of the stream: lines held are passed on (no report followed them). */
  end(): void {
    if (!this.#report) this.#flush();
  }

  #flush(): void {
    for (const held of this.#held) this.#passOn(held);
    this.#held = [];
  }
}

/** Pass a sandbox process's line on to this process's own output. */
function passOn(to: { writeSync(p: Uint8Array): number }, line: string): void {
  try {
    writeLineSync(to, line);
  } catch {
    // An output that is closed loses the handler's print, not the run.
  }
}

/**
 * The `deno run` arguments of a sandbox process: its permissions as flags, the heap cap,
 * the deno.json nearest the handler's module (its import map), then the entry.
 */
function processArgs(spec: SandboxSpec, entry: string): string[] {
  const args = ["run", "--no-prompt", ...permissionFlags(spec.permissions)];
  if (spec.maxHeapMb !== null) args.push(`--v8-flags=--max-old-space-size=${spec.maxHeapMb}`);
  const config = nearestConfig(spec.module);
  if (config) args.push("--config", config);
  args.push(entry);
  return args;
}

const PERMISSION_KINDS = ["env", "ffi", "net", "read", "run", "sys", "write", "import"] as const;

/** `Deno.PermissionOptions` as `deno run` flags; "inherit" is what this process has whole. */
function permissionFlags(permissions: Deno.PermissionOptions): string[] {
  if (permissions === "none") return [];
  const flags: string[] = [];
  for (const kind of PERMISSION_KINDS) {
    const value = permissions === "inherit"
      ? "inherit"
      : (permissions as Record<string, unknown>)[kind];
    if (value === true) flags.push(`--allow-${kind}`);
    else if (Array.isArray(value) && value.length > 0) {
      const list = value.map((v) =>
        v instanceof URL
          ? (v.protocol === "file:" ? decodeURIComponent(v.pathname) : v.host)
          : String(v)
      );
      flags.push(`--allow-${kind}=${list.join(",")}`);
    } else if (value === "inherit" && kind !== "import") {
      const state = Deno.permissions.querySync({ name: kind } as Deno.PermissionDescriptor).state;
      if (state === "granted") flags.push(`--allow-${kind}`);
    }
  }
  return flags;
}

/** The deno.json (or deno.jsonc) in the directory of a file module or above it, if any. */
function nearestConfig(module: string): string | null {
  const url = new URL(module);
  if (url.protocol !== "file:") return null;
  let dir = decodeURIComponent(url.pathname).replace(/\/[^/]*$/, "");
  for (;;) {
    for (const name of ["deno.json", "deno.jsonc"]) {
      try {
        if (Deno.statSync(`${dir}/${name}`).isFile) return `${dir}/${name}`;
      } catch {
        // not there, or not readable: look further up
      }
    }
    if (dir === "" || dir === "/") return null;
    dir = dir.replace(/\/[^/]*$/, "");
  }
}

/** The sandboxes of one sandboxed task. */
export class SandboxPool {
  #spec: SandboxSpec;
  #task: string;
  #entry: string;
  #idle: Sandbox[] = [];
  #all = new Set<Sandbox>();
  #count = 0;
  #waiting: { take: (thread: Sandbox) => void }[] = [];
  #closed = false;

  /** A pool for `task`; threads start on demand. */
  constructor(task: string, spec: SandboxSpec) {
    this.#spec = spec;
    this.#task = task;
    const [serveModule, serve] = spec.isolation === "process"
      ? [PROCESS_MODULE, "serveProcess"]
      : [THREAD_MODULE, "serve"];
    this.#entry = "data:application/javascript," + encodeURIComponent(
      `import { ${serve} } from ${JSON.stringify(serveModule)};\n` +
        `import * as handlers from ${JSON.stringify(spec.module)};\n` +
        `${serve}(handlers);\n`,
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

  #acquire(signal: AbortSignal): Promise<Sandbox> {
    const idle = this.#idle.pop();
    if (idle) return Promise.resolve(idle);
    if (this.#spec.pool === null || this.#count < this.#spec.pool) {
      return Promise.resolve(this.#spawn());
    }
    return new Promise((resolve, reject) => {
      const waiter = {
        take: (thread: Sandbox) => {
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

  #spawn(): Sandbox {
    this.#count++;
    const onDeath = (thread: Sandbox) => {
      const at = this.#idle.indexOf(thread);
      if (at >= 0) this.#idle.splice(at, 1);
      this.#died(thread);
    };
    const thread = this.#spec.isolation === "process"
      ? new Subprocess(processArgs(this.#spec, this.#entry), this.#spec, onDeath)
      : new Thread(this.#entry, this.#spec, `akadze sandbox ${this.#task}`, onDeath);
    this.#all.add(thread);
    return thread;
  }

  #release(thread: Sandbox): void {
    if (thread.dead) return;
    const waiter = this.#waiting.shift();
    if (waiter) waiter.take(thread);
    else if (this.#closed) thread.terminate();
    else this.#idle.push(thread);
  }

  /** A thread is gone: a run waiting for one gets a new one. */
  #died(thread: Sandbox): void {
    if (!this.#all.delete(thread)) return;
    this.#count--;
    const waiter = this.#waiting.shift();
    if (waiter && !this.#closed) waiter.take(this.#spawn());
  }
}

function crashed(what: string, kind: "thread" | "process"): Error {
  return Object.assign(
    new Error(`${what}; the run failed and its sandbox ${kind} was replaced`),
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
