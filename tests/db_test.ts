import { assert, assertEquals, assertRejects, assertThrows } from "./assert.ts";
import postgres from "postgres";
import { connect, describeError, isTransientError, quoteSchema, redact } from "../src/db.ts";
import { AkadzeError } from "../src/errors.ts";
import { installDriverGuard } from "../src/worker/driver_guard.ts";
import { withDatabase } from "./_helpers.ts";

Deno.test("redact removes URL passwords, password parameters and given secrets", () => {
  assertEquals(redact("postgres://app:s3cret@db:5432/app"), "postgres://app:***@db:5432/app");
  assertEquals(
    redact("failed: postgresql://u:p%40ss@h/d and postgres://x@h/d"),
    "failed: postgresql://u:***@h/d and postgres://x@h/d",
  );
  assertEquals(redact("host=db password=hunter2 user=x"), "host=db password=*** user=x");
  assertEquals(redact("auth failed for hunter22", ["hunter22"]), "auth failed for ***");
  assertEquals(redact("no secrets here"), "no secrets here");
});

Deno.test("quoteSchema accepts plain lower-case identifiers only", () => {
  assertEquals(quoteSchema("akadze"), '"akadze"');
  assertEquals(quoteSchema("_q2"), '"_q2"');
  for (const bad of ["", "A", "9a", "a-b", 'a"b', "pg_x", "a".repeat(64)]) {
    assertThrows(() => quoteSchema(bad), AkadzeError);
  }
});

Deno.test("connect refuses something that is not a postgres URL", () => {
  assertThrows(() => connect("mysql://x@y/z"), AkadzeError);
  assertThrows(() => connect(""), AkadzeError);
});

Deno.test("connect uses no prepared statements and names the application", async () => {
  await withDatabase("db_connect", async (db) => {
    const sql = connect(db.url, { max: 1 });
    try {
      const [{ name }] = await sql`select current_setting('application_name') as name`;
      assertEquals(name, "akadze");
      assertEquals(sql.options.prepare, false);
    } finally {
      await sql.end();
    }
  }, { migrated: false });
});

Deno.test("transient SQLSTATEs and driver codes are classified as transient", () => {
  const err = (code: string) => Object.assign(new Error(code), { code });
  for (const code of ["08006", "08001", "57P01", "57P02", "57P03", "53300", "40001", "40P01"]) {
    assert(isTransientError(err(code)), code);
  }
  for (const code of ["CONNECTION_CLOSED", "CONNECTION_ENDED", "CONNECT_TIMEOUT", "ECONNREFUSED"]) {
    assert(isTransientError(err(code)), code);
  }
  for (const code of ["23505", "42601", "42P01", "42501", "22P02", "UNDEFINED_VALUE"]) {
    assert(!isTransientError(err(code)), code);
  }
  assert(isTransientError(new Error("wrapped", { cause: err("57P01") })));
  assert(!isTransientError(new TypeError("x")));
  assert(!isTransientError(null));
});

Deno.test("the classifier on real errors: terminated backend, unique violation, syntax error", async () => {
  await withDatabase("db_classify", async (db, sql) => {
    const victim = postgres(db.url, { max: 1, onnotice: () => {} });
    // The driver may also report the terminated connection as an unhandled rejection
    // (a known postgres.js hazard the worker guards against the same way).
    const removeGuard = installDriverGuard(() => {});
    try {
      await sql`create table u (x int primary key)`;
      await sql`insert into u values (1)`;
      const unique = await assertRejects<Error & { code: string }>(() =>
        sql`insert into u values (1)`
      );
      assertEquals(unique.code, "23505");
      assert(!isTransientError(unique));

      const syntax = await assertRejects<Error & { code: string }>(() => sql.unsafe("selec 1"));
      assertEquals(syntax.code, "42601");
      assert(!isTransientError(syntax));

      const [{ pid }] = await victim`select pg_backend_pid() as pid`;
      const inFlight = victim`select pg_sleep(30)`.execute();
      await new Promise((r) => setTimeout(r, 100));
      await sql`select pg_terminate_backend(${pid})`;
      const terminated = await assertRejects(() => inFlight);
      assert(isTransientError(terminated), describeError(terminated));
    } finally {
      await victim.end({ timeout: 1 });
      await new Promise((r) => setTimeout(r, 50));
      removeGuard();
    }
  }, { migrated: false });
});

Deno.test("a refused connection is transient and its message has no password", async () => {
  const sql = postgres("postgres://app:topsecretpw@127.0.0.1:1/app", {
    max: 1,
    connect_timeout: 2,
  });
  try {
    const error = await assertRejects(() => sql`select 1`);
    assert(isTransientError(error), describeError(error));
    assert(!describeError(error, ["topsecretpw"]).includes("topsecretpw"));
  } finally {
    await sql.end({ timeout: 1 });
  }
});
