// A primary with a synchronous streaming standby, and a hard stop of a server: what
// tests/failover_test.ts and the chaos soak's failover phase (chaos/run.ts) build on.
import postgres from "postgres";
import {
  startThrowawayPostgres,
  startThrowawayStandby,
  type ThrowawayPostgres,
  type ThrowawayStandby,
} from "../src/throwaway_postgres.ts";

/** A primary whose commits wait until its standby has applied them. */
export interface SyncPair {
  primary: ThrowawayPostgres;
  standby: ThrowawayStandby;
  /** Stop and remove both servers. */
  stop(): Promise<void>;
}

/** How long the standby may take to stream synchronously (ms): generous, for a busy machine. */
const SYNC_TIMEOUT = 60_000;

/**
 * Start a primary and a synchronous streaming standby of it (`synchronous_commit =
 * remote_apply`, fsync still off): what a reader sees on the standby is what the primary
 * acknowledged. `settings` apply to both servers; `databases` are created on the primary
 * once the standby streams synchronously. The standby retries its WAL stream every 100 ms
 * (not every 5 s), so that a restarted primary's commits do not wait long for it.
 */
export async function startSyncPair(
  options: { settings?: Record<string, string | number>; databases?: string[] } = {},
): Promise<SyncPair> {
  const primary = await startThrowawayPostgres({
    settings: { ...options.settings, synchronous_commit: "remote_apply" },
  });
  let standby: ThrowawayStandby | undefined;
  try {
    standby = await startThrowawayStandby(primary, {
      settings: { ...options.settings, synchronous_commit: "on", wal_retrieve_retry_interval: 100 },
    });
    const admin = postgres(primary.url, { max: 1, onnotice: () => {} });
    try {
      await admin`alter system set synchronous_standby_names = '*'`;
      await admin`select pg_reload_conf()`;
      await waitSync(primary);
      for (const name of options.databases ?? []) await admin.unsafe(`create database ${name}`);
    } finally {
      await admin.end();
    }
  } catch (error) {
    await Promise.all([primary.stop(), standby?.stop()]);
    throw error;
  }
  const pair = standby;
  return {
    primary,
    standby,
    stop: () => Promise.all([primary.stop(), pair.stop()]).then(() => {}),
  };
}

/** Wait until `primary` has a standby that replicates synchronously. */
export async function waitSync(primary: ThrowawayPostgres, timeoutMs = SYNC_TIMEOUT) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const sql = postgres(primary.url, { max: 1, connect_timeout: 2, onnotice: () => {} });
    try {
      const rows = await sql`select 1 from pg_stat_replication where sync_state = 'sync'`;
      if (rows.length > 0) return;
    } catch {
      // starting up: try again
    } finally {
      await sql.end({ timeout: 1 });
    }
    if (Date.now() > until) throw new Error("the standby did not replicate synchronously");
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** `pg_ctl stop -m immediate` on a throwaway server: a crash, no shutdown checkpoint. */
export async function crash(server: ThrowawayPostgres): Promise<void> {
  const sql = postgres(server.url, { max: 1, onnotice: () => {} });
  const [{ data }] = await sql`select current_setting('data_directory') as data`;
  await sql.end();
  const bindir = new TextDecoder().decode(
    (await new Deno.Command("pg_config", { args: ["--bindir"] }).output()).stdout,
  ).trim();
  const argv = [`${bindir}/pg_ctl`, "stop", "-m", "immediate", "-D", data];
  const [cmd, ...args] = Deno.uid() === 0 ? ["runuser", "-u", "postgres", "--", ...argv] : argv;
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) throw new Error(`pg_ctl stop failed: ${new TextDecoder().decode(out.stderr)}`);
}
