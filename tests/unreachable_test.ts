// One-shot runs against a database nothing answers for: a batch worker (API and CLI) and
// the migrate command give up in bounded time with exit 1 and one clear line, where a
// long-running worker keeps retrying; a stop stays bounded whatever the database does.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { Akadze } from "../src/app.ts";
import { Worker } from "../src/worker/worker.ts";
import { MOD, spawnCli, within, withProcesses } from "./_processes.ts";
import { waitFor } from "./_helpers.ts";

const PASSWORD = "Unre4chableSecret";
/** Generous: only a run that never gives up (the defect) comes near it. */
const BOUND = 60_000;

/** A URL to a local port nothing listens on (bound and released again). */
function deadUrl(): string {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return `postgres://app:${PASSWORD}@127.0.0.1:${port}/app`;
}

/** Write `app.ts` into `dir`: an app on AKADZE_DATABASE_URL with one task, for the CLI. */
async function writeApp(dir: string): Promise<void> {
  await Deno.writeTextFile(
    `${dir}/app.ts`,
    `import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("hello", () => "hi");
`,
  );
}

Deno.test("a batch worker whose database never answers stops with code 1 after heartbeatTtl", async () => {
  const app = new Akadze({ databaseUrl: deadUrl() });
  app.task("hello", () => "hi");
  try {
    const worker = new Worker(app, {
      batch: true,
      heartbeatInterval: 200,
      heartbeatTtl: 1_000,
      pollInterval: 100,
    });
    const running = worker.run();
    let exit;
    try {
      exit = await within(running, BOUND, "the batch worker to give up");
    } finally {
      worker.stop();
    }
    assertEquals([exit.code, exit.reason], [1, "heartbeat_lost"]);
    assertMatch(exit.message ?? "", /could not reach the database/);
    // The last heartbeat's error: refused, or (on a loaded machine) out of its time.
    assertMatch(exit.message ?? "", /ECONNREFUSED|ETIMEDOUT/);
    assert(!exit.message?.includes(PASSWORD), exit.message);
  } finally {
    await app.close();
  }
});

Deno.test("akadze worker --batch against an unreachable database exits 1 with one clear line", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze-unreachable-" });
  try {
    await writeApp(dir);
    await withProcesses(async () => {
      const out = await within(
        spawnCli(
          [
            "worker",
            `${dir}/app.ts`,
            "--batch",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-ttl",
            "1",
          ],
          { AKADZE_DATABASE_URL: deadUrl() },
        ).done(),
        BOUND,
        "akadze worker --batch to exit",
      );
      assertEquals(out.code, 1, out.stderr);
      const errors = out.stderr.split("\n").filter((line) => line.startsWith("error: "));
      assertEquals(errors.length, 1, out.stderr);
      assertMatch(errors[0], /could not reach the database for \d+ s/);
      assert(!out.stderr.includes(PASSWORD), out.stderr);
      assert(!/\bat \S+:\d+/.test(out.stderr), "no stack trace");
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("akadze migrate and migrate --status against an unreachable database exit 1 at once", async () => {
  await withProcesses(async () => {
    for (const args of [["migrate"], ["migrate", "--status"]]) {
      const out = await within(
        spawnCli(args, { AKADZE_DATABASE_URL: deadUrl() }).done(),
        BOUND,
        `akadze ${args.join(" ")} to exit`,
      );
      assertEquals(out.code, 1, out.stderr);
      assertMatch(out.stderr, /^error: [^\n]*ECONNREFUSED[^\n]*\n$/);
      assert(!out.stderr.includes(PASSWORD), out.stderr);
      assertEquals(out.stdout, "");
    }
  });
});

/** Run `fn` with the URL of an HTTP server (not PostgreSQL), which answers and closes. */
async function withHttpServer(fn: (url: string) => Promise<void>): Promise<void> {
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response("not a database"),
  );
  try {
    await fn(`postgres://app:${PASSWORD}@127.0.0.1:${server.addr.port}/app`);
  } finally {
    await server.shutdown();
  }
}

Deno.test("a URL that points at a server that is not PostgreSQL fails at once with one clear line", async () => {
  await withHttpServer(async (url) => {
    const app = new Akadze({ databaseUrl: url });
    const hello = app.task("hello", () => "hi");
    try {
      const error = await within(
        hello.enqueue().then(() => null, (e) => e),
        BOUND,
        "the enqueue to fail",
      );
      assertMatch(String(error?.message), /did not answer as PostgreSQL does/);
      assertEquals(error.code, "AKADZE_NOT_POSTGRES");
    } finally {
      await app.close();
    }
    const dir = await Deno.makeTempDir({ prefix: "akadze-not-postgres-" });
    await writeApp(dir);
    await withProcesses(async () => {
      const commands = [["jobs", "list"], ["migrate"], ["worker", `${dir}/app.ts`]];
      for (const args of commands) {
        const out = await within(
          spawnCli(args, { AKADZE_DATABASE_URL: url }).done(),
          BOUND,
          `akadze ${args.join(" ")} to exit`,
        );
        assertEquals(out.code, 1, out.stderr);
        assertMatch(out.stderr, /^error: [^\n]*did not answer as PostgreSQL does[^\n]*\n$/);
        assert(!out.stderr.includes(PASSWORD), out.stderr);
      }
    }).finally(() => Deno.remove(dir, { recursive: true }));
  });
});

/**
 * Run `fn` with the URL of a server that accepts connections and never answers (a hung
 * server, a firewall that swallows the packets after the handshake), with `connect_timeout`
 * in the URL, and the number of connections it has accepted so far.
 */
async function withSilentServer(
  connectTimeout: number,
  fn: (url: string, accepted: () => number) => Promise<void>,
): Promise<void> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) conns.push(conn);
  })().catch(() => {});
  const { port } = listener.addr as Deno.NetAddr;
  try {
    await fn(
      `postgres://app:${PASSWORD}@127.0.0.1:${port}/app?connect_timeout=${connectTimeout}`,
      () => conns.length,
    );
  } finally {
    listener.close();
    for (const conn of conns) {
      try {
        conn.close();
      } catch { /* closed by the other side */ }
    }
    await accepting;
  }
}

Deno.test("a server that never answers fails the enqueue and the CLI after the connect timeout, with one clear line", async () => {
  await withSilentServer(1, async (url) => {
    const app = new Akadze({ databaseUrl: url });
    const hello = app.task("hello", () => "hi");
    try {
      const error = await within(
        hello.enqueue().then(() => null, (e) => e),
        BOUND,
        "the enqueue to fail",
      );
      assertEquals(error?.code, "CONNECT_TIMEOUT", String(error));
    } finally {
      await app.close();
    }
    await withProcesses(async () => {
      for (const args of [["jobs", "list"], ["migrate"]]) {
        const out = await within(
          spawnCli(args, { AKADZE_DATABASE_URL: url }).done(),
          BOUND,
          `akadze ${args.join(" ")} to exit`,
        );
        assertEquals(out.code, 1, out.stderr);
        assertMatch(
          out.stderr,
          /^error: [^\n]*no PostgreSQL server answered within the connect timeout[^\n]*\n$/,
        );
        assert(!out.stderr.includes(PASSWORD), out.stderr);
      }
    });
  });
});

/** Longer than any bound these tests allow for a stop: only a stop that waits for it nears it. */
const LONG_CONNECT_TIMEOUT = 120;

Deno.test("a worker whose database never answers stops within its shutdown timeout", async () => {
  await withSilentServer(LONG_CONNECT_TIMEOUT, async (url, accepted) => {
    const app = new Akadze({ databaseUrl: url });
    app.task("hello", () => "hi");
    try {
      const worker = new Worker(app, { shutdownTimeout: 500 });
      const running = worker.run();
      // The worker is waiting for the server's answer.
      await waitFor(() => accepted() > 0, "the worker to connect");
      const stopped = performance.now();
      worker.stop();
      const exit = await within(running, BOUND, "the worker to stop");
      const took = performance.now() - stopped;
      assertEquals([exit.code, exit.reason], [0, "stopped"]);
      // shutdownTimeout, and the release writes' bound at most; never the connect timeout.
      assert(took < 15_000, `the stop took ${Math.round(took)} ms`);
    } finally {
      await app.close();
    }
  });
});

Deno.test("akadze worker against a database that never answers exits 0 soon after SIGTERM", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze-silent-" });
  try {
    await writeApp(dir);
    await withSilentServer(LONG_CONNECT_TIMEOUT, async (url, accepted) => {
      await withProcesses(async () => {
        const cli = spawnCli(["worker", `${dir}/app.ts`, "--shutdown-timeout", "1"], {
          AKADZE_DATABASE_URL: url,
        });
        // Its start-up checks are waiting for the server's answer.
        await waitFor(() => accepted() > 0, "the worker to connect", BOUND);
        const stopped = performance.now();
        cli.child.kill("SIGTERM");
        const out = await within(cli.done(), BOUND, "akadze worker to exit");
        const took = performance.now() - stopped;
        assertEquals(out.code, 0, out.stderr);
        // --shutdown-timeout, the release writes' and the pool's close bounds at most.
        assert(took < 20_000, `the stop took ${Math.round(took)} ms:\n${out.stderr}`);
        assert(!out.stderr.includes(PASSWORD), out.stderr);
      });
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
