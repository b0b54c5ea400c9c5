// akadze's run of the flows scenario (bench/flows.ts): one flow of the shape asked for,
// enqueued with `app.enqueueFlow` in one call (one transaction), then drained by one Worker in
// this process, as the peers' drivers do; or, for shape "plain", as many independent jobs
// enqueued with `enqueueMany` and drained the same way (the reference the flows are compared
// with). Prints one line "BENCH_RESULT {json}"; when this akadze has no `enqueueFlow`, the
// result says so (`skipped`) instead of measuring anything. Started with a JSON spec as
// argument.
import postgres from "postgres";
import { Worker, type WorkerOptions } from "../../mod.ts";
import { migrate } from "../../admin.ts";
import { cpuMs, postgresCpuMs } from "../lib/proc.ts";
import { workerApp, type WorkerAppSpec } from "./worker_app.ts";
import { createFlowLog, flowShape } from "../peers/flow_shapes.mjs";

/** What bench/flows.ts asks of one run. */
export interface FlowsSpec {
  url: string;
  shape: "fanout" | "chain" | "dag" | "plain";
  n: number;
  layers?: number;
  /** Rows per enqueueMany call of the plain run. */
  batchRows?: number;
  app: WorkerAppSpec;
  worker: WorkerOptions;
  postmasterPid?: number;
}

/** A step of `enqueueFlow`, as the flows API takes it. */
interface FlowStep {
  task: string;
  args: { s: number };
  dependsOn?: string[];
}
type EnqueueFlow = (
  steps: Record<string, FlowStep>,
) => Promise<{ id: string; jobs: Record<string, string> }>;

const spec: FlowsSpec = JSON.parse(Deno.args[0]);
const report = (result: Record<string, unknown>) =>
  console.log(`BENCH_RESULT ${JSON.stringify(result)}`);
const result: Record<string, unknown> = { system: "akadze", shape: { ...spec, url: undefined } };

await migrate(spec.url);
const { app, close } = workerApp(spec.url, spec.app);
const enqueueFlow = (app as unknown as { enqueueFlow?: EnqueueFlow }).enqueueFlow?.bind(app);
if (spec.shape !== "plain" && !enqueueFlow) {
  await close();
  report({ ...result, skipped: "flows not available: this akadze has no app.enqueueFlow" });
  Deno.exit(0);
}

const { deps, edges } = spec.shape === "plain"
  ? { deps: Array.from({ length: spec.n }, () => [] as number[]), edges: 0 }
  : flowShape({ shape: spec.shape, n: spec.n, layers: spec.layers });
result.steps = deps.length;
result.edges = edges;
const log = createFlowLog(deps);
const step = app.task("step", ({ s }) => {
  log.begin(s as number);
  log.finish(s as number);
});
const probe = postgres(spec.url, { max: 1, onnotice: () => {} });
const lsn = async () => (await probe`select pg_current_wal_lsn()::text as l`)[0].l as string;
const walBetween = async (a: string, b: string) =>
  Number((await probe`select pg_wal_lsn_diff(${b}::pg_lsn, ${a}::pg_lsn) as d`)[0].d);
const pgCpu = () => spec.postmasterPid ? postgresCpuMs(spec.postmasterPid) : Promise.resolve(NaN);

try {
  await Promise.all(Array.from({ length: 4 }, () => app.sql`select 1`));
  await probe`checkpoint`;

  // 1) the enqueue: the whole flow in one enqueueFlow call (plain: enqueueMany calls).
  let l0 = await lsn();
  let pg0 = await pgCpu();
  let t = performance.now();
  if (spec.shape === "plain") {
    const rows = spec.batchRows ?? 5_000;
    for (let i = 0; i < spec.n; i += rows) {
      await step.enqueueMany(
        Array.from({ length: Math.min(rows, spec.n - i) }, (_, k) => ({ s: i + k })),
      );
    }
  } else {
    const steps: Record<string, FlowStep> = {};
    deps.forEach((d, s) => {
      steps[`s${s}`] = d.length
        ? { task: "step", args: { s }, dependsOn: d.map((x) => `s${x}`) }
        : { task: "step", args: { s } };
    });
    await enqueueFlow!(steps);
  }
  result.enqueue_ms = performance.now() - t;
  result.enqueue_pg_cpu_ms = (await pgCpu()) - pg0;
  result.enqueue_wal_bytes = await walBetween(l0, await lsn());
  await probe`analyze akadze.jobs`;

  // 2) the drain: worker start until the database shows every job finished.
  const worker = new Worker(app, { schedules: false, ...spec.worker });
  l0 = await lsn();
  const cpu0 = await cpuMs();
  pg0 = await pgCpu();
  t = performance.now();
  const run = worker.run();
  const exit = await Promise.race([log.done.then(() => null), run]);
  if (exit) throw new Error(`the worker stopped early: ${exit.reason} ${exit.message ?? ""}`);
  result.handlers_ms = performance.now() - t;
  let l1: string;
  for (;;) {
    const [row] = await probe`
      select exists (select 1 from akadze.jobs
                      where state not in ('succeeded', 'failed', 'cancelled')) as busy,
             pg_current_wal_lsn()::text as lsn`;
    if (!row.busy) {
      l1 = row.lsn;
      break;
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  result.drain_ms = performance.now() - t;
  result.worker_cpu_ms = (await cpuMs()) - cpu0;
  result.drain_pg_cpu_ms = (await pgCpu()) - pg0;
  result.drain_wal_bytes = await walBetween(l0, l1);
  worker.stop();
  await run;
  const [{ c }] = await probe`
    select count(*)::int as c from akadze.jobs where task = 'step' and state = 'succeeded'`;
  Object.assign(result, log.summary());
  result.completed = log.ended === deps.length ? c : 0;
  report(result);
} finally {
  await probe.end();
  await close();
}
