// `akadze worker`, `akadze dev` and `deno task demo` as real processes against a real
// PostgreSQL.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import type { Sql } from "../src/db.ts";
import { knownVersions } from "../src/migrate.ts";
import { waitFor, withDatabase } from "./_helpers.ts";
import { CLI, MOD, ROOT, spawnCli, spawnDeno as spawn, WORKER_PERMISSIONS } from "./_processes.ts";

// Workers run with WORKER_PERMISSIONS, so the tests prove those suffice.
const ONE_LINE_ERROR = /^error: [^\n]+\n$/;

const APP_MODULE = `
import { Akadze } from ${JSON.stringify(MOD)};

export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
export const notAnApp = { tasks: "no" };

export const hello = app.task("hello", async ({ name }) => {
  const marker = Deno.env.get("MARKER");
  if (marker) await Deno.writeTextFile(marker, String(name));
  return "hello " + name;
});

// Runs until its signal aborts (shutdown, cancel) or a minute passes.
app.task("sleepy", (_args, ctx) => new Promise((resolve) => {
  const timer = setTimeout(() => resolve("slept"), 60_000);
  ctx.signal.addEventListener("abort", () => {
    clearTimeout(timer);
    resolve("aborted");
  });
}));

if (Deno.env.get("ENQUEUE_ON_LOAD")) await hello.enqueue({ name: "dev" });
`;

/** Run `fn` with the test app module written to a fresh directory. */
async function withAppModule(fn: (path: string, dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "akadze-cli-worker-" });
  try {
    await Deno.writeTextFile(`${dir}/app.ts`, APP_MODULE);
    await fn(`${dir}/app.ts`, dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function insertJob(sql: Sql, task: string, args: Record<string, unknown>): Promise<string> {
  const [{ id }] = await sql`
    insert into akadze.jobs (task, args) values (${task}, ${sql.json(args as never)})
    returning id::text as id`;
  return id;
}

async function jobState(sql: Sql, id: string) {
  const [row] = await sql`
    select state, attempt, run_count, result from akadze.jobs where id = ${id}`;
  return row as { state: string; attempt: number; run_count: number; result: unknown };
}

/** The command lines of running processes that mention `-c port=PORT` (a postgres server). */
async function serverProcesses(port: string): Promise<string[]> {
  const out = await new Deno.Command("ps", { args: ["-eo", "args"], stdout: "piped" }).output();
  return new TextDecoder().decode(out.stdout).split("\n").filter((line) =>
    line.includes(`port=${port} `) || line.endsWith(`port=${port}`)
  );
}

async function assertServerGone(port: string): Promise<void> {
  await waitFor(async () => (await serverProcesses(port)).length === 0, "postgres to exit");
  const refused = await Deno.connect({ hostname: "127.0.0.1", port: Number(port) }).then(
    (conn) => (conn.close(), false),
    () => true,
  );
  assert(refused, `something still listens on port ${port}`);
}

Deno.test("akadze worker --help and akadze dev --help describe the flags", async () => {
  for (const command of ["worker", "dev"]) {
    const out = await spawnCli([command, "--help"], {}).done();
    assertEquals(out.code, 0, out.stderr);
    for (const flag of ["--queue", "--slots", "--batch", "--shutdown-timeout", "--log-format"]) {
      assert(out.stdout.includes(flag), `${command} --help lacks ${flag}`);
    }
    assertMatch(out.stdout, /130/);
  }
  const top = await spawnCli(["--help"], {}).done();
  assertMatch(top.stdout, /worker APP/);
  assertMatch(top.stdout, /dev APP/);
});

Deno.test("akadze worker --batch runs a job enqueued before it started, then exits 0", async () => {
  await withAppModule(async (path) => {
    await withDatabase("cli_worker_batch", async (db, sql) => {
      const id = await insertJob(sql, "hello", { name: "ada-secret-arg" });
      const out = await spawnCli(
        ["worker", path, "--batch", "--poll-interval", "0.1", "--log-format", "json"],
        { AKADZE_DATABASE_URL: db.url },
      ).done();
      assertEquals(out.code, 0, out.stderr);
      const job = await jobState(sql, id);
      assertEquals([job.state, job.result], ["succeeded", "hello ada-secret-arg"]);
      const records = out.stderr.trim().split("\n").map((line) => JSON.parse(line));
      const events = records.map((r) => r.event);
      for (const event of ["worker_started", "job_succeeded", "worker_stopped"]) {
        assert(events.includes(event), `no ${event} in ${events}`);
      }
      assertEquals(records.find((r) => r.event === "worker_stopped").reason, "batch_done");
      // Logs carry ids, never arguments or results.
      assert(!out.stderr.includes("ada-secret-arg"), out.stderr);
      assertEquals(out.stdout, "");
    });
  });
});

Deno.test("akadze worker APP:export with a relative path and --max-jobs 2 stops after 2 claims", async () => {
  await withAppModule(async (_path, dir) => {
    await withDatabase("cli_worker_max_jobs", async (db, sql) => {
      for (const name of ["a", "b", "c"]) await insertJob(sql, "hello", { name });
      const out = await spawn(
        ["run", CLI, "worker", "app.ts:app", "--max-jobs", "2", "--poll-interval", "0.1"],
        { AKADZE_DATABASE_URL: db.url },
        { permissions: WORKER_PERMISSIONS, cwd: dir },
      ).done();
      assertEquals(out.code, 0, out.stderr);
      const states = await sql`select state from akadze.jobs order by id`;
      assertEquals(states.map((r) => r.state), ["succeeded", "succeeded", "queued"]);
    });
  });
});

Deno.test("SIGTERM during a long job: the job goes back to queued, attempt unchanged, exit 0", async () => {
  await withAppModule(async (path) => {
    await withDatabase("cli_worker_sigterm", async (db, sql) => {
      const id = await insertJob(sql, "sleepy", {});
      const cli = spawnCli(
        ["worker", path, "--shutdown-timeout", "0.5", "--poll-interval", "0.1"],
        { AKADZE_DATABASE_URL: db.url },
      );
      await waitFor(async () => (await jobState(sql, id)).state === "running", "the job to run");
      cli.child.kill("SIGTERM");
      const out = await cli.done();
      assertEquals(out.code, 0, out.stderr);
      assertMatch(out.stderr, /stopping gracefully/);
      const job = await jobState(sql, id);
      assertEquals([job.state, job.attempt, job.run_count], ["queued", 0, 1]);
      const [{ n }] = await sql`select count(*)::int as n from akadze.workers`;
      assertEquals(n, 0, "the worker row is removed");
    });
  });
});

Deno.test("a second SIGTERM exits at once with 130", async () => {
  await withAppModule(async (path) => {
    await withDatabase("cli_worker_force", async (db, sql) => {
      const id = await insertJob(sql, "sleepy", {});
      const cli = spawnCli(
        ["worker", path, "--shutdown-timeout", "120", "--poll-interval", "0.1"],
        { AKADZE_DATABASE_URL: db.url },
      );
      await waitFor(async () => (await jobState(sql, id)).state === "running", "the job to run");
      cli.child.kill("SIGTERM");
      await waitFor(() => cli.stderr().includes("stopping gracefully"), "the first signal");
      cli.child.kill("SIGTERM");
      const out = await cli.done();
      assertEquals(out.code, 130, out.stderr);
      // Left to the lease: still running, owned by the dead worker.
      assertEquals((await jobState(sql, id)).state, "running");
    });
  });
});

Deno.test("missing module, bad export, non-app export and bad flags: exit 2, one line", async () => {
  await withAppModule(async (path, dir) => {
    const env = { AKADZE_DATABASE_URL: "postgres://app:Sup3rSecretPw@127.0.0.1:1/app" };
    await Deno.writeTextFile(`${dir}/no_app.ts`, "export const answer = 42;\n");
    const cases: [string[], RegExp][] = [
      [["worker", `${dir}/missing.ts`], /app module not found/],
      [["worker", `${path}:nope`], /no export "nope"/],
      [["worker", `${dir}/no_app.ts`], /exports neither "app" nor a default \(exports: answer\)/],
      [["worker", `${path}:notAnApp`], /not an Akadze app/],
      [["worker", `file://${path}:hello`], /not an Akadze app/],
      [["worker"], /missing APP/],
      [["worker", path, "--slots", "abc"], /--slots must be an integer/],
      [["worker", path, "--shutdown-timeout", "soon"], /--shutdown-timeout must be a positive/],
      [["worker", path, "--poll-interval", "0"], /--poll-interval must be a positive/],
      [["worker", path, "--prune-interval", "0"], /--prune-interval must be a positive/],
      [["worker", path, "--max-jobs", "1.5"], /--max-jobs must be an integer/],
      [["worker", path, "--processes", "2", "--batch"], /--batch runs a single process/],
      [["worker", path, "--log-format", "xml"], /--log-format must be/],
      [["worker", path, "--queue", "no spaces"], /queue name/],
      [["worker", path, "--bogus"], /bogus/],
      [["dev", `${dir}/missing.ts`], /app module not found/],
    ];
    for (const [args, message] of cases) {
      const out = await spawnCli(args, env).done();
      assertEquals(out.code, 2, `${args.join(" ")}: ${out.stderr}`);
      assertMatch(out.stderr, ONE_LINE_ERROR);
      assertMatch(out.stderr, message);
      assert(!out.stderr.includes("Sup3rSecretPw"), out.stderr);
    }
  });
});

Deno.test("a module that fails while AKADZE_DATABASE_URL is unset: exit 2 naming it", async () => {
  await withAppModule(async (path) => {
    const out = await spawnCli(["worker", path], {}).done();
    assertEquals(out.code, 2, out.stderr);
    assertMatch(out.stderr, ONE_LINE_ERROR);
    assertMatch(out.stderr, /AKADZE_DATABASE_URL is not set/);
  });
});

Deno.test("a database without the schema: exit 1 with one line that says to migrate", async () => {
  await withAppModule(async (path) => {
    await withDatabase("cli_worker_unmigrated", async (db) => {
      const out = await spawnCli(["worker", path, "--batch"], { AKADZE_DATABASE_URL: db.url })
        .done();
      assertEquals(out.code, 1, out.stderr);
      assertMatch(out.stderr, ONE_LINE_ERROR);
      assertMatch(out.stderr, /akadze migrate/);
      // The operations commands say the same (a failure, exit 1, not a usage error).
      for (const args of [["jobs", "list"], ["limits", "set", "k", "--max-running", "1"]]) {
        const ops = await spawnCli(args, { AKADZE_DATABASE_URL: db.url }).done();
        assertEquals(ops.code, 1, `${args.join(" ")}: ${ops.stderr}`);
        assertMatch(ops.stderr, ONE_LINE_ERROR);
        assertMatch(
          ops.stderr,
          /schema "akadze" is not installed in this database.*akadze migrate/,
        );
      }
    }, { migrated: false });
  });
});

Deno.test("rolling deploy: a worker runs on a schema a newer release migrated, refuses an older one", async () => {
  await withAppModule(async (path) => {
    await withDatabase("cli_worker_newer_schema", async (db, sql) => {
      // A newer release's migrate recorded a version this release does not know.
      await sql`insert into akadze.schema_migrations (version) values ('9999_newer_release')`;
      const id = await insertJob(sql, "hello", { name: "newer" });
      const out = await spawnCli(
        ["worker", path, "--batch", "--poll-interval", "0.1"],
        { AKADZE_DATABASE_URL: db.url },
      ).done();
      assertEquals(out.code, 0, out.stderr);
      assertEquals((await jobState(sql, id)).state, "succeeded");
      // A schema behind this release: the worker refuses, naming what is pending.
      const [last] = knownVersions().slice(-1);
      await sql`delete from akadze.schema_migrations where version = ${last}`;
      const behind = await spawnCli(["worker", path, "--batch"], { AKADZE_DATABASE_URL: db.url })
        .done();
      assertEquals(behind.code, 1, behind.stderr);
      assertMatch(behind.stderr, ONE_LINE_ERROR);
      assert(behind.stderr.includes(`pending: ${last}): run akadze migrate`), behind.stderr);
    });
  });
});

Deno.test("akadze dev --batch runs a job without AKADZE_DATABASE_URL and leaves no server", async () => {
  await withAppModule(async (path, dir) => {
    const marker = `${dir}/ran`;
    const out = await spawnCli(
      ["dev", path, "--batch", "--poll-interval", "0.1"],
      { ENQUEUE_ON_LOAD: "1", MARKER: marker },
      { permissions: ["--allow-all"] },
    ).done();
    assertEquals(out.code, 0, out.stderr);
    assertEquals(await Deno.readTextFile(marker), "dev");
    const port = /127\.0\.0\.1:(\d+)\/akadze_dev/.exec(out.stderr)?.[1];
    assert(port, `no URL on stderr: ${out.stderr}`);
    assert(!/postgres:\/\/[^@\s]*:[^@\s]*@/.test(out.stderr), "no password in the URL");
    await assertServerGone(port);
  });
});

Deno.test("deno task demo exits 0 and leaves no server", async () => {
  const out = await spawn(["task", "demo"], {}).done();
  assertEquals(out.code, 0, out.stderr);
  for (const line of [/greet\s+succeeded/, /flaky\s+succeeded\s+1/, /charge\s+failed\s+2/]) {
    assertMatch(out.stdout, line);
  }
  const port = /on port (\d+)/.exec(out.stderr)?.[1];
  assert(port, `no port on stderr: ${out.stderr}`);
  await assertServerGone(port);
});

Deno.test("a database URL without a user name works under the documented worker permissions", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze-cli-no-user-" });
  try {
    // The fixture app reads MARKER and ENQUEUE_ON_LOAD, which these permissions forbid.
    await Deno.writeTextFile(
      `${dir}/app.ts`,
      `import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("hello", ({ name }) => "hello " + name);
`,
    );
    await withDatabase("cli_worker_no_user", async (db, sql) => {
      const url = new URL(db.url);
      const database = decodeURIComponent(url.pathname.slice(1));
      // Exactly those; the app's code is its directory and this checkout (its akadze).
      const permissions = [
        `--allow-net=${url.host}`,
        "--allow-env=AKADZE_*,PG*",
        "--allow-sys=hostname",
        `--allow-read=${dir},${ROOT}`,
      ];
      const pg: Record<string, string> = url.password
        ? { PGPASSWORD: decodeURIComponent(url.password) }
        : {};
      const user = decodeURIComponent(url.username);
      const cases: [string, Record<string, string>][] = [
        [`postgres://${url.host}/${database}`, { ...pg, PGUSER: user }],
        [`postgres://${url.hostname}`, {
          ...pg,
          PGUSERNAME: user,
          PGPORT: url.port,
          PGDATABASE: database,
        }],
        [`postgres:///${database}`, {
          ...pg,
          PGUSER: user,
          PGHOST: url.hostname,
          PGPORT: url.port,
        }],
      ];
      for (const [databaseUrl, env] of cases) {
        const id = await insertJob(sql, "hello", { name: "ada" });
        const out = await spawnCli(
          ["worker", `${dir}/app.ts`, "--batch", "--poll-interval", "0.1"],
          { AKADZE_DATABASE_URL: databaseUrl, ...env },
          { permissions },
        ).done();
        assertEquals(out.code, 0, `${databaseUrl}: ${out.stderr}`);
        assertEquals((await jobState(sql, id)).state, "succeeded");
      }
      // No user anywhere these permissions let it look: one line saying where to put it.
      const out = await spawnCli(
        ["worker", `${dir}/app.ts`, "--batch"],
        { AKADZE_DATABASE_URL: `postgres://${url.host}/${database}`, ...pg },
        { permissions },
      ).done();
      assertEquals(out.code, 1, out.stderr);
      assertMatch(out.stderr, ONE_LINE_ERROR);
      assertMatch(out.stderr, /no user name and PGUSER is not set.*put the user in the URL/);
      assert(!out.stderr.includes("Requires"), out.stderr);
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
