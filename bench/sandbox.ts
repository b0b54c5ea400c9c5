// What a sandbox costs and buys. Not part of `deno task bench`; run
//
//   deno run --allow-all bench/sandbox.ts [--n 5000] [--cpu 40] [--spin 100] [--rounds 3]
//
// On one throwaway PostgreSQL (fsync off), one Worker in batch mode drains, per round:
//   - "no-op in loop" / "no-op sandboxed": N no-op jobs, slots 32 (the sandboxed task's pool
//     is one thread per running job, so up to 32 threads, started in each run: a worker
//     stops its threads when its run ends);
//   - "no-op in 4 processes": the same with `isolation: "process"`, a pool of 4 processes;
//   - "cpu in loop" / "cpu sandboxed, pool 2" / "cpu in processes, pool 2": CPU jobs each
//     spinning `--spin` ms, slots 2.
// Prints jobs/s per variant (median of the rounds) and the speed-up of the CPU set.
import { Akadze, Worker } from "../mod.ts";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { flagValue } from "./lib/flags.ts";

const N = Number(flagValue(Deno.args, "--n", "5000"));
const CPU = Number(flagValue(Deno.args, "--cpu", "40"));
const SPIN = Number(flagValue(Deno.args, "--spin", "100"));
const ROUNDS = Number(flagValue(Deno.args, "--rounds", "3"));
const HANDLERS = new URL("../tests/fixtures/sandbox_handlers.ts", import.meta.url).href;

const server = await startThrowawayPostgres();
try {
  await migrate(server.url);
  const app = new Akadze({ databaseUrl: server.url, retention: 0 });
  const noop = app.task("noop", { queue: "noop" }, () => null);
  const noopBox = app.task("noop_box", {
    queue: "noop_box",
    sandbox: { module: HANDLERS, export: "noop" },
  });
  const noopProcess = app.task("noop_process", {
    queue: "noop_process",
    sandbox: { module: HANDLERS, export: "noop", isolation: "process", pool: 4 },
  });
  const cpuProcess = app.task("cpu_process", {
    queue: "cpu_process",
    sandbox: { module: HANDLERS, export: "spin", isolation: "process", pool: 2 },
  });
  const spin = (ms: number) => {
    const end = performance.now() + ms;
    while (performance.now() < end);
    return null;
  };
  const cpu = app.task("cpu", { queue: "cpu" }, ({ ms }) => spin(ms as number));
  const cpuBox = app.task("cpu_box", {
    queue: "cpu_box",
    sandbox: { module: HANDLERS, export: "spin", pool: 2 },
  });

  /** Enqueue, then drain the queue with one worker in batch mode; returns the drain's ms. */
  const workers = new Map<string, Worker>();
  const drain = async (queue: string, slots: number, enqueue: () => Promise<unknown>) => {
    await enqueue();
    let worker = workers.get(queue);
    if (!worker) {
      workers.set(queue, worker = new Worker(app, { queues: [queue], slots, batch: true }));
    }
    const start = performance.now();
    const exit = await worker.run();
    if (exit.code !== 0) throw new Error(`${queue}: ${exit.reason} ${exit.message ?? ""}`);
    return performance.now() - start;
  };
  const args = (n: number, value: Record<string, unknown>) =>
    Array.from({ length: n }, () => value);
  const variants: [string, number, () => Promise<number>][] = [
    ["no-op in loop", N, () => drain("noop", 32, () => noop.enqueueMany(args(N, {})))],
    ["no-op sandboxed", N, () => drain("noop_box", 32, () => noopBox.enqueueMany(args(N, {})))],
    [
      "no-op in 4 processes",
      N,
      () => drain("noop_process", 32, () => noopProcess.enqueueMany(args(N, {}))),
    ],
    ["cpu in loop", CPU, () => drain("cpu", 2, () => cpu.enqueueMany(args(CPU, { ms: SPIN })))],
    [
      "cpu sandboxed, pool 2",
      CPU,
      () => drain("cpu_box", 2, () => cpuBox.enqueueMany(args(CPU, { ms: SPIN }))),
    ],
    [
      "cpu in processes, pool 2",
      CPU,
      () => drain("cpu_process", 2, () => cpuProcess.enqueueMany(args(CPU, { ms: SPIN }))),
    ],
  ];
  // Warm-up: a small run of each (modules loaded and compiled, statements planned).
  await drain("noop_box", 32, () => noopBox.enqueueMany(args(50, {})));
  await drain("cpu_box", 2, () => cpuBox.enqueueMany(args(2, { ms: 1 })));
  await drain("noop", 32, () => noop.enqueueMany(args(50, {})));
  await drain("noop_process", 32, () => noopProcess.enqueueMany(args(50, {})));
  await drain("cpu_process", 2, () => cpuProcess.enqueueMany(args(2, { ms: 1 })));
  const rates = new Map<string, number[]>();
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, n, run] of variants) {
      const ms = await run();
      rates.set(name, [...(rates.get(name) ?? []), n / (ms / 1000)]);
    }
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log(
    `${navigator.hardwareConcurrency} cores, Deno ${Deno.version.deno}, PostgreSQL ${server.version}`,
  );
  for (const [name, n] of variants) {
    const r = rates.get(name)!;
    console.log(`${name.padEnd(24)} ${median(r).toFixed(0).padStart(7)} jobs/s (${n} jobs)`);
  }
  const speedup = median(rates.get("cpu sandboxed, pool 2")!) / median(rates.get("cpu in loop")!);
  console.log(`cpu speed-up with a pool of 2: ${speedup.toFixed(2)}x (${SPIN} ms a job)`);
  const processSpeedup = median(rates.get("cpu in processes, pool 2")!) /
    median(rates.get("cpu in loop")!);
  console.log(`cpu speed-up with 2 processes: ${processSpeedup.toFixed(2)}x`);
  await app.close();
} finally {
  await server.stop();
}
