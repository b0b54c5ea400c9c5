// A throwaway PgBouncer in front of the test server, like the throwaway PostgreSQL: Debian's
// pgbouncer binary, on 127.0.0.1 and a free port, as the postgres OS user when we are root,
// in a private directory removed by stop().

/** A running PgBouncer. */
export interface ThrowawayPgBouncer {
  /** `databaseUrl` with its host and port replaced by PgBouncer's. */
  url(databaseUrl: string): string;
  /** Stop it and remove its directory. */
  stop(): Promise<void>;
}

/** The pgbouncer binary, or undefined when it is not installed (the test is then skipped). */
export function pgbouncerBinary(): string | undefined {
  for (const path of ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]) {
    try {
      Deno.statSync(path);
      return path;
    } catch {
      // not there
    }
  }
  return undefined;
}

/** Start PgBouncer in `poolMode` in front of the server of `serverUrl` (trust auth). */
export async function startPgBouncer(
  serverUrl: string,
  poolMode: "transaction" | "session" = "transaction",
): Promise<ThrowawayPgBouncer> {
  const binary = pgbouncerBinary();
  if (!binary) throw new Error("pgbouncer is not installed");
  const server = new URL(serverUrl);
  const user = decodeURIComponent(server.username || "postgres");
  const dir = await Deno.makeTempDir({ prefix: "akadze-pgbouncer-" });
  const port = freePort();
  await Deno.writeTextFile(`${dir}/users.txt`, `"${user}" ""\n`);
  await Deno.writeTextFile(
    `${dir}/pgbouncer.ini`,
    [
      "[databases]",
      `* = host=${server.hostname} port=${server.port || 5432}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      "unix_socket_dir =",
      "auth_type = trust",
      `auth_file = ${dir}/users.txt`,
      `pool_mode = ${poolMode}`,
      "max_client_conn = 500",
      "default_pool_size = 20",
      "ignore_startup_parameters = extra_float_digits,options",
      `logfile = ${dir}/pgbouncer.log`,
      "",
    ].join("\n"),
  );
  const asPostgres = Deno.uid() === 0;
  if (asPostgres) {
    const ids = await idOf("postgres");
    for (const path of [dir, `${dir}/users.txt`, `${dir}/pgbouncer.ini`]) {
      await Deno.chown(path, ...ids);
    }
  }
  const argv = [binary, `${dir}/pgbouncer.ini`];
  const child = new Deno.Command(asPostgres ? "runuser" : argv[0], {
    args: asPostgres ? ["-u", "postgres", "--", ...argv] : argv.slice(1),
    stdin: "null",
    stdout: "null",
    stderr: "null",
    // Its own process group, signalled as a whole by stop().
    detached: true,
  }).spawn();
  let stopped: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    stopped ??= (async () => {
      try {
        Deno.kill(-child.pid, "SIGINT");
      } catch {
        // already gone
      }
      await child.status;
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    })();
  const url = (databaseUrl: string) => {
    const parsed = new URL(databaseUrl);
    parsed.hostname = "127.0.0.1";
    parsed.port = String(port);
    return parsed.toString();
  };
  // Ready once it accepts a TCP connection.
  const until = Date.now() + 20_000;
  for (;;) {
    try {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port });
      conn.close();
      return { url, stop };
    } catch {
      if (Date.now() > until) {
        const log = await Deno.readTextFile(`${dir}/pgbouncer.log`).catch(() => "");
        await stop();
        throw new Error(`pgbouncer did not start: ${log.trim().split("\n").slice(-3).join(" | ")}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

async function idOf(user: string): Promise<[number, number]> {
  const out = await new Deno.Command("id", { args: [user], stderr: "null" }).output();
  const text = new TextDecoder().decode(out.stdout);
  const uid = /uid=(\d+)/.exec(text), gid = /gid=(\d+)/.exec(text);
  if (!out.success || !uid || !gid) throw new Error(`no ${user} OS user`);
  return [Number(uid[1]), Number(gid[1])];
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}
