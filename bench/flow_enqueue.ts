// Where a flow enqueue's time goes, for the fan-out and the DAG of `deno task bench --scenario
// flows` (10,000 steps each), on a durable throwaway PostgreSQL: `app.enqueueFlow` (the steps as
// arrays to `enqueue_flow_steps`, 0019) beside the JSON path it replaced (`prepareFlow`, the steps'
// JSON text, SQL `enqueue_flow`, 0018), each part timed. As in the bench, every enqueue is the
// first call on a fresh database and pool; prints the medians of the rounds. With `--explain`, the
// server logs auto_explain plans of the functions' statements (log_nested_statements) to
// /tmp/flow_enqueue_explain/server.log.
//
//   deno run --allow-all bench/flow_enqueue.ts [--rounds 7] [--n 10000] [--explain]
import postgres from "postgres";
import { Akadze } from "../mod.ts";
import { migrate } from "../admin.ts";
import { prepareFlow } from "../src/flow.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { flowShape } from "./peers/flow_shapes.mjs";
import { cpuMs } from "./lib/proc.ts";

const args = Deno.args;
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) : fallback;
};
const rounds = flag("--rounds", 7);
const n = flag("--n", 10_000);
const explain = args.includes("--explain");

const settings: Record<string, string> = explain
  ? {
    shared_preload_libraries: "auto_explain",
    "auto_explain.log_min_duration": "5",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_timing": "on",
    logging_collector: "on",
    log_directory: "/tmp/flow_enqueue_explain",
    log_filename: "server.log",
  }
  : {};
const pg = await startThrowawayPostgres({ durable: true, settings });
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
try {
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  const result: Record<string, Record<string, number>> = {};
  for (const shape of ["fanout", "dag"] as const) {
    const { deps } = flowShape({ shape, n, layers: 20 });
    const times = { prepare: [] as number[], stringify: [] as number[], sql: [] as number[] };
    const whole: number[] = [];
    // CPU time (client: this process; server: the enqueue's backend), less moved by a
    // machine shared with other work than the wall time.
    const cpu = {
      json: [] as number[],
      jsonServer: [] as number[],
      steps: [] as number[],
      stepsServer: [] as number[],
    };
    for (let r = 0; r < rounds; r++) {
      // As the bench does: a fresh database, the flow enqueued once on a fresh pool.
      for (const mode of ["parts", "whole"]) {
        const db = `flow_enqueue_${r}_${mode}`;
        await admin.unsafe(`create database ${db}`);
        const url = pg.url.replace(/\/postgres$/, `/${db}`);
        await migrate(url);
        const sql = postgres(url, {
          max: 1,
          prepare: true,
          onnotice: () => {},
          connection: { jit: "off" },
        });
        const app = new Akadze({ sql });
        app.task("step", () => {});
        const [{ pid }] = await sql`select pg_backend_pid() as pid`;
        await sql`checkpoint`;
        const steps: Record<string, unknown> = {};
        deps.forEach((d, s) => {
          steps[`s${s}`] = d.length
            ? { task: "step", args: { s }, dependsOn: d.map((x) => `s${x}`) }
            : { task: "step", args: { s } };
        });
        let t = performance.now();
        const [client0, server0] = [await cpuMs(), await cpuMs(pid)];
        if (mode === "parts") {
          // deno-lint-ignore no-explicit-any
          const ordered = await prepareFlow(app as any, steps as any);
          times.prepare.push(performance.now() - t);
          t = performance.now();
          const text = JSON.stringify(ordered);
          times.stringify.push(performance.now() - t);
          t = performance.now();
          await sql.unsafe(
            `select step, id::text from akadze.enqueue_flow($1::text::jsonb, null, null)`,
            [text],
            { prepare: true },
          );
          times.sql.push(performance.now() - t);
          cpu.json.push((await cpuMs()) - client0);
          cpu.jsonServer.push((await cpuMs(pid)) - server0);
        } else {
          // deno-lint-ignore no-explicit-any
          await app.enqueueFlow(steps as any);
          whole.push(performance.now() - t);
          cpu.steps.push((await cpuMs()) - client0);
          cpu.stepsServer.push((await cpuMs(pid)) - server0);
        }
        await sql.end();
        await admin.unsafe(`drop database ${db}`);
      }
    }
    result[shape] = {
      "enqueueFlow, ms": median(whole),
      "JSON path: prepareFlow, ms": median(times.prepare),
      "JSON.stringify, ms": median(times.stringify),
      "enqueue_flow call, ms": median(times.sql),
      "CPU ms, enqueueFlow: client": median(cpu.steps),
      "server": median(cpu.stepsServer),
      "CPU ms, JSON path: client": median(cpu.json),
      "server ": median(cpu.jsonServer),
    };
  }
  console.table(result);
  if (explain) console.log("plans: /tmp/flow_enqueue_explain/server.log");
  await admin.end();
} finally {
  await pg.stop();
}
