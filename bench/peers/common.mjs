// Shared by the peer drivers (run by the Node >= 22 of bench/.peers): /proc readers, the
// result line, latency summaries. Same definitions as bench/lib/proc.ts.
import { readdirSync, readFileSync } from "node:fs";

const CLK_TCK = Number(process.env.BENCH_CLK_TCK ?? 100);

function readStat(pid) {
  let text;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  const f = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const ms = (i) => Number(f[i]) * 1000 / CLK_TCK;
  return { ppid: Number(f[1]), own: ms(11) + ms(12), children: ms(13) + ms(14) };
}

/** CPU time (user + system) of this process so far, ms. */
export function cpuMs(pid = "self") {
  return readStat(pid)?.own ?? NaN;
}

/** CPU time of a PostgreSQL server: postmaster, live children, reaped children; ms. */
export function postgresCpuMs(postmasterPid) {
  if (!postmasterPid) return NaN;
  const root = readStat(postmasterPid);
  if (!root) return NaN;
  let total = root.own + root.children;
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = readStat(name);
    if (stat?.ppid === postmasterPid) total += stat.own;
  }
  return total;
}

/** Peak resident set size of this process (VmHWM), KiB. */
export function peakRssKb() {
  try {
    return Number(/^VmHWM:\s+(\d+)/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1]);
  } catch {
    return NaN;
  }
}

/** Wall-clock milliseconds with sub-millisecond precision (comparable across processes). */
export const wallMs = () => performance.timeOrigin + performance.now();

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** p50/p95/max of latency samples (ms). */
export function summarize(samples) {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  return { n: s.length, p50: at(0.5), p95: at(0.95), max: s[s.length - 1] };
}

/** The settings every driver reads from its environment. */
export function benchEnv() {
  const env = process.env;
  return {
    url: env.DATABASE_URL,
    n: Number(env.N ?? 50_000),
    batchRows: Number(env.BATCH_ROWS ?? 5_000),
    single: Number(env.SINGLE ?? 1_000),
    samples: Number(env.SAMPLES ?? 300),
    // Unmeasured repetitions before the single-row and the latency measurements.
    warmup: Number(env.WARMUP ?? 100),
    postmasterPid: Number(env.PG_POSTMASTER_PID ?? 0),
  };
}

/** Print the one result line bench/run.ts reads. */
export function report(result) {
  console.log(`BENCH_RESULT ${JSON.stringify(result)}`);
}

/**
 * Poll until `busy()` is false (all jobs done in the database); returns the WAL position
 * read in the same statement.
 */
export async function untilIdle(query) {
  for (;;) {
    const { busy, lsn } = await query();
    if (!busy) return lsn;
    await sleep(1);
  }
}

/**
 * The version of a package installed in bench/.peers (bench/run.ts copies these scripts to
 * bench/.peers/drivers/ so that Node resolves the packages from bench/.peers/node_modules).
 */
export function packageVersion(name) {
  const url = new URL(`../node_modules/${name}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, "utf8")).version;
}
