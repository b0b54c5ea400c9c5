// `deno task chaos [--jobs N] [--workers K] [--minutes M] [--seed S]`: the chaos soak.
//
// On its own throwaway PostgreSQL (whose user gets a password, so the URL every worker
// sees carries one), producers enqueue N mixed jobs (chaos/tasks.ts), flows, and sandboxed
// jobs (CPU-bound ones, crashing ones) in their own transactions while K `akadze worker`
// processes run them under seeded, logged faults:
// SIGKILL of a random worker every 5-15 s (replaced at once), SIGSTOP of one for longer
// than its heartbeatTtl then SIGCONT, pg_terminate_backend of random worker connections,
// one fast restart of PostgreSQL and a few seconds of refused connections. Then the
// faults stop, the queue drains, the workers are stopped with SIGTERM, and the run is
// judged: one PASS/FAIL line per assertion (chaos/analyze.ts) and `N passed, N failed`;
// exit 1 if any failed. See docs/reliability.md.
import { parseArgs } from "node:util";
import postgres from "postgres";
import { Akadze, DuplicateJob, type FlowStep } from "../mod.ts";
import { migrate, setLimit } from "../admin.ts";
import { applyMigrations, MIGRATIONS } from "../src/migrate.ts";
import { describeError, isTransientError, redact } from "../src/db.ts";
import { startThrowawayPostgres, type ThrowawayPostgres } from "../src/testing.ts";
import { crash, startSyncPair, type SyncPair, waitSync } from "../tests/_failover.ts";
import {
  analyze,
  type DbState,
  type Fault,
  type FlowExpect,
  leaseLost,
  type Outage,
  type RunData,
} from "./analyze.ts";
import { Fleet, type WorkerProcess } from "./fleet.ts";
import { CHAOS_SCHEMA, CRASH_HEAP_MB, type Kind, register, TASKS, TICK_EVERY } from "./tasks.ts";

const HELP = `Usage: deno task chaos [--jobs N] [--workers K] [--minutes M] [--seed S]
                       [--failover] [--migrate-from VERSION]

The chaos soak: N mixed jobs, K akadze worker processes, M minutes of seeded faults
(SIGKILL, SIGSTOP/SIGCONT, pg_terminate_backend, a PostgreSQL restart, refused
connections) on a throwaway PostgreSQL; then a drain and one PASS/FAIL line per assertion.

Options:
  --jobs N        jobs to enqueue (default 2000)
  --workers K     worker processes (default 3)
  --minutes M     length of the fault window, decimals allowed (default 3)
  --seed S        seed of the job plan and the fault schedule (default: random, printed)
  --slots N       slots per queue of each worker (default 6)
  --prepare       workers and producers use prepared statements (prepare: true)
  --logs DIR      write the workers' logs there (default: a temporary directory)
  --keep-logs     keep the logs when every assertion passed (they are kept otherwise)
  --failover      the failover phase: a primary and a synchronous standby, everyone on a
                  multi-host URL; at 50 % of the window the primary is stopped hard
                  (pg_ctl stop -m immediate) and the standby promoted; heartbeat TTL 6 s.
                  On by default with --minutes 10 or more (the long profile)
  --no-failover   without the failover phase, whatever the length
  --migrate-from VERSION
                  the migrate phase: the schema starts at VERSION (e.g. 0014_flow_speed)
                  and the release that shipped it runs the workers and producers; at 25 % of
                  the window \`akadze migrate\` brings it to the current schema under load
  -h, --help      show this help

Short profile (CI, about two minutes): --jobs 600 --workers 3 --minutes 1.5 --seed 1
Long profile (about twelve minutes, with the failover phase): --minutes 10`;

// ---------------------------------------------------------------------------------------
// Options

const { values: flags } = parseArgs({
  args: Deno.args,
  options: {
    jobs: { type: "string" },
    workers: { type: "string" },
    minutes: { type: "string" },
    seed: { type: "string" },
    slots: { type: "string" },
    prepare: { type: "boolean" },
    logs: { type: "string" },
    "keep-logs": { type: "boolean" },
    failover: { type: "boolean" },
    "no-failover": { type: "boolean" },
    "migrate-from": { type: "string" },
    help: { type: "boolean", short: "h" },
  },
  strict: true,
});
if (flags.help) {
  console.log(HELP);
  Deno.exit(0);
}
function numberFlag(name: string, text: string | undefined, fallback: number, min: number) {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!Number.isFinite(n) || n < min) {
    console.error(`error: --${name} must be a number ≥ ${min}, got "${text}"`);
    Deno.exit(2);
  }
  return n;
}
const JOBS = Math.floor(numberFlag("jobs", flags.jobs, 2000, 1));
const WORKERS = Math.floor(numberFlag("workers", flags.workers, 3, 2));
const MINUTES = numberFlag("minutes", flags.minutes, 3, 0.5);
const SLOTS = Math.floor(numberFlag("slots", flags.slots, 6, 1));
const PREPARE = flags.prepare ?? false;
const SEED = Math.floor(numberFlag("seed", flags.seed, 1 + Math.floor(Math.random() * 2 ** 31), 0));
const WINDOW = MINUTES * 60_000;
/** The length from which the failover phase is on unless --no-failover (the long profile). */
const FAILOVER_FROM_MINUTES = 10;
/** The failover phase: with --failover, and by default in the long profile. */
if (flags.failover && flags["no-failover"]) {
  console.error("error: --failover and --no-failover exclude each other");
  Deno.exit(2);
}
const FAILOVER = flags.failover ?? (!flags["no-failover"] && MINUTES >= FAILOVER_FROM_MINUTES);
/** The migrate phase: the schema version the run starts at (--migrate-from), if any. */
const MIGRATE_FROM = flags["migrate-from"];
const FROM_INDEX = MIGRATIONS.findIndex((m) => m.version === MIGRATE_FROM);
if (MIGRATE_FROM !== undefined && (FROM_INDEX < 0 || FROM_INDEX === MIGRATIONS.length - 1)) {
  console.error(
    `error: --migrate-from must be an earlier schema version, one of ${
      MIGRATIONS.slice(0, -1).map((m) => m.version).join(", ")
    }; got "${MIGRATE_FROM}"`,
  );
  Deno.exit(2);
}
const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

// Worker timings: short, so that rescues happen within the run.
const HEARTBEAT_INTERVAL = 500;
/**
 * The heartbeat TTL: 3 s, and 6 s with the failover phase. On its multi-host URL a new
 * connection may try the standby first (turned down: not a primary) and, after a round of
 * hosts failed, wait out akadze's pause between rounds (up to 1 s) before it connects: with
 * TTL 3 s, a worker lost its lease on reconnecting to a live primary (connect timeout 1 s: 6 s
 * after the last outage; 2 s: after its connections were terminated, load average 14).
 */
const HEARTBEAT_TTL = FAILOVER ? 6_000 : 3_000;
/**
 * The workers' pool connect timeout, scaled with the TTL as production's defaults are
 * (10 s against 30 s): a query postgres.js routes to a connection killed under it can wait
 * that long (docs/worker.md), and a wait longer than the TTL loses the lease.
 */
const CONNECT_TIMEOUT = HEARTBEAT_TTL / 3;
const POLL_INTERVAL = 250;
const SHUTDOWN_TIMEOUT = 10_000;
/** Allowed on top of heartbeatTtl + heartbeatInterval for the slowest rescue. */
const RESCUE_SLACK = 1_000;
/** Added to that bound per database outage a rescue had to wait through. */
const RECONNECT_ALLOWANCE = 1_000;
// The fault schedule (ms).
const KILL_EVERY: [number, number] = [5_000, 15_000];
const STOP_EVERY: [number, number] = [15_000, 30_000];
const STOP_FOR: [number, number] = [HEARTBEAT_TTL + 1_000, HEARTBEAT_TTL + 2_500];
const TERMINATE_EVERY: [number, number] = [3_000, 10_000];
/** Fractions of the window at which PostgreSQL restarts, then refuses connections. */
const RESTART_AT = 0.35;
const HALT_AT = 0.7;
/** The migrate phase: `akadze migrate` runs at this fraction of the window. */
const MIGRATE_AT = 0.25;
/** The failover phase: the primary is stopped hard at this fraction of the window. */
const FAILOVER_AT = 0.5;
/**
 * How long after the crash the standby is promoted: the time a failover manager takes to
 * decide. Meanwhile no host is a primary: connections wait for one (target_session_attrs).
 */
const PROMOTE_AFTER = 1_000;
/** How long connections are refused (after the server is down, before it starts again). */
const HALT_FOR = 1_500;
/** Producers spread the jobs over this fraction of the window. */
const ENQUEUE_SHARE = 0.8;
const PRODUCERS = 3;
/** maxRunning of the limit keys. */
const LIMITS: Record<string, number> = { "lk-a": 1, "lk-b": 2, "lk-c": 3 };
const UNIQUE_KEYS = 20;
/**
 * The longest time with work ready and no job finishing (assertion 24). An outage (the halt,
 * the failover: crash, PROMOTE_AFTER, promotion) and the reconnect after it make up most of
 * it: measured 0.99 s to 3.10 s in short and long runs (docs/reliability.md); the bound leaves
 * room for a machine at a load average of 18, while any real hang of the queue outlasts it.
 */
const STALL_BOUND = 15_000;
const DRAIN_TIMEOUT = 180_000;
const FINAL_STOP_TIMEOUT = 30_000;
const RSS_LIMIT_MB = 512;
const SAMPLE_EVERY = 50;
const PROGRESS_EVERY = 30_000;

// ---------------------------------------------------------------------------------------
// Seeded randomness (mulberry32), one stream per purpose so each schedule stands alone.

class Rng {
  #state: number;
  constructor(seed: number, stream: number) {
    this.#state = (seed ^ Math.imul(stream + 1, 0x9e3779b1)) >>> 0;
  }
  next(): number {
    let t = (this.#state = (this.#state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  range([min, max]: [number, number]): number {
    return min + (max - min) * this.next();
  }
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }
  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }
}

// ---------------------------------------------------------------------------------------
// The job plan

interface Batch {
  kind: Kind;
  seqs: number[];
  args: Record<string, unknown>[];
  limitKey?: string;
  uniqueBase?: number;
  /** When to enqueue it, ms after the start of the window. */
  at: number;
}

const WEIGHTS: [Kind, number][] = [
  ["quick", 34],
  ["slow", 12],
  ["flaky", 16],
  ["doomed", 5],
  ["limited", 18],
  ["unique", 15],
];

function makePlan(rng: Rng, secret: string): Batch[] {
  const total = WEIGHTS.reduce((a, [, w]) => a + w, 0);
  const batches: Batch[] = [];
  for (let seq = 0; seq < JOBS;) {
    let roll = rng.next() * total;
    const kind = WEIGHTS.find(([, w]) => (roll -= w) < 0)?.[0] ?? "quick";
    const max = {
      quick: 8,
      slow: 2,
      flaky: 4,
      doomed: 1,
      limited: 4,
      unique: 1,
      tick: 1,
      cpu: 1,
      crash: 1,
    }[kind];
    const size = Math.min(JOBS - seq, rng.int(1, max));
    const batch: Batch = { kind, seqs: [], args: [], at: (seq / JOBS) * WINDOW * ENQUEUE_SHARE };
    if (kind === "limited") batch.limitKey = rng.pick(Object.keys(LIMITS));
    if (kind === "unique") batch.uniqueBase = rng.int(0, UNIQUE_KEYS - 1);
    for (let i = 0; i < size; i++, seq++) {
      const args: Record<string, unknown> = { seq };
      if (kind === "quick") args.ms = rng.int(0, 30);
      if (kind === "slow") args.ms = rng.int(1_000, 4_000);
      if (kind === "flaky") args.failures = rng.int(1, 2);
      if (kind === "limited") args.ms = rng.int(100, 600);
      if (kind === "unique") args.ms = rng.int(200, 1_500);
      // A marker that must never reach a log line: logs carry ids, never arguments.
      if (rng.next() < 0.2) args.note = `${secret} (job ${seq})`;
      batch.seqs.push(seq);
      batch.args.push(args);
    }
    batches.push(batch);
  }
  return batches;
}

/** Flow rounds over the enqueue window: each a fan-in of FAN_IN steps and a chain of CHAIN. */
const FLOW_ROUNDS = 3;
const FAN_IN = 50;
const CHAIN = 10;

/** One flow of the plan: its steps (for app.enqueueFlow) and what each must end as. */
interface FlowPlan {
  name: string;
  at: number;
  seqs: number[];
  steps: Record<string, FlowStep>;
  expect: Record<string, FlowExpect>;
}

/**
 * The flows, the same whatever the seed (the seeded plan and faults stay as they were): per
 * round a fan-in of FAN_IN quick steps into a collector, and a chain of CHAIN quick steps.
 * Round 2's chain has an always-failing step (the rest of the chain is cancelled) and its
 * fan-in one failing step that the collector ignores; round 3's fan-in has a failing step
 * that cancels the collector.
 */
function makeFlows(firstSeq: number): FlowPlan[] {
  const flows: FlowPlan[] = [];
  let seq = firstSeq;
  for (let round = 1; round <= FLOW_ROUNDS; round++) {
    const at = ((round - 0.5) / FLOW_ROUNDS) * WINDOW * ENQUEUE_SHARE;
    const fan: FlowPlan = { name: `fanin-${round}`, at, seqs: [], steps: {}, expect: {} };
    const failing = round >= 2 ? "f7" : null;
    for (let i = 0; i < FAN_IN; i++) {
      const name = `f${i}`;
      fan.seqs.push(seq);
      fan.steps[name] = name === failing
        ? { task: TASKS.doomed, args: { seq: seq++ } }
        : { task: TASKS.quick, args: { seq: seq++, ms: (i * 7) % 30 } };
      fan.expect[name] = name === failing ? "fail" : "succeed";
    }
    const onFailure = round === 2 ? "ignore" : "cancel";
    fan.seqs.push(seq);
    fan.steps.collect = {
      task: TASKS.quick,
      args: { seq: seq++, ms: 5 },
      dependsOn: Object.keys(fan.expect).map((step) => ({ step, onFailure })),
    };
    fan.expect.collect = failing && onFailure === "cancel" ? "cancel" : "succeed";
    const chain: FlowPlan = {
      name: `chain-${round}`,
      at: at + 1_000,
      seqs: [],
      steps: {},
      expect: {},
    };
    const doomedAt = round === 2 ? 4 : -1;
    for (let i = 0; i < CHAIN; i++) {
      chain.seqs.push(seq);
      chain.steps[`c${i}`] = {
        task: i === doomedAt ? TASKS.doomed : TASKS.quick,
        args: i === doomedAt ? { seq: seq++ } : { seq: seq++, ms: 20 },
        ...(i > 0 ? { dependsOn: [`c${i - 1}`] } : {}),
      };
      chain.expect[`c${i}`] = i === doomedAt
        ? "fail"
        : doomedAt >= 0 && i > doomedAt
        ? "cancel"
        : "succeed";
    }
    flows.push(fan, chain);
  }
  return flows;
}

/** One CPU-bound sandboxed job per this much of the window (ms), at least two. */
const CPU_EVERY = 15_000;
/** How long each CPU-bound job computes without yielding: longer than the heartbeat TTL. */
const CPU_MS = HEARTBEAT_TTL + 1_000;
/** One crashing sandboxed job per this much of the window (ms), at least two. */
const CRASH_EVERY = 30_000;
/** How long a crashing job runs before it crashes: its worker's other jobs run meanwhile. */
const CRASH_AFTER = 1_500;

/**
 * The sandboxed jobs, evenly over the enqueue window and the same whatever the seed (the
 * seeded plan stays as it was): CPU-bound ones (chaos.cpu, in a thread) and crashing ones
 * (chaos.crash, in a process), which crash by `Deno.exit(3)` and by running out of their
 * heap cap in turn.
 */
function makeSandboxed(firstSeq: number): Batch[] {
  const batches: Batch[] = [];
  let seq = firstSeq;
  const spread = (kind: Kind, count: number, offset: number, args: (i: number) => object) => {
    for (let i = 0; i < count; i++) {
      batches.push({
        kind,
        seqs: [seq],
        args: [{ seq: seq++, ...args(i) }],
        at: ((i + offset) / count) * WINDOW * ENQUEUE_SHARE,
      });
    }
  };
  spread("cpu", Math.max(2, Math.round(WINDOW / CPU_EVERY)), 0.5, () => ({ ms: CPU_MS }));
  spread("crash", Math.max(2, Math.round(WINDOW / CRASH_EVERY)), 0.3, (i) => ({
    oom: i % 2 === 1,
    ms: CRASH_AFTER,
  }));
  return batches;
}

// ---------------------------------------------------------------------------------------
// Helpers

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)));
let t0 = Date.now();
const rel = (at: number) => `+${((at - t0) / 1000).toFixed(1)}s`.padStart(8);
const secs = (ms: number, digits = 1) => `${(ms / 1000).toFixed(digits)} s`;

/**
 * Copy the code under test (with a link to node_modules), so that the workers this run
 * starts, some of them minutes in, all run the tree as it was at the start, whatever
 * happens to the working tree meanwhile. Returns the copy's root and a description.
 */
async function snapshotCode(root: string, into: string): Promise<[string, string]> {
  const dir = `${into}/code`;
  await Deno.mkdir(dir, { recursive: true });
  const entries: string[] = [];
  for (
    const name of [
      "cli.ts",
      "mod.ts",
      "admin.ts",
      "deno.json",
      "deno.lock",
      "src",
      "migrations",
      "chaos",
    ]
  ) {
    if (await Deno.lstat(`${root}/${name}`).then(() => true, () => false)) {
      entries.push(`${root}/${name}`);
    }
  }
  const copy = await new Deno.Command("cp", { args: ["-r", ...entries, dir], stderr: "piped" })
    .output();
  if (!copy.success) {
    throw new Error(`could not copy the code: ${new TextDecoder().decode(copy.stderr).trim()}`);
  }
  await Deno.symlink(`${root}/node_modules`, `${dir}/node_modules`).catch(() => {});
  const git = async (...args: string[]) => {
    const out = await new Deno.Command("git", { args, cwd: root, stdout: "piped", stderr: "null" })
      .output().catch(() => null);
    return out?.success ? new TextDecoder().decode(out.stdout).trim() : "";
  };
  const head = await git("rev-parse", "--short", "HEAD");
  const changed = (await git("status", "--porcelain")).split("\n").filter(Boolean).length;
  return [dir, head ? `git ${head} + ${changed} uncommitted changes` : "not a git checkout"];
}

/**
 * The release that ran on the schema at MIGRATE_FROM: the newest commit of the branch's
 * first-parent history whose migrations/ holds exactly the versions up to it, unpacked
 * with this run's chaos/ (its tasks and tables) the way snapshotCode lays the code out.
 * Its workers and producers run until `akadze migrate` has run.
 */
async function releaseCode(root: string, code: string, into: string): Promise<[string, string]> {
  const git = async (...args: string[]) => {
    const out = await new Deno.Command("git", { args, cwd: root, stdout: "piped", stderr: "piped" })
      .output();
    if (!out.success) {
      throw new Error(`git ${args[0]}: ${new TextDecoder().decode(out.stderr).trim()}`);
    }
    return new TextDecoder().decode(out.stdout).trim();
  };
  const want = MIGRATIONS.slice(0, FROM_INDEX + 1).map((m) => `migrations/${m.version}.sql`);
  let commit: string | undefined;
  for (const c of (await git("log", "--first-parent", "--format=%h", "HEAD")).split("\n")) {
    const files = (await git("ls-tree", "--name-only", c, "migrations/")).split("\n")
      .filter((f) => f.endsWith(".sql")).sort();
    if (files.join("\n") === want.join("\n")) {
      commit = c;
      break;
    }
  }
  if (!commit) {
    throw new Error(
      `no commit of this branch's history ships exactly the migrations up to ${MIGRATE_FROM} ` +
        "(a later version landed before it): choose another --migrate-from",
    );
  }
  const dir = `${into}/release-code`;
  await Deno.mkdir(dir, { recursive: true });
  const paths = ["cli.ts", "mod.ts", "admin.ts", "deno.json", "deno.lock", "src", "migrations"];
  const unpack = await new Deno.Command("bash", {
    args: ["-c", `git archive "$1" -- "\${@:2}" | tar -x -C "${dir}"`, "bash", commit, ...paths],
    cwd: root,
    stderr: "piped",
  }).output();
  if (!unpack.success) {
    throw new Error(`git archive ${commit}: ${new TextDecoder().decode(unpack.stderr).trim()}`);
  }
  const copy = await new Deno.Command("cp", { args: ["-r", `${code}/chaos`, dir] }).output();
  if (!copy.success) throw new Error("could not copy chaos/ into the release's code");
  await Deno.symlink(`${root}/node_modules`, `${dir}/node_modules`).catch(() => {});
  return [dir, `git ${commit} (schema ${MIGRATE_FROM})`];
}

/** The extra environment of the workers; `release`: of the migrate phase's release. */
function workerEnv(release: boolean): Record<string, string> {
  return {
    ...(PREPARE ? { AKADZE_CHAOS_PREPARE: "1" } : {}),
    ...(release ? { AKADZE_CHAOS_RELEASE: "1" } : {}),
    AKADZE_CHAOS_CONNECT_TIMEOUT: String(CONNECT_TIMEOUT / 1000),
  };
}

/** `url` with an application_name (the URL may be multi-host, which URL cannot parse). */
function withAppName(url: string, name: string): string {
  return `${url}${url.includes("?") ? "&" : "?"}application_name=${name}`;
}

/** Retry a harness query through outages (the harness is not under test). */
async function retrying<T>(what: string, fn: () => Promise<T>, timeoutMs = 60_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (error) {
      if (Date.now() > until) throw new Error(`${what}: ${describeError(error)}`);
      harnessMessages.push(String((error as Error)?.message ?? error));
      await sleep(250);
    }
  }
}

// ---------------------------------------------------------------------------------------
// State shared by the phases

const faults: Fault[] = [];
const outages: Outage[] = [];
const harnessMessages: string[] = [];
const producerErrors: string[] = [];
const samples = {
  count: 0,
  failed: 0,
  lockWaits: [] as string[],
  maxRunning: {} as Record<string, number>,
  uniqueViolations: [] as string[],
  heartbeats: [] as { at: number; ages: Record<string, number> }[],
};
interface LockWait {
  app: string;
  pid: number;
  query_start: string;
  waited: number;
  query: string;
  blockers: { app: string; pid: number; state: string; query: string }[] | null;
  at?: number;
}
const lockWaits = new Map<string, LockWait>();
let chaosOver = false;
let stopping = false;
/** Jobs the producers enqueue: the plan's and the flows' steps. */
let planned = JOBS;
const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);
let dbDown = false;

function logFault(fault: Fault): void {
  faults.push(fault);
  const who = fault.idx === undefined ? "" : `w${fault.idx} (pid ${fault.pid})`;
  console.log(`${rel(fault.at)}  ${fault.kind.padEnd(9)} ${who} ${fault.detail ?? ""}`.trimEnd());
}

/** Sleep `ms` unless the chaos window ends first; false once it has. */
async function pause(ms: number): Promise<boolean> {
  const until = Math.min(Date.now() + ms, t0 + WINDOW);
  while (!chaosOver && Date.now() < until) await sleep(Math.min(200, until - Date.now()));
  return !chaosOver && Date.now() < t0 + WINDOW;
}

// ---------------------------------------------------------------------------------------
// Main

const password = `pw${crypto.randomUUID().replaceAll("-", "")}`;
const secret = `CHAOS-SECRET-${crypto.randomUUID().slice(0, 13)}`;
const logDir = flags.logs ?? await Deno.makeTempDir({ prefix: `akadze-chaos-${SEED}-` });
await Deno.mkdir(logDir, { recursive: true });

console.log(
  `akadze chaos: seed ${SEED}, ${JOBS} jobs, ${WORKERS} workers × ${SLOTS} slots per queue, ` +
    `${MINUTES} min of faults; heartbeat ${secs(HEARTBEAT_INTERVAL)}, ` +
    `TTL ${secs(HEARTBEAT_TTL)}, connect timeout ${secs(CONNECT_TIMEOUT)}` +
    (PREPARE ? "; prepared statements" : "") + (FAILOVER ? "; failover phase" : "") +
    (MIGRATE_FROM ? `; migrate phase from ${MIGRATE_FROM}` : ""),
);
console.log(
  `rerun: deno task chaos --jobs ${JOBS} --workers ${WORKERS} --minutes ${MINUTES} ` +
    `--seed ${SEED}${flags.slots ? ` --slots ${SLOTS}` : ""}${PREPARE ? " --prepare" : ""}` +
    (FAILOVER ? " --failover" : MINUTES >= FAILOVER_FROM_MINUTES ? " --no-failover" : "") +
    (MIGRATE_FROM ? ` --migrate-from ${MIGRATE_FROM}` : ""),
);

let pg: ThrowawayPostgres | undefined;
let pair: SyncPair | undefined;
let fleet: Fleet | undefined;
let app: Akadze | undefined;
/** With the migrate phase: the producers' app of the release the run starts at. */
let releaseApp: Akadze | undefined;
let sampler: postgres.Sql | undefined;
let exitCode = 1;
let migration:
  | { from: string; at: number | null; to: number | null; error: string | null }
  | undefined;

Deno.addSignalListener("SIGINT", async () => {
  console.log("interrupted: stopping the workers and the server");
  await fleet?.killAll();
  await (pair ?? pg)?.stop();
  Deno.exit(130);
});

try {
  // --- The server, with a password in the URL.
  // With the failover phase: a primary and a synchronous standby, and everyone but the
  // set-up on a multi-host URL that finds the primary, as docs/production.md advises.
  const settings = { max_connections: 400 };
  if (FAILOVER) {
    pair = await startSyncPair({ settings, databases: ["chaos"] });
    pg = pair.primary;
  } else {
    pg = await startThrowawayPostgres({ settings });
  }
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  if (!pair) await admin.unsafe("create database chaos");
  await admin.unsafe(`alter user postgres password '${password}'`);
  await admin.end({ timeout: 1 });
  const direct = `postgres://postgres:${password}@127.0.0.1:${pg.port}/chaos`;
  const url = pair
    ? `postgres://postgres:${password}@127.0.0.1:${pair.primary.port},` +
      `127.0.0.1:${pair.standby.port}/chaos?target_session_attrs=primary`
    : direct;
  console.log(
    `server: PostgreSQL ${pg.version} (${pg.engine} binaries), ${redact(url)}` +
      `${pair ? " (primary, synchronous standby)" : ""}; logs in ${logDir}`,
  );
  if (MIGRATE_FROM) await applyMigrations(direct, MIGRATIONS.slice(0, FROM_INDEX + 1));
  else await migrate(direct);
  const setup = postgres(direct, { max: 1, onnotice: () => {} });
  await setup.unsafe(CHAOS_SCHEMA);
  await setup.end({ timeout: 1 });

  // --- The code under test, snapshotted; with the migrate phase also the release whose
  // schema the run starts at, whose workers and producers run until the migration.
  const [code, described] = await snapshotCode(ROOT, logDir);
  console.log(`code: ${described}, copied to ${code}`);
  const [release, releaseDescribed] = MIGRATE_FROM
    ? await releaseCode(ROOT, code, logDir)
    : [code, ""];
  if (MIGRATE_FROM) {
    console.log(
      `migrate phase: schema at ${MIGRATE_FROM}; until akadze migrate runs at ` +
        `${MIGRATE_AT * 100} % of the window, workers and producers run ${releaseDescribed}`,
    );
  }
  const Release = MIGRATE_FROM
    ? await import(`${release}/mod.ts`) as typeof import("../mod.ts")
    : undefined;
  const harnessApp = (Class: typeof Akadze) => {
    const made = new Class({
      databaseUrl: withAppName(url, "chaos_harness"),
      max: 8,
      prepare: PREPARE,
    });
    made.include({ register });
    return made;
  };
  app = harnessApp(Release?.Akadze ?? Akadze);
  releaseApp = Release ? app : undefined;
  for (const [key, maxRunning] of Object.entries(LIMITS)) {
    await setLimit(app.sql, key, { maxRunning });
  }
  sampler = postgres(withAppName(url, "chaos_sampler"), {
    max: 1,
    connect_timeout: 2,
    onnotice: () => {},
  });
  const rng = {
    plan: new Rng(SEED, 1),
    kill: new Rng(SEED, 2),
    stop: new Rng(SEED, 3),
    terminate: new Rng(SEED, 4),
  };
  const plan = makePlan(rng.plan, secret);
  const flows = makeFlows(JOBS);
  const flowSteps = sum(flows.map((f) => f.seqs.length));
  const sandboxed = makeSandboxed(JOBS + flowSteps);
  plan.push(...sandboxed);
  plan.sort((a, b) => a.at - b.at);
  const kinds: Record<string, number> = {};
  for (const b of plan) kinds[b.kind] = (kinds[b.kind] ?? 0) + b.seqs.length;
  kinds["flow steps"] = flowSteps;
  planned = JOBS + flowSteps + sandboxed.length;
  console.log(
    `plan: ${Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ")} in ${plan.length} ` +
      `enqueue transactions over ${secs(WINDOW * ENQUEUE_SHARE)}; limits ${
        Object.entries(LIMITS).map(([k, n]) => `${k}≤${n}`).join(" ")
      }; ${UNIQUE_KEYS} unique keys`,
  );

  // --- The workers.
  const activeFleet = fleet = new Fleet({
    root: release,
    url,
    workerArgs: [
      "--queue",
      "default,slow",
      "--slots",
      String(SLOTS),
      "--heartbeat-interval",
      String(HEARTBEAT_INTERVAL / 1000),
      "--heartbeat-ttl",
      String(HEARTBEAT_TTL / 1000),
      "--poll-interval",
      String(POLL_INTERVAL / 1000),
      "--shutdown-timeout",
      String(SHUTDOWN_TIMEOUT / 1000),
      "--log-format",
      "json",
      "--log-level",
      "debug",
    ],
    logDir,
    env: workerEnv(MIGRATE_FROM !== undefined),
    onUnexpectedExit(w) {
      const lost = leaseLost({
        faults,
        outages,
        heartbeatTtl: HEARTBEAT_TTL,
        heartbeatInterval: HEARTBEAT_INTERVAL,
      }, w);
      const fresh = stopping ? undefined : activeFleet.spawn();
      console.log(
        `${rel(Date.now())}  EXIT      w${w.idx} (pid ${w.pid}) code ${w.code} signal ${w.signal}` +
          (lost === "stop"
            ? " — lease lost while stopped (expected)"
            : lost === "outage"
            ? " — lease lost while the database was down (expected)"
            : " — UNEXPECTED") +
          (fresh ? ` → replaced by w${fresh.idx} (pid ${fresh.pid})` : ""),
      );
    },
  });
  for (let i = 0; i < WORKERS; i++) fleet.spawn();
  let appSql = app.sql;
  await retrying("the workers to register", async () => {
    const [{ n }] = await appSql`select count(*)::int as n from akadze.workers`;
    if (n < WORKERS) throw new Error(`${n} of ${WORKERS} workers registered`);
  });

  // --- The chaos window.
  t0 = Date.now();
  console.log(`${rel(t0)}  start     ${WORKERS} workers registered; producers and faults on`);
  let next = 0;
  const produceOne = async (batch: Batch): Promise<void> => {
    // The migrate phase's release may not know a task (chaos.crash): the current code does.
    if (!app!.tasks.has(TASKS[batch.kind])) await migrated;
    const task = app!.tasks.get(TASKS[batch.kind])!;
    for (;;) {
      try {
        await appSql.begin(async (tx) => {
          let ids: string[];
          let uniqueKey: string | null = null;
          if (batch.kind === "unique") {
            let id: string | undefined;
            for (let k = 0; k < UNIQUE_KEYS && id === undefined; k++) {
              const key = `uk-${(batch.uniqueBase! + k) % UNIQUE_KEYS}`;
              try {
                id = await task.using({ session: tx, uniqueKey: key }).enqueue(batch.args[0]);
                uniqueKey = key;
              } catch (error) {
                // (The release's producers throw the release's DuplicateJob.)
                if (!(error instanceof DuplicateJob || (error as Error)?.name === "DuplicateJob")) {
                  throw error;
                }
                // The refusal left the transaction usable: record it in it.
                await tx`insert into chaos.duplicates (seq, unique_key)
                         values (${batch.seqs[0]}, ${key})`;
              }
            }
            id ??= await task.using({ session: tx }).enqueue(batch.args[0]);
            ids = [id];
          } else {
            const using = task.using({
              session: tx,
              ...(batch.limitKey ? { limitKey: batch.limitKey } : {}),
            });
            ids = batch.seqs.length === 1
              ? [await using.enqueue(batch.args[0])]
              : await using.enqueueMany(batch.args);
          }
          const rows = ids.map((id, i) => ({
            seq: batch.seqs[i],
            kind: batch.kind,
            job_id: id,
            unique_key: uniqueKey,
            limit_key: batch.limitKey ?? null,
            secret: "note" in batch.args[i],
          }));
          await tx`insert into chaos.expected ${tx(rows)}`;
        });
        return;
      } catch (error) {
        if (!isTransientError(error)) {
          producerErrors.push(`seq ${batch.seqs[0]} (${batch.kind}): ${describeError(error)}`);
          return;
        }
        harnessMessages.push(String((error as Error)?.message ?? error));
        // The commit may have happened before the connection broke: look.
        const [row] = await retrying(
          "an enqueue check",
          () => appSql`select 1 from chaos.expected where seq = ${batch.seqs[0]}`,
        );
        if (row) return;
        await sleep(250);
      }
    }
  };
  // A flow and its bookkeeping in one transaction: chaos.expected for every step, and
  // chaos.flow_steps with each step's dependencies (job ids) and the outcome it must reach.
  const produceFlow = async (flow: FlowPlan): Promise<void> => {
    for (;;) {
      try {
        await appSql.begin(async (tx) => {
          const { jobs } = await app!.enqueueFlow(flow.steps, { session: tx });
          const names = Object.keys(flow.steps);
          await tx`insert into chaos.expected ${
            tx(names.map((name) => ({
              seq: (flow.steps[name].args as { seq: number }).seq,
              kind: flow.steps[name].task === TASKS.doomed ? "doomed" : "quick",
              job_id: jobs[name],
              unique_key: null,
              limit_key: null,
              secret: false,
            })))
          }`;
          await tx`insert into chaos.flow_steps ${
            tx(names.map((name) => ({
              job_id: jobs[name],
              flow: flow.name,
              step: name,
              deps: `{${
                (flow.steps[name].dependsOn ?? []).map((d) =>
                  jobs[typeof d === "string" ? d : d.step!]
                ).join(",")
              }}`,
              expect: flow.expect[name],
            })))
          }`;
        });
        return;
      } catch (error) {
        if (!isTransientError(error)) {
          producerErrors.push(`flow ${flow.name}: ${describeError(error)}`);
          return;
        }
        harnessMessages.push(String((error as Error)?.message ?? error));
        const [row] = await retrying(
          "an enqueue check",
          () => appSql`select 1 from chaos.expected where seq = ${flow.seqs[0]}`,
        );
        if (row) return;
        await sleep(250);
      }
    }
  };
  const producers = Promise.all([
    ...Array.from({ length: PRODUCERS }, async () => {
      while (next < plan.length) {
        const batch = plan[next++];
        await sleep(t0 + batch.at - Date.now());
        await produceOne(batch);
      }
    }),
    (async () => {
      for (const flow of flows) {
        await sleep(t0 + flow.at - Date.now());
        await produceFlow(flow);
      }
    })(),
  ]);

  const sampleSql = sampler;
  const sampling = (async () => {
    while (!stopping) {
      try {
        const [row] = await sampleSql.unsafe(`
          select
            pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())
              operator(pg_catalog.*) 1000 as at,
            coalesce((select pg_catalog.json_object_agg(w.id, pg_catalog.round(
                pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()
                  operator(pg_catalog.-) w.heartbeat_at) operator(pg_catalog.*) 1000))
              from akadze.workers w), '{}'::pg_catalog.json) as beats,
            coalesce((select json_object_agg(k, n) from (
              select limit_key as k, count(*)::int as n from akadze.jobs
               where state = 'running' and limit_key is not null group by 1) x), '{}') as running,
            coalesce((select json_agg(k) from (
              select unique_key as k from akadze.jobs
               where state in ('queued', 'running') and unique_key is not null
               group by 1 having count(*) > 1) y), '[]') as dups,
            coalesce((select json_agg(w) from (
              select a.application_name as app, a.pid, a.query_start,
                     extract(epoch from now() - a.query_start)::float8 as waited,
                     left(regexp_replace(a.query, '\s+', ' ', 'g'), 90) as query,
                     (select json_agg(json_build_object('app', b.application_name, 'pid', b.pid,
                        'state', b.state, 'query',
                        left(regexp_replace(b.query, '\s+', ' ', 'g'), 90)))
                        from pg_stat_activity b where b.pid = any(pg_blocking_pids(a.pid)))
                       as blockers
                from pg_stat_activity a
               where a.wait_event_type = 'Lock' and a.datname = 'chaos'
                 and a.query_start < now() - interval '1 second') w), '[]') as waits`);
        samples.count++;
        samples.heartbeats.push({ at: Number(row.at), ages: row.beats });
        for (const [key, n] of Object.entries(row.running as Record<string, number>)) {
          samples.maxRunning[key] = Math.max(samples.maxRunning[key] ?? 0, n);
        }
        for (const key of row.dups as string[]) {
          samples.uniqueViolations.push(`${rel(Date.now())}: uniqueKey ${key} active twice`);
        }
        for (const w of row.waits as LockWait[]) {
          const id = `${w.pid}@${w.query_start}`;
          const seen = lockWaits.get(id);
          if (!seen || seen.waited < w.waited) lockWaits.set(id, { ...w, at: Date.now() });
        }
      } catch {
        samples.failed++;
        await sleep(200);
      }
      await sleep(SAMPLE_EVERY);
    }
  })();

  const rssLoop = (async () => {
    while (!stopping) {
      await activeFleet.sampleRss();
      await sleep(1_000);
    }
  })();

  const killLoop = async () => {
    while (await pause(rng.kill.range(KILL_EVERY))) {
      const candidates = activeFleet.live().filter((w) => !w.stopped && w.endedBy === null);
      if (candidates.length === 0) continue;
      const w = rng.kill.pick(candidates);
      await activeFleet.sampleRss();
      w.endedBy = "kill";
      w.send("SIGKILL");
      const fresh = activeFleet.spawn();
      logFault({
        at: Date.now(),
        kind: "kill",
        idx: w.idx,
        pid: w.pid,
        detail: `→ replaced by w${fresh.idx} (pid ${fresh.pid})`,
      });
    }
  };
  /** Workers let go after a SIGSTOP: each will exit 1 once it notices its lost lease. */
  const resumed = new Set<WorkerProcess>();
  const stopLoop = async () => {
    while (await pause(rng.stop.range(STOP_EVERY))) {
      const candidates = activeFleet.live().filter((w) => !w.stopped && w.endedBy === null);
      if (candidates.length === 0) continue;
      const w = rng.stop.pick(candidates);
      const forMs = rng.stop.range(STOP_FOR);
      w.stopped = true;
      w.send("SIGSTOP");
      logFault({
        at: Date.now(),
        kind: "stop",
        idx: w.idx,
        pid: w.pid,
        detail: `for ${secs(forMs)}`,
      });
      await sleep(forMs);
      w.send("SIGCONT");
      w.stopped = false;
      resumed.add(w);
      logFault({ at: Date.now(), kind: "cont", idx: w.idx, pid: w.pid });
    }
  };
  const terminateLoop = async () => {
    while (await pause(rng.terminate.range(TERMINATE_EVERY))) {
      const candidates = activeFleet.live().filter((w) => w.endedBy === null);
      if (dbDown || candidates.length === 0) continue;
      const w = rng.terminate.pick(candidates);
      const all = rng.terminate.next() < 0.3;
      try {
        const pids = (await appSql`
          select pid from pg_stat_activity
           where datname = 'chaos' and application_name = ${`chaos_w${w.idx}`}`)
          .map((r) => r.pid as number);
        // All of them, or a random non-empty part.
        const chosen = all ? pids : pids.filter(() => rng.terminate.next() < 0.5);
        if (chosen.length === 0 && pids.length > 0) chosen.push(rng.terminate.pick(pids));
        if (chosen.length === 0) continue;
        const [{ n }] = await appSql`
          select count(*) filter (where pg_terminate_backend(pid))::int as n
            from unnest(${chosen}::int[]) as pid`;
        logFault({
          at: Date.now(),
          kind: "terminate",
          idx: w.idx,
          pid: w.pid,
          count: n,
          detail: `${n} of ${pids.length} connections`,
        });
      } catch (error) {
        harnessMessages.push(String((error as Error)?.message ?? error));
      }
    }
  };
  const serverLoop = async (primary: ThrowawayPostgres) => {
    let server = primary;
    await migrated;
    if (!await pause(t0 + RESTART_AT * WINDOW - Date.now())) return;
    dbDown = true;
    let from = Date.now();
    await server.restart();
    // Commits wait for the synchronous standby: the outage lasts until it streams again.
    if (pair) await waitSync(server);
    let to = Date.now();
    dbDown = false;
    outages.push({ kind: "restart", from, to });
    logFault({ at: from, kind: "restart", detail: `fast restart, down ${secs(to - from, 2)}` });
    if (pair) {
      if (!await pause(t0 + FAILOVER_AT * WINDOW - Date.now())) return;
      dbDown = true;
      from = Date.now();
      await crash(pair.primary);
      await sleep(PROMOTE_AFTER);
      await pair.standby.promote();
      server = pair.standby;
      to = Date.now();
      dbDown = false;
      outages.push({ kind: "failover", from, to });
      logFault({
        at: from,
        kind: "failover",
        detail: `primary stopped hard (immediate), standby promoted ${secs(to - from, 2)} later`,
      });
    }
    if (!await pause(t0 + HALT_AT * WINDOW - Date.now())) return;
    dbDown = true;
    from = Date.now();
    await server.halt();
    await sleep(HALT_FOR);
    await server.resume();
    to = Date.now();
    dbDown = false;
    outages.push({ kind: "halt", from, to });
    logFault({ at: from, kind: "halt", detail: `connections refused for ${secs(to - from, 2)}` });
  };
  // The migrate phase: `akadze migrate` (this run's CLI) while the release's workers and
  // producers run; then producers and new workers run this run's code. The server faults
  // wait for it (an outage would fail the migration, which is not what this phase tests).
  const migrateLoop = async () => {
    if (!MIGRATE_FROM || !await pause(t0 + MIGRATE_AT * WINDOW - Date.now())) return;
    const at = Date.now();
    const done = migration = {
      from: MIGRATE_FROM,
      at,
      to: null as number | null,
      error: null as string | null,
    };
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", `${code}/cli.ts`, "migrate"],
      cwd: code,
      env: { AKADZE_DATABASE_URL: url, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    const lines = text.trim().split("\n").filter(Boolean);
    harnessMessages.push(...lines);
    if (!out.success) {
      done.error = `exit ${out.code}: ${lines.slice(-3).join(" | ")}`;
      logFault({ at, kind: "migrate", detail: `FAILED: ${done.error}` });
      return;
    }
    done.to = Date.now();
    logFault({
      at,
      kind: "migrate",
      detail: `akadze migrate from ${MIGRATE_FROM} in ${secs(done.to - at, 2)}: ` +
        `${lines.length} lines, "${
          lines.at(-1) ?? ""
        }"; new workers and producers run ${described}`,
    });
    activeFleet.useRoot(code, workerEnv(false));
    app = harnessApp(Akadze);
    appSql = app.sql;
  };
  const migrated = migrateLoop();
  const progressLoop = async () => {
    while (await pause(PROGRESS_EVERY)) {
      try {
        const [c] = await appSql`
          select count(*) filter (where state in ('succeeded', 'failed', 'cancelled'))::int as done,
                 count(*) filter (where state = 'running')::int as running,
                 count(*)::int as total
            from akadze.jobs`;
        console.log(
          `${rel(Date.now())}  progress  ${c.total}/${planned} enqueued, ${c.done} finished, ` +
            `${c.running} running, ${activeFleet.live().length} worker processes`,
        );
      } catch {
        // an outage: the next one will tell
      }
    }
  };
  const faultLoops = Promise.all([
    killLoop(),
    stopLoop(),
    terminateLoop(),
    serverLoop(pg),
    migrated,
    progressLoop(),
  ]);

  await sleep(t0 + WINDOW - Date.now());
  chaosOver = true;
  const chaosTo = Date.now();
  const [{ terminal }] = await retrying(
    "the count at the end of the window",
    () =>
      appSql`select count(*)::int as terminal from akadze.jobs
            where state in ('succeeded', 'failed', 'cancelled')`,
  );
  await faultLoops;
  console.log(
    `${rel(Date.now())}  window over: ${terminal} jobs finished within it; faults off ` +
      "(stopped workers continued, server up)",
  );
  await producers;

  // --- Drain with the faults off.
  const drainFrom = Date.now();
  let drained = false;
  // The snapshot of the count that found the drain over: a job it did not see (a tick whose
  // transaction was still open then) came after the drain.
  let drainSnapshot: string | null = null;
  while (Date.now() - drainFrom < DRAIN_TIMEOUT) {
    const [c] = await retrying(
      "the drain count",
      () =>
        appSql`select count(*) filter (where state in ('waiting', 'queued', 'running'))::int
                      as active,
                    count(*)::int as total, pg_current_snapshot()::text as snapshot
               from akadze.jobs`,
    );
    if (c.active === 0 && c.total >= planned) {
      drained = true;
      drainSnapshot = c.snapshot;
      break;
    }
    await sleep(500);
  }
  const drainEnd = Date.now();
  console.log(
    `${rel(Date.now())}  drain     ${
      drained ? "every job finished" : "TIMED OUT with jobs still active"
    } after ${secs(Date.now() - drainFrom)}`,
  );

  // --- Stop every worker gracefully. A worker resumed from a stop longer than its TTL exits 1
  // by design about a second after its SIGCONT: when that SIGCONT came at the
  // very end of the window, let it exit and its replacement start before the SIGTERMs.
  const waking = activeFleet.live().filter((w) => resumed.has(w));
  if (waking.length > 0) {
    await Promise.race([Promise.all(waking.map((w) => w.done)), sleep(15_000)]);
    await sleep(2_000);
  }
  stopping = true;
  const finalStopFrom = Date.now();
  const finals = activeFleet.live();
  for (const w of finals) {
    w.endedBy = "final";
    w.send("SIGCONT");
    w.send("SIGTERM");
  }
  const allDone = Promise.all(finals.map((w) => w.done));
  const timedOut = await Promise.race([
    allDone.then(() => false),
    sleep(FINAL_STOP_TIMEOUT).then(() => true),
  ]);
  if (timedOut) {
    for (const w of activeFleet.live()) w.send("SIGKILL");
    await allDone;
  }
  console.log(
    `${rel(Date.now())}  stop      ${finals.length} workers: exit codes ${
      finals.map((w) => w.code ?? w.signal).join(", ")
    }`,
  );
  await Promise.all([sampling, rssLoop]);

  // --- Judge.
  samples.lockWaits = [...lockWaits.values()].sort((a, b) => b.waited - a.waited).map((w) =>
    `${rel(w.at ?? 0)} ${w.app} (backend ${w.pid}) waited ${w.waited.toFixed(1)} s on a lock ` +
    `in "${w.query}", blocked by ${
      (w.blockers ?? []).map((b) => `${b.app} (backend ${b.pid}, ${b.state}: "${b.query}")`)
        .join(", ") || "?"
    }`
  );
  const db = await readDb(appSql, drainSnapshot);
  await Deno.writeTextFile(
    `${logDir}/run.json`,
    JSON.stringify({ t0, faults, outages, workers: activeFleet.all, samples, db: db.state }),
  );
  const run: RunData = {
    jobsPlanned: planned,
    heartbeatInterval: HEARTBEAT_INTERVAL,
    heartbeatTtl: HEARTBEAT_TTL,
    rescueSlack: RESCUE_SLACK,
    reconnectAllowance: RECONNECT_ALLOWANCE,
    limits: LIMITS,
    tickEvery: TICK_EVERY,
    offeredRate: JOBS / (WINDOW * ENQUEUE_SHARE / 1000),
    producerErrors,
    duplicatesHandled: db.duplicates,
    faults,
    outages,
    workers: activeFleet.all as WorkerProcess[],
    samples,
    chaos: { from: t0, to: chaosTo, terminalAtEnd: terminal },
    drained,
    drainedAt: drainEnd,
    finalStopFrom,
    secrets: [{ name: "the database password", value: password }, {
      name: "the task-argument secret",
      value: secret,
    }],
    harnessMessages,
    rssLimitMb: RSS_LIMIT_MB,
    failover: FAILOVER,
    ...(migration ? { migration } : {}),
    stallBound: STALL_BOUND,
    crashHeapMb: CRASH_HEAP_MB,
    db: db.state,
  };
  const verdicts = await analyze(run);
  console.log("");
  if (samples.lockWaits.length > 0) {
    console.log(`note: ${samples.lockWaits.length} lock waits over 1 s (longest first):`);
    for (const line of samples.lockWaits.slice(0, 10)) console.log(`        ${line}`);
  }
  for (const v of verdicts) {
    console.log(`${v.ok ? "PASS" : "FAIL"}  ${v.name}: ${v.detail}`);
    for (const line of v.lines ?? []) console.log(`        ${line}`);
  }
  const failed = verdicts.filter((v) => !v.ok).length;
  console.log(`${verdicts.length - failed} passed, ${failed} failed`);
  exitCode = failed === 0 ? 0 : 1;
  if (failed === 0 && !flags["keep-logs"] && !flags.logs) {
    await Deno.remove(logDir, { recursive: true });
  } else {
    console.log(`logs kept in ${logDir}`);
  }
} catch (error) {
  console.error(`error: ${describeError(error, [password])}`);
  console.error(`logs kept in ${logDir}`);
  exitCode = 1;
} finally {
  stopping = true;
  chaosOver = true;
  await fleet?.killAll();
  await sampler?.end({ timeout: 1 }).catch(() => {});
  await app?.close().catch(() => {});
  await releaseApp?.close().catch(() => {});
  await (pair ?? pg)?.stop();
}
Deno.exit(exitCode);

async function readDb(
  sql: postgres.Sql,
  drainSnapshot: string | null,
): Promise<{ state: DbState; duplicates: number }> {
  // xmin read as an xid8 of epoch 0: true of a throwaway cluster, far from 2^32 transactions.
  const jobs = await sql`
    select id::text as id, task, state, attempt, max_attempts, run_count, result, errors,
           created_at, finished_at,
           case when task = ${TASKS.crash}
                then case when (args ->> 'oom')::boolean then 'oom' else 'exit' end end as how,
           coalesce(pg_visible_in_snapshot(xmin::text::xid8, ${drainSnapshot}::pg_snapshot),
                    true) as seen_at_drain
      from akadze.jobs order by id`;
  const expected = await sql`
    select seq, kind, job_id::text as job_id, limit_key from chaos.expected order by seq`;
  const transitions = await sql`
    select job_id::text as job_id, old_state, new_state, old_run_count, new_run_count,
           old_attempt, new_attempt, old_worker, new_worker, error, message, limit_running,
           run_at, at
      from chaos.transitions order by id`;
  const starts = await sql`
    select job_id::text as job_id, run_count, nonce::text as nonce, pid, at
      from chaos.ledger_start`;
  const commits = await sql`
    select job_id::text as job_id, run_count, nonce::text as nonce, pid from chaos.ledger_commit`;
  const texts = await sql`
    select errors::text as t from akadze.jobs where errors <> '[]'
    union all select result::text from akadze.jobs where result is not null
    union all select message from chaos.transitions where message is not null`;
  const periodic = await sql`
    select fire_at, job_id::text as job_id from akadze.periodic_runs
     where name = ${TASKS.tick} order by fire_at`;
  const flowSteps = await sql`
    select job_id::text as job_id, flow, step, deps::text[] as deps, expect
      from chaos.flow_steps order by job_id`;
  const [{ n }] = await sql`select count(*)::int as n from chaos.duplicates`;
  return {
    state: {
      jobs: jobs as unknown as DbState["jobs"],
      expected: expected as unknown as DbState["expected"],
      transitions: transitions as unknown as DbState["transitions"],
      starts: starts as unknown as DbState["starts"],
      commits: commits as unknown as DbState["commits"],
      periodic: periodic as unknown as DbState["periodic"],
      flowSteps: flowSteps as unknown as DbState["flowSteps"],
      storedTexts: texts.map((r) => r.t as string),
    },
    duplicates: n,
  };
}
