// The flows scenario: jobs that wait for other jobs. Each system enqueues one flow of each
// shape (a fan-out of N jobs into one that waits for them all, a chain, a layered DAG) in one
// call and drains it with one worker in the same process, on a fresh database of one durable
// throwaway PostgreSQL; akadze also drains as many plain jobs, the reference its flows are
// held to. Writes bench/results/<date>-flows.json and .md (see bench/README.md).
//
//   deno task bench --scenario flows [--entries akadze,bullmq,pgboss] [--shapes fanout,chain,dag]
//       [--fanout 10000] [--chain 1000] [--dag 10000] [--layers 20] [--rounds 1]
//       [--timeout 900] [--out FILE.json] [--pg name=value]... [--base DIR]
//   deno task bench --scenario flows --smoke   # tiny flows, akadze only, writes nothing
import postgres from "postgres";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import type { FlowsSpec } from "./akadze/flows.ts";
import { runDriver, wasInterrupted } from "./lib/children.ts";
import { environmentLines, machineInfo, postgresInfo } from "./lib/machine.ts";
import { ensurePeers, NODE, PEERS_DIR, peersLine } from "./lib/peers.ts";
import { CLK_TCK, readPostmasterPid } from "./lib/proc.ts";
import { fmt } from "./lib/report.ts";

const BENCH = new URL(".", import.meta.url).pathname.replace(/\/$/, "");
const ROOT = BENCH.replace(/\/bench$/, "");

type Shape = "fanout" | "chain" | "dag" | "plain";
const FLOW_SHAPES: readonly Shape[] = ["fanout", "chain", "dag"];

interface Flags {
  smoke: boolean;
  entries: string[];
  shapes: Shape[];
  fanout: number;
  chain: number;
  dag: number;
  layers: number;
  rounds: number;
  timeout: number;
  out?: string;
  pg: Record<string, string>;
  /** Another checkout of akadze (e.g. main): its akadze entry runs too, as `base-akadze`. */
  base?: string;
}

class UsageError extends Error {}

function parseFlags(args: readonly string[]): Flags {
  const smoke = args.includes("--smoke");
  const flags: Flags = {
    smoke,
    entries: smoke ? ["akadze"] : ENTRIES.map((e) => e.key),
    shapes: [...FLOW_SHAPES],
    fanout: smoke ? 50 : 10_000,
    chain: smoke ? 20 : 1_000,
    dag: smoke ? 100 : 10_000,
    layers: smoke ? 5 : 20,
    rounds: 1,
    timeout: 900,
    pg: {},
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--smoke") continue;
    const [name, inline] = arg.startsWith("--") && arg.includes("=")
      ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)]
      : [arg, undefined];
    const value = () => {
      const v = inline ?? args[++i];
      if (v === undefined) throw new UsageError(`${name} needs a value`);
      return v;
    };
    const count = (min: number) => {
      const v = value();
      const n = Number(v.replaceAll("_", ""));
      if (!Number.isInteger(n) || n < min) {
        throw new UsageError(`${name} must be an integer >= ${min}, got ${v}`);
      }
      return n;
    };
    switch (name) {
      case "--entries": {
        flags.entries = value().split(",").filter(Boolean);
        const unknown = flags.entries.filter((k) => !ENTRIES.some((e) => e.key === k));
        if (unknown.length || !flags.entries.length) {
          throw new UsageError(
            `--entries takes ${ENTRIES.map((e) => e.key).join(", ")}, got ${unknown.join(",")}`,
          );
        }
        break;
      }
      case "--shapes": {
        const shapes = value().split(",").filter(Boolean) as Shape[];
        const unknown = shapes.filter((s) => !FLOW_SHAPES.includes(s));
        if (unknown.length || !shapes.length) {
          throw new UsageError(
            `--shapes takes ${FLOW_SHAPES.join(", ")}, got ${unknown.join(",")}`,
          );
        }
        flags.shapes = shapes;
        break;
      }
      case "--fanout":
        flags.fanout = count(1);
        break;
      case "--chain":
        flags.chain = count(2);
        break;
      case "--dag":
        flags.dag = count(2);
        break;
      case "--layers":
        flags.layers = count(2);
        break;
      case "--rounds":
        flags.rounds = count(1);
        break;
      case "--timeout":
        flags.timeout = count(1);
        break;
      case "--out":
        flags.out = value();
        break;
      case "--base":
        flags.base = value().replace(/\/$/, "");
        break;
      case "--pg": {
        const v = value();
        const eq = v.indexOf("=");
        if (eq < 1) throw new UsageError(`--pg takes name=value, got ${v}`);
        flags.pg[v.slice(0, eq)] = v.slice(eq + 1);
        break;
      }
      default:
        throw new UsageError(`unknown argument ${arg}`);
    }
  }
  if (flags.layers > flags.dag) throw new UsageError("--layers must not exceed --dag");
  return flags;
}

// ---------------------------------------------------------------------------------------
// What runs

interface Entry {
  key: string;
  system: "akadze" | "bullmq" | "pgboss";
  label: string;
  /** akadze: the FlowsSpec's app and worker; peers: environment of their driver. */
  config: Record<string, unknown>;
  /** Why this entry does not run a shape of these sizes (null: it runs). */
  skip?: (shape: Shape, flags: Flags) => string | null;
  /** akadze: the checkout whose bench/akadze/flows.ts runs it (`--base`), else this one. */
  root?: string;
}

const ENTRIES: readonly Entry[] = [
  // `deno task bench`'s throughput configuration of akadze (bench/run.ts).
  {
    key: "akadze",
    system: "akadze",
    label: "akadze (slots 500, jit=off pool, prepare: true)",
    config: { app: { jit: false, prepare: true }, worker: { slots: 500 } },
  },
  // `deno task bench`'s BullMQ entry: its PostgreSQL guide's advice for throughput.
  {
    key: "bullmq",
    system: "bullmq",
    label: "BullMQ on PostgreSQL (FlowProducer, conc 50, pool 20, removeOnComplete)",
    config: { CONC: 50, POOL: 20, KEEP: 0 },
  },
  // `deno task bench`'s pg-boss entry without LISTEN/NOTIFY (bench/peers/pgboss_flows.mjs);
  // its flow resolver runs every flowIntervalSeconds (1, its smallest), so every layer of a
  // flow waits for a resolver pass.
  {
    key: "pgboss",
    system: "pgboss",
    label: "pg-boss (flow, batch 500, conc 4, polling 0.5 s, flowIntervalSeconds 1)",
    config: { CONC: 4, BATCH: 500 },
    skip: (shape, flags) =>
      shape === "chain" && flags.chain > PGBOSS_CHAIN_MAX
        ? `a chain of ${fmt(flags.chain)} needs one flow-resolver pass (1 s at least) per step, ` +
          `over ${fmt(flags.chain)} s; run with --chain ${PGBOSS_CHAIN_MAX} or less to measure it`
        : null,
  },
];
/** The longest chain pg-boss runs (one resolver pass per step). */
const PGBOSS_CHAIN_MAX = 60;

/** One system's result for one shape (bench/akadze/flows.ts, bench/peers/bullmq_flows.mjs). */
interface FlowResult {
  system: string;
  skipped?: string;
  steps: number;
  edges: number;
  completed: number;
  started_early: number;
  repeats: number;
  enqueue_ms: number;
  enqueue_pg_cpu_ms: number;
  enqueue_wal_bytes: number;
  handlers_ms: number;
  drain_ms: number;
  worker_cpu_ms: number;
  drain_pg_cpu_ms: number;
  drain_wal_bytes: number;
  handoff: { n: number; p50: number | null; p99: number | null; max: number | null };
}

interface Run {
  key: string;
  shape: Shape;
  round: number;
  ok: boolean;
  error?: string;
  result?: FlowResult;
}

function sizeOf(flags: Flags, shape: Shape): number {
  return shape === "fanout" ? flags.fanout : shape === "chain" ? flags.chain : flags.dag;
}

async function runOne(
  entry: Entry,
  shape: Shape,
  round: number,
  flags: Flags,
  serverUrl: string,
  admin: postgres.Sql,
  postmasterPid: number,
): Promise<Run> {
  const run: Run = { key: entry.key, shape, round, ok: false };
  const skipped = entry.skip?.(shape, flags);
  if (skipped) {
    run.ok = true;
    run.result = { system: entry.system, skipped } as FlowResult;
    return run;
  }
  const db = `flows_r${round}_${entry.key.replaceAll("-", "_")}_${shape}`;
  await admin.unsafe(`drop database if exists "${db}" with (force)`);
  await admin.unsafe(`create database "${db}"`);
  const url = serverUrl.replace(/\/postgres$/, `/${db}`);
  const n = sizeOf(flags, shape);
  const timeoutMs = flags.timeout * 1000;
  try {
    let result: FlowResult;
    if (entry.system === "akadze") {
      const spec: FlowsSpec = {
        url,
        shape,
        n,
        layers: flags.layers,
        app: entry.config.app as FlowsSpec["app"],
        worker: entry.config.worker as FlowsSpec["worker"],
        postmasterPid,
      };
      const root = entry.root ?? ROOT;
      result = await runDriver<FlowResult>(`${entry.key} ${shape}`, Deno.execPath(), {
        args: ["run", "--allow-all", `${root}/bench/akadze/flows.ts`, JSON.stringify(spec)],
        env: { BENCH_CLK_TCK: String(CLK_TCK) },
        cwd: root,
        timeoutMs,
      });
    } else {
      const env: Record<string, string> = {
        DATABASE_URL: url,
        SHAPE: shape,
        N: String(n),
        LAYERS: String(flags.layers),
        PG_POSTMASTER_PID: String(postmasterPid),
        BENCH_CLK_TCK: String(CLK_TCK),
      };
      for (const [k, v] of Object.entries(entry.config)) env[k] = String(v);
      result = await runDriver<FlowResult>(`${entry.key} ${shape}`, NODE, {
        args: [`${PEERS_DIR}/drivers/${entry.system}_flows.mjs`],
        env,
        cwd: ROOT,
        timeoutMs,
      });
    }
    run.result = result;
    if (!result.skipped) {
      if (result.completed !== result.steps) {
        throw new Error(`${result.completed} of ${result.steps} jobs completed`);
      }
      if (result.started_early > 0) {
        throw new Error(`${result.started_early} jobs started before their dependencies ended`);
      }
    }
    run.ok = true;
  } catch (error) {
    run.error = error instanceof Error ? error.message : String(error);
  }
  await admin.unsafe(`drop database if exists "${db}" with (force)`).catch(() => {});
  return run;
}

// ---------------------------------------------------------------------------------------
// Report

/** The metrics of the table, from one result. */
const METRICS: { label: string; digits: number; of: (r: FlowResult) => number | null }[] = [
  { label: "jobs", digits: 0, of: (r) => r.steps },
  { label: "dependencies", digits: 0, of: (r) => r.edges },
  { label: "enqueue (one call; plain: 5,000-row calls), ms", digits: 0, of: (r) => r.enqueue_ms },
  { label: "drain wall time, ms", digits: 0, of: (r) => r.drain_ms },
  { label: "enqueue + drain, ms", digits: 0, of: (r) => r.enqueue_ms + r.drain_ms },
  { label: "jobs/s (drain)", digits: 0, of: (r) => r.steps / r.drain_ms * 1000 },
  { label: "hand-off p50, ms", digits: 2, of: (r) => r.handoff?.p50 ?? null },
  { label: "hand-off p99, ms", digits: 2, of: (r) => r.handoff?.p99 ?? null },
  { label: "hand-off samples", digits: 0, of: (r) => r.handoff?.n ?? null },
  {
    label: "PostgreSQL CPU µs/job (drain)",
    digits: 0,
    of: (r) => r.drain_pg_cpu_ms / r.steps * 1000,
  },
  {
    label: "PostgreSQL CPU µs/job (enqueue)",
    digits: 0,
    of: (r) => r.enqueue_pg_cpu_ms / r.steps * 1000,
  },
  { label: "worker CPU µs/job (drain)", digits: 0, of: (r) => r.worker_cpu_ms / r.steps * 1000 },
  {
    label: "WAL bytes/job (enqueue + drain)",
    digits: 0,
    of: (r) => (r.enqueue_wal_bytes + r.drain_wal_bytes) / r.steps,
  },
];

const median = (values: number[]): number | null => {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
};

/** The median over rounds of a metric of one entry and shape (null when none ran). */
function metric(runs: Run[], key: string, shape: Shape, of: (r: FlowResult) => number | null) {
  const values = runs
    .filter((r) => r.key === key && r.shape === shape && r.ok && r.result && !r.result.skipped)
    .map((r) => of(r.result!))
    .filter((v): v is number => v !== null);
  return median(values);
}

interface Target {
  target: string;
  value: string;
  reference: string;
  ratio: number | null;
  met: boolean | null;
}

function targetsOf(runs: Run[]): Target[] {
  const targets: Target[] = [];
  const rate = (r: FlowResult) => r.steps / r.drain_ms * 1000;
  const add = (
    target: string,
    value: number | null,
    ref: number | null,
    refLabel: string,
    factor: number,
    higher: boolean,
    digits = 0,
  ) => {
    const known = value !== null && ref !== null && ref > 0;
    const ratio = known ? value! / ref! : null;
    targets.push({
      target,
      value: fmt(value, digits),
      reference: `${fmt(ref, digits)} (${refLabel})`,
      ratio: ratio === null ? null : Math.round(ratio * 100) / 100,
      met: ratio === null ? null : higher ? ratio >= factor : ratio <= factor,
    });
  };
  const plain = metric(runs, "akadze", "plain", rate);
  for (const shape of ["fanout", "dag"] as const) {
    const a = metric(runs, "akadze", shape, rate);
    add(
      `${shape} jobs/s ≥ 10 × BullMQ's`,
      a,
      metric(runs, "bullmq", shape, rate),
      "BullMQ",
      10,
      true,
    );
    add(`${shape} jobs/s ≥ 0.5 × akadze's plain drain`, a, plain, "plain jobs", 0.5, true);
    add(
      `${shape}: the flow enqueued in ≤ 500 ms`,
      metric(runs, "akadze", shape, (r) => r.enqueue_ms),
      500,
      "ms",
      1,
      false,
    );
  }
  add(
    "chain wall time (drain) ≤ BullMQ's",
    metric(runs, "akadze", "chain", (r) => r.drain_ms),
    metric(runs, "bullmq", "chain", (r) => r.drain_ms),
    "BullMQ, ms",
    1,
    false,
  );
  add(
    "chain hand-off p50 ≤ BullMQ's",
    metric(runs, "akadze", "chain", (r) => r.handoff.p50),
    metric(runs, "bullmq", "chain", (r) => r.handoff.p50),
    "BullMQ, ms",
    1,
    false,
    2,
  );
  return targets;
}

interface Report {
  date: string;
  command: string;
  machine: Awaited<ReturnType<typeof machineInfo>>;
  postgres: Awaited<ReturnType<typeof postgresInfo>>;
  peers: Record<string, string> | null;
  params: Omit<Flags, "out" | "smoke">;
  entries: Entry[];
  runs: Run[];
  targets: Target[];
}

function markdown(report: Report): string {
  const p = report.params;
  const lines = [`# Flows, ${report.date}`, "", `Command: \`${report.command}\``, ""];
  lines.push(...environmentLines(report.machine, report.postgres, report.peers));
  if (report.peers) lines.push(peersLine(report.peers), "");
  lines.push(
    `Shapes: fan-out of ${fmt(p.fanout)} jobs into one that waits for them all; a chain of ` +
      `${fmt(p.chain)}; a DAG of ${fmt(p.dag)} jobs in ${p.layers} layers, each job after the ` +
      `first layer waiting for two of the layer before (BullMQ's flows are trees, a job has one ` +
      `parent: its DAG waits for one, which makes ${fmt(Math.floor(p.dag / p.layers))} chains ` +
      `of ${p.layers}); plain: akadze's drain of ${fmt(p.dag)} independent jobs. Each flow is ` +
      `enqueued in one call before the worker starts (akadze \`app.enqueueFlow\`, one ` +
      `transaction; BullMQ \`FlowProducer.add\`, \`addBulk\` for several trees), then one worker ` +
      `in the same process drains it; a fresh database per system, shape and round; ` +
      `${p.rounds} round(s), medians.`,
    "",
  );
  const shapes: Shape[] = [...p.shapes, "plain"];
  for (const shape of shapes) {
    const shown = report.entries.filter((e) =>
      report.runs.some((r) => r.key === e.key && r.shape === shape)
    );
    if (!shown.length) continue;
    lines.push(`## ${shape}`, "");
    const skipped = shown.flatMap((e) => {
      const r = report.runs.find((x) => x.key === e.key && x.shape === shape);
      return r?.result?.skipped ? [`${e.key}: ${r.result.skipped}`] : [];
    });
    lines.push(`| metric | ${shown.map((e) => e.label).join(" | ")} |`);
    lines.push(`|---|${shown.map(() => "---:").join("|")}|`);
    for (const m of METRICS) {
      const cells = shown.map((e) => fmt(metric(report.runs, e.key, shape, m.of), m.digits));
      lines.push(`| ${m.label} | ${cells.join(" | ")} |`);
    }
    lines.push("");
    if (skipped.length) lines.push(...skipped.map((s) => `- ${s}`), "");
  }
  if (report.targets.length) {
    lines.push("## Targets (medians)", "");
    lines.push("| target | akadze | reference | ratio | met |", "|---|---:|---:|---:|:---:|");
    for (const t of report.targets) {
      const met = t.met === null ? "–" : t.met ? "yes" : "**no**";
      lines.push(`| ${t.target} | ${t.value} | ${t.reference} | ${t.ratio ?? "–"} | ${met} |`);
    }
    lines.push("");
  }
  const failed = report.runs.filter((r) => !r.ok);
  if (failed.length) {
    lines.push("## Errors", "");
    for (const r of failed) lines.push(`- round ${r.round}, ${r.key} ${r.shape}: ${r.error}`);
    lines.push("");
  }
  lines.push(
    "Definitions: enqueue = the one call that inserts the whole flow. Drain = worker start " +
      "until the database shows every job of the flow finished. Hand-off = a job's handler " +
      "start minus the end of its latest dependency's handler (both in the worker's process, " +
      "so it includes the dependency's outcome commit and the dependent's claim). CPU: " +
      "/proc utime+stime, PostgreSQL = all server processes, worker = the driver's process.",
    "",
  );
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------
// Main

/** `deno task bench --scenario flows ...`; returns the exit code. */
export async function runFlows(args: readonly string[]): Promise<number> {
  let flags: Flags;
  try {
    flags = parseFlags(args);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`error: ${error.message}`);
    console.error(
      "usage: deno task bench --scenario flows [--smoke] [--entries akadze,bullmq,pgboss]\n" +
        "       [--shapes fanout,chain,dag] [--fanout N] [--chain N] [--dag N] [--layers L]\n" +
        "       [--rounds R] [--timeout SECONDS] [--out FILE.json] [--pg name=value]...\n" +
        "       [--base DIR]",
    );
    return 2;
  }
  const entries = flags.entries.flatMap((k) => {
    const entry = ENTRIES.find((e) => e.key === k)!;
    // With --base, each akadze entry runs from the other checkout too, right after or before it.
    return entry.system === "akadze" && flags.base
      ? [entry, {
        ...entry,
        key: `base-${k}`,
        label: `${entry.label}, at ${flags.base}`,
        root: flags.base,
      }]
      : [entry];
  });
  const peers = entries.some((e) => e.system !== "akadze") ? await ensurePeers() : null;

  console.error("starting a durable throwaway PostgreSQL ...");
  const server = await startThrowawayPostgres({ durable: true, settings: flags.pg });
  const admin = postgres(server.url, { max: 1, onnotice: () => {} });
  try {
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const postmasterPid = await readPostmasterPid(dir);
    const machine = await machineInfo(dir.replace(/\/data$/, ""));
    const pgInfo = await postgresInfo(admin);
    const runs: Run[] = [];
    const plan: [Entry, Shape][] = [];
    for (const shape of [...flags.shapes, "plain"] as Shape[]) {
      for (const entry of entries) {
        if (shape === "plain" && entry.system !== "akadze") continue;
        plan.push([entry, shape]);
      }
    }
    for (let round = 1; round <= flags.rounds && !wasInterrupted(); round++) {
      // Rotated each round, so that no system always runs first; with --base, each entry and
      // its base run one after the other, in turns first.
      const shift = (round - 1) % plan.length;
      const order = flags.base ? [...plan] : [...plan.slice(shift), ...plan.slice(0, shift)];
      for (let i = 0; flags.base && round % 2 === 0 && i + 1 < order.length; i++) {
        if (order[i + 1][0].key === `base-${order[i][0].key}`) {
          [order[i], order[i + 1]] = [order[i + 1], order[i]];
          i++;
        }
      }
      for (const [entry, shape] of order) {
        if (wasInterrupted()) break;
        console.error(`round ${round}/${flags.rounds}: ${entry.key} ${shape} ...`);
        const run = await runOne(entry, shape, round, flags, server.url, admin, postmasterPid);
        runs.push(run);
        const r = run.result;
        if (!run.ok) console.error(`  FAILED: ${run.error}`);
        else if (r?.skipped) console.error(`  skipped: ${r.skipped}`);
        else if (r) {
          console.error(
            `  ${fmt(r.steps)} jobs: enqueue ${fmt(r.enqueue_ms)} ms, drain ${
              fmt(r.drain_ms)
            } ms ` +
              `(${fmt(r.steps / r.drain_ms * 1000)} jobs/s), hand-off p50 ` +
              `${fmt(r.handoff?.p50 ?? null, 2)} ms p99 ${fmt(r.handoff?.p99 ?? null, 2)} ms`,
          );
        }
      }
    }
    if (wasInterrupted()) return 130;
    const date = new Date().toISOString().slice(0, 10);
    const { out: _o, smoke: _s, ...params } = flags;
    const report: Report = {
      date,
      command: `deno task bench --scenario flows${args.length ? ` ${args.join(" ")}` : ""}`,
      machine,
      postgres: pgInfo,
      peers,
      params,
      entries,
      runs,
      targets: targetsOf(runs),
    };
    const md = markdown(report);
    console.log(md);
    // One summary line per entry and shape (the smoke test reads akadze's).
    for (const [entry, shape] of plan) {
      const r = runs.find((x) => x.key === entry.key && x.shape === shape);
      if (!r) continue;
      if (!r.ok) console.log(`${entry.key} ${shape}: failed: ${r.error}`);
      else if (r.result?.skipped) {
        console.log(`${entry.key} ${shape}: skipped: ${r.result.skipped}`);
      } else {
        const rate = metric(runs, entry.key, shape, (x) => x.steps / x.drain_ms * 1000);
        console.log(`${entry.key} ${shape}: ${fmt(rate)} jobs/s`);
      }
    }
    const out = flags.out ?? (flags.smoke ? undefined : `${BENCH}/results/${date}-flows.json`);
    if (out) {
      await Deno.mkdir(out.slice(0, Math.max(0, out.lastIndexOf("/"))) || ".", { recursive: true });
      await Deno.writeTextFile(out, JSON.stringify(report, null, 2) + "\n");
      await Deno.writeTextFile(out.replace(/(\.json)?$/, ".md"), md);
      console.error(`wrote ${out} and ${out.replace(/(\.json)?$/, ".md")}`);
    }
    return runs.some((r) => !r.ok) ? 1 : 0;
  } finally {
    await admin.end({ timeout: 1 });
    await server.stop();
  }
}
