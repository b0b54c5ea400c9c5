// `deno task bench`: akadze, graphile-worker 0.18, pg-boss 12 and BullMQ 6 (on its PostgreSQL
// backend) side by side on one durable
// throwaway PostgreSQL, interleaved over rounds, each system on a fresh database per round.
// Writes bench/results/<date>.json and .md (see bench/README.md).
//
//   deno task bench [--rounds 3] [--n 50000] [--only akadze,graphile,pgboss,bullmq] [--out FILE]
//                   [--single 1000] [--samples 300] [--warmup 100] [--retained 1000000]
//                   [--idle 30] [--latency-worker in-process|process]
//                   [--timeout 900] [--entries akadze,graphile,...] [--pg name=value]...
//                   [--rtt MS]   # every system reaches the server through a delay of MS round trip
//   deno task bench --smoke     # N=200, 1 round, akadze only, writes nothing unless --out
//   deno task bench --scenario horizon [...]   # the pinned-horizon scenario, bench/horizon.ts
//   deno task bench --scenario flows [...]     # dependent jobs, bench/flows.ts
//   deno task bench --scenario limits [...]    # limit keys at speed, bench/limits.ts
import postgres from "postgres";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import type { DriverSpec } from "./akadze/driver.ts";
import type { WorkerSpec } from "./akadze/worker.ts";
import { release, runDriver, track, wasInterrupted } from "./lib/children.ts";
import { LineReader, LineWriter } from "./lib/lines.ts";
import {
  environmentLines,
  machineCpu,
  type MachineInfo,
  machineInfo,
  ownTreeCpuMs,
  type PostgresInfo,
  postgresInfo,
} from "./lib/machine.ts";
import { ensurePeers, NODE, PEERS_DIR, peersLine } from "./lib/peers.ts";
import { type RemoteServer, startRemote } from "./lib/remote.ts";
import { CLK_TCK, cpuMs, postgresCpuMs, readPostmasterPid } from "./lib/proc.ts";
import {
  cell,
  fmt,
  type MetricName,
  METRICS,
  type Metrics,
  metricsOf,
  type RawResult,
  summarize,
  type Summary,
} from "./lib/report.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const BENCH = `${ROOT}/bench`;

// ---------------------------------------------------------------------------------------
// Flags

type System = "akadze" | "graphile" | "pgboss" | "bullmq";
const SYSTEMS: readonly System[] = ["akadze", "graphile", "pgboss", "bullmq"];

interface Flags {
  smoke: boolean;
  rounds: number;
  n: number;
  only: Set<System>;
  /** Entry keys to run (default: all of the systems in `only`). */
  entries?: Set<string>;
  out?: string;
  single: number;
  samples: number;
  /** Unmeasured repetitions before the single-row and the latency measurements. */
  warmup: number;
  /** Where akadze's latency worker runs: beside the enqueue, like the peers', or apart. */
  latencyWorker: "in-process" | "process";
  batchRows: number;
  retained: number;
  idle: number;
  timeout: number;
  pg: Record<string, string>;
  /** Another checkout of akadze (e.g. main): its akadze entries run too, as `base-KEY`. */
  base?: string;
  /** The database a round trip of this many ms away (0: on the same host, no delay). */
  rtt: number;
}

function usage(message: string): never {
  console.error(`error: ${message}`);
  console.error(
    "usage: deno task bench [--smoke] [--rounds R] [--n N]\n" +
      "       [--only akadze|graphile|pgboss|bullmq[,...]]\n" +
      "       [--out FILE.json] [--single K] [--samples S] [--warmup W] [--retained M]\n" +
      "       [--idle SECONDS] [--latency-worker in-process|process]" +
      " [--timeout SECONDS] [--entries KEY,...] [--pg name=value]... [--base DIR]" +
      " [--rtt MS]",
  );
  Deno.exit(2);
}

function parseFlags(args: string[]): Flags {
  const smoke = args.includes("--smoke");
  const flags: Flags = {
    smoke,
    rounds: smoke ? 1 : 3,
    n: smoke ? 200 : 50_000,
    only: new Set(smoke ? ["akadze"] : SYSTEMS),
    single: smoke ? 20 : 1_000,
    samples: smoke ? 20 : 300,
    warmup: smoke ? 5 : 100,
    latencyWorker: "in-process",
    batchRows: 5_000,
    retained: smoke ? 0 : 1_000_000,
    idle: smoke ? 0 : 30,
    timeout: 900,
    pg: {},
    rtt: 0,
  };
  let onlyGiven = false;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--smoke") continue;
    const [name, inline] = arg.startsWith("--") && arg.includes("=") && !arg.startsWith("--pg=")
      ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)]
      : [arg, undefined];
    const value = () => {
      const v = inline ?? args[++i];
      if (v === undefined) usage(`${name} needs a value`);
      return v;
    };
    const count = (min: number) => {
      const v = value();
      const n = Number(v.replaceAll("_", ""));
      if (!Number.isInteger(n) || n < min) usage(`${name} must be an integer >= ${min}, got ${v}`);
      return n;
    };
    switch (name) {
      case "--rounds":
        flags.rounds = count(1);
        break;
      case "--n":
        flags.n = count(1);
        break;
      case "--single":
        flags.single = count(0);
        break;
      case "--samples":
        flags.samples = count(0);
        break;
      case "--warmup":
        flags.warmup = count(0);
        break;
      case "--latency-worker": {
        const v = value();
        if (v !== "in-process" && v !== "process") {
          usage(`--latency-worker takes in-process or process, got ${v}`);
        }
        flags.latencyWorker = v;
        break;
      }
      case "--batch-rows":
        flags.batchRows = count(1);
        break;
      case "--retained":
        flags.retained = count(0);
        break;
      case "--idle":
        flags.idle = count(0);
        break;
      case "--timeout":
        flags.timeout = count(1);
        break;
      case "--out":
        flags.out = value();
        break;
      case "--only": {
        if (!onlyGiven) flags.only.clear();
        onlyGiven = true;
        for (const s of value().split(",")) {
          if (!SYSTEMS.includes(s as System)) usage(`--only takes ${SYSTEMS.join(", ")}, got ${s}`);
          flags.only.add(s as System);
        }
        break;
      }
      case "--entries":
        flags.entries = new Set(value().split(","));
        break;
      case "--base":
        flags.base = value().replace(/\/$/, "");
        break;
      case "--rtt": {
        const v = value();
        const ms = Number(v);
        if (!Number.isFinite(ms) || ms < 0 || ms > 100) {
          usage(`--rtt takes 0 to 100 (ms), got ${v}`);
        }
        flags.rtt = ms;
        break;
      }
      case "--pg": {
        const v = value();
        const eq = v.indexOf("=");
        if (eq < 1) usage(`--pg takes name=value, got ${v}`);
        flags.pg[v.slice(0, eq)] = v.slice(eq + 1);
        break;
      }
      default:
        usage(`unknown argument ${arg}`);
    }
  }
  return flags;
}

// ---------------------------------------------------------------------------------------
// What runs: one entry per system and configuration.

interface Entry {
  key: string;
  system: System;
  label: string;
  /** akadze: app/worker options; peers: environment of the driver. */
  config: Record<string, unknown>;
  /** akadze: succeeded rows stored in the jobs table before the run. */
  retained?: number;
  /** For the retained case: the entry (same config, empty table) it is compared with. */
  baseline?: string;
  /** akadze: the checkout whose bench/akadze/driver.ts runs it (`--base`), else this one. */
  root?: string;
}

/**
 * Round `round`'s order: the entries rotated by one more each round, then each entry with a
 * baseline moved next to it, after it in odd rounds and before it in even ones, so that
 * their ratio compares neighbouring drains (the machine's speed drifts by tens of per cent
 * over a run) and neither always runs first.
 */
function roundOrder(entries: Entry[], round: number): Entry[] {
  const shift = (round - 1) % entries.length;
  const rotated = [...entries.slice(shift), ...entries.slice(0, shift)];
  const hasBaseline = (e: Entry) => rotated.some((b) => b.key === e.baseline);
  const order = rotated.filter((e) => !hasBaseline(e));
  for (const e of rotated.filter(hasBaseline)) {
    const at = order.findIndex((b) => b.key === e.baseline);
    order.splice(round % 2 === 1 ? at + 1 : at, 0, e);
  }
  return order;
}

/**
 * akadze's configurations. The first is its throughput configuration: the one the targets
 * are checked with, and the one the retained-rows case, the idle measurement and the smoke
 * run use. It prepares its statements (`prepare: true`), as graphile-worker does (its
 * queries are named, so node-postgres prepares them); `akadze-noprep` is the default,
 * `prepare: false`, which PgBouncer in transaction mode needs. `jit: false` hands the app a
 * pool opened with the session setting jit=off
 * (`new Akadze({ sql: postgres(url, { connection: { jit: "off" } }) })`): with PostgreSQL's
 * default JIT the claim statement gets compiled on every call once the queue is large (see
 * bench/README.md).
 */
const AKADZE_CONFIGS: {
  key: string;
  label: string;
  app: DriverSpec["app"];
  worker: DriverSpec["worker"];
  /** Worker instances in the worker process (default 1). */
  instances?: number;
}[] = [
  {
    key: "akadze",
    label: "akadze (slots 500, jit=off pool, prepare: true)",
    app: { jit: false, prepare: true },
    worker: { slots: 500 },
  },
  {
    key: "akadze-noprep",
    label: "akadze (slots 500, jit=off pool, prepare: false)",
    app: { jit: false },
    worker: { slots: 500 },
  },
  {
    key: "akadze-r0",
    label: "akadze (slots 500, jit=off pool, prepare: true, retention 0)",
    app: { jit: false, prepare: true, retention: 0 },
    worker: { slots: 500 },
  },
  {
    key: "akadze-i2",
    label: "akadze (2 workers of slots 500, jit=off pool, prepare: true)",
    app: { jit: false, prepare: true },
    worker: { slots: 500 },
    instances: 2,
  },
  {
    key: "akadze-r0-i2",
    label: "akadze (2 workers of slots 500, jit=off pool, prepare: true, retention 0)",
    app: { jit: false, prepare: true, retention: 0 },
    worker: { slots: 500 },
    instances: 2,
  },
  { key: "akadze-jit", label: "akadze (slots 500, default pool)", app: {}, worker: { slots: 500 } },
  {
    key: "akadze-s50",
    label: "akadze (slots 50, jit=off pool)",
    app: { jit: false },
    worker: { slots: 50 },
  },
];

function entriesFor(flags: Flags): Entry[] {
  const entries: Entry[] = [];
  if (flags.only.has("akadze")) {
    const configs = flags.smoke ? AKADZE_CONFIGS.slice(0, 1) : AKADZE_CONFIGS;
    for (const c of configs) {
      entries.push({
        key: c.key,
        system: "akadze",
        label: c.label,
        config: { app: c.app, worker: c.worker, instances: c.instances },
      });
    }
    if (flags.base) {
      // The same configurations on the other checkout's code, interleaved with these.
      for (const c of configs) {
        entries.push({
          key: `base-${c.key}`,
          system: "akadze",
          label: `${c.label}, at ${flags.base}`,
          config: { app: c.app, worker: c.worker, instances: c.instances },
          root: flags.base,
        });
      }
    }
    if (flags.retained > 0) {
      const c = AKADZE_CONFIGS[0];
      entries.push({
        key: `${c.key}-retained`,
        system: "akadze",
        label: `${c.label}, ${fmt(flags.retained)} rows retained`,
        config: { app: c.app, worker: c.worker },
        retained: flags.retained,
        baseline: c.key,
      });
    }
  }
  if (flags.only.has("graphile")) {
    entries.push({
      key: "graphile",
      system: "graphile",
      label: "graphile-worker (LQ 500, batched, conc 24)",
      config: { CONC: 24, LQ: 500, BATCH: 0 },
    });
  }
  if (flags.only.has("pgboss")) {
    entries.push({
      key: "pgboss",
      system: "pgboss",
      label: "pg-boss (batch 500, notify, burst, conc 4)",
      config: { CONC: 4, BATCH: 500 },
    });
  }
  if (flags.only.has("bullmq")) {
    // Its PostgreSQL guide's advice for throughput: a pool sized for the concurrency and
    // `removeOnComplete` so that finished jobs do not accumulate (bench/README.md).
    entries.push({
      key: "bullmq",
      system: "bullmq",
      label: "BullMQ on PostgreSQL (conc 50, pool 20, removeOnComplete)",
      config: { CONC: 50, POOL: 20, KEEP: 0 },
    });
    entries.push({
      key: "bullmq-keep",
      system: "bullmq",
      label: "BullMQ on PostgreSQL (conc 50, pool 20, completed jobs kept)",
      config: { CONC: 50, POOL: 20, KEEP: 1 },
    });
  }
  return flags.entries ? entries.filter((e) => flags.entries!.has(e.key)) : entries;
}

// ---------------------------------------------------------------------------------------
// Child processes: each driver runs in its own process group (bench/lib/children.ts).

// ---------------------------------------------------------------------------------------
// One entry of one round.

interface RunRecord {
  key: string;
  round: number;
  ok: boolean;
  error?: string;
  wall_ms: number;
  foreign_cpu_pct: number;
  steal_pct: number;
  raw?: RawResult;
  metrics?: Metrics;
}

async function runEntry(
  entry: Entry,
  round: number,
  flags: Flags,
  serverUrl: string,
  admin: postgres.Sql,
  postmasterPid: number,
): Promise<RunRecord> {
  const db = `bench_r${round}_${entry.key.replaceAll("-", "_")}`;
  await admin.unsafe(`drop database if exists "${db}" with (force)`);
  await admin.unsafe(`create database "${db}"`);
  const url = serverUrl.replace(/\/postgres$/, `/${db}`);
  const machine0 = await machineCpu();
  const pg0 = await postgresCpuMs(postmasterPid);
  const own0 = await ownTreeCpuMs();
  const t0 = performance.now();
  const record: RunRecord = {
    key: entry.key,
    round,
    ok: false,
    wall_ms: 0,
    foreign_cpu_pct: NaN,
    steal_pct: NaN,
  };
  const timeoutMs = flags.timeout * 1000;
  try {
    let raw: RawResult;
    if (entry.system === "akadze") {
      const spec: DriverSpec = {
        url,
        n: flags.n,
        batchRows: flags.batchRows,
        single: entry.retained ? 0 : flags.single,
        samples: entry.retained ? 0 : flags.samples,
        warmup: flags.warmup,
        latencyWorker: flags.latencyWorker,
        retained: entry.retained ?? 0,
        app: entry.config.app as DriverSpec["app"],
        worker: entry.config.worker as DriverSpec["worker"],
        instances: entry.config.instances as number | undefined,
        postmasterPid,
      };
      raw = await runDriver<RawResult>(entry.key, Deno.execPath(), {
        args: [
          "run",
          "--allow-all",
          `${entry.root ?? ROOT}/bench/akadze/driver.ts`,
          JSON.stringify(spec),
        ],
        env: { BENCH_CLK_TCK: String(CLK_TCK) },
        cwd: entry.root ?? ROOT,
        timeoutMs,
      });
    } else {
      const script = `${entry.system}.mjs`;
      const env: Record<string, string> = {
        DATABASE_URL: url,
        N: String(flags.n),
        BATCH_ROWS: String(flags.batchRows),
        SINGLE: String(flags.single),
        SAMPLES: String(flags.samples),
        WARMUP: String(flags.warmup),
        PG_POSTMASTER_PID: String(postmasterPid),
        BENCH_CLK_TCK: String(CLK_TCK),
      };
      for (const [k, v] of Object.entries(entry.config)) env[k] = String(v);
      raw = await runDriver<RawResult>(entry.key, NODE, {
        args: [`${PEERS_DIR}/drivers/${script}`],
        env,
        cwd: ROOT,
        timeoutMs,
      });
    }
    if (raw.completed !== flags.n) {
      throw new Error(`${entry.key}: ${raw.completed} of ${flags.n} jobs completed`);
    }
    if (!(raw.drain_ms > 0)) throw new Error(`${entry.key}: no drain time`);
    const wantSamples = entry.retained ? 0 : flags.samples;
    if (wantSamples > 0 && raw.latency?.n !== wantSamples) {
      throw new Error(`${entry.key}: ${raw.latency?.n ?? 0} of ${wantSamples} latency samples`);
    }
    record.raw = raw;
    record.ok = true;
  } catch (error) {
    record.error = error instanceof Error ? error.message : String(error);
  }
  const wall = performance.now() - t0;
  const machine1 = await machineCpu();
  const pg1 = await postgresCpuMs(postmasterPid);
  const own1 = await ownTreeCpuMs();
  const capacity = wall * navigator.hardwareConcurrency;
  const foreign = (machine1.busy - machine0.busy) - (pg1 - pg0) - (own1 - own0);
  record.wall_ms = wall;
  record.foreign_cpu_pct = Math.max(0, foreign / capacity * 100);
  record.steal_pct = (machine1.steal - machine0.steal) / capacity * 100;
  if (record.raw) record.metrics = metricsOf(record.raw, flags.n, record.foreign_cpu_pct);
  await admin.unsafe(`drop database if exists "${db}" with (force)`).catch(() => {});
  return record;
}

// ---------------------------------------------------------------------------------------
// akadze's idle worker: CPU over `seconds` with nothing to do.

async function idleCpu(
  flags: Flags,
  serverUrl: string,
  admin: postgres.Sql,
  postmasterPid: number,
) {
  const db = "bench_idle";
  await admin.unsafe(`drop database if exists "${db}" with (force)`);
  await admin.unsafe(`create database "${db}"`);
  const url = serverUrl.replace(/\/postgres$/, `/${db}`);
  await migrate(url);
  const c = AKADZE_CONFIGS[0];
  const spec: WorkerSpec = { url, mode: "idle", n: 0, app: c.app, worker: c.worker };
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", `${BENCH}/akadze/worker.ts`, JSON.stringify(spec)],
    cwd: ROOT,
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
    detached: true,
  }).spawn();
  track(child);
  const lines = new LineReader(child.stdout);
  const stdin = new LineWriter(child.stdin);
  try {
    const ready = JSON.parse((await lines.next()) ?? "{}");
    if (ready.event !== "ready") throw new Error(`idle worker: ${JSON.stringify(ready)}`);
    const cpu0 = await cpuMs(child.pid);
    const pg0 = await postgresCpuMs(postmasterPid);
    await new Promise((r) => setTimeout(r, flags.idle * 1000));
    if (wasInterrupted()) throw new Error("interrupted");
    const cpu1 = await cpuMs(child.pid);
    const pg1 = await postgresCpuMs(postmasterPid);
    await stdin.write("stop");
    await stdin.close();
    await child.status;
    const workerMs = cpu1 - cpu0;
    return {
      config: c.key,
      seconds: flags.idle,
      worker_cpu_ms: workerMs,
      worker_cpu_pct: workerMs / (flags.idle * 1000) * 100,
      pg_cpu_ms: pg1 - pg0,
    };
  } finally {
    release(child);
    await lines.cancel();
    await admin.unsafe(`drop database if exists "${db}" with (force)`).catch(() => {});
  }
}

// ---------------------------------------------------------------------------------------
// Targets of the performance issue, checked on the medians.

interface Target {
  target: string;
  akadze: string;
  reference: string;
  ratio: number | null;
  met: boolean | null;
}

function targetsOf(
  summary: Record<string, Record<MetricName, Summary>>,
  retainedRatio: Summary | null,
): Target[] {
  const a = summary["akadze"], g = summary["graphile"], b = summary["pgboss"];
  const med = (s: Record<MetricName, Summary> | undefined, m: MetricName) => s?.[m]?.median ?? null;
  const targets: Target[] = [];
  const add = (
    target: string,
    value: number | null,
    ref: number | null,
    refLabel: string,
    ok: (v: number, r: number) => boolean,
    ratio: (v: number, r: number) => number,
    digits = 0,
  ) => {
    const known = value !== null && ref !== null;
    targets.push({
      target,
      akadze: fmt(value, digits),
      reference: `${fmt(ref, digits)} (${refLabel})`,
      ratio: known ? Math.round(ratio(value!, ref!) * 100) / 100 : null,
      met: known ? ok(value!, ref!) : null,
    });
  };
  if (a && g && b) {
    // The best of the peers that ran (BullMQ's entries only when they did).
    const peers: [string, Record<MetricName, Summary>][] = [["graphile-worker", g], ["pg-boss", b]];
    for (const key of ["bullmq", "bullmq-keep"]) {
      if (summary[key]) peers.push([key === "bullmq" ? "BullMQ" : "BullMQ, kept", summary[key]]);
    }
    const better = (m: MetricName, higher: boolean) => {
      let best: { v: number | null; who: string; s?: Record<MetricName, Summary> } = {
        v: null,
        who: "graphile-worker",
      };
      for (const [who, s] of peers) {
        const v = med(s, m);
        if (v === null) continue;
        if (best.v === null || (higher ? v > best.v : v < best.v)) best = { v, who, s };
      }
      return best;
    };
    const drain = better("drain_jobs_per_s", true);
    add(
      "drain jobs/s ≥ 1.3 × better peer",
      med(a, "drain_jobs_per_s"),
      drain.v,
      drain.who,
      (v, r) => v >= 1.3 * r,
      (v, r) => v / r,
    );
    // The same target for the other drain configurations: retention 0 has graphile-worker's
    // semantics (a job is deleted when it succeeds); two workers overlap their claims.
    const variants: [string, string][] = [
      ["akadze-r0", "retention 0"],
      ["akadze-i2", "two workers"],
      ["akadze-r0-i2", "two workers, retention 0"],
    ];
    for (const [key, what] of variants) {
      if (!summary[key]) continue;
      add(
        `drain jobs/s ≥ 1.3 × better peer, akadze with ${what}`,
        med(summary[key], "drain_jobs_per_s"),
        drain.v,
        drain.who,
        (v, r) => v >= 1.3 * r,
        (v, r) => v / r,
      );
    }
    const p50 = better("lat_p50_ms", false);
    const peerP95 = med(p50.s, "lat_p95_ms");
    add(
      "latency p50 ≤ better peer's p50",
      med(a, "lat_p50_ms"),
      p50.v,
      p50.who,
      (v, r) => v <= r,
      (v, r) => v / r,
      2,
    );
    add(
      "latency p95 ≤ 2 × that peer's p95",
      med(a, "lat_p95_ms"),
      peerP95,
      p50.who,
      (v, r) => v <= 2 * r,
      (v, r) => v / r,
      2,
    );
    const single = better("single_rows_per_s", true);
    add(
      "single-row enqueue ≥ better peer",
      med(a, "single_rows_per_s"),
      single.v,
      single.who,
      (v, r) => v >= r,
      (v, r) => v / r,
    );
    add(
      "bulk enqueue ≥ 0.8 × graphile-worker",
      med(a, "bulk_rows_per_s"),
      med(g, "bulk_rows_per_s"),
      "graphile-worker",
      (v, r) => v >= 0.8 * r,
      (v, r) => v / r,
    );
    add(
      `WAL bytes/job (enqueue + drain) ≤ pg-boss (graphile-worker: ${
        fmt(med(g, "wal_total_per_job"))
      })`,
      med(a, "wal_total_per_job"),
      med(b, "wal_total_per_job"),
      "pg-boss",
      (v, r) => v <= r,
      (v, r) => v / r,
    );
  }
  if (retainedRatio?.median !== null && retainedRatio?.median !== undefined) {
    targets.push({
      target: "drain with retained rows ≥ 0.9 × empty table",
      akadze: `${fmt(retainedRatio.median, 2)} ×`,
      reference: "0.90 ×",
      ratio: Math.round(retainedRatio.median * 100) / 100,
      met: retainedRatio.median >= 0.9,
    });
  }
  return targets;
}

// ---------------------------------------------------------------------------------------
// Report.

function markdown(report: Report): string {
  const { entries, summary } = report;
  const shown = entries.filter((e) => summary[e.key]);
  const lines: string[] = [];
  lines.push(`# akadze benchmark, ${report.date}`, "");
  lines.push(`Command: \`${report.command}\``, "");
  lines.push(...environmentLines(report.machine, report.postgres, report.peers));
  lines.push(
    `N = ${fmt(report.params.n)} no-op jobs per drain, bulk enqueue in calls of ` +
      `${fmt(report.params.batchRows)} rows, ${fmt(report.params.single)} single-row enqueues, ` +
      `${report.params.samples} latency samples (each measurement after ${
        report.params.warmup ?? 0
      } ` +
      `unmeasured ones, so that every system's client code runs warm; ` +
      `${latencyWhere(report.params.latencyWorker)}); ` +
      `${report.params.rounds} round(s), systems ` +
      `interleaved (order rotated each round, the retained-rows entry next to its ` +
      `empty-table one, after it and before it in turn), a fresh database per system and round. ` +
      `Cells: median (min–max over rounds).`,
    "",
  );
  if (report.peers) lines.push(peersLine(report.peers), "");
  const rtt = report.params.rtt;
  if (rtt) {
    lines.push(
      `The database ${rtt.ms} ms round trip away: every system connects through a TCP proxy ` +
        `that delays each direction by ${rtt.ms / 2} ms (bench/lib/delay_proxy.py); \`select 1\` ` +
        `took ${fmt(rtt.proxied_ms, 2)} ms through it and ${fmt(rtt.direct_ms, 2)} ms straight ` +
        `(medians of 200).`,
      "",
    );
  }
  lines.push(`| metric | ${shown.map((e) => e.label).join(" | ")} |`);
  lines.push(`|---|${shown.map(() => "---:").join("|")}|`);
  for (
    const [name, def] of Object.entries(METRICS) as [MetricName, (typeof METRICS)[MetricName]][]
  ) {
    const cells = shown.map((e) => cell(summary[e.key]?.[name], def.digits));
    if (cells.every((c) => c === "–")) continue;
    lines.push(`| ${def.label} | ${cells.join(" | ")} |`);
  }
  lines.push("");
  if (report.retained_ratio?.median != null) {
    lines.push(
      `Drain rate with ${fmt(report.params.retained)} succeeded rows retained ÷ empty table ` +
        `(neighbouring runs of the same round): ${cell(report.retained_ratio, 2)}.`,
      "",
    );
  }
  if (report.idle) {
    const i = report.idle;
    lines.push(
      `Idle akadze worker (${i.config}) over ${i.seconds} s: ${fmt(i.worker_cpu_ms)} ms CPU ` +
        `(${fmt(i.worker_cpu_pct, 2)} % of a core); PostgreSQL ${fmt(i.pg_cpu_ms)} ms.`,
      "",
    );
  }
  if (report.targets.length) {
    lines.push("## Targets (medians)", "");
    lines.push("| target | akadze | reference | ratio | met |", "|---|---:|---:|---:|:---:|");
    for (const t of report.targets) {
      lines.push(
        `| ${t.target} | ${t.akadze} | ${t.reference} | ${t.ratio ?? "–"} | ${
          t.met === null ? "–" : t.met ? "yes" : "**no**"
        } |`,
      );
    }
    lines.push("");
  }
  lines.push("## Rounds", "");
  lines.push(
    "| round | order | drain jobs/s per entry | other processes' CPU % |",
    "|---|---|---|---|",
  );
  for (const r of report.rounds) {
    const drains = r.runs.map((x) =>
      `${x.key} ${x.ok ? fmt(x.metrics?.drain_jobs_per_s ?? null) : `failed: ${x.error}`}`
    );
    lines.push(
      `| ${r.round} | ${r.runs.map((x) => x.key).join(" → ")} | ${drains.join("; ")} | ${
        r.runs.map((x) => fmt(x.foreign_cpu_pct)).join(" / ")
      } |`,
    );
  }
  lines.push("");
  if (report.errors.length) {
    lines.push("## Errors", "", ...report.errors.map((e) => `- ${e}`), "");
  }
  lines.push(
    "Definitions: drain = worker start (pool already connected) until the database shows all " +
      "N jobs finished (outcomes committed); the handler-start variant stops the clock at the " +
      "N-th handler call. WAL = pg_current_wal_lsn() differences. Dead tuples = " +
      "pg_stat_user_tables.n_dead_tup of the jobs table(s) 1.5 s after the drain. Peak RSS = " +
      "VmHWM of the worker process after the drain (akadze: the worker runs in its own Deno " +
      "process; peers: their Node process, which also did the enqueue). CPU per 1,000 jobs: " +
      "/proc utime+stime over the drain, PostgreSQL = all server processes. Other processes' " +
      "CPU: machine-wide busy time not spent by this benchmark or its server (noise from " +
      "whatever else ran).",
    "",
  );
  return lines.join("\n");
}

interface Report {
  date: string;
  command: string;
  machine: MachineInfo;
  postgres: PostgresInfo;
  peers: Record<string, string> | null;
  params: {
    n: number;
    rounds: number;
    batchRows: number;
    single: number;
    samples: number;
    warmup?: number;
    latencyWorker: "in-process" | "process";
    retained: number;
    idle: number;
    /** The round trip every system's connections paid, and what `select 1` measured. */
    rtt?: { ms: number; proxied_ms: number; direct_ms: number };
  };
  entries: Entry[];
  rounds: { round: number; runs: RunRecord[] }[];
  summary: Record<string, Record<MetricName, Summary>>;
  retained_ratio: Summary | null;
  idle: Awaited<ReturnType<typeof idleCpu>> | null;
  targets: Target[];
  errors: string[];
}

// ---------------------------------------------------------------------------------------
// Main.

async function main(): Promise<number> {
  const flags = parseFlags(Deno.args);
  const entries = entriesFor(flags);
  if (entries.length === 0) usage("nothing to run");
  const needPeers = entries.some((e) => e.system !== "akadze");
  const peers = needPeers ? await ensurePeers() : null;

  console.error("starting a durable throwaway PostgreSQL ...");
  const server = await startThrowawayPostgres({ durable: true, settings: flags.pg });
  const admin = postgres(server.url, { max: 1, onnotice: () => {} });
  const errors: string[] = [];
  let remote: RemoteServer | undefined;
  try {
    if (flags.rtt > 0) {
      remote = await startRemote(server.url, flags.rtt);
      console.error(
        `every system connects through a ${flags.rtt} ms round-trip delay: select 1 takes ` +
          `${fmt(remote.measured.proxied_ms, 2)} ms through it, ` +
          `${fmt(remote.measured.direct_ms, 2)} ms straight (medians)`,
      );
    }
    const clientUrl = remote?.url ?? server.url;
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const postmasterPid = await readPostmasterPid(dir);
    const machine = await machineInfo(dir.replace(/\/data$/, ""));
    const pgInfo = await postgresInfo(admin);
    console.error(
      `${pgInfo.version.split(" on ")[0]} on port ${server.port}; ${machine.cores} cores, ` +
        `${machine.ram_gib} GiB; fsync ${machine.fsync_8k_ms} ms; load ${machine.loadavg_at_start}`,
    );

    const rounds: Report["rounds"] = [];
    for (let round = 1; round <= flags.rounds && !wasInterrupted(); round++) {
      const order = roundOrder(entries, round);
      const runs: RunRecord[] = [];
      for (const entry of order) {
        if (wasInterrupted()) break;
        console.error(`round ${round}/${flags.rounds}: ${entry.label} ...`);
        const record = await runEntry(entry, round, flags, clientUrl, admin, postmasterPid);
        runs.push(record);
        if (record.ok) {
          const x = record.metrics!;
          console.error(
            `  drain ${fmt(x.drain_jobs_per_s)} jobs/s, bulk ${fmt(x.bulk_rows_per_s)} rows/s, ` +
              `single ${fmt(x.single_rows_per_s)} rows/s, latency p50 ${fmt(x.lat_p50_ms, 2)} ms ` +
              `p95 ${fmt(x.lat_p95_ms, 2)} ms, WAL ${fmt(x.wal_total_per_job)} B/job, ` +
              `other CPU ${fmt(x.foreign_cpu_pct)} %`,
          );
        } else {
          errors.push(`round ${round}, ${entry.key}: ${record.error}`);
          console.error(`  FAILED: ${record.error}`);
        }
      }
      rounds.push({ round, runs });
    }

    const summary: Report["summary"] = {};
    for (const entry of entries) {
      const runs = rounds.flatMap((r) => r.runs).filter((x) => x.key === entry.key && x.ok);
      if (runs.length === 0) continue;
      summary[entry.key] = Object.fromEntries(
        (Object.keys(METRICS) as MetricName[]).map((
          m,
        ) => [m, summarize(runs.map((x) => x.metrics![m]))]),
      ) as Record<MetricName, Summary>;
    }
    let retainedRatio: Summary | null = null;
    const retained = entries.find((e) => e.baseline);
    if (retained) {
      const ratios = rounds.map((r) => {
        const a = r.runs.find((x) => x.key === retained.key)?.metrics?.drain_jobs_per_s;
        const b = r.runs.find((x) => x.key === retained.baseline)?.metrics?.drain_jobs_per_s;
        return a && b ? a / b : NaN;
      });
      retainedRatio = summarize(ratios);
    }

    let idle: Report["idle"] = null;
    if (flags.idle > 0 && flags.only.has("akadze") && !wasInterrupted()) {
      console.error(`idle akadze worker, ${flags.idle} s ...`);
      try {
        idle = await idleCpu(flags, clientUrl, admin, postmasterPid);
        console.error(`  ${fmt(idle.worker_cpu_ms)} ms CPU (${fmt(idle.worker_cpu_pct, 2)} %)`);
      } catch (error) {
        errors.push(`idle: ${error instanceof Error ? error.message : error}`);
      }
    }
    if (wasInterrupted()) {
      console.error("interrupted");
      return 130;
    }

    const date = new Date().toISOString().slice(0, 10);
    const report: Report = {
      date,
      command: `deno task bench${Deno.args.length ? ` ${Deno.args.join(" ")}` : ""}`,
      machine,
      postgres: pgInfo,
      peers,
      params: {
        n: flags.n,
        rounds: flags.rounds,
        batchRows: flags.batchRows,
        single: flags.single,
        samples: flags.samples,
        warmup: flags.warmup,
        latencyWorker: flags.latencyWorker,
        retained: flags.retained,
        idle: flags.idle,
        ...(remote ? { rtt: { ms: remote.rttMs, ...remote.measured } } : {}),
      },
      entries,
      rounds,
      summary,
      retained_ratio: retainedRatio,
      idle,
      targets: targetsOf(summary, retainedRatio),
      errors,
    };
    const md = markdown(report);
    console.log(md);
    for (const e of entries) {
      const d = summary[e.key]?.drain_jobs_per_s;
      if (d) console.log(`${e.key}: drain ${fmt(d.median)} jobs/s (median of ${d.values.length})`);
    }
    const out = flags.out ?? (flags.smoke ? undefined : `${BENCH}/results/${date}.json`);
    if (out) {
      await Deno.mkdir(out.slice(0, Math.max(0, out.lastIndexOf("/"))) || ".", { recursive: true });
      await Deno.writeTextFile(out, JSON.stringify(report, null, 2) + "\n");
      await Deno.writeTextFile(out.replace(/(\.json)?$/, ".md"), md);
      console.error(`wrote ${out} and ${out.replace(/(\.json)?$/, ".md")}`);
    }
    return errors.length ? 1 : 0;
  } finally {
    remote?.stop();
    await admin.end({ timeout: 1 });
    await server.stop();
  }
}

let code: number;
try {
  const scenario = scenarioOf(Deno.args);
  if (scenario.name === "horizon") {
    code = await (await import("./horizon.ts")).runHorizon(scenario.rest);
  } else if (scenario.name === "flows") {
    code = await (await import("./flows.ts")).runFlows(scenario.rest);
  } else if (scenario.name === "limits") {
    code = await (await import("./limits.ts")).runLimits(scenario.rest);
  } else if (scenario.name !== null) {
    usage(`--scenario takes horizon, flows or limits, got ${scenario.name}`);
  } else code = await main();
} catch (error) {
  console.error(`error: ${error instanceof Error ? error.message : error}`);
  code = wasInterrupted() ? 130 : 2;
}
Deno.exit(code);

/** Where the latency samples' workers ran, for the results' header. */
function latencyWhere(latencyWorker: "in-process" | "process"): string {
  return latencyWorker === "in-process"
    ? "every system's latency worker runs in the process that enqueues"
    : "akadze's latency worker runs in a process of its own, the peers' in the process that enqueues";
}

/** `--scenario NAME` (or `--scenario=NAME`) and the other arguments. */
function scenarioOf(args: readonly string[]): { name: string | null; rest: string[] } {
  const rest = [...args];
  const i = rest.findIndex((a) => a === "--scenario" || a.startsWith("--scenario="));
  if (i < 0) return { name: null, rest };
  const [arg] = rest.splice(i, 1);
  const name = arg.includes("=") ? arg.slice(arg.indexOf("=") + 1) : rest.splice(i, 1)[0];
  if (!name) usage("--scenario needs a value");
  return { name, rest };
}
