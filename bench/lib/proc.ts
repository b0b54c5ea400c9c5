// /proc readers shared by the bench processes (Linux only): CPU time of a process or of a
// PostgreSQL server's whole process tree, and peak resident memory.

/** Clock ticks per second of /proc/<pid>/stat (USER_HZ; 100 on every Linux we run on). */
export const CLK_TCK = Number(Deno.env.get("BENCH_CLK_TCK") ?? 100);

interface Stat {
  ppid: number;
  /** utime + stime, ms. */
  own: number;
  /** cutime + cstime (reaped children), ms. */
  children: number;
}

async function readStat(pid: number | "self"): Promise<Stat | null> {
  let text: string;
  try {
    text = await Deno.readTextFile(`/proc/${pid}/stat`);
  } catch {
    return null; // gone
  }
  // The command name (field 2) may hold spaces: split after its closing parenthesis.
  const f = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const ms = (i: number) => Number(f[i]) * 1000 / CLK_TCK;
  return { ppid: Number(f[1]), own: ms(11) + ms(12), children: ms(13) + ms(14) };
}

/** CPU time (user + system) a process has used so far, ms. */
export async function cpuMs(pid: number | "self" = "self"): Promise<number> {
  return (await readStat(pid))?.own ?? NaN;
}

/**
 * CPU time used so far by a PostgreSQL server: the postmaster, its live children
 * (backends, walwriter, autovacuum, ...) and the children it has already reaped.
 */
export async function postgresCpuMs(postmasterPid: number): Promise<number> {
  const root = await readStat(postmasterPid);
  if (!root) return NaN;
  let total = root.own + root.children;
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const stat = await readStat(Number(entry.name));
    if (stat?.ppid === postmasterPid) total += stat.own;
  }
  return total;
}

/** Peak resident set size (VmHWM) of a process, KiB. */
export async function peakRssKb(pid: number | "self" = "self"): Promise<number> {
  try {
    const status = await Deno.readTextFile(`/proc/${pid}/status`);
    return Number(/^VmHWM:\s+(\d+)/m.exec(status)?.[1] ?? NaN);
  } catch {
    return NaN;
  }
}

/** The postmaster's pid of the PostgreSQL server whose data directory is `dataDir`. */
export async function readPostmasterPid(dataDir: string): Promise<number> {
  return Number((await Deno.readTextFile(`${dataDir}/postmaster.pid`)).split("\n")[0]);
}
