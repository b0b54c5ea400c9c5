/**
 * A throwaway PostgreSQL server for tests and `akadze dev`: the system's binaries (found
 * with `pg_config --bindir`), run as the `postgres` OS user when we are root. The server
 * lives in a private temporary directory, listens on 127.0.0.1 on a free port, and is
 * stopped and removed by `stop()`; if this process dies without calling it, the server
 * notices its closed stdin and shuts itself down and removes its directory.
 *
 * @module
 */
import postgres from "postgres";
import { AkadzeError } from "./errors.ts";

/** A running throwaway server. */
export interface ThrowawayPostgres {
  /** URL of the `postgres` maintenance database (user `postgres`, trust auth). */
  readonly url: string;
  /** The TCP port it listens on (127.0.0.1). */
  readonly port: number;
  /** Server major version, e.g. 15. */
  readonly version: number;
  /** Fast-shutdown the server and remove its directory. Idempotent. */
  stop(): Promise<void>;
}

/** Options of {@linkcode startThrowawayPostgres}. */
export interface ThrowawayPostgresOptions {
  /** Extra `-c name=value` server settings. */
  settings?: Record<string, string | number>;
  /**
   * Durable settings (fsync on). Default false: tests run with fsync and synchronous
   * commit off, which is safe for data nobody keeps.
   */
  durable?: boolean;
  /** Directory with initdb/postgres; default from `pg_config --bindir`. */
  bindir?: string;
}

const START_TIMEOUT_MS = 60_000;

/**
 * Start a throwaway PostgreSQL server.
 *
 * @example
 * ```ts ignore
 * import { startThrowawayPostgres } from "@akadze/akadze/testing";
 * const pg = await startThrowawayPostgres();
 * try {
 *   console.log(pg.url);
 * } finally {
 *   await pg.stop();
 * }
 * ```
 */
export async function startThrowawayPostgres(
  options: ThrowawayPostgresOptions = {},
): Promise<ThrowawayPostgres> {
  const bindir = options.bindir ?? await findBindir();
  const asPostgres = Deno.uid() === 0;
  const dir = await Deno.makeTempDir({ prefix: "akadze-pg-" });
  const data = `${dir}/data`;
  try {
    if (asPostgres) {
      const [uid, gid] = await postgresUser();
      await Deno.chown(dir, uid, gid);
    }
    await run(asPostgres, [
      `${bindir}/initdb`,
      "-D",
      data,
      "-U",
      "postgres",
      "--auth=trust",
      "--encoding=UTF8",
      "--locale=C",
      "--no-sync",
    ]);
  } catch (error) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw error;
  }
  const port = freePort();
  const settings: Record<string, string | number> = {
    listen_addresses: "127.0.0.1",
    port,
    unix_socket_directories: dir,
    max_connections: 300,
    shared_buffers: "128MB",
    ...(options.durable
      ? {}
      : { fsync: "off", synchronous_commit: "off", full_page_writes: "off" }),
    ...options.settings,
  };
  const flags = Object.entries(settings).flatMap(([k, v]) => ["-c", `${k}=${v}`]);
  // The shell keeps postgres tied to our stdin: when it closes (stop(), or this process
  // died), postgres gets a fast shutdown and the directory is removed.
  const script = 'd="$1"; shift; "$0" -D "$d" "$@" >"${d%/*}/server.log" 2>&1 & pid=$!; ' +
    'trap "" INT TERM; read _ignored; kill -INT $pid 2>/dev/null; wait $pid; rm -rf "${d%/*}"';
  const argv = ["sh", "-c", script, `${bindir}/postgres`, data, ...flags];
  const child = new Deno.Command(asPostgres ? "runuser" : argv[0], {
    args: asPostgres ? ["-u", "postgres", "--", ...argv] : argv.slice(1),
    stdin: "piped",
    stdout: "null",
    stderr: "null",
  }).spawn();
  const stdin = child.stdin.getWriter();
  let stopped: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    stopped ??= (async () => {
      await stdin.close().catch(() => {});
      await child.status;
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    })();
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  try {
    const version = await waitReady(url, child.status, dir);
    return { url, port, version, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

async function waitReady(
  url: string,
  exited: Promise<Deno.CommandStatus>,
  dir: string,
): Promise<number> {
  let done = false;
  exited.then(() => done = true);
  const until = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < until) {
    if (done) break;
    const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
    try {
      const [{ v }] = await sql`select current_setting('server_version_num')::int as v`;
      return Math.floor(v / 10000);
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      await sql.end({ timeout: 1 });
    }
  }
  const log = await Deno.readTextFile(`${dir}/server.log`).catch(() => "");
  throw new AkadzeError(
    `throwaway PostgreSQL did not start${
      log ? `: ${log.trim().split("\n").slice(-3).join(" | ")}` : ""
    }`,
  );
}

async function findBindir(): Promise<string> {
  try {
    const out = await new Deno.Command("pg_config", { args: ["--bindir"], stderr: "null" })
      .output();
    const dir = new TextDecoder().decode(out.stdout).trim();
    if (out.success && dir) {
      await Deno.stat(`${dir}/initdb`);
      return dir;
    }
  } catch {
    // fall through to the clear error below
  }
  throw new AkadzeError(
    "no PostgreSQL server binaries found: install PostgreSQL (pg_config --bindir must list " +
      "initdb and postgres) or set AKADZE_DATABASE_URL to a database named akadze or *_test",
  );
}

async function postgresUser(): Promise<[number, number]> {
  const out = await new Deno.Command("id", { args: ["postgres"], stderr: "null" }).output();
  const text = new TextDecoder().decode(out.stdout);
  const uid = /uid=(\d+)/.exec(text), gid = /gid=(\d+)/.exec(text);
  if (!out.success || !uid || !gid) {
    throw new AkadzeError("running as root needs a 'postgres' OS user to run the server");
  }
  return [Number(uid[1]), Number(gid[1])];
}

async function run(asPostgres: boolean, argv: string[]): Promise<void> {
  const [cmd, ...args] = asPostgres ? ["runuser", "-u", "postgres", "--", ...argv] : argv;
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    const err = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-3).join(" | ");
    throw new AkadzeError(`${argv[0].split("/").pop()} failed: ${err}`);
  }
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}
