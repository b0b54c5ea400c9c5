// akadze's driver of the pinned-horizon scenario (bench/horizon.ts): one producer app
// enqueuing at a steady rate and one Worker on an app of its own, both in this
// process, talking the protocol of bench/peers/steady.mjs. Started with a JSON spec as
// argument.
import { Akadze, Worker, type WorkerOptions } from "../../mod.ts";
import { migrate } from "../../admin.ts";
import { createSteady } from "../peers/steady.mjs";
import { workerApp, type WorkerAppSpec } from "./worker_app.ts";

/** What bench/horizon.ts asks of one akadze run. */
export interface SteadySpec {
  url: string;
  /** Jobs per second. */
  rate: number;
  /** The producer's tick, ms. */
  tickMs: number;
  /** Jobs per enqueue call at most (1: `enqueue`, else `enqueueMany`). */
  batch: number;
  /** The worker's app (empty: `new Akadze({ databaseUrl })`, what a user gets). */
  app: WorkerAppSpec;
  /** The Worker's options (empty: its defaults). */
  worker: WorkerOptions;
}

const spec: SteadySpec = JSON.parse(Deno.args[0]);
await migrate(spec.url);
const steady = createSteady({ rate: spec.rate, tickMs: spec.tickMs, batch: spec.batch });

// The producer is an app of its own, as a web process enqueuing jobs would be.
const producer = new Akadze({ databaseUrl: spec.url });
const noop = producer.task("noop", () => {});

const { app, close } = workerApp(spec.url, spec.app);
app.task("noop", (args) => steady.record(args as { t0: number; seq: number }));
const worker = new Worker(app, spec.worker);
const exit = worker.run();
let stopping = false;
// Open both pools before the clock starts, and let the worker register and listen.
await Promise.all([producer.sql`select 1`, app.sql`select 1`]);
await new Promise((r) => setTimeout(r, 1_000));

await steady.run(
  (jobs: { t0: number; seq: number }[]) =>
    jobs.length === 1 ? noop.enqueue(jobs[0]) : noop.enqueueMany(jobs),
  async () => {
    stopping = true;
    worker.stop();
    await exit;
    await close();
    await producer.close();
  },
  exit.then((e) => stopping ? new Promise(() => {}) : e),
);
Deno.exit(0);
