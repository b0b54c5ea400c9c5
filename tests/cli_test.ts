import { assert, assertEquals, assertMatch } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };
import { runCli, withDatabase } from "./_helpers.ts";

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
    const status0 = await runCli(["migrate", "--status"], env);
    assertEquals(status0.stdout, "pending 0001_init\npending 0002_limit_key_order\n");
    const first = await runCli(["migrate"], env);
    assertEquals([first.code, first.stdout, first.stderr], [
      0,
      "applied 0001_init\napplied 0002_limit_key_order\n",
      "",
    ]);
    const second = await runCli(["migrate"], env);
    assertEquals([second.code, second.stdout], [0, "schema up to date\n"]);
    const status = await runCli(["migrate", "--status"], env);
    assertEquals(status.stdout, "applied 0001_init\napplied 0002_limit_key_order\n");
  }, { migrated: false });
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
