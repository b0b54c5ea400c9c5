// Facts about the machine and the server a benchmark ran on, for its results' header, and
// the machine-wide CPU counters that tell how much else ran meanwhile (Linux only).
import type postgres from "postgres";
import { CLK_TCK } from "./proc.ts";
import { summarize } from "./report.ts";

const ROOT = new URL("../..", import.meta.url).pathname.replace(/\/$/, "");

/** A file's text, or "" when it cannot be read. */
export async function readText(path: string): Promise<string> {
  try {
    return await Deno.readTextFile(path);
  } catch {
    return "";
  }
}

/** Busy and steal CPU time of the whole machine so far, ms (from /proc/stat). */
export async function machineCpu(): Promise<{ busy: number; steal: number }> {
  const line = (await readText("/proc/stat")).split("\n")[0];
  const [user, nice, system, _idle, _iowait, irq, softirq, steal] = line.split(/\s+/).slice(1)
    .map(Number);
  const ms = (ticks: number) => ticks * 1000 / CLK_TCK;
  return { busy: ms(user + nice + system + irq + softirq), steal: ms(steal) };
}

/** CPU time of this process and of its reaped children so far, ms. */
export async function ownTreeCpuMs(): Promise<number> {
  const text = await readText("/proc/self/stat");
  const f = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 1000 / CLK_TCK;
}

/** The 1-, 5- and 15-minute load averages, as /proc/loadavg prints them. */
export async function loadAverage(): Promise<string> {
  return (await readText("/proc/loadavg")).split(" ").slice(0, 3).join(" ");
}

/** Median latency of an 8 KiB write + fdatasync in the directory PostgreSQL's data is in. */
async function fsyncMs(dir: string): Promise<number> {
  const path = await Deno.makeTempFile({ dir, prefix: "bench-fsync-" });
  const file = await Deno.open(path, { write: true });
  const block = new Uint8Array(8192).fill(7);
  const times: number[] = [];
  try {
    for (let i = 0; i < 200; i++) {
      await file.seek(0, Deno.SeekMode.Start);
      const t = performance.now();
      await file.write(block);
      await file.syncData();
      times.push(performance.now() - t);
    }
  } finally {
    file.close();
    await Deno.remove(path);
  }
  return summarize(times).median ?? NaN;
}

/** The commit the run measured, and which of akadze's source files differ from it. */
async function gitInfo(): Promise<{ commit: string; modified: string[] }> {
  const git = async (...args: string[]) => {
    try {
      const out = await new Deno.Command("git", { args, cwd: ROOT, stderr: "null" }).output();
      return out.success ? new TextDecoder().decode(out.stdout).trim() : "";
    } catch {
      return "";
    }
  };
  const status = await git(
    "status",
    "--porcelain",
    "--",
    "src",
    "migrations",
    "mod.ts",
    "admin.ts",
  );
  return {
    commit: await git("rev-parse", "--short", "HEAD") || "unknown",
    modified: status ? status.split("\n").map((l) => l.slice(3)) : [],
  };
}

/** What a results file says about the machine. */
export interface MachineInfo {
  cpu_model: string;
  cores: number;
  ram_gib: number;
  os: string;
  deno: string;
  git: { commit: string; modified: string[] };
  fsync_8k_ms: number;
  loadavg_at_start: string;
}

/** The machine's facts; `dataDir` is where the server's data lives (for the fsync latency). */
export async function machineInfo(dataDir: string): Promise<MachineInfo> {
  const cpuinfo = await readText("/proc/cpuinfo");
  const meminfo = await readText("/proc/meminfo");
  const memKb = Number(/^MemTotal:\s+(\d+)/m.exec(meminfo)?.[1] ?? NaN);
  return {
    cpu_model: /^model name\s*:\s*(.+)$/m.exec(cpuinfo)?.[1] ?? "unknown",
    cores: navigator.hardwareConcurrency,
    ram_gib: Math.round(memKb / 1024 / 1024 * 10) / 10,
    os: `${Deno.build.os} ${Deno.osRelease()}`,
    deno: Deno.version.deno,
    git: await gitInfo(),
    fsync_8k_ms: Math.round(await fsyncMs(dataDir) * 1000) / 1000,
    loadavg_at_start: await loadAverage(),
  };
}

const PG_SETTINGS = [
  "shared_buffers",
  "synchronous_commit",
  "fsync",
  "full_page_writes",
  "wal_level",
  "max_wal_size",
  "checkpoint_timeout",
  "max_connections",
  "work_mem",
  "jit",
  "autovacuum",
  "autovacuum_naptime",
  "idle_in_transaction_session_timeout",
  "shared_preload_libraries",
];

/** What a results file says about the server: its version and the settings that matter. */
export interface PostgresInfo {
  version: string;
  settings: Record<string, string>;
}

/** The server's version and settings, read through `admin`. */
export async function postgresInfo(admin: postgres.Sql): Promise<PostgresInfo> {
  const [{ version }] = await admin`select version()`;
  const rows = await admin`
    select name, setting, unit from pg_settings where name = any(${PG_SETTINGS}) order by name`;
  const settings: Record<string, string> = {};
  for (const r of rows) settings[r.name] = r.unit ? `${r.setting} (${r.unit})` : r.setting;
  return { version, settings };
}

/** The markdown lines describing the machine and the server, shared by the reports. */
export function environmentLines(
  machine: MachineInfo,
  pg: PostgresInfo,
  peers: Record<string, string> | null,
): string[] {
  const m = machine;
  return [
    `Machine: ${m.cores} cores (${m.cpu_model}), ${m.ram_gib} GiB RAM, ${m.os}; ` +
    `8 KiB write+fdatasync ${m.fsync_8k_ms} ms (median); load average at start ${m.loadavg_at_start}. ` +
    `Deno ${m.deno}` + (peers ? `, Node ${peers.node}` : "") + ". akadze at " +
    `commit ${m.git.commit}` +
    (m.git.modified.length ? ` with uncommitted changes in ${m.git.modified.join(", ")}` : "") +
    ".",
    "",
    `PostgreSQL: ${pg.version.split(" on ")[0]}, one throwaway server for the whole run; ` +
    Object.entries(pg.settings).map(([k, v]) => `${k}=${v || "''"}`).join(", ") + ".",
    "",
  ];
}
