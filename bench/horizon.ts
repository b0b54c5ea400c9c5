// The pinned-MVCC-horizon scenario: a long transaction elsewhere (an analytics query, a
// forgotten BEGIN) holds back the xmin horizon, so that nothing the queue deletes or updates
// can be cleaned up while it lasts. Every system runs the same steady load on a fresh
// database of one durable throwaway PostgreSQL, one after another: a producer enqueuing
// jobs at a fixed rate and one worker, first unpinned, then with a REPEATABLE READ
// transaction held open in its database, then after that transaction ends. Writes
// bench/results/<date>-horizon.json and .md (see bench/README.md).
//
//   deno task bench --scenario horizon [--entries akadze,graphile,graphile-batched,pgboss,bullmq]
//       [--rate 500] [--before 60] [--pinned 900] [--after 120] [--window 60]
//       [--recovery-window 10] [--collapse-backlog 100000] [--collapse-p50 60]
//       [--tick-ms 10] [--batch 100] [--out FILE.json] [--pg name=value]...
//   deno task bench --scenario horizon --smoke   # akadze, rate 50, 3 + 5 + 5 s, writes nothing
import postgres from "postgres";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import type { SteadySpec } from "./akadze/steady.ts";
import { release, track, wasInterrupted } from "./lib/children.ts";
import { LineReader, LineWriter } from "./lib/lines.ts";
import {
  environmentLines,
  loadAverage,
  machineCpu,
  type MachineInfo,
  machineInfo,
  ownTreeCpuMs,
  type PostgresInfo,
  postgresInfo,
} from "./lib/machine.ts";
import { ensurePeers, NODE, PEERS_DIR, peersLine } from "./lib/peers.ts";
import { CLK_TCK, cpuMs, postgresCpuMs, readPostmasterPid } from "./lib/proc.ts";
import { fmt } from "./lib/report.ts";

const BENCH = new URL(".", import.meta.url).pathname.replace(/\/$/, "");
const ROOT = BENCH.replace(/\/bench$/, "");

// ---------------------------------------------------------------------------------------
// Flags

interface Flags {
  smoke: boolean;
  entries: string[];
  /** Jobs per second the producer enqueues. */
  rate: number;
  /** Seconds of each phase. */
  before: number;
  pinned: number;
  after: number;
  /** Seconds per reported window. */
  window: number;
  /** Seconds of the rolling window the recovery is judged on. */
  recoveryWindow: number;
  /** A backlog above this stops the entry (collapsed). */
  collapseBacklog: number;
  /** A rolling 10 s p50 above this many seconds stops the entry (collapsed). */
  collapseP50: number;
  tickMs: number;
  /** Jobs per enqueue call at most. */
  batch: number;
  out?: string;
  pg: Record<string, string>;
}

const USAGE =
  "usage: deno task bench --scenario horizon [--smoke] [--entries KEY,...] [--rate R]\n" +
  "       [--before S] [--pinned S] [--after S] [--window S] [--recovery-window S]\n" +
  "       [--collapse-backlog N] [--collapse-p50 S] [--tick-ms MS] [--batch N] [--out FILE.json]" +
  " [--pg name=value]...";

class UsageError extends Error {}

function parseFlags(args: readonly string[]): Flags {
  const smoke = args.includes("--smoke");
  const flags: Flags = {
    smoke,
    entries: smoke ? ["akadze"] : [...DEFAULT_ENTRIES],
    rate: smoke ? 50 : 500,
    before: smoke ? 3 : 60,
    pinned: smoke ? 5 : 900,
    after: smoke ? 5 : 120,
    window: 60,
    recoveryWindow: smoke ? 2 : 10,
    collapseBacklog: 100_000,
    collapseP50: 60,
    tickMs: 10,
    batch: 100,
    pg: {},
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--smoke") continue;
    const eq = arg.indexOf("=");
    const [name, inline] = arg.startsWith("--") && eq > 0 && !arg.startsWith("--pg=")
      ? [arg.slice(0, eq), arg.slice(eq + 1)]
      : [arg, undefined];
    const value = () => {
      const v = inline ?? args[++i];
      if (v === undefined) throw new UsageError(`${name} needs a value`);
      return v;
    };
    const number = (min: number) => {
      const v = value();
      const n = Number(v.replaceAll("_", ""));
      if (!Number.isFinite(n) || n < min) {
        throw new UsageError(`${name} must be a number >= ${min}, got ${v}`);
      }
      return n;
    };
    switch (name) {
      case "--entries": {
        flags.entries = value().split(",").filter(Boolean);
        const unknown = flags.entries.filter((k) => !ENTRIES.some((e) => e.key === k));
        if (unknown.length || flags.entries.length === 0) {
          throw new UsageError(
            `--entries takes ${ENTRIES.map((e) => e.key).join(", ")}, got ${unknown.join(",")}`,
          );
        }
        break;
      }
      case "--rate":
        flags.rate = number(1);
        break;
      case "--before":
        flags.before = number(1);
        break;
      case "--pinned":
        flags.pinned = number(1);
        break;
      case "--after":
        flags.after = number(1);
        break;
      case "--window":
        flags.window = number(1);
        break;
      case "--recovery-window":
        flags.recoveryWindow = number(0.5);
        break;
      case "--collapse-backlog":
        flags.collapseBacklog = number(1);
        break;
      case "--collapse-p50":
        flags.collapseP50 = number(0.1);
        break;
      case "--tick-ms":
        flags.tickMs = number(1);
        break;
      case "--batch":
        flags.batch = number(1);
        break;
      case "--out":
        flags.out = value();
        break;
      case "--pg": {
        const v = value();
        const at = v.indexOf("=");
        if (at < 1) throw new UsageError(`--pg takes name=value, got ${v}`);
        flags.pg[v.slice(0, at)] = v.slice(at + 1);
        break;
      }
      default:
        throw new UsageError(`unknown argument ${arg}`);
    }
  }
  return flags;
}

// ---------------------------------------------------------------------------------------
// What runs

interface Entry {
  key: string;
  system: "akadze" | "graphile" | "pgboss" | "bullmq";
  label: string;
  /** akadze: the SteadySpec's app and worker; peers: environment of bench/peers/horizon.mjs. */
  config: Record<string, unknown>;
}

const ENTRIES: readonly Entry[] = [
  // One Worker with graphile-worker's concurrency, everything else akadze's defaults. With
  // the default slots (1) a worker runs one job at a time, a claim and an outcome write per
  // job: on a shared two-core machine that kept up with about 150 jobs/s, far below the
  // rate, pinned or not (akadze-s1).
  {
    key: "akadze",
    system: "akadze",
    label: "akadze (one Worker, slots 10, default app pool)",
    config: { app: {}, worker: { slots: 10 } },
  },
  {
    key: "akadze-s1",
    system: "akadze",
    label: "akadze (one Worker, default slots (1), default app pool)",
    config: { app: {}, worker: {} },
  },
  {
    key: "graphile",
    system: "graphile",
    label: "graphile-worker (defaults, concurrency 10)",
    config: { CONC: 10 },
  },
  {
    key: "graphile-batched",
    system: "graphile",
    label: "graphile-worker (concurrency 10, localQueue 500, batched completion)",
    config: { CONC: 10, LQ: 500, BATCH: 0 },
  },
  {
    key: "pgboss",
    system: "pgboss",
    label: "pg-boss (batch 500, localConcurrency 4, notify, burst)",
    config: { CONC: 4, BATCH: 500 },
  },
  // The settings of `deno task bench`'s BullMQ entry (its PostgreSQL guide's advice).
  {
    key: "bullmq",
    system: "bullmq",
    label: "BullMQ on PostgreSQL (concurrency 50, pool 20, removeOnComplete)",
    config: { CONC: 50, POOL: 20, KEEP: 0 },
  },
];
const DEFAULT_ENTRIES = ["akadze", "graphile", "graphile-batched", "pgboss", "bullmq"];

// ---------------------------------------------------------------------------------------
// One entry

/** One report of the driver (bench/peers/steady.mjs): totals so far, latencies since the last. */
interface Tick {
  t: number;
  enqueued: number;
  started: number;
  issued: number;
  failed: number;
  lat: number[];
}

type Phase = "before" | "pinned" | "after";

/** Counters read at a window boundary. */
interface Sample {
  t: number;
  pg: number;
  driver: number;
  busy: number;
  own: number;
  load: string;
  dead: number | null;
  sizeMb: number | null;
}

interface WindowStats {
  phase: Phase;
  /** Seconds since the phase began, at the window's start and end. */
  from_s: number;
  to_s: number;
  enqueued: number;
  started: number;
  p50_ms: number | null;
  p99_ms: number | null;
  max_ms: number | null;
  backlog_end: number;
  backlog_max: number;
  pg_cpu_ms_per_1k: number | null;
  pg_cpu_pct: number;
  driver_cpu_ms_per_1k: number | null;
  driver_cpu_pct: number;
  other_cpu_pct: number;
  loadavg: string;
  dead_tuples: number | null;
  db_size_mb: number | null;
}

interface Check {
  baseline: { p50_ms: number | null; p99_ms: number | null; backlog_max: number };
  end: { p50_ms: number | null; p99_ms: number | null; backlog_end: number } | null;
  backlog_slope_per_min: number | null;
  backlog_growth: number | null;
  backlog_bounded: boolean | null;
  p50_ratio: number | null;
  p50_ok: boolean | null;
  p99_ok: boolean | null;
  recovery_s: number | null;
  recovery_ok: boolean | null;
  /** From the COMMIT to the first backlog sample at the unpinned level. */
  backlog_cleared_s: number | null;
}

interface EntryResult {
  key: string;
  label: string;
  system: Entry["system"];
  config: Record<string, unknown>;
  ok: boolean;
  errors: string[];
  /** What the reader should know that does not invalidate the run. */
  notes: string[];
  /** Set when the entry was stopped before its end (collapsed, or the driver failed). */
  stopped: { phase: Phase; minute: number; reason: string } | null;
  pin: { backend_xmin: string | null; xid_age_at_commit: number | null; held_s: number | null };
  windows: WindowStats[];
  check: Check | null;
  /** Per second since the producer started: totals, backlog, p50 of the starts in it. */
  series: {
    s: number;
    enqueued: number;
    started: number;
    backlog: number;
    p50_ms: number | null;
  }[];
  done: Record<string, unknown> | null;
}

function quantile(sorted: Float64Array, q: number): number | null {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : null;
}

function sortedLatencies(ticks: readonly Tick[]): Float64Array {
  const n = ticks.reduce((sum, t) => sum + t.lat.length, 0);
  const all = new Float64Array(n);
  let i = 0;
  for (const t of ticks) for (const v of t.lat) all[i++] = v;
  return all.sort();
}

const wallMs = () => performance.timeOrigin + performance.now();
const delay = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)));

async function runEntry(
  entry: Entry,
  flags: Flags,
  serverUrl: string,
  admin: postgres.Sql,
  postmasterPid: number,
): Promise<EntryResult> {
  const result: EntryResult = {
    key: entry.key,
    label: entry.label,
    system: entry.system,
    config: entry.config,
    ok: false,
    errors: [],
    notes: [],
    stopped: null,
    pin: { backend_xmin: null, xid_age_at_commit: null, held_s: null },
    windows: [],
    check: null,
    series: [],
    done: null,
  };
  const db = `horizon_${entry.key.replaceAll("-", "_")}`;
  await admin.unsafe(`drop database if exists "${db}" with (force)`);
  await admin.unsafe(`create database "${db}"`);
  await admin`checkpoint`;
  const url = serverUrl.replace(/\/postgres$/, `/${db}`);

  let command: string, args: string[];
  const env: Record<string, string> = { BENCH_CLK_TCK: String(CLK_TCK) };
  if (entry.system === "akadze") {
    const spec: SteadySpec = {
      url,
      rate: flags.rate,
      tickMs: flags.tickMs,
      batch: flags.batch,
      app: entry.config.app as SteadySpec["app"],
      worker: entry.config.worker as SteadySpec["worker"],
    };
    command = Deno.execPath();
    args = ["run", "--allow-all", `${BENCH}/akadze/steady.ts`, JSON.stringify(spec)];
  } else {
    command = NODE;
    args = [`${PEERS_DIR}/drivers/horizon.mjs`];
    Object.assign(env, {
      SYSTEM: entry.system,
      DATABASE_URL: url,
      RATE: String(flags.rate),
      TICK_MS: String(flags.tickMs),
      ENQUEUE_BATCH: String(flags.batch),
    });
    for (const [k, v] of Object.entries(entry.config)) env[k] = String(v);
  }
  const child = new Deno.Command(command, {
    args,
    env,
    cwd: ROOT,
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
    detached: true,
  }).spawn();
  track(child);
  const stdin = new LineWriter(child.stdin);
  const lines = new LineReader(child.stdout);
  // Connected before the clock starts; the pin and the monitor work in the entry's database
  // (a snapshot holds back the horizon of the database its session is connected to).
  const pin = postgres(url, {
    max: 1,
    idle_timeout: 0,
    onnotice: () => {},
    connection: { application_name: "bench-horizon-pin" },
  });
  const monitor = postgres(url, { max: 1, onnotice: () => {} });

  // What ends the entry before its time: a collapse, the driver ending, an interrupt.
  const stop = Promise.withResolvers<string>();
  const ticks: Tick[] = [];
  let ready = false;
  const readyNow = Promise.withResolvers<void>();
  let lastProgress = { t: 0, started: -1 };
  let started = false;
  const checkCollapse = (tick: Tick) => {
    if (!started) return;
    const backlog = tick.enqueued - tick.started;
    if (backlog > flags.collapseBacklog) {
      stop.resolve(`backlog ${fmt(backlog)} > ${fmt(flags.collapseBacklog)}`);
    }
    if (tick.started !== lastProgress.started) lastProgress = { t: tick.t, started: tick.started };
    else if (backlog > 0 && tick.t - lastProgress.t > 60_000) {
      stop.resolve("no job started for 60 s");
    }
    if (ticks.length % 4 === 0) {
      const recent = ticks.filter((x) => x.t > tick.t - 10_000);
      const p50 = quantile(sortedLatencies(recent), 0.5);
      if (p50 !== null && p50 > flags.collapseP50 * 1000) {
        stop.resolve(`p50 over 10 s ${fmt(p50 / 1000, 1)} s > ${flags.collapseP50} s`);
      }
    }
  };
  const reader = (async () => {
    for (let line = await lines.next(); line !== null; line = await lines.next()) {
      let message: Record<string, unknown> | null = null;
      if (line.startsWith("{")) {
        try {
          message = JSON.parse(line);
        } catch {
          // printed as is below
        }
      }
      if (message?.event === "tick") {
        const tick = message as unknown as Tick;
        ticks.push(tick);
        checkCollapse(tick);
      } else if (message?.event === "ready") {
        ready = true;
        readyNow.resolve();
      } else if (message?.event === "done") {
        result.done = message;
      } else if (line.trim()) {
        console.error(`  [${entry.key}] ${line}`);
      }
    }
    stop.resolve("the driver exited");
    readyNow.resolve();
  })();
  const interruptTimer = setInterval(() => {
    if (wasInterrupted()) stop.resolve("interrupted");
  }, 200);

  const samples: { phase: Phase; sample: Sample }[] = [];
  const sample = async (): Promise<Sample> => {
    const [busy, pg, driver, own, load] = await Promise.all([
      machineCpu(),
      postgresCpuMs(postmasterPid),
      cpuMs(child.pid),
      ownTreeCpuMs(),
      loadAverage(),
    ]);
    let dead: number | null = null, sizeMb: number | null = null;
    try {
      // Statistics and sizes only: counting the jobs would itself be the expensive scan.
      const [row] = await monitor`
        select coalesce(sum(n_dead_tup), 0)::float8 as dead,
               coalesce(sum(pg_total_relation_size(relid)), 0)::float8 / 1048576 as mb
          from pg_stat_user_tables`;
      dead = row.dead;
      sizeMb = Math.round(row.mb * 10) / 10;
    } catch {
      // not essential
    }
    return { t: wallMs(), pg, driver, busy: busy.busy, own, load, dead, sizeMb };
  };

  const phaseStart: Partial<Record<Phase, number>> = {};
  let pinned = false;
  let pinnedAt = 0, committedAt = 0;
  let stopReason: string | null = null;
  let pinPid = 0;
  const commit = async () => {
    if (!pinned) return;
    const [row] = await admin`
      select age(backend_xmin)::int as age from pg_stat_activity where pid = ${pinPid}`;
    result.pin.xid_age_at_commit = row?.age ?? null;
    await pin.unsafe("commit");
    committedAt = wallMs();
    pinned = false;
    result.pin.held_s = Math.round((committedAt - pinnedAt) / 100) / 10;
  };
  try {
    await Promise.race([
      readyNow.promise,
      delay(180_000).then(() => {
        throw new Error("the driver was not ready within 180 s");
      }),
    ]);
    if (!ready) throw new Error("the driver exited before it was ready");
    [{ pid: pinPid }] = await pin`select pg_backend_pid() as pid`;
    await monitor`select 1`;

    const phases: { phase: Phase; seconds: number; enter?: () => Promise<void> }[] = [
      { phase: "before", seconds: flags.before },
      {
        phase: "pinned",
        seconds: flags.pinned,
        enter: async () => {
          await pin.unsafe("begin isolation level repeatable read");
          await pin.unsafe("select count(*) from pg_class"); // takes the snapshot
          pinned = true;
          pinnedAt = wallMs();
          const [row] = await admin`
            select backend_xmin::text as xmin, state from pg_stat_activity where pid = ${pinPid}`;
          if (!row?.xmin || row.state !== "idle in transaction") {
            throw new Error(`the pinning session holds no snapshot (${JSON.stringify(row)})`);
          }
          result.pin.backend_xmin = row.xmin;
        },
      },
      { phase: "after", seconds: flags.after, enter: commit },
    ];
    samples.push({ phase: "before", sample: await sample() });
    await stdin.write("go");
    started = true;
    outer: for (const { phase, seconds, enter } of phases) {
      if (enter) await enter();
      const start = wallMs();
      phaseStart[phase] = start;
      if (phase !== "before") samples.push({ phase, sample: await sample() });
      const end = start + seconds * 1000;
      for (let k = 1;; k++) {
        const at = Math.min(start + k * flags.window * 1000, end);
        const reason = await Promise.race([delay(at - wallMs()).then(() => null), stop.promise]);
        if (reason !== null) {
          stopReason = reason;
          samples.push({ phase, sample: await sample() });
          result.stopped = {
            phase,
            minute: Math.floor((wallMs() - start) / 60_000) + 1,
            reason,
          };
          break outer;
        }
        samples.push({ phase, sample: await sample() });
        const w = samples.length - 1;
        console.error(`  ${phase} ${describe(windowOf(w))}`);
        if (at >= end) break;
      }
    }
  } catch (error) {
    result.errors.push(error instanceof Error ? error.message : String(error));
    stopReason ??= "error";
  } finally {
    clearInterval(interruptTimer);
    try {
      await commit();
    } catch (error) {
      result.errors.push(`commit of the pinning transaction: ${error}`);
    }
    // A collapsed system is not waited for; a healthy one gets 30 s to start what is left.
    await stdin.write(stopReason ? "abort" : "stop 30").catch(() => {});
    await stdin.close();
    await Promise.race([reader, delay(60_000)]);
    const status = await Promise.race([child.status, delay(5_000).then(() => null)]);
    release(child);
    await lines.cancel();
    await pin.end({ timeout: 1 }).catch(() => {});
    await monitor.end({ timeout: 1 }).catch(() => {});
    await admin.unsafe(`drop database if exists "${db}" with (force)`).catch(() => {});
    if (status && !status.success) result.errors.push(`the driver exited with ${status.code}`);
    if (!status) result.errors.push("the driver did not exit within 5 s of being stopped");
  }

  // -------------------------------------------------------------------------------------
  // Windows, baseline, check.

  function windowOf(i: number): WindowStats {
    const a = samples[i - 1].sample, b = samples[i].sample, phase = samples[i].phase;
    const inside = ticks.filter((x) => x.t >= a.t && x.t < b.t);
    const last = (t: number) => ticks.findLast((x) => x.t < t);
    const count = (k: "enqueued" | "started") => (last(b.t)?.[k] ?? 0) - (last(a.t)?.[k] ?? 0);
    const lat = sortedLatencies(inside);
    const ms = b.t - a.t;
    const enqueued = count("enqueued"), startedHere = count("started");
    const lb = last(b.t);
    const cores = navigator.hardwareConcurrency;
    const pgMs = b.pg - a.pg, driverMs = b.driver - a.driver;
    const per1k = (v: number) => startedHere > 0 ? v / startedHere * 1000 : null;
    const p0 = phaseStart[phase] ?? a.t;
    return {
      phase,
      from_s: Math.round((a.t - p0) / 1000),
      to_s: Math.round((b.t - p0) / 1000),
      enqueued,
      started: startedHere,
      p50_ms: quantile(lat, 0.5),
      p99_ms: quantile(lat, 0.99),
      max_ms: lat.length ? lat[lat.length - 1] : null,
      backlog_end: lb ? lb.enqueued - lb.started : 0,
      backlog_max: Math.max(0, ...inside.map((x) => x.enqueued - x.started)),
      pg_cpu_ms_per_1k: per1k(pgMs),
      pg_cpu_pct: pgMs / ms * 100,
      driver_cpu_ms_per_1k: per1k(driverMs),
      driver_cpu_pct: driverMs / ms * 100,
      other_cpu_pct: Math.max(0, (b.busy - a.busy) - pgMs - driverMs - (b.own - a.own)) /
        (ms * cores) * 100,
      loadavg: b.load,
      dead_tuples: b.dead,
      db_size_mb: b.sizeMb,
    };
  }
  // A phase's first sample opens its first window; the moments between phases (opening
  // the pinning transaction, committing it) belong to no window.
  for (let i = 1; i < samples.length; i++) {
    if (samples[i].phase === samples[i - 1].phase) result.windows.push(windowOf(i));
  }

  const go = samples[0]?.sample.t ?? 0;
  for (let s = 1; ticks.length && s <= Math.ceil((ticks[ticks.length - 1].t - go) / 1000); s++) {
    const inside = ticks.filter((x) => x.t >= go + (s - 1) * 1000 && x.t < go + s * 1000);
    const last = inside[inside.length - 1];
    if (!last) continue;
    result.series.push({
      s,
      enqueued: last.enqueued,
      started: last.started,
      backlog: last.enqueued - last.started,
      p50_ms: quantile(sortedLatencies(inside), 0.5),
    });
  }

  if (phaseStart.pinned !== undefined) {
    // The pinned phase ended as planned when the after phase began (its COMMIT done); the
    // recovery is measured only when the after phase ran to its end.
    const afterBegan = phaseStart.after !== undefined;
    result.check = checkOf(ticks, result.windows, flags, {
      go,
      pinnedAt: phaseStart.pinned,
      committedAt: afterBegan ? committedAt : 0,
      afterEnd: afterBegan && !result.stopped ? phaseStart.after! + flags.after * 1000 : 0,
    });
  }

  // What makes the entry's run invalid (a collapse is a result, not an error).
  const d = result.done;
  if (!d) result.errors.push("the driver reported no totals");
  else {
    if (d.error) result.errors.push(`driver: ${d.error}`);
    if (Number(d.failed) > 0) result.errors.push(`${d.failed} enqueues failed`);
    if (Number(d.duplicates) > 0) result.errors.push(`${d.duplicates} jobs started twice`);
    if (!result.stopped && Number(d.missing) > 0) {
      // Lost jobs if the system had recovered; otherwise it was still catching up.
      const what = `${fmt(Number(d.missing))} enqueued jobs had not started 30 s after the run`;
      if (result.check?.recovery_s != null) result.errors.push(what);
      else result.notes.push(`${what} (it had not recovered)`);
    }
  }
  if (result.stopped && !/^(backlog|p50|no job)/.test(result.stopped.reason)) {
    result.errors.push(`stopped in the ${result.stopped.phase} phase: ${result.stopped.reason}`);
  }
  result.ok = result.errors.length === 0;
  return result;
}

function checkOf(
  ticks: readonly Tick[],
  windows: readonly WindowStats[],
  flags: Flags,
  at: { go: number; pinnedAt: number; committedAt: number; afterEnd: number },
): Check {
  // The unpinned baseline, without the first seconds (pools, caches and JIT warming up).
  const warm = Math.min(10, flags.before / 3) * 1000;
  const base = ticks.filter((x) => x.t >= at.go + warm && x.t < at.pinnedAt);
  const baseLat = sortedLatencies(base);
  const baseline = {
    p50_ms: quantile(baseLat, 0.5),
    p99_ms: quantile(baseLat, 0.99),
    backlog_max: Math.max(0, ...base.map((x) => x.enqueued - x.started)),
  };
  const pinnedWindows = windows.filter((w) => w.phase === "pinned");
  const lastPinned = pinnedWindows[pinnedWindows.length - 1];
  const completed = at.committedAt > 0;
  const end = completed && lastPinned
    ? { p50_ms: lastPinned.p50_ms, p99_ms: lastPinned.p99_ms, backlog_end: lastPinned.backlog_end }
    : null;

  // Backlog trend over the pinned phase: least-squares slope, jobs per minute.
  const pinnedTicks = ticks.filter((x) =>
    x.t >= at.pinnedAt && (at.committedAt ? x.t < at.committedAt : true)
  );
  let slope: number | null = null;
  if (pinnedTicks.length >= 2) {
    const xs = pinnedTicks.map((x) => (x.t - at.pinnedAt) / 60_000);
    const ys = pinnedTicks.map((x) => x.enqueued - x.started);
    const mx = xs.reduce((a, b) => a + b, 0) / xs.length;
    const my = ys.reduce((a, b) => a + b, 0) / ys.length;
    let num = 0, den = 0;
    for (let i = 0; i < xs.length; i++) {
      num += (xs[i] - mx) * (ys[i] - my);
      den += (xs[i] - mx) ** 2;
    }
    slope = den > 0 ? num / den : null;
  }
  const growth = slope === null ? null : slope * flags.pinned / 60;
  // Bounded: the fitted growth over the whole pinned phase stays under 0.1 s of enqueues.
  const bounded = growth === null ? null : completed && growth <= 0.1 * flags.rate;

  // Recovery: the first rolling window after the commit with p50 <= 1.5 x the unpinned p50
  // and no backlog above the unpinned level; reported from its start.
  let recovery: number | null = null, cleared: number | null = null;
  const recoverable = completed && at.afterEnd > 0;
  const backlogLevel = Math.max(baseline.backlog_max, Math.ceil(flags.rate / 100));
  const after = ticks.filter((x) => x.t >= at.committedAt && x.t <= at.afterEnd + 300);
  if (recoverable) {
    const first = after.find((x) => x.enqueued - x.started <= backlogLevel);
    if (first) cleared = Math.round((first.t - at.committedAt) / 100) / 10;
  }
  if (recoverable && baseline.p50_ms !== null) {
    const span = flags.recoveryWindow * 1000;
    for (let s = 0; s < after.length; s++) {
      const from = s === 0 ? at.committedAt : after[s - 1].t;
      const e = after.findIndex((x) => x.t >= from + span);
      if (e < 0 || after[e].t > at.afterEnd + 300) break;
      const inside = after.slice(s, e + 1);
      const p50 = quantile(sortedLatencies(inside), 0.5);
      const backlog = Math.max(...inside.map((x) => x.enqueued - x.started));
      if (p50 !== null && p50 <= 1.5 * baseline.p50_ms && backlog <= backlogLevel) {
        recovery = Math.round((from - at.committedAt) / 100) / 10;
        break;
      }
    }
  }
  const ratio = end?.p50_ms != null && baseline.p50_ms ? end.p50_ms / baseline.p50_ms : null;
  return {
    baseline,
    end,
    backlog_slope_per_min: slope,
    backlog_growth: growth,
    backlog_bounded: bounded,
    p50_ratio: ratio,
    p50_ok: ratio === null ? (completed ? null : false) : ratio <= 3,
    p99_ok: end?.p99_ms != null ? end.p99_ms <= 100 : (completed ? null : false),
    recovery_s: recovery,
    recovery_ok: recoverable ? recovery !== null && recovery <= 60 : false,
    backlog_cleared_s: cleared,
  };
}

function ms(v: number | null): string {
  if (v === null) return "–";
  return v >= 10_000 ? `${fmt(v / 1000, 1)} s` : `${fmt(v, v >= 100 ? 0 : v >= 10 ? 1 : 2)} ms`;
}

function describe(w: WindowStats): string {
  return `${w.from_s}-${w.to_s} s: enqueued ${fmt(w.enqueued)}, started ${fmt(w.started)}, ` +
    `p50 ${ms(w.p50_ms)}, p99 ${ms(w.p99_ms)}, backlog ${fmt(w.backlog_end)}, ` +
    `PostgreSQL ${fmt(w.pg_cpu_ms_per_1k)} ms CPU/1,000 jobs, dead tuples ${fmt(w.dead_tuples)}`;
}

// ---------------------------------------------------------------------------------------
// Report

interface Report {
  date: string;
  command: string;
  machine: MachineInfo;
  postgres: PostgresInfo;
  peers: Record<string, string> | null;
  params: Omit<Flags, "out" | "smoke" | "entries" | "pg"> & { pg: Record<string, string> };
  entries: EntryResult[];
  loadavg_at_end: string;
  errors: string[];
}

function yesNo(v: boolean | null): string {
  return v === null ? "–" : v ? "yes" : "**no**";
}

function markdown(report: Report): string {
  const p = report.params;
  const lines: string[] = [`# Pinned MVCC horizon, ${report.date}`, ""];
  lines.push(`Command: \`${report.command}\``, "");
  lines.push(...environmentLines(report.machine, report.postgres, report.peers));
  lines.push(
    `Load average at the end: ${report.loadavg_at_end} (the machine is shared; see the ` +
      `"other CPU" column).`,
    "",
  );
  if (report.peers) lines.push(peersLine(report.peers), "");
  lines.push(
    `Load: ${fmt(p.rate)} no-op jobs/s, enqueued by a producer ticking every ${p.tickMs} ms ` +
      `(open loop: each tick enqueues the jobs due since the last, whatever the worker does, ` +
      `${p.batch === 1 ? "one job per call" : `in calls of at most ${p.batch} jobs`}), one ` +
      `worker; producer and worker share one process per system, each on a pool of its own. ` +
      `Phases: ${p.before} s unpinned, ${p.pinned} s with a REPEATABLE READ transaction held ` +
      `open in the system's database (\`BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT ...\`, ` +
      `its backend_xmin checked in pg_stat_activity), ${p.after} s after its COMMIT. ` +
      `Windows of ${p.window} s; a system is stopped when its backlog exceeds ` +
      `${fmt(p.collapseBacklog)}, its 10 s p50 exceeds ${p.collapseP50} s, or nothing starts ` +
      `for 60 s. Each system on a fresh database, one after another.`,
    "",
  );

  lines.push("## Summary", "");
  lines.push(
    "| entry | unpinned p50 / p99 | end of pinned p50 / p99 | p50 ratio | backlog at end of pinned | backlog trend, jobs/min | PostgreSQL CPU ms/1,000 jobs, unpinned → end of pinned | backlog cleared | recovery | stopped |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
  );
  for (const e of report.entries) {
    const c = e.check;
    const before = e.windows.filter((w) => w.phase === "before").at(-1);
    const pinned = e.windows.filter((w) => w.phase === "pinned").at(-1);
    lines.push(
      `| ${e.label} | ${ms(c?.baseline.p50_ms ?? null)} / ${ms(c?.baseline.p99_ms ?? null)} | ${
        c?.end ? `${ms(c.end.p50_ms)} / ${ms(c.end.p99_ms)}` : "–"
      } | ${c?.p50_ratio != null ? `${fmt(c.p50_ratio, 2)} ×` : "–"} | ${
        c?.end ? fmt(c.end.backlog_end) : pinned ? `(${fmt(pinned.backlog_end)})` : "–"
      } | ${fmt(c?.backlog_slope_per_min ?? null, 1)} | ${
        fmt(before?.pg_cpu_ms_per_1k ?? null)
      } → ${fmt(pinned?.pg_cpu_ms_per_1k ?? null)} | ${
        c?.backlog_cleared_s != null
          ? `${fmt(c.backlog_cleared_s, 1)} s`
          : e.stopped
          ? "–"
          : `not within ${p.after} s`
      } | ${
        c?.recovery_s != null
          ? `${fmt(c.recovery_s, 1)} s`
          : e.stopped
          ? "–"
          : `not within ${p.after} s`
      } | ${
        e.stopped
          ? `at minute ${e.stopped.minute} of ${e.stopped.phase}: ${e.stopped.reason}`
          : "no"
      } |`,
    );
  }
  lines.push("");

  const targeted = report.entries.filter((e) => e.system === "akadze" && e.check);
  if (targeted.length) {
    lines.push(`## Targets (akadze, ${fmt(p.rate)} jobs/s, ${p.pinned} s pinned)`, "");
    lines.push("| entry | target | value | met |", "|---|---|---:|:---:|");
    for (const e of targeted) {
      const c = e.check!;
      const rows: [string, string, boolean | null][] = [
        [
          `backlog bounded: fitted growth over the pinned phase ≤ ${
            fmt(0.1 * p.rate)
          } jobs (0.1 s of enqueues)`,
          `${fmt(c.backlog_growth, 1)} jobs (${fmt(c.backlog_slope_per_min, 2)}/min)`,
          c.backlog_bounded,
        ],
        [
          "p50 at the end of the pinned phase ≤ 3 × unpinned p50",
          `${ms(c.end?.p50_ms ?? null)} vs ${ms(c.baseline.p50_ms)} (${fmt(c.p50_ratio, 2)} ×)`,
          c.p50_ok,
        ],
        ["p99 at the end of the pinned phase ≤ 100 ms", ms(c.end?.p99_ms ?? null), c.p99_ok],
        [
          "recovery to unpinned latency ≤ 60 s after the COMMIT",
          c.recovery_s != null ? `${fmt(c.recovery_s, 1)} s` : `not within ${p.after} s`,
          c.recovery_ok,
        ],
      ];
      for (const [target, value, met] of rows) {
        lines.push(`| ${e.key} | ${target} | ${value} | ${yesNo(met)} |`);
      }
    }
    lines.push("");
  }

  for (const e of report.entries) {
    lines.push(`## ${e.label}`, "");
    if (e.pin.backend_xmin) {
      lines.push(
        `Pinning transaction: backend_xmin ${e.pin.backend_xmin}, held ${
          fmt(e.pin.held_s, 1)
        } s, xmin age at COMMIT ${fmt(e.pin.xid_age_at_commit)} transactions.` +
          (e.done
            ? ` Driver totals: ${fmt(Number(e.done.enqueued))} enqueued, ${
              fmt(Number(e.done.started))
            } started.`
            : ""),
        "",
      );
    }
    const remarks = [...e.errors.map((x) => `error: ${x}`), ...e.notes];
    if (remarks.length) lines.push(...remarks.map((x) => `- ${x}`), "");
    lines.push(
      "| phase | s | enqueued | started | p50 | p99 | max | backlog end (max) | PostgreSQL CPU ms/1,000 jobs (% of a core) | driver CPU ms/1,000 jobs (%) | dead tuples | DB MiB | other CPU % | load |",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    );
    for (const w of e.windows) {
      lines.push(
        `| ${w.phase} | ${w.from_s}–${w.to_s} | ${fmt(w.enqueued)} | ${fmt(w.started)} | ${
          ms(w.p50_ms)
        } | ${ms(w.p99_ms)} | ${ms(w.max_ms)} | ${fmt(w.backlog_end)} (${fmt(w.backlog_max)}) | ${
          fmt(w.pg_cpu_ms_per_1k)
        } (${fmt(w.pg_cpu_pct)}) | ${fmt(w.driver_cpu_ms_per_1k)} (${fmt(w.driver_cpu_pct)}) | ${
          fmt(w.dead_tuples)
        } | ${fmt(w.db_size_mb, 1)} | ${fmt(w.other_cpu_pct)} | ${w.loadavg} |`,
      );
    }
    lines.push("");
  }
  if (report.errors.length) lines.push("## Errors", "", ...report.errors.map((e) => `- ${e}`), "");
  lines.push(
    "Definitions: latency = handler start − the moment the job's enqueue call was made (both " +
      "wall clocks of the one driver process), per window over the jobs that started in it " +
      "(p50/p99 nearest rank). Backlog = enqueues committed − jobs started, counted by the " +
      "driver (the jobs table is not counted: under a pinned horizon that scan is the " +
      "expensive thing). Unpinned baseline = the unpinned phase without its first " +
      `${Math.min(10, p.before / 3)} s. Backlog trend = least-squares slope of the backlog ` +
      "(sampled every 250 ms) over the pinned phase. Recovery = from the COMMIT to the start " +
      `of the first rolling ${p.recoveryWindow} s window whose p50 is ≤ 1.5 × the unpinned ` +
      "p50 and whose backlog never exceeds the unpinned maximum (at least 1 % of a second's " +
      "jobs); backlog cleared = from the COMMIT to the first backlog sample at that level. CPU = /proc utime+stime over the window: PostgreSQL = all server processes " +
      "(including exited ones), driver = the process running the producer and the worker; " +
      "per 1,000 jobs started in the window. Dead tuples and DB size = " +
      "pg_stat_user_tables.n_dead_tup and pg_total_relation_size summed over the database's " +
      "tables at the window's end. Other CPU = machine-wide busy time not spent by the " +
      "server, the driver or the harness, % of all cores.",
    "",
  );
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------
// Main

/** Run the scenario with command-line `args`; resolves to the exit code. */
export async function runHorizon(args: readonly string[]): Promise<number> {
  let flags: Flags;
  try {
    flags = parseFlags(args);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`error: ${error.message}\n${USAGE}`);
    return 2;
  }
  const entries = flags.entries.map((k) => ENTRIES.find((e) => e.key === k)!);
  const peers = entries.some((e) => e.system !== "akadze") ? await ensurePeers() : null;
  console.error("starting a durable throwaway PostgreSQL ...");
  const server = await startThrowawayPostgres({ durable: true, settings: flags.pg });
  const admin = postgres(server.url, { max: 1, onnotice: () => {} });
  try {
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const postmasterPid = await readPostmasterPid(dir);
    const machine = await machineInfo(dir.replace(/\/data$/, ""));
    const pgInfo = await postgresInfo(admin);
    const minutes = entries.length * (flags.before + flags.pinned + flags.after) / 60;
    console.error(
      `${
        pgInfo.version.split(" on ")[0]
      }; ${machine.cores} cores; load ${machine.loadavg_at_start}; ` +
        `${entries.length} entries, at most ${fmt(minutes, 0)} min`,
    );
    const results: EntryResult[] = [];
    for (const entry of entries) {
      if (wasInterrupted()) break;
      console.error(`${entry.label} ...`);
      const r = await runEntry(entry, flags, server.url, admin, postmasterPid);
      results.push(r);
      const c = r.check;
      const line = `${entry.key}: unpinned p50 ${ms(c?.baseline.p50_ms ?? null)}, end of pinned ` +
        `p50 ${ms(c?.end?.p50_ms ?? null)} p99 ${ms(c?.end?.p99_ms ?? null)}, backlog ${
          fmt(c?.end?.backlog_end ?? null)
        }, trend ${fmt(c?.backlog_slope_per_min ?? null, 1)}/min, recovery ${
          c?.recovery_s != null ? `${fmt(c.recovery_s, 1)} s` : "–"
        }` + (r.stopped ? `, stopped (${r.stopped.reason})` : "") +
        (r.errors.length ? `; errors: ${r.errors.join("; ")}` : "");
      console.log(line);
    }
    if (wasInterrupted()) {
      console.error("interrupted");
      return 130;
    }
    const errors = results.flatMap((r) => r.errors.map((e) => `${r.key}: ${e}`));
    if (flags.smoke) {
      // The scenario itself must work: every phase saw jobs start, the producer kept its rate.
      for (const r of results) {
        for (const phase of ["before", "pinned", "after"] as const) {
          if (!r.windows.some((w) => w.phase === phase && w.started > 0)) {
            errors.push(`${r.key}: no job started in the ${phase} phase`);
          }
        }
        if (!r.pin.backend_xmin) errors.push(`${r.key}: the horizon was not pinned`);
        if (r.stopped) errors.push(`${r.key}: stopped (${r.stopped.reason})`);
        const expected = flags.rate * (flags.before + flags.pinned + flags.after);
        const enqueued = Number(r.done?.enqueued ?? 0);
        if (enqueued < 0.8 * expected) {
          errors.push(`${r.key}: ${enqueued} jobs enqueued, ${expected} expected`);
        }
      }
      if (errors.length) console.error(errors.map((e) => `error: ${e}`).join("\n"));
      return errors.length ? 1 : 0;
    }
    const date = new Date().toISOString().slice(0, 10);
    const { out: _o, smoke: _s, entries: _e, ...params } = flags;
    const report: Report = {
      date,
      command: `deno task bench --scenario horizon${args.length ? ` ${args.join(" ")}` : ""}`,
      machine,
      postgres: pgInfo,
      peers,
      params,
      entries: results,
      loadavg_at_end: await loadAverage(),
      errors,
    };
    const md = markdown(report);
    const out = flags.out ?? `${BENCH}/results/${date}-horizon.json`;
    const mdOut = out.replace(/(\.json)?$/, ".md");
    await Deno.mkdir(out.slice(0, Math.max(0, out.lastIndexOf("/"))) || ".", { recursive: true });
    await Deno.writeTextFile(out, JSON.stringify(report, null, 1) + "\n");
    await Deno.writeTextFile(mdOut, md);
    console.error(`wrote ${out} and ${mdOut}`);
    return errors.length ? 1 : 0;
  } finally {
    await admin.end({ timeout: 1 });
    await server.stop();
  }
}

if (import.meta.main) Deno.exit(await runHorizon(Deno.args));
