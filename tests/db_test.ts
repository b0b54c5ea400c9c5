import { assert, assertEquals, assertRejects, assertThrows } from "./assert.ts";
import { userInfo } from "node:os";
import postgres from "postgres";
import {
  connect,
  describeError,
  isReadOnlyError,
  isTransientError,
  quoteSchema,
  redact,
} from "../src/db.ts";
import { AkadzeError } from "../src/errors.ts";
import { installDriverGuard } from "../src/driver_guard.ts";
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

Deno.test("postgres.js's connection errors are described by what happened, with their code and address", () => {
  const closed = Object.assign(new Error("write CONNECTION_CLOSED 127.0.0.1:5432"), {
    code: "CONNECTION_CLOSED",
  });
  const text = describeError(closed);
  assert(text.startsWith("the database server closed the connection while it was in use"), text);
  assert(text.includes("idle_in_transaction_session_timeout"), text);
  assert(text.endsWith("(CONNECTION_CLOSED, 127.0.0.1:5432)"), text);
  const timeout = Object.assign(new Error("write CONNECT_TIMEOUT db:5432"), {
    code: "CONNECT_TIMEOUT",
  });
  const said = describeError(timeout);
  assert(said.startsWith("no PostgreSQL server answered within the connect timeout"), said);
  assert(said.endsWith("(CONNECT_TIMEOUT, db:5432)"), said);
  // Only the driver's own wording is rewritten.
  const other = Object.assign(new Error("something else"), { code: "CONNECTION_CLOSED" });
  assertEquals(describeError(other), "something else (CONNECTION_CLOSED)");
});

Deno.test("connect refuses something that is not a postgres URL", () => {
  assertThrows(() => connect("mysql://x@y/z"), AkadzeError);
  assertThrows(() => connect(""), AkadzeError);
});

Deno.test("a password with an unencoded @ is never shown: connect refuses the URL, redact hides it whole", () => {
  for (
    const url of [
      "postgres://app:s3cr@tP4ss@db:5432/app",
      "postgres://app:s3cr@tP4ss@h1:1,h2:2/app",
    ]
  ) {
    const error = assertThrows(() => connect(url), AkadzeError);
    assert(!error.message.includes("P4ss") && error.message.includes("%40"), error.message);
  }
  assertEquals(
    redact("Invalid URL: 'postgres://app:s3cr@tP4ss@h1:5432,h2:5432/app?sslmode=require'"),
    "Invalid URL: 'postgres://app:***@h1:5432,h2:5432/app?sslmode=require'",
  );
  assertEquals(redact("postgres://a:b@h/d?x=y@z"), "postgres://a:***@h/d?x=y@z");
  // An @ in the path or the query is not in the credentials.
  connect("postgres://app:pw@db/app?application_name=a@b").end();
});

Deno.test("a host list with a port that is not a port number is refused at once, without the password", () => {
  for (
    const [url, said] of [
      ["postgres://app:s3cret@h1:99999,h2:5432/app", "host h1 the port 99999"],
      ["postgres://app:s3cret@h1:5432,h2:99999/app", "host h2 the port 99999"],
      ["postgres://app:s3cret@h1:5432,h2:0/app", "host h2 the port 0"],
      ["postgres://app:s3cret@h1:x1/app", "host h1 the port x1"],
      ["postgres://app:s3cret@[::1]:70000/app", "host [::1] the port 70000"],
    ]
  ) {
    const error = assertThrows(() => connect(url), AkadzeError);
    assert(error.message.includes(said), error.message);
    assert(!error.message.includes("s3cret"), error.message);
  }
  // The driver's own "Invalid URL" quotes the URL: it is replaced.
  const invalid = assertThrows(() => connect("postgres://app:s3cret@h 1/app"), AkadzeError);
  assert(invalid.message.startsWith("the database URL is not a valid URL"), invalid.message);
  assert(!invalid.message.includes("s3cret"), invalid.message);
  // Ports in range, with or without a port, IPv6, pass.
  for (const url of ["postgres://a@h1:1,h2:65535,h3/d", "postgres://a@[::1]:5432,h2/d"]) {
    connect(url).end();
  }
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

Deno.test("connect takes the user from the URL, else PGUSERNAME, PGUSER, else the OS user", async () => {
  const saved = Object.fromEntries(["PGUSERNAME", "PGUSER"].map((k) => [k, Deno.env.get(k)]));
  const userOf = async (url: string) => {
    const sql = connect(url);
    const user = sql.options.user;
    await sql.end();
    return user;
  };
  try {
    Deno.env.set("PGUSERNAME", "from_pgusername");
    Deno.env.set("PGUSER", "from_pguser");
    assertEquals(await userOf("postgres://in_url@127.0.0.1:1/x"), "in_url");
    assertEquals(await userOf("postgres://in_url:pw@h1:1,h2:2/x"), "in_url");
    assertEquals(await userOf("postgres://127.0.0.1:1/x"), "from_pgusername");
    Deno.env.delete("PGUSERNAME");
    assertEquals(await userOf("postgres://:pw@127.0.0.1:1/x"), "from_pguser");
    Deno.env.delete("PGUSER");
    // With every permission (this test run), as postgres.js itself would.
    assertEquals(await userOf("postgres:///x"), userInfo().username);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);
    }
  }
});

Deno.test("transient SQLSTATEs and driver codes are classified as transient", () => {
  const err = (code: string) => Object.assign(new Error(code), { code });
  for (
    const code of [
      "08006",
      "08001",
      "57P01",
      "57P02",
      "57P03",
      "53100",
      "53300",
      "40001",
      "40P01",
      "25006",
    ]
  ) {
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

Deno.test("a read-only server (a standby during a failover) is transient: 25006 and the in-recovery refusals", async () => {
  await withDatabase("db_read_only", async (_db, sql) => {
    let error: unknown;
    try {
      await sql.begin("read only", (tx) => tx`update akadze.jobs set priority = 1`);
    } catch (e) {
      error = e;
    }
    assertEquals((error as { code?: string }).code, "25006");
    assert(isReadOnlyError(error) && isTransientError(error), describeError(error));
  });
  const lock = Object.assign(
    new Error(
      "cannot acquire lock mode ExclusiveLock on database objects while recovery is in progress",
    ),
    { code: "0A000" },
  );
  assert(isReadOnlyError(lock) && isTransientError(lock));
  const unsupported = Object.assign(new Error("not supported"), { code: "0A000" });
  assert(!isReadOnlyError(unsupported) && !isTransientError(unsupported));
  assert(!isReadOnlyError(new Error("during recovery")), "a server error has a SQLSTATE");
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
