// One-shot runs against a database nothing answers for: a batch worker (API and CLI) and
// the migrate command give up in bounded time with exit 1 and one clear line, where a
// long-running worker keeps retrying.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { Akadze } from "../src/app.ts";
import { Worker } from "../src/worker/worker.ts";
import { MOD, spawnCli, within, withProcesses } from "./_processes.ts";

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
    await Deno.writeTextFile(
      `${dir}/app.ts`,
      `import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("hello", () => "hi");
`,
    );
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
    await Deno.writeTextFile(
      `${dir}/app.ts`,
      `import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("hello", () => "hi");
`,
    );
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
