// Where akadze's drain time goes: Deno or PostgreSQL. Not part of `deno task bench`; run
//
//   deno run --allow-all bench/profile.ts [--n 50000] [--reps 5] [--parts A,B,C,D] [--queued 200000]
//                                         [--out bench/results/DATE-profile]
//
// On one durable throwaway PostgreSQL with pg_stat_statements (and WAL I/O timing) it
//  A. drains N jobs with a few worker configurations and reads, per statement kind, calls,
//     rows per call, planning and execution time, WAL (pg_stat_statements) plus the WAL
//     syncs (pg_stat_wal) and the CPU time of the worker process and of the server;
//  B. EXPLAIN ANALYZEs the claim and outcome statements of src/worker (their exact text,
//     taken from Claimer and Completer) for 1, 50 and 500 jobs with --queued jobs, with JIT
//     on and off, also with 1,000,000 succeeded rows retained;
//  C. records a V8 CPU profile of the worker process during one drain (self time by function);
//  D. measures the enqueue INSERT (5,000 rows and one row) in PostgreSQL and from Deno, next
//     to the same statement sent raw and a plain INSERT.
// Writes <out>.json and <out>.md.
import postgres from "postgres";
import { Akadze } from "../mod.ts";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { Claimer } from "../src/worker/claimer.ts";
import { Completer, type Outcome } from "../src/worker/completer.ts";
import type { DriverSpec } from "./akadze/driver.ts";
import { flagValue } from "./lib/flags.ts";
import { HISTORY_DDL, MOVE_SUCCEEDED } from "./lib/history.ts";
import { LineReader } from "./lib/lines.ts";
import { readPostmasterPid } from "./lib/proc.ts";
import { fmt, summarize } from "./lib/report.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const flag = (name: string, fallback: string) => flagValue(Deno.args, name, fallback);
const N = Number(flag("--n", "50000"));
const REPS = Number(flag("--reps", "5"));
const QUEUED = Number(flag("--queued", "200000"));
const DATE = new Date().toISOString().slice(0, 10);
const OUT = flag("--out", `${ROOT}/bench/results/${DATE}-profile`);
const PARTS = new Set(flag("--parts", "A,B,C,D").split(","));

const server = await startThrowawayPostgres({
  durable: true,
  settings: {
    shared_preload_libraries: "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
    track_io_timing: "on",
    track_wal_io_timing: "on",
  },
});
const admin = postgres(server.url, { max: 1, onnotice: () => {} });
const dbUrl = (name: string) => server.url.replace(/\/postgres$/, `/${name}`);
const md: string[] = [`# Where akadze's drain time goes (${DATE})`, ""];
const json: Record<string, unknown> = { date: DATE, n: N };

// ---------------------------------------------------------------------------------------
// Statement texts, exactly as src/worker builds them (a fake sql captures the first call).

class Captured extends Error {
  constructor(readonly text: string, readonly params: unknown[]) {
    super("captured");
  }
}
// deno-lint-ignore no-explicit-any
const capture: any = {
  unsafe: (text: string, params: unknown[]) => {
    throw new Captured(text, params);
  },
  begin: () => {
    throw new Error("unexpected transaction");
  },
};
async function captured(fn: () => Promise<unknown>): Promise<Captured> {
  try {
    await fn();
  } catch (error) {
    if (error instanceof Captured) return error;
    throw error;
  }
  throw new Error("nothing captured");
}
const claimer = new Claimer(capture, {
  schema: "akadze",
  workerId: "profile",
  tasks: ["noop", "lat"],
  hooks: [],
});
const claimText = (await captured(() => claimer.claim([{ queue: "default", slots: 1 }], 1))).text;
// The one-queue claim: queue, tasks, how many, excluded ids, worker id.
const claimParams = (k: number) => ["default", ["noop", "lat"], k, [], "profile"];
const completer = new Completer(capture, "akadze", []);
const completeText =
  (await captured(() =>
    completer.write([{ id: "1", runCount: 1, kind: "succeeded", result: null }])
  )).text;
// The outcome with `retention: 0`: a fenced DELETE of the succeeded jobs.
const deleteText =
  (await captured(() =>
    new Completer(capture, "akadze", [], { deleteSucceeded: true }).write([
      { id: "1", runCount: 1, kind: "succeeded", result: null },
    ])
  )).text;
// The outcome UPDATE's parallel arrays: ids, run counts, kinds, results, errors, delays.
const completeParams = (outcomes: Outcome[]) => [
  outcomes.map((o) => o.id),
  outcomes.map((o) => o.runCount),
  outcomes.map(() => "succeeded"),
  outcomes.map(() => null),
  outcomes.map(() => null),
  outcomes.map(() => null),
];

// ---------------------------------------------------------------------------------------
// A. Drains with statement statistics.

async function runDriver(spec: DriverSpec, workerFlags = ""): Promise<Record<string, number>> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", `${ROOT}/bench/akadze/driver.ts`, JSON.stringify(spec)],
    cwd: ROOT,
    env: workerFlags ? { BENCH_WORKER_FLAGS: workerFlags } : {},
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines = new LineReader(child.stdout);
  let result: Record<string, number> | null = null;
  for (let line = await lines.next(); line !== null; line = await lines.next()) {
    if (line.startsWith("BENCH_RESULT ")) result = JSON.parse(line.slice(13));
  }
  if (!(await child.status).success || !result) throw new Error("driver failed");
  return result;
}

function kindOf(query: string): string {
  if (query.includes("candidates as") || query.includes(".claim_one")) return "claim";
  if (query.includes(".complete_jobs(")) return "complete";
  if (query.includes("as o(") && query.includes("run_count")) return "complete";
  if (/insert into "akadze"\.jobs/.test(query)) return "enqueue";
  if (query.includes('akadze".workers') || query.includes("heartbeat")) return "heartbeat/rescue";
  if (query.includes("exists (select $1 from akadze.jobs")) return "bench poll";
  return "other";
}

const [{ dir: dataDir }] = await admin`select current_setting('data_directory') as dir`;
const postmasterPid = await readPostmasterPid(dataDir);
const DRAIN_CONFIGS: { name: string; app: DriverSpec["app"]; slots: number }[] = [
  { name: "slots 50, JIT on (default pool)", app: {}, slots: 50 },
  { name: "slots 50, jit=off", app: { jit: false }, slots: 50 },
  { name: "slots 500, JIT on (default pool)", app: {}, slots: 500 },
  { name: "slots 500, jit=off", app: { jit: false }, slots: 500 },
  // The `akadze` entry of `deno task bench`.
  { name: "slots 500, jit=off, prepared", app: { jit: false, prepare: true }, slots: 500 },
];
// `--configs 1,5`: only these drain configurations (1-based), all by default.
const CONFIGS = flag("--configs", "");
const drainConfigs = CONFIGS === ""
  ? DRAIN_CONFIGS
  : CONFIGS.split(",").map((i) => DRAIN_CONFIGS[Number(i) - 1]);
const drains: Record<string, unknown>[] = [];
md.push("## A. Drains of N jobs, per statement kind", "");
md.push(
  `N = ${fmt(N)}; pg_stat_statements (track_planning on); times in ms; "in PG" = planning + ` +
    "execution of the statement (not the commit's WAL flush, counted under WAL syncs).",
  "",
);
let round = 0;
for (const config of PARTS.has("A") ? drainConfigs : []) {
  const db = `profile_drain_${++round}`;
  await admin.unsafe(`create database ${db}`);
  const sql = postgres(dbUrl(db), { max: 1, onnotice: () => {} });
  await sql`create extension pg_stat_statements`;
  await sql`select pg_stat_statements_reset()`;
  await sql`select pg_stat_reset_shared('wal')`;
  const raw = await runDriver({
    url: dbUrl(db),
    n: N,
    batchRows: 5000,
    single: 0,
    samples: 0,
    warmup: 0,
    retained: 0,
    app: config.app,
    worker: { slots: config.slots },
    postmasterPid,
  });
  const rows = await sql`
    select query, toplevel, calls::int, rows::int, total_exec_time::float8 as exec,
           total_plan_time::float8 as plan, wal_bytes::float8 as wal
      from pg_stat_statements
     where dbid = (select oid from pg_database where datname = current_database())`;
  const [wal] = await sql`
    select wal_records::int, wal_fpi::int, wal_bytes::float8, wal_write::int, wal_sync::int,
           wal_write_time::float8, wal_sync_time::float8 from pg_stat_wal`;
  await sql.end();
  await admin.unsafe(`drop database ${db} with (force)`);
  const kinds: Record<
    string,
    { calls: number; rows: number; exec: number; plan: number; wal: number }
  > = {};
  // Statements inside the claim and outcome functions are counted there (toplevel false).
  for (const r of rows.filter((r) => r.toplevel)) {
    const k = kindOf(r.query);
    const x = kinds[k] ??= { calls: 0, rows: 0, exec: 0, plan: 0, wal: 0 };
    x.calls += r.calls;
    x.rows += r.rows;
    x.exec += r.exec;
    x.plan += r.plan;
    x.wal += r.wal;
  }
  const drainMs = raw.drain_ms;
  drains.push({ config: config.name, raw, kinds, wal });
  md.push(
    `### ${config.name}: ${fmt(N / drainMs * 1000)} jobs/s (${fmt(drainMs)} ms); worker CPU ` +
      `${fmt(raw.drain_worker_cpu_ms)} ms, PostgreSQL CPU ${fmt(raw.drain_pg_cpu_ms)} ms`,
    "",
  );
  md.push(
    "| statement | calls | rows/call | plan ms/call | exec ms/call | in PG, ms total | WAL B/row |",
    "|---|---:|---:|---:|---:|---:|---:|",
  );
  for (const [k, x] of Object.entries(kinds).sort((a, b) => b[1].exec - a[1].exec)) {
    if (x.exec + x.plan < 1) continue;
    md.push(
      `| ${k} | ${fmt(x.calls)} | ${fmt(x.rows / x.calls, 1)} | ${fmt(x.plan / x.calls, 2)} | ` +
        `${fmt(x.exec / x.calls, 2)} | ${fmt(x.exec + x.plan)} | ${
          fmt(x.rows ? x.wal / x.rows : NaN)
        } |`,
    );
  }
  md.push(
    "",
    "Every statement (nested: run inside a function), per 1,000 jobs:",
    "",
    "| statement | nested | calls / 1,000 jobs | rows/call | mean ms | total ms / 1,000 jobs |",
    "|---|---|---:|---:|---:|---:|",
  );
  for (const r of [...rows].sort((a, b) => b.exec + b.plan - a.exec - a.plan).slice(0, 14)) {
    const text = r.query.replace(/\s+/g, " ").slice(0, 90).replaceAll("|", "\\|");
    md.push(
      `| \`${text}\` | ${r.toplevel ? "" : "yes"} | ${fmt(r.calls / N * 1000, 2)} | ` +
        `${fmt(r.rows / r.calls, 1)} | ${fmt((r.exec + r.plan) / r.calls, 3)} | ` +
        `${fmt((r.exec + r.plan) / N * 1000, 2)} |`,
    );
  }
  md.push(
    "",
    `WAL (whole server, enqueue included): ${fmt(wal.wal_bytes / N)} B/job, ${fmt(wal.wal_fpi)} ` +
      `full-page images, ${fmt(wal.wal_sync)} syncs taking ${fmt(wal.wal_sync_time)} ms in total.`,
    "",
  );
}
json.drains = drains;

// ---------------------------------------------------------------------------------------
// B. EXPLAIN ANALYZE of claim and outcome statements.

interface Explained {
  planning: number;
  execution: number;
  jit: number;
  walBytes: number;
  nodes: string[];
}
async function explain(
  sql: postgres.Sql,
  text: string,
  params: unknown[],
  setup: (tx: postgres.TransactionSql) => Promise<unknown[] | null>,
  jit: boolean,
): Promise<Explained> {
  let out: Explained | null = null;
  await sql.begin(async (tx) => {
    if (!jit) await tx`set local jit = off`;
    const extra = await setup(tx);
    const [row] = await tx.unsafe(
      `explain (analyze, buffers, wal, format json) ${text}`,
      (extra ?? params) as never[],
    );
    const value = Object.values(row)[0];
    const [plan] = typeof value === "string" ? JSON.parse(value) : value;
    const nodes: string[] = [];
    const walk = (node: Record<string, unknown>) => {
      const name = `${node["Node Type"]}${node["Index Name"] ? ` ${node["Index Name"]}` : ""}${
        node["Relation Name"] && !node["Index Name"] ? ` ${node["Relation Name"]}` : ""
      }`;
      if (/Seq Scan|Hash Join|Index Scan|Tid Scan|Nested Loop|Bitmap/.test(name)) nodes.push(name);
      for (const child of (node.Plans as Record<string, unknown>[] | undefined) ?? []) walk(child);
    };
    walk(plan.Plan);
    out = {
      planning: plan["Planning Time"],
      execution: plan["Execution Time"],
      jit: plan.JIT?.Timing?.Total ?? 0,
      walBytes: plan.Plan["WAL Bytes"] ?? 0,
      nodes: [...new Set(nodes)],
    };
    throw new Error("rollback");
  }).catch((error) => {
    if (error.message !== "rollback") throw error;
  });
  return out!;
}

async function claimedRows(tx: postgres.TransactionSql, k: number): Promise<Outcome[]> {
  const rows = await tx.unsafe(claimText, claimParams(k) as never[]);
  if (rows.length !== k) throw new Error(`claimed ${rows.length} of ${k} jobs`);
  return rows.map((r) => ({
    id: r.id,
    runCount: r.run_count,
    kind: "succeeded" as const,
    result: null,
  }));
}

function fencedParams(outcomes: Outcome[]): unknown[] {
  return [outcomes.map((o) => o.id), outcomes.map((o) => o.runCount)];
}

async function explainSet(sql: postgres.Sql, label: string, ks: number[]) {
  const results: Record<string, unknown>[] = [];
  md.push(`### ${label}`, "");
  md.push(
    "| statement | jobs | JIT | planning ms | execution ms | of which JIT ms | WAL B/job | plan nodes |",
    "|---|---:|---|---:|---:|---:|---:|---|",
  );
  const cases: {
    name: string;
    text: string | null;
    params: (k: number) => unknown[];
    setup?: (tx: postgres.TransactionSql, k: number) => Promise<unknown[]>;
  }[] = [
    { name: "claim (src)", text: claimText, params: claimParams },
    {
      name: "complete (src)",
      text: completeText,
      params: () => [],
      setup: async (tx, k) => completeParams(await claimedRows(tx, k)),
    },
    {
      name: "complete, retention 0 (src)",
      text: deleteText,
      params: () => [],
      setup: async (tx, k) => fencedParams(await claimedRows(tx, k)),
    },
    {
      name: "complete as a move to a history table (not adopted)",
      text: MOVE_SUCCEEDED,
      params: () => [],
      setup: async (tx, k) => fencedParams(await claimedRows(tx, k)),
    },
  ];
  for (const c of cases) {
    if (!c.text) continue;
    for (const k of ks) {
      for (const jit of [true, false]) {
        const reps: Explained[] = [];
        for (let i = 0; i < REPS; i++) {
          reps.push(
            await explain(
              sql,
              c.text,
              c.params(k),
              (tx) => c.setup?.(tx, k) ?? Promise.resolve(null),
              jit,
            ),
          );
        }
        const med = (f: (e: Explained) => number) => summarize(reps.map(f)).median ?? NaN;
        const r = {
          statement: c.name,
          jobs: k,
          jit,
          planning_ms: med((e) => e.planning),
          execution_ms: med((e) => e.execution),
          jit_ms: med((e) => e.jit),
          wal_per_job: med((e) => e.walBytes) / k,
          nodes: reps[0].nodes,
        };
        results.push(r);
        md.push(
          `| ${c.name} | ${k} | ${jit ? "on" : "off"} | ${fmt(r.planning_ms, 2)} | ` +
            `${fmt(r.execution_ms, 2)} | ${fmt(r.jit_ms, 1)} | ${fmt(r.wal_per_job)} | ` +
            `${r.nodes.join(", ")} |`,
        );
      }
    }
  }
  md.push("");
  return results;
}

if (PARTS.has("B")) {
  md.push(
    "## B. EXPLAIN ANALYZE (median of " + REPS + "; each in a rolled-back transaction)",
    "",
    "The complete statements are measured right after a claim of the same jobs in the same " +
      "transaction. JIT on = the server default (jit_above_cost 100000). Beside the outcome " +
      "UPDATE: the DELETE of `retention: 0` (what graphile-worker does with a finished job) " +
      "and, not adopted, keeping finished jobs in a history table (same columns, primary key " +
      "and finished_at index) by moving them there.",
    "",
  );
  await admin`create database profile_explain`;
  const ex = postgres(dbUrl("profile_explain"), { max: 1, onnotice: () => {} });
  await migrate(ex);
  for (const ddl of HISTORY_DDL) await ex.unsafe(ddl);
  await ex`insert into akadze.jobs (task, args)
         select 'noop', jsonb_build_object('id', g) from generate_series(1, ${QUEUED}::int) g`;
  await ex`vacuum (analyze) akadze.jobs`;
  json.explain_empty = await explainSet(
    ex,
    `${fmt(QUEUED)} queued jobs, nothing retained`,
    [1, 50, 500],
  );
  await ex`
  insert into akadze.jobs (task, queue, state, args, run_count, attempt, run_at, created_at,
                           started_at, finished_at)
  select 'noop', 'default', 'succeeded', jsonb_build_object('id', -g), 1, 0,
         now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
         now() - interval '1 day' + g * interval '1 ms'
    from generate_series(1, 1000000) g`;
  await ex`vacuum (analyze) akadze.jobs`;
  json.explain_retained = await explainSet(
    ex,
    `${fmt(QUEUED)} queued jobs and 1,000,000 succeeded rows retained`,
    [500],
  );
  await ex.end();
  await admin`drop database profile_explain with (force)`;
}

// ---------------------------------------------------------------------------------------
// C. V8 CPU profile of the worker process during one drain.

// ---------------------------------------------------------------------------------------
// D. Enqueue: the INSERT of src/enqueue.ts (bulk 5,000 rows and single rows), in
// PostgreSQL (EXPLAIN ANALYZE) and end to end (wall time per call from Deno).

if (PARTS.has("D")) {
  const fake = new Akadze({ sql: capture });
  const fakeTask = fake.task("noop", () => {});
  const rows = (n: number) => Array.from({ length: n }, (_, i) => ({ id: i }));
  const bulk = await captured(() => fakeTask.enqueueMany(rows(5000)));
  const one = await captured(() => fakeTask.enqueue({ id: 1 }));
  await admin`create database profile_enqueue`;
  const eq = postgres(dbUrl("profile_enqueue"), { max: 1, onnotice: () => {} });
  await migrate(eq);
  md.push(
    "## D. Enqueue (src/enqueue.ts INSERT)",
    "",
    `EXPLAIN ANALYZE, median of ${REPS}, rolled back; WAL from EXPLAIN.`,
    "",
    "| statement | rows | planning ms | execution ms | µs/row | WAL B/row |",
    "|---|---:|---:|---:|---:|---:|",
  );
  const enqueueResults: Record<string, unknown>[] = [];
  for (const [label, params, n] of [["bulk", bulk, 5000], ["single", one, 1]] as const) {
    const reps: Explained[] = [];
    for (let i = 0; i < REPS; i++) {
      reps.push(await explain(eq, params.text, params.params, () => Promise.resolve(null), true));
    }
    const med = (f: (e: Explained) => number) => summarize(reps.map(f)).median ?? NaN;
    const r = {
      case: label,
      statement: "insert (src)",
      rows: n,
      planning_ms: med((e) => e.planning),
      execution_ms: med((e) => e.execution),
      wal_per_row: med((e) => e.walBytes) / n,
    };
    enqueueResults.push(r);
    md.push(
      `| insert (src) | ${n} | ${fmt(r.planning_ms, 2)} | ${fmt(r.execution_ms, 2)} | ` +
        `${fmt(r.execution_ms / n * 1000, 1)} | ${fmt(r.wal_per_row)} |`,
    );
  }
  // End to end, committed: the task API vs the same statement sent raw vs a plain INSERT.
  const app = new Akadze({ sql: eq });
  const task = app.task("noop", () => {});
  const wall = async (times: number, fn: (i: number) => Promise<unknown>) => {
    const t = performance.now();
    for (let i = 0; i < times; i++) await fn(i);
    return (performance.now() - t) / times;
  };
  const payload = rows(5000);
  const e2e = {
    bulk_enqueueMany_ms: await wall(REPS, () => task.enqueueMany(payload)),
    bulk_raw_statement_ms: await wall(REPS, () => eq.unsafe(bulk.text, bulk.params as never[])),
    single_enqueue_ms: await wall(300, (i) => task.enqueue({ id: i })),
    single_raw_statement_ms: await wall(300, () => eq.unsafe(one.text, one.params as never[])),
    single_plain_insert_notify_ms: await wall(
      300,
      (i) =>
        eq`with ins as (insert into akadze.jobs (task, args) values ('noop', ${
          eq.json({ id: i })
        }) returning id) select id::text, pg_notify('akadze_jobs', 'default') from ins`,
    ),
  };
  enqueueResults.push(e2e);
  json.enqueue = enqueueResults;
  md.push(
    "",
    "Wall time per call from Deno, committed (fsync on): " +
      `enqueueMany(5,000) ${fmt(e2e.bulk_enqueueMany_ms, 1)} ms vs the same statement sent raw ` +
      `${fmt(e2e.bulk_raw_statement_ms, 1)} ms; enqueue(one) ` +
      `${fmt(e2e.single_enqueue_ms, 2)} ms vs the same statement raw ` +
      `${fmt(e2e.single_raw_statement_ms, 2)} ms vs a plain INSERT ... RETURNING id with ` +
      `pg_notify ${fmt(e2e.single_plain_insert_notify_ms, 2)} ms.`,
    "",
  );
  await eq.end();
  await admin`drop database profile_enqueue with (force)`;
}

if (PARTS.has("C")) {
  const profDir = await Deno.makeTempDir({ prefix: "akadze-cpuprof-" });
  await admin`create database profile_cpu`;
  const cpuRaw = await runDriver(
    {
      url: dbUrl("profile_cpu"),
      n: N,
      batchRows: 5000,
      single: 0,
      samples: 0,
      warmup: 0,
      retained: 0,
      app: { jit: false, prepare: true },
      worker: { slots: 500 },
      postmasterPid,
    },
    `--cpu-prof --cpu-prof-dir=${profDir}`,
  );
  await admin`drop database profile_cpu with (force)`;
  const self = new Map<string, number>();
  let total = 0;
  for await (const entry of Deno.readDir(profDir)) {
    const profile = JSON.parse(await Deno.readTextFile(`${profDir}/${entry.name}`));
    const byId = new Map<
      number,
      { callFrame: { functionName: string; url: string; lineNumber: number } }
    >();
    for (const node of profile.nodes) byId.set(node.id, node);
    const dt = profile.timeDeltas as number[];
    (profile.samples as number[]).forEach((id, i) => {
      const { functionName, url, lineNumber } = byId.get(id)!.callFrame;
      const file = url.replace(/^.*\/(node_modules\/\.deno\/[^/]+|src|bench)\//, "$1/").replace(
        /^file:\/\//,
        "",
      );
      const key = functionName === "(idle)" || functionName === "(program)" ||
          functionName === "(garbage collector)"
        ? functionName
        : `${functionName || "(anonymous)"} ${file}:${lineNumber + 1}`;
      self.set(key, (self.get(key) ?? 0) + (dt[i] ?? 0) / 1000);
      total += (dt[i] ?? 0) / 1000;
    });
  }
  await Deno.remove(profDir, { recursive: true });
  const busy = [...self.entries()].filter(([k]) => k !== "(idle)");
  const busyMs = busy.reduce((s, [, v]) => s + v, 0);
  const top = busy.sort((a, b) => b[1] - a[1]).slice(0, 25);
  json.cpu_profile = { drain: cpuRaw, total_ms: total, busy_ms: busyMs, top };
  md.push(
    "## C. V8 CPU profile of the worker process (slots 500, jit=off, prepared)",
    "",
    `Drain ${fmt(N / cpuRaw.drain_ms * 1000)} jobs/s under the profiler; the worker process's ` +
      `samples: ${fmt(total)} ms in all, ${fmt(busyMs)} ms not idle (start-up included).`,
    "",
    "| self ms | % of busy | function |",
    "|---:|---:|---|",
    ...top.map(([k, v]) => `| ${fmt(v)} | ${fmt(v / busyMs * 100, 1)} | \`${k}\` |`),
    "",
  );
}

await admin.end();
await server.stop();
await Deno.mkdir(OUT.slice(0, OUT.lastIndexOf("/")), { recursive: true });
await Deno.writeTextFile(`${OUT}.json`, JSON.stringify(json, null, 2) + "\n");
await Deno.writeTextFile(`${OUT}.md`, md.join("\n"));
console.log(md.join("\n"));
console.error(`wrote ${OUT}.json and ${OUT}.md`);
