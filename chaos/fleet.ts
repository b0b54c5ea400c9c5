// Worker processes of the chaos soak: `deno run cli.ts worker chaos/app.ts …` each, their
// stdout and stderr written to files, their exits recorded (and told apart: killed by the
// harness, stopped at the end, or unexpected), their peak RSS sampled from /proc.

/** Why the harness ended a worker process, if it did. */
export type EndedBy = "kill" | "final";

/** One worker process, alive or not. */
export interface WorkerProcess {
  /** 1, 2, 3, … in spawn order; its connections use application_name `chaos_w<idx>`. */
  readonly idx: number;
  readonly pid: number;
  /** Epoch ms. */
  readonly startedAt: number;
  exitedAt: number | null;
  /** Exit code (null while running). */
  code: number | null;
  /** The signal that ended it, if any. */
  signal: string | null;
  /** Set before the harness sends SIGKILL (or SIGTERM at the end). */
  endedBy: EndedBy | null;
  /** Currently SIGSTOPped by the harness. */
  stopped: boolean;
  /** Peak resident set size seen (VmHWM), KiB. */
  peakRssKb: number;
  readonly stdoutPath: string;
  readonly stderrPath: string;
  /** Resolves when it exited and its output files are complete. */
  done: Promise<void>;
  /** Send a signal (ignored once it exited). */
  send(signal: Deno.Signal): void;
}

/** How to start a worker process. */
export interface FleetOptions {
  /** The project root (cwd of the workers, where deno.json is). */
  root: string;
  /** The database URL (with its password); `application_name` is appended per worker. */
  url: string;
  /** `akadze worker` arguments after the APP. */
  workerArgs: string[];
  /** Where the log files go. */
  logDir: string;
  /** Extra environment of the workers. */
  env: Record<string, string>;
  /** Called when a worker exits without the harness having ended it. */
  onUnexpectedExit(worker: WorkerProcess): void;
}

/** Spawns and tracks the worker processes. */
export class Fleet {
  /** Every process ever started, in order. */
  readonly all: WorkerProcess[] = [];
  #options: FleetOptions;

  constructor(options: FleetOptions) {
    this.#options = options;
  }

  /**
   * Start the processes spawned from now on from the code at `root` (a new release), with
   * `env` as their extra environment.
   */
  useRoot(root: string, env: Record<string, string> = this.#options.env): void {
    this.#options = { ...this.#options, root, env };
  }

  /** Processes that have not exited. */
  live(): WorkerProcess[] {
    return this.all.filter((w) => w.exitedAt === null);
  }

  /** Start one worker process. */
  spawn(): WorkerProcess {
    const { root, url, workerArgs, logDir, env } = this.#options;
    const idx = this.all.length + 1;
    const sep = url.includes("?") ? "&" : "?";
    const child = new Deno.Command(Deno.execPath(), {
      // Worker options: chaos.cpu's sandbox threads run with permissions of their own.
      args: [
        "run",
        "--allow-all",
        "--unstable-worker-options",
        `${root}/cli.ts`,
        "worker",
        "chaos/app.ts",
        ...workerArgs,
      ],
      cwd: root,
      env: {
        ...env,
        AKADZE_DATABASE_URL: `${url}${sep}application_name=chaos_w${idx}`,
        NO_COLOR: "1",
      },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const stdoutPath = `${logDir}/w${idx}.stdout`;
    const stderrPath = `${logDir}/w${idx}.stderr.jsonl`;
    const open = (path: string) =>
      Deno.openSync(path, { write: true, create: true, truncate: true });
    const pipes = Promise.all([
      child.stdout.pipeTo(open(stdoutPath).writable).catch(() => {}),
      child.stderr.pipeTo(open(stderrPath).writable).catch(() => {}),
    ]);
    const worker: WorkerProcess = {
      idx,
      pid: child.pid,
      startedAt: Date.now(),
      exitedAt: null,
      code: null,
      signal: null,
      endedBy: null,
      stopped: false,
      peakRssKb: 0,
      stdoutPath,
      stderrPath,
      done: Promise.resolve(),
      send: (signal) => {
        if (worker.exitedAt !== null) return;
        try {
          child.kill(signal);
        } catch {
          // it exited meanwhile
        }
      },
    };
    worker.done = (async () => {
      const status = await child.status;
      worker.exitedAt = Date.now();
      worker.code = status.code;
      worker.signal = status.signal;
      await pipes;
      if (worker.endedBy === null) this.#options.onUnexpectedExit(worker);
    })();
    this.all.push(worker);
    return worker;
  }

  /** Sample the peak RSS of every live process. */
  async sampleRss(): Promise<void> {
    await Promise.all(
      this.live().map(async (w) => {
        const kb = await peakRssKb(w.pid);
        if (kb > w.peakRssKb) w.peakRssKb = kb;
      }),
    );
  }

  /** SIGKILL everything still running (cleanup). */
  async killAll(): Promise<void> {
    for (const w of this.live()) {
      w.endedBy ??= "kill";
      w.send("SIGCONT");
      w.send("SIGKILL");
    }
    await Promise.all(this.all.map((w) => w.done));
  }
}

/** Peak resident set size (VmHWM) of a process, KiB; 0 when it is gone. */
export async function peakRssKb(pid: number): Promise<number> {
  try {
    const status = await Deno.readTextFile(`/proc/${pid}/status`);
    return Number(/^VmHWM:\s+(\d+)/m.exec(status)?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** The pid in a worker id (`hostname:pid:random`), or null. */
export function pidOfWorkerId(workerId: string | null): number | null {
  const match = workerId ? /:(\d+):[0-9a-f]{8}$/.exec(workerId) : null;
  return match ? Number(match[1]) : null;
}
