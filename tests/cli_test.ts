import { assert, assertEquals, assertMatch } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };
import { psql, runCli, withDatabase } from "./_helpers.ts";
import { knownVersions, migrationSql } from "../src/migrate.ts";

Deno.test("akadze --version prints the version of deno.json", async () => {
  const out = await runCli(["--version"], {});
  assertEquals(out.code, 0);
  assertEquals(out.stdout.trim(), denoJson.version);
});

Deno.test("akadze --help lists the commands; every level has --help", async () => {
  const top = await runCli(["--help"], {});
  assertEquals(top.code, 0);
  assertMatch(top.stdout, /migrate/);
  const migrate = await runCli(["migrate", "--help"], {});
  assertEquals(migrate.code, 0);
  assertMatch(migrate.stdout, /--status/);
});

Deno.test("akadze migrate prints applied versions, then schema up to date", async () => {
  await withDatabase("cli_migrate", async (db) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const first = await runCli(["migrate"], env);
    const applied = knownVersions().map((v) => `applied ${v}\n`).join("");
    assertEquals([first.code, first.stdout, first.stderr], [0, applied, ""]);
    const second = await runCli(["migrate"], env);
    assertEquals([second.code, second.stdout], [0, "schema up to date\n"]);
  }, { migrated: false });
});

Deno.test("akadze migrate --status lists versions as a table or --json, never like a migration", async () => {
  await withDatabase("cli_migrate_status", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const pending = await runCli(["migrate", "--status"], env);
    assertEquals([pending.code, pending.stderr], [0, ""]);
    assertEquals(
      pending.stdout,
      "VERSION\tSTATE\tAPPLIED_AT\n" + knownVersions().map((v) => `${v}\tpending\t-\n`).join(""),
    );
    const pendingJson = await runCli(["migrate", "--status", "--json"], env);
    assertEquals(
      JSON.parse(pendingJson.stdout),
      knownVersions().map((version) => ({ version, state: "pending", appliedAt: null })),
    );
    await runCli(["migrate"], env);
    // Each version is applied in its own transaction, at its own time.
    const times = new Map(
      (await sql`select version, applied_at from akadze.schema_migrations`)
        .map((r) => [r.version as string, (r.applied_at as Date).toISOString()]),
    );
    const applied = await runCli(["migrate", "--status"], env);
    assertEquals([applied.code, applied.stderr], [0, ""]);
    assertEquals(
      applied.stdout,
      "VERSION\tSTATE\tAPPLIED_AT\n" +
        knownVersions().map((v) => `${v}\tapplied\t${times.get(v)}\n`).join(""),
    );
    assert(!/^applied /m.test(applied.stdout), "not the output of a real migration");
    const json = await runCli(["migrate", "--status", "--json"], env);
    assertEquals(
      JSON.parse(json.stdout),
      knownVersions().map((version) => ({
        version,
        state: "applied",
        appliedAt: times.get(version),
      })),
    );
    const misuse = await runCli(["migrate", "--json"], env);
    assertEquals(misuse.code, 2);
    assertMatch(misuse.stderr, /^error: --json goes with --status\n$/);
    const badTimeout = await runCli(["migrate", "--lock-timeout", "0"], env);
    assertEquals(badTimeout.code, 2);
    assertMatch(badTimeout.stderr, /--lock-timeout must be a positive number of seconds/);
    const withStatus = await runCli(["migrate", "--status", "--retry-for", "5"], env);
    assertEquals(withStatus.code, 2);
  }, { migrated: false });
});

Deno.test("akadze migrate --print-sql prints a script for another migration tool, no database needed", async () => {
  const out = await runCli(["migrate", "--print-sql", "--schema", "app_jobs"], {});
  assertEquals([out.code, out.stderr], [0, ""]);
  assertEquals(out.stdout, migrationSql({ schema: "app_jobs" }));
  await withDatabase("cli_print_sql", async (db, sql) => {
    const applied = await psql(db.url, out.stdout, { args: ["--single-transaction"] });
    assertEquals([applied.code, applied.stderr], [0, ""]);
    const env = { AKADZE_DATABASE_URL: db.url };
    const status = await runCli(["migrate", "--status", "--json", "--schema", "app_jobs"], env);
    assertEquals(
      JSON.parse(status.stdout).map((
        m: { version: string; state: string },
      ) => [m.version, m.state]),
      knownVersions().map((v) => [v, "applied"]),
    );
    const migrate = await runCli(["migrate", "--schema", "app_jobs"], env);
    assertEquals([migrate.code, migrate.stdout], [0, "schema up to date\n"]);
    const [{ id }] = await sql`select app_jobs.enqueue('t') as id`;
    assertMatch(id, /^\d+$/);
  }, { migrated: false });
  for (
    const [args, message] of [
      [["--print-sql", "--status"], /^error: --print-sql and --status cannot be combined\n$/],
      [["--print-sql", "--json"], /^error: --json goes with --status\n$/],
      [["--print-sql", "--schema", "Bad"], /^error: --schema: schema must be a lower-case/],
    ] as const
  ) {
    const misuse = await runCli(["migrate", ...args], {});
    assertEquals(misuse.code, 2, misuse.stderr);
    assertMatch(misuse.stderr, message);
  }
});

Deno.test("a missing AKADZE_DATABASE_URL is a usage error (exit 2, one line)", async () => {
  const out = await runCli(["migrate"], {});
  assertEquals(out.code, 2);
  assertMatch(out.stderr, /^error: AKADZE_DATABASE_URL is not set[^\n]*\n$/);
});

Deno.test("a refused connection exits 1 with one line and no password", async () => {
  const out = await runCli(["migrate"], {
    AKADZE_DATABASE_URL: "postgres://app:Sup3rSecretPw@127.0.0.1:1/app",
  });
  assertEquals(out.code, 1);
  assert(!out.stderr.includes("Sup3rSecretPw"), out.stderr);
  assertMatch(out.stderr, /^error: [^\n]+\n$/);
  assert(!/\bat \S+:\d+/.test(out.stderr), "no stack trace");
  assertEquals(out.stdout, "");
});

Deno.test("unknown commands and flags are usage errors", async () => {
  assertEquals((await runCli(["frobnicate"], {})).code, 2);
  const flag = await runCli(["migrate", "--bogus"], { AKADZE_DATABASE_URL: "postgres://x@h/d" });
  assertEquals(flag.code, 2);
  assertMatch(flag.stderr, /^error: [^\n]*bogus[^\n]*\n$/);
});

Deno.test("akadze beat explains that schedules run in the worker and exits 1", async () => {
  const out = await runCli(["beat"], {});
  assertEquals(out.code, 1);
  assertMatch(out.stderr, /schedules run inside every worker/);
});
