// examples/http_service.ts as a real process: POST /signup enqueues inside the request's
// transaction and the welcome job succeeds, with a separate `akadze worker` process
// (against a test database) and with the embedded default (no database given).
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { passthroughEnv, waitFor, withDatabase } from "./_helpers.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const SERVICE = `${ROOT}examples/http_service.ts`;
const APP = `${ROOT}examples/http_app.ts`;
const WEB_PERMISSIONS = ["--allow-net", "--allow-env", "--allow-read"];
const WORKER_PERMISSIONS = ["--allow-net", "--allow-env", "--allow-sys=hostname", "--allow-read"];

interface Process {
  child: Deno.ChildProcess;
  stderr(): string;
  /** SIGTERM, then the exit code. */
  stop(): Promise<number>;
}

function start(args: string[], env: Record<string, string>): Process {
  const child = new Deno.Command(Deno.execPath(), {
    args,
    cwd: ROOT,
    env: { NO_COLOR: "1", ...passthroughEnv(), ...env },
    clearEnv: true,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let stderr = "";
  const reading = (async () => {
    for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) stderr += text;
  })();
  return {
    child,
    stderr: () => stderr,
    stop: async () => {
      try {
        child.kill("SIGTERM");
      } catch {
        // exited already
      }
      const { code } = await child.status;
      await reading;
      return code;
    },
  };
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}

/** Start the service and wait until it listens; returns its base URL. */
async function startService(
  extraArgs: string[],
  env: Record<string, string>,
  permissions: string[],
): Promise<{ service: Process; base: string }> {
  const port = freePort();
  const service = start(["run", ...permissions, SERVICE, ...extraArgs], {
    ...env,
    PORT: String(port),
  });
  const base = `http://127.0.0.1:${port}`;
  let exited = false;
  service.child.status.then(() => exited = true);
  try {
    await waitFor(
      () => {
        if (exited) throw new Error("the service exited before it listened");
        return service.stderr().includes(`listening on ${base}/`);
      },
      "the service to listen",
      60_000,
    );
  } catch (error) {
    await service.stop();
    throw new Error(`${(error as Error).message}\n${service.stderr()}`);
  }
  return { service, base };
}

// deno-lint-ignore no-explicit-any
async function post(base: string, body: unknown): Promise<{ status: number; body: any }> {
  const response = await fetch(`${base}/signup`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
}

async function welcomed(base: string, userId: string): Promise<boolean> {
  const response = await fetch(`${base}/users/${userId}`);
  const user = await response.json();
  return response.status === 200 && user.welcomedAt !== null;
}

Deno.test("http example: the signup's job commits with the user row and a worker runs it", async () => {
  await withDatabase("http_example", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const { service, base } = await startService([], env, WEB_PERMISSIONS);
    const worker = start(
      ["run", ...WORKER_PERMISSIONS, `${ROOT}cli.ts`, "worker", APP, "--queue", "mail"],
      env,
    );
    try {
      const created = await post(base, { email: "ada@example.com" });
      assertEquals(created.status, 201, JSON.stringify(created.body));
      assertMatch(created.body.userId, /^\d+$/);
      assertMatch(created.body.jobId, /^\d+$/);
      await waitFor(() => welcomed(base, created.body.userId), "the welcome mail", 30_000);
      const [job] =
        await sql`select task, queue, state from akadze.jobs where id = ${created.body.jobId}`;
      assertEquals({ ...job }, { task: "mail.welcome", queue: "mail", state: "succeeded" });

      // A failed request leaves neither a user nor a job behind.
      const duplicate = await post(base, { email: "ada@example.com" });
      assertEquals(duplicate.status, 409);
      const invalid = await post(base, { email: "not an email" });
      assertEquals(invalid.status, 400);
      assertMatch(invalid.body.error, /mail\.welcome/);
      const [{ users, jobs }] = await sql`
        select (select count(*)::int from example_users) as users,
               (select count(*)::int from akadze.jobs) as jobs`;
      assertEquals([users, jobs], [1, 1]);

      const metrics = await (await fetch(`${base}/metrics`)).text();
      assertMatch(metrics, /^akadze_jobs\{queue="mail",state="succeeded"\} 1$/m);
    } finally {
      assertEquals(await worker.stop(), 0, worker.stderr());
      assertEquals(await service.stop(), 0, service.stderr());
    }
  }, { migrated: false });
});

Deno.test("http example: runs with the embedded default (no database given)", async () => {
  // No AKADZE_DATABASE_URL: the service starts its own throwaway PostgreSQL and a worker.
  const { service, base } = await startService([], {}, ["--allow-all"]);
  try {
    assertMatch(service.stderr(), /throwaway PostgreSQL \d+/);
    const created = await post(base, { email: "grace@example.com" });
    assertEquals(created.status, 201, JSON.stringify(created.body));
    await waitFor(() => welcomed(base, created.body.userId), "the welcome mail", 30_000);
  } finally {
    assertEquals(await service.stop(), 0, service.stderr());
  }
  const url = /at (postgres:\/\/\S+)/.exec(service.stderr())?.[1];
  assert(url, service.stderr());
  // The server was removed on exit: its port refuses connections now.
  const port = Number(new URL(url).port);
  await Deno.connect({ hostname: "127.0.0.1", port }).then(
    (conn) => {
      conn.close();
      throw new Error(`the throwaway PostgreSQL on ${port} is still running`);
    },
    () => {},
  );
});
