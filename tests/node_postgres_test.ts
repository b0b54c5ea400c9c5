// `task.using({ session })` with a node-postgres (npm:pg) client, pool client or pool.
// @ts-types="@types/pg"
import pg from "pg";
import postgres from "postgres";
import * as v from "valibot";
import { DuplicateJob, EnqueueError } from "../src/errors.ts";
import { jobsChannel } from "../src/db.ts";
import { assertEquals, assertMatch, assertRejects } from "./assert.ts";
import { countJobs, waitFor, withApp, withDatabase } from "./_helpers.ts";
import { Akadze } from "../src/app.ts";

Deno.test("a pg.Client session enqueues in the client's transaction: rollback removes it", async () => {
  await withApp("pg_client", async (app, sql, testDb) => {
    const task = app.task(
      "mail.send",
      { queue: "mail", priority: 3, args: v.object({ to: v.string() }) },
      () => {},
    );
    const db = new pg.Client({ connectionString: testDb.url });
    await db.connect();
    try {
      await db.query("begin");
      const id = await task.using({ session: db }).enqueue({ to: "ada@example.com" });
      assertMatch(id, /^\d+$/);
      const seen = await db.query("select count(*)::int as n from akadze.jobs");
      assertEquals(seen.rows[0].n, 1, "visible in the client's transaction");
      assertEquals(await countJobs(sql), 0, "not committed yet");
      await db.query("rollback");
      assertEquals(await countJobs(sql), 0, "the rollback removed the job");

      await db.query("begin");
      const kept = await task.using({ session: db, uniqueKey: "u", delay: 60_000 }).enqueue({
        to: "bob@example.com",
      });
      const ids = await task.enqueueMany([{ to: "a" }, { to: "b" }], { session: db });
      await db.query("commit");
      const rows = await sql`select id::text as id, task, queue, priority, unique_key, args,
                                    run_at > now() + interval '50 seconds' as delayed
                               from akadze.jobs j order by j.id`;
      assertEquals(rows.map((r) => r.id), [kept, ...ids]);
      assertEquals(
        [rows[0].task, rows[0].queue, rows[0].priority, rows[0].unique_key, rows[0].delayed],
        ["mail.send", "mail", 3, "u", true],
      );
      assertEquals(rows.map((r) => r.args.to), ["bob@example.com", "a", "b"]);
    } finally {
      await db.end();
    }
  });
});

Deno.test("a pg DuplicateJob keeps the client's transaction usable; pool clients and pools work", async () => {
  await withApp("pg_pool", async (app, sql, db) => {
    await sql`create table public.notes (t text)`;
    const task = app.task("t", () => {});
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    try {
      const client = await pool.connect();
      try {
        await client.query("begin");
        await task.using({ session: client, uniqueKey: "k" }).enqueue({ n: 1 });
        const error = await assertRejects(
          () => task.using({ session: client, uniqueKey: "k" }).enqueue({ n: 2 }),
          DuplicateJob,
        );
        assertMatch(error.message, /"k" is already waiting, queued or running/);
        await client.query("insert into public.notes values ('still usable')");
        await client.query("commit");
      } finally {
        client.release();
      }
      // A pool: the statement commits on its own.
      await task.using({ session: pool }).enqueue({ n: 3 });
      await assertRejects(
        () => task.using({ session: pool, uniqueKey: "k" }).enqueue(),
        DuplicateJob,
      );
      const rows = await sql`select args->>'n' as n from akadze.jobs j order by j.id`;
      assertEquals(rows.map((r) => r.n), ["1", "3"]);
      assertEquals((await sql`select t from public.notes`).map((r) => r.t), ["still usable"]);
    } finally {
      await pool.end();
    }
  });
});

Deno.test("a pg session's NOTIFY arrives at commit, not before", async () => {
  await withApp("pg_notify", async (app, _sql, db) => {
    const url = db.url;
    const listener = postgres(url, { max: 1, onnotice: () => {} });
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const got: string[] = [];
    try {
      await listener.listen(jobsChannel("akadze"), (payload) => got.push(payload));
      const task = app.task("t", { queue: "mail" }, () => {});
      await client.query("begin");
      await task.using({ session: client }).enqueue();
      await new Promise((r) => setTimeout(r, 100));
      assertEquals(got.length, 0, "nothing before commit");
      await client.query("commit");
      await waitFor(() => got.length === 1, "the commit's notification");
      assertEquals(got, ["mail"]);
    } finally {
      await client.end();
      await listener.end();
    }
  });
});

Deno.test("a pg session is refused while the app has onEnqueue hooks; nothing inserted", async () => {
  await withApp("pg_hooks", async (app, sql, db) => {
    app.hooks.onEnqueue.push(() => {});
    const task = app.task("t", () => {});
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const error = await assertRejects(
        () => task.using({ session: client }).enqueue({}),
        EnqueueError,
      );
      assertMatch(error.message, /onEnqueue hooks.*postgres\.js/);
      assertEquals(await countJobs(sql), 0);
      // Hooks still run with a postgres.js session.
      await task.enqueue();
      assertEquals(await countJobs(sql), 1);
    } finally {
      await client.end();
    }
  });
});

Deno.test("a pg session on a database without akadze's schema says to run akadze migrate", async () => {
  await withDatabase("pg_unmigrated", async (db) => {
    const app = new Akadze({ databaseUrl: db.url });
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const task = app.task("t", () => {});
      const error = await assertRejects(
        () => task.using({ session: client }).enqueue(),
        EnqueueError,
      );
      assertMatch(error.message, /not installed.*akadze migrate/);
    } finally {
      await client.end();
      await app.close();
    }
  }, { migrated: false });
});
