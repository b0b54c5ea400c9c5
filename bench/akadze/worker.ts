// The akadze worker process of the benchmark (its own process, so that its CPU time and
// peak RSS are its own). Started by bench/akadze/driver.ts with a JSON spec as argument;
// talks JSON lines on stdout; "stop" on stdin (or stdin closing) stops it.
//
//   drain:   run until `n` noop jobs are done (every row succeeded, checked in the
//            database), report timings, WAL, CPU and peak RSS, then stop.
//   latency: run; each `lat` job prints its enqueue→start latency.
//   idle:    run until stopped (the driver samples our CPU time).
import postgres from "postgres";
import { Worker, type WorkerOptions } from "../../mod.ts";
import { cpuMs, peakRssKb, postgresCpuMs } from "../lib/proc.ts";
import { LineReader } from "../lib/lines.ts";
import { workerApp, type WorkerAppSpec } from "./worker_app.ts";

/** What the driver asks of this process. */
export interface WorkerSpec {
  url: string;
  mode: "drain" | "latency" | "idle";
  /** drain: how many jobs to wait for. */
  n: number;
  app: WorkerAppSpec;
  worker: WorkerOptions;
  /** How many Worker instances share the process (and the app's pool). Default 1. */
  instances?: number;
  /** For PostgreSQL's CPU time during the drain. */
  postmasterPid?: number;
}

const spec: WorkerSpec = JSON.parse(Deno.args[0]);
const send = (message: Record<string, unknown>) => console.log(JSON.stringify(message));
const wallMs = () => performance.timeOrigin + performance.now();

const { app, close } = workerApp(spec.url, spec.app);
let started = 0;
let allStarted!: () => void;
const everyJobStarted = new Promise<void>((resolve) => allStarted = resolve);
app.task("noop", () => {
  if (++started === spec.n) allStarted();
});
app.task("lat", ({ t0 }) => {
  send({ event: "lat", ms: wallMs() - (t0 as number) });
});

const workers = Array.from(
  { length: spec.instances ?? 1 },
  () => new Worker(app, { schedules: false, ...spec.worker }),
);
const worker = {
  run: async () => {
    const exits = await Promise.all(workers.map((w) => w.run()));
    return exits.find((e) => e.code !== 0) ?? exits[0];
  },
  stop: () => workers.forEach((w) => w.stop()),
  get claimed() {
    return workers.reduce((sum, w) => sum + w.claimed, 0);
  },
};
// Open the pool's connections before the clock starts (the peers' pools are warm too).
await Promise.all(Array.from({ length: Math.min(spec.app.max ?? 10, 4) }, () => app.sql`select 1`));

// "stop" on stdin, or stdin closing (the driver is gone), stops the worker.
const stdin = new LineReader(Deno.stdin.readable);
let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  worker.stop();
  setTimeout(() => Deno.exit(3), 15_000).unref?.();
};
(async () => {
  for (;;) {
    const line = await stdin.next();
    if (line === null || line.trim() === "stop") break;
  }
  stop();
})();

let run: Promise<{ code: number; reason: string; message?: string }>;
if (spec.mode === "drain") {
  const probe = postgres(spec.url, { max: 1, onnotice: () => {} });
  const [{ lsn: walStart }] = await probe`select pg_current_wal_lsn()::text as lsn`;
  const cpu0 = await cpuMs();
  const pg0 = spec.postmasterPid ? await postgresCpuMs(spec.postmasterPid) : NaN;
  const t0 = performance.now();
  run = worker.run();
  await Promise.race([everyJobStarted, run]);
  const handlerMs = performance.now() - t0;
  if (started < spec.n) {
    const exit = await run;
    send({ event: "error", message: `worker stopped early: ${exit.reason} ${exit.message ?? ""}` });
    Deno.exit(1);
  }
  // Every handler has started; the drain ends when the database shows no job left to do
  // (all outcomes committed).
  let walEnd = "";
  for (;;) {
    const [row] = await probe`
      select (exists (select 1 from akadze.jobs where state = 'queued')
           or exists (select 1 from akadze.jobs where state = 'running')) as busy,
             pg_current_wal_lsn()::text as lsn`;
    if (!row.busy) {
      walEnd = row.lsn;
      break;
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  const drainMs = performance.now() - t0;
  const cpu1 = await cpuMs();
  const pg1 = spec.postmasterPid ? await postgresCpuMs(spec.postmasterPid) : NaN;
  await probe.end();
  send({
    event: "drained",
    drain_ms: drainMs,
    handler_ms: handlerMs,
    started,
    claimed: worker.claimed,
    wal_start: walStart,
    wal_end: walEnd,
    worker_cpu_ms: cpu1 - cpu0,
    pg_cpu_ms: pg1 - pg0,
    rss_kb: await peakRssKb(),
  });
  stop();
} else {
  run = worker.run();
  await new Promise((r) => setTimeout(r, 1_000)); // registered and listening
  send({ event: "ready", pid: Deno.pid });
}
const exit = await run;
await close();
send({ event: "exit", code: exit.code, reason: exit.reason, message: exit.message });
Deno.exit(exit.code);
