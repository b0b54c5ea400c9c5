// A worker process of the limits scenario (bench/limits.ts): one `Worker` of `slots` slots
// on the akadze of the checkout whose mod.ts it is given (this one or `--base`'s), with two
// tasks: `hot`, which waits `taskMs`, and `free`, a no-op. Prints "ready" once running;
// stops when stdin closes.
import { LineReader } from "../lib/lines.ts";

/** What bench/limits.ts asks of this process. */
export interface LimitsWorkerSpec {
  url: string;
  /** The mod.ts of the akadze to run. */
  mod: string;
  slots: number;
  taskMs: number;
}

const spec: LimitsWorkerSpec = JSON.parse(Deno.args[0]);
const { Akadze, Worker } = await import(spec.mod);
const app = new Akadze({ databaseUrl: spec.url, max: 4 });
app.task("hot", () => new Promise((resolve) => setTimeout(resolve, spec.taskMs)));
app.task("free", () => {});
const worker = new Worker(app, { slots: spec.slots, schedules: false });
await app.sql`select 1`;
const run = worker.run();
console.log("ready");
const stdin = new LineReader(Deno.stdin.readable);
while ((await stdin.next()) !== null) {
  // only the end of stdin matters
}
worker.stop();
await run;
await app.close();
