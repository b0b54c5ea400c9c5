import { assert, assertEquals, assertThrows } from "./assert.ts";
import postgres from "postgres";
import { requestCancel } from "../admin.ts";
import { AkadzeError } from "../src/errors.ts";
import {
  assertTestDatabaseUrl,
  createTestDatabase,
  drain,
  startThrowawayPostgres,
} from "../src/testing.ts";
import { withApp, withDatabase } from "./_helpers.ts";

Deno.test("the database-name guard accepts akadze and *_test only", () => {
  assertEquals(assertTestDatabaseUrl("postgres://u@h/akadze"), "akadze");
  assertEquals(assertTestDatabaseUrl("postgres://u@h:5/app_test"), "app_test");
  for (const url of ["postgres://u@h/app", "postgres://u@h/test_app", "postgres://u@h/", "nope"]) {
    assertThrows(() => assertTestDatabaseUrl(url), AkadzeError);
  }
});

Deno.test("createTestDatabase refuses a non-test database and creates nothing", async () => {
  await withDatabase("guard", async (db, sql) => {
    const before = await sql`select count(*)::int as n from pg_database`;
    const prod = new URL(db.url);
    prod.pathname = "/production";
    let error: unknown = undefined;
    try {
      await createTestDatabase({ databaseUrl: prod.toString() });
    } catch (e) {
      error = e;
    }
    assert(error instanceof AkadzeError);
    assert(error.message.includes('"production"'), error.message);
    assertEquals(await sql`select count(*)::int as n from pg_database`, before);
  }, { migrated: false });
});

Deno.test("createTestDatabase accepts a throwaway server's own URL and creates the database on it", async () => {
  const server = await startThrowawayPostgres();
  try {
    assert(server.url.endsWith("/postgres"), server.url);
    const db = await createTestDatabase({ name: "own", databaseUrl: server.url });
    assertEquals(new URL(db.url).port, String(server.port));
    const sql = postgres(server.url, { max: 1, onnotice: () => {} });
    try {
      assertEquals((await sql`select 1 from pg_database where datname = ${db.name}`).length, 1);
      await db.close();
      assertEquals((await sql`select 1 from pg_database where datname = ${db.name}`).length, 0);
    } finally {
      await sql.end();
    }
  } finally {
    await server.stop();
  }
});

Deno.test("each test database is fresh and is dropped by close()", async () => {
  const a = await createTestDatabase({ name: "fresh" });
  const b = await createTestDatabase({ name: "fresh" });
  assert(a.name !== b.name && a.name.endsWith("_test"));
  const sql = postgres(a.url, { max: 1, onnotice: () => {} });
  const [{ n }] = await sql`select count(*)::int as n from pg_tables where schemaname = 'public'`;
  assertEquals(n, 0);
  await sql.end();
  await a.close();
  const check = postgres(b.url, { max: 1, onnotice: () => {} });
  const rows = await check`select 1 from pg_database where datname = ${a.name}`;
  assertEquals(rows.length, 0);
  await check.end();
  await b.close();
});

Deno.test("deno task test refuses a non-test AKADZE_DATABASE_URL and drops nothing", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", new URL("./run.ts", import.meta.url).pathname],
    env: { AKADZE_DATABASE_URL: "postgres://u:pw@127.0.0.1:1/production", NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assertEquals(out.code, 2);
  const stderr = new TextDecoder().decode(out.stderr);
  assert(stderr.includes('refusing to use database "production"'), stderr);
});

Deno.test("drain runs jobs enqueued into another queue with using({ queue })", async () => {
  await withApp("drain_queues", async (app, sql) => {
    const ran: string[] = [];
    const hop = app.task("hop", async ({ at }) => {
      ran.push(String(at));
      // A job may move its follow-up to a queue no task names as its default.
      if (at === "other") await hop.using({ queue: "third" }).enqueue({ at: "third" });
    });
    await hop.using({ queue: "other" }).enqueue({ at: "other" });
    await hop.enqueue({ at: "default" });
    // A job of a task this app does not define is not drain's to run.
    await sql`insert into akadze.jobs (task, queue, args) values ('elsewhere', 'other', '{}')`;
    // A later job whose cancel was asked for is cancelled by the claim pass, in its queue too.
    const later = await hop.using({ queue: "fourth", delay: 60_000 }).enqueue({ at: "later" });
    assert(await requestCancel(app.sql, later));
    assertEquals(await drain(app), 3);
    assertEquals(ran.sort(), ["default", "other", "third"]);
    const rows = await sql`select task, state from akadze.jobs where state <> 'succeeded'
                           order by id`;
    assertEquals(rows.map((r) => `${r.task}:${r.state}`), ["elsewhere:queued", "hop:cancelled"]);
  });
});
