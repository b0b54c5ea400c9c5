// The limits scenario: how fast jobs under a limit key run, and what limits rows cost the
// jobs without a key. On one durable throwaway PostgreSQL, each case on a fresh database, with
// `--workers` worker processes of `--slots` slots each (bench/akadze/limits_worker.ts):
//
//  - hot key: one key with `maxRunning` M, jobs of `--task-ms` T each; jobs/s over
//    `--seconds` (after 1 s of warm-up) against the most the limit allows, M / T, and the most
//    jobs of the key seen running at once (sampled every 100 ms);
//  - unkeyed drain: `--n` no-op jobs without a key, enqueued at once, drained with no limits
//    rows and with `--limit-rows` rows (keys with no job queued, as after their jobs ran).
//
// With `--base DIR` every case also runs on that checkout's code (e.g. a worktree of main),
// interleaved with this one's, round by round. Writes bench/results/<date>-limits.json and .md.
//
//   deno task bench --scenario limits [--base DIR] [--rounds 3] [--workers 3] [--slots 8]
//       [--task-ms 5] [--max-running 5,20] [--seconds 10] [--n 10000] [--limit-rows 10000]
//       [--out FILE.json]
//   deno task bench --scenario limits --smoke   # small, this checkout, writes nothing
import postgres from "postgres";
import { migrate } from "../admin.ts";
import { jobsChannel } from "../src/db.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import type { LimitsWorkerSpec } from "./akadze/limits_worker.ts";
import { killGroup, release, track } from "./lib/children.ts";
import { LineReader, LineWriter } from "./lib/lines.ts";
import { environmentLines, machineInfo, postgresInfo } from "./lib/machine.ts";
import { fmt, summarize } from "./lib/report.ts";

const BENCH = new URL(".", import.meta.url).pathname.replace(/\/$/, "");
const ROOT = BENCH.replace(/\/bench$/, "");
const WORKER = `${BENCH}/akadze/limits_worker.ts`;

interface Flags {
  smoke: boolean;
  base?: string;
  rounds: number;
  workers: number;
  slots: number;
  taskMs: number;
  maxRunning: number[];
  seconds: number;
  n: number;
  limitRows: number;
  out?: string;
}

function parseFlags(args: readonly string[]): Flags {
  const smoke = args.includes("--smoke");
  const flags: Flags = {
    smoke,
    rounds: smoke ? 1 : 3,
    workers: 3,
    slots: 8,
    taskMs: 5,
    maxRunning: smoke ? [5] : [5, 20],
    seconds: smoke ? 2 : 10,
    n: smoke ? 500 : 10_000,
    limitRows: smoke ? 1_000 : 10_000,
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--smoke") continue;
    const value = () => {
      const v = args[++i];
      if (v === undefined) throw new Error(`${arg} needs a value`);
      return v;
    };
    const count = (min: number) => {
      const v = value();
      const n = Number(v.replaceAll("_", ""));
      if (!Number.isInteger(n) || n < min) throw new Error(`${arg} must be an integer >= ${min}`);
      return n;
    };
    switch (arg) {
      case "--base":
        flags.base = value().replace(/\/$/, "");
        break;
      case "--rounds":
        flags.rounds = count(1);
        break;
      case "--workers":
        flags.workers = count(1);
        break;
      case "--slots":
        flags.slots = count(1);
        break;
      case "--task-ms":
        flags.taskMs = count(1);
        break;
      case "--max-running":
        flags.maxRunning = value().split(",").map(Number);
        break;
      case "--seconds":
        flags.seconds = count(1);
        break;
      case "--n":
        flags.n = count(1);
        break;
      case "--limit-rows":
        flags.limitRows = count(1);
        break;
      case "--out":
        flags.out = value();
        break;
      default:
        throw new Error(`unknown argument ${arg}`);
    }
  }
  return flags;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Start `flags.workers` worker processes of `root`'s akadze; resolves once all run. */
async function startWorkers(url: string, root: string, flags: Flags) {
  const spec: LimitsWorkerSpec = {
    url,
    mod: `${root}/mod.ts`,
    slots: flags.slots,
    taskMs: flags.taskMs,
  };
  const children = Array.from({ length: flags.workers }, () => {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", WORKER, JSON.stringify(spec)],
      cwd: root,
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
      detached: true,
    }).spawn();
    track(child);
    return child;
  });
  await Promise.all(children.map(async (child) => {
    const line = await new LineReader(child.stdout).next();
    if (line !== "ready") throw new Error(`a limits worker failed to start (${line})`);
  }));
  return async () => {
    await Promise.all(children.map(async (child) => {
      await new LineWriter(child.stdin).close().catch(() => {});
      const timer = setTimeout(() => killGroup(child), 10_000);
      await child.status;
      clearTimeout(timer);
      release(child);
    }));
  };
}

/** One hot-key case: jobs/s of the key and the most seen running at once. */
async function hotKey(
  sql: postgres.Sql,
  url: string,
  root: string,
  flags: Flags,
  maxRunning: number,
) {
  await sql`insert into akadze.limits (key, max_running) values ('hot', ${maxRunning})`;
  const ideal = maxRunning / flags.taskMs * 1000;
  const jobs = Math.ceil(Math.min(ideal, 5_000) * (flags.seconds + 2) * 1.5);
  const stop = await startWorkers(url, root, flags);
  let peak = 0;
  let rate = 0;
  try {
    await sql`insert into akadze.jobs (task, limit_key)
              select 'hot', 'hot' from generate_series(1, ${jobs}::int)`;
    await sql`select pg_notify(${jobsChannel("akadze")}, 'default')`;
    await sleep(1_000);
    const done = async () =>
      (await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`)[0].n;
    const c0 = await done();
    const t0 = performance.now();
    while (performance.now() - t0 < flags.seconds * 1000) {
      const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                where state = 'running' and limit_key = 'hot'`;
      peak = Math.max(peak, n);
      await sleep(100);
    }
    const c1 = await done();
    rate = (c1 - c0) / ((performance.now() - t0) / 1000);
    if (c1 >= jobs) throw new Error("the hot key ran out of jobs: raise the job count");
  } finally {
    await stop();
  }
  return { rate, ideal, share: rate / ideal, peak };
}

/** One unkeyed drain: jobs/s of `flags.n` jobs without a key, with `limitRows` limits rows. */
async function unkeyed(
  sql: postgres.Sql,
  url: string,
  root: string,
  flags: Flags,
  limitRows: number,
) {
  await sql`insert into akadze.limits (key, max_running)
            select format('tenant:%s', i), 1 from generate_series(1, ${limitRows}::int) as i`;
  await sql`analyze akadze.limits`;
  const stop = await startWorkers(url, root, flags);
  let rate = 0;
  try {
    // Past the workers' first check for limits rows (they ask again every 2 s).
    await sleep(500);
    const t0 = performance.now();
    await sql`insert into akadze.jobs (task) select 'free' from generate_series(1, ${flags.n}::int)`;
    await sql`select pg_notify(${jobsChannel("akadze")}, 'default')`;
    for (;;) {
      const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                where state <> 'succeeded'`;
      if (n === 0) break;
      if (performance.now() - t0 > 600_000) throw new Error("the drain took over 10 minutes");
      await sleep(50);
    }
    rate = flags.n / ((performance.now() - t0) / 1000);
  } finally {
    await stop();
  }
  return { rate };
}

/** Run the scenario; returns the exit code. */
export async function runLimits(args: string[]): Promise<number> {
  const flags = parseFlags(args);
  const codes: { name: string; root: string }[] = [{ name: "this", root: ROOT }];
  if (flags.base) codes.push({ name: "base", root: flags.base });
  const server = await startThrowawayPostgres({ durable: true });
  const admin = postgres(server.url, { max: 1, onnotice: () => {} });
  const dbUrl = (name: string) => server.url.replace(/\/postgres$/, `/${name}`);
  type Case = {
    key: string;
    run: (sql: postgres.Sql, url: string, root: string) => Promise<Record<string, number>>;
  };
  const cases: Case[] = [
    ...flags.maxRunning.map((m): Case => ({
      key: `hot key, maxRunning ${m}`,
      run: (sql, url, root) => hotKey(sql, url, root, flags, m),
    })),
    { key: "unkeyed, no limits rows", run: (sql, url, root) => unkeyed(sql, url, root, flags, 0) },
    {
      key: `unkeyed, ${fmt(flags.limitRows)} limits rows`,
      run: (sql, url, root) => unkeyed(sql, url, root, flags, flags.limitRows),
    },
  ];
  const results: Record<string, Record<string, Record<string, number>[]>> = {};
  let db = 0;
  try {
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const machine = await machineInfo(dir);
    const pg = await postgresInfo(admin);
    for (let round = 1; round <= flags.rounds; round++) {
      // Alternate which code runs first.
      const order = round % 2 === 1 ? codes : [...codes].reverse();
      for (const c of cases) {
        for (const code of order) {
          const name = `limits_${++db}`;
          await admin.unsafe(`create database ${name}`);
          const url = dbUrl(name);
          await migrate(url);
          const sql = postgres(url, { max: 1, onnotice: () => {} });
          try {
            const r = await c.run(sql, url, code.root);
            ((results[c.key] ??= {})[code.name] ??= []).push(r);
            console.error(`round ${round}, ${c.key}, ${code.name}: ${JSON.stringify(r)}`);
          } finally {
            await sql.end();
            await admin.unsafe(`drop database ${name} with (force)`);
          }
        }
      }
    }
    const median = (rs: Record<string, number>[], k: string) => summarize(rs.map((r) => r[k]));
    const md = [
      `# Limits at speed (${new Date().toISOString().slice(0, 10)})`,
      "",
      ...environmentLines(machine, pg, null),
      "",
      `\`deno task bench --scenario limits ${args.join(" ")}\`: ${flags.workers} worker ` +
      `processes × ${flags.slots} slots, ${flags.rounds} round(s), medians (min–max).`,
      "",
      "| case | code | jobs/s | of maxRunning / task time | peak running |",
      "|---|---|---:|---:|---:|",
    ];
    for (const c of cases) {
      for (const code of codes) {
        const rs = results[c.key]?.[code.name] ?? [];
        const rate = median(rs, "rate");
        const share = c.key.startsWith("hot") ? median(rs, "share") : null;
        const peak = c.key.startsWith("hot") ? Math.max(...rs.map((r) => r.peak)) : null;
        md.push(
          `| ${c.key}${
            c.key.startsWith("hot") ? `, ${flags.taskMs} ms tasks` : `, ${fmt(flags.n)} jobs`
          } | ` +
            `${code.name === "this" ? "this checkout" : flags.base} | ` +
            `${fmt(rate.median ?? NaN)} (${fmt(rate.min ?? NaN)}–${fmt(rate.max ?? NaN)}) | ` +
            `${share ? `${fmt((share.median ?? NaN) * 100)} %` : ""} | ${peak ?? ""} |`,
        );
      }
    }
    for (const code of codes) {
      const none = median(results["unkeyed, no limits rows"]?.[code.name] ?? [], "rate").median;
      const many = median(
        results[`unkeyed, ${fmt(flags.limitRows)} limits rows`]?.[code.name] ?? [],
        "rate",
      ).median;
      md.push(
        "",
        `${code.name === "this" ? "This checkout" : flags.base}: unkeyed drain with ` +
          `${fmt(flags.limitRows)} limits rows ${fmt((many ?? NaN) / (none ?? NaN), 2)} × ` +
          "the drain without.",
      );
    }
    console.log(md.join("\n"));
    if (!flags.smoke) {
      const out = flags.out ??
        `${ROOT}/bench/results/${new Date().toISOString().slice(0, 10)}-limits.json`;
      await Deno.writeTextFile(
        out,
        JSON.stringify({ flags, machine, pg, results }, null, 2) + "\n",
      );
      await Deno.writeTextFile(out.replace(/\.json$/, ".md"), md.join("\n") + "\n");
      console.error(`wrote ${out} and its .md`);
    }
    return 0;
  } finally {
    await admin.end();
    await server.stop();
  }
}
