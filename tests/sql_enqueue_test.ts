// The SQL functions of migrations/0003_sql_enqueue.sql: akadze.enqueue and
// akadze.enqueue_many, called from psql, from a trigger, and from node-postgres.
// @ts-types="@types/pg"
import pg from "pg";
import postgres from "postgres";
import * as v from "valibot";
import type { EnqueueOptions } from "../src/enqueue.ts";
import { EnqueueError } from "../src/errors.ts";
import { jobsChannel } from "../src/db.ts";
import { drain } from "../src/testing.ts";
import { assert, assertEquals, assertMatch, assertRejects } from "./assert.ts";
import { countJobs, psql, waitFor, withApp } from "./_helpers.ts";

Deno.test("akadze.enqueue from psql stores every column, NULL meaning the default", async () => {
  await withApp("sql_psql", async (_app, sql, db) => {
    const out = await psql(
      db.url,
      `begin;
       select akadze.enqueue('mail.send', '{"to": "ada@example.com", "n": [1, {"deep": true}]}',
         queue => 'mail.bulk', priority => -7, run_at => '2030-01-01T00:00:00Z',
         max_attempts => 9, unique_key => 'u-1', limit_key => 'smtp',
         expires_at => '2031-01-01T00:00:00Z');
       select akadze.enqueue('plain');
       select akadze.enqueue('nulls', null, null, null, null, null, null, null, null, null);
       select string_agg(id::text, ',') from akadze.enqueue_many('many',
         '[{"i": 0}, {"i": 1}, {"i": 2}]', queue => 'mail');
       commit;`,
    );
    assertEquals([out.code, out.stderr], [0, ""]);
    const [full, plain, nulls, many] = out.stdout.trim().split("\n");
    const rows = await sql`select id::text as id, * from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => r.id), [full, plain, nulls, ...many.split(",")]);
    const [f, p, n] = rows;
    assertEquals(
      [f.task, f.queue, f.priority, f.max_attempts, f.unique_key, f.limit_key, f.args],
      ["mail.send", "mail.bulk", -7, 9, "u-1", "smtp", {
        to: "ada@example.com",
        n: [1, {
          deep: true,
        }],
      }],
    );
    assertEquals(f.run_at.toISOString(), "2030-01-01T00:00:00.000Z");
    assertEquals(f.expires_at.toISOString(), "2031-01-01T00:00:00.000Z");
    for (const row of [p, n]) {
      assertEquals(
        [row.queue, row.priority, row.max_attempts, row.args, row.unique_key, row.expires_at],
        ["default", 0, 3, {}, null, null],
      );
      assertEquals([row.state, row.attempt, row.run_count, row.errors], ["queued", 0, 0, []]);
    }
    assertEquals(rows.slice(3).map((r) => [r.task, r.queue, r.args.i]), [
      ["many", "mail", 0],
      ["many", "mail", 1],
      ["many", "mail", 2],
    ]);
    const [{ ready }] = await sql`select run_at <= now() as ready from akadze.jobs
                                   where id = ${plain}`;
    assert(ready, "run_at defaults to now()");
  });
});

Deno.test("the SQL functions refuse what the TypeScript API refuses, nothing inserted", async () => {
  await withApp("sql_rules", async (app, sql) => {
    const task = app.task("t", () => {});
    const long = "k".repeat(501);
    // [TypeScript options and args, SQL named arguments, SQLSTATE, TS message, SQL message]
    const cases: [Record<string, unknown>, unknown, string, string, RegExp, RegExp][] = [
      [
        { priority: 32768 },
        {},
        "priority => 32768",
        "22003",
        /priority must be an integer from -32768 to 32767, got 32768/,
        /priority must be an integer from -32768 to 32767, got 32768/,
      ],
      [
        { priority: -32769 },
        {},
        "priority => -32769",
        "22003",
        /priority must be/,
        /priority must be/,
      ],
      [
        { maxAttempts: 0 },
        {},
        "max_attempts => 0",
        "22003",
        /maxAttempts must be an integer from 1 to 2147483647/,
        /max_attempts must be an integer from 1 to 2147483647, got 0/,
      ],
      [
        { queue: "bad queue" },
        {},
        "queue => 'bad queue'",
        "23514",
        /queue name "bad queue"/,
        /queue_name/,
      ],
      [{ queue: "" }, {}, "queue => ''", "23514", /queue name/, /queue_name/],
      [
        { uniqueKey: "" },
        {},
        "unique_key => ''",
        "23514",
        /uniqueKey must be a non-empty string/,
        /job_key/,
      ],
      [{ limitKey: long }, {}, `limit_key => '${long}'`, "23514", /limitKey must be/, /job_key/],
      [{}, [], "args => '[]'", "23514", /must be a JSON object/, /job_args/],
      [{}, "x", `args => '"x"'`, "23514", /must be a JSON object/, /job_args/],
    ];
    for (const [options, args, named, code, tsMessage, sqlMessage] of cases) {
      const tsError = await assertRejects(
        () => task.using(options).enqueue(args as never),
        EnqueueError,
      );
      assertMatch(tsError.message, tsMessage);
      const sqlError = await assertRejects(
        () => sql.unsafe(`select akadze.enqueue('t', ${named})`),
      ) as { code?: string; message: string };
      assertEquals(sqlError.code, code, `${named}: ${sqlError.message}`);
      assertMatch(sqlError.message, sqlMessage);
    }
    const emptyTask = await assertRejects(() => sql`select akadze.enqueue('')`) as {
      code?: string;
      message: string;
    };
    assertEquals(emptyTask.code, "23514");
    assertMatch(emptyTask.message, /task_name/);
    const bulk: [string, string, RegExp][] = [
      [`'{"a": 1}'`, "22023", /args_list must be a JSON array of argument objects/],
      [`'"x"'`, "22023", /args_list must be a JSON array/],
      [`'[{}, 1]'`, "23514", /job_args/],
      [`'[{}]', on_duplicate => 'nope'`, "22023", /on_duplicate must be 'raise', 'ignore', 'keep'/],
      [`'[{}]', unique_key => 'u', while_running => 'x'`, "22023", /while_running must be/],
      [`'[{}]', unique_key => 'u', throttle => '-1 s'`, "22023", /throttle must be a positive/],
      [`'[{}]', on_duplicate => 'keep'`, "22023", /need a unique_key/],
      // A batch cannot share a unique key (enqueueMany refuses it too), ignored or not.
      [`'[{}, {}]', unique_key => 'u'`, "22023", /the 2 jobs of this batch cannot share/],
      [`'[{}, {}]', unique_key => 'u', on_duplicate => 'ignore'`, "22023", /cannot share/],
      // A Date is finite: so must SQL's times be (a job at 'infinity' would never run).
      [`'[{}]', run_at => 'infinity'`, "22023", /run_at must be a finite time, got infinity/],
      [`'[{}]', run_at => '-infinity'`, "22023", /run_at must be a finite time, got -infinity/],
      [`'[{}]', expires_at => '-infinity'`, "22023", /expires_at must be a finite time/],
    ];
    for (const [rest, code, message] of bulk) {
      const error = await assertRejects(
        () => sql.unsafe(`select * from akadze.enqueue_many('t', ${rest})`),
      ) as { code?: string; message: string };
      assertEquals(error.code, code, `${rest}: ${error.message}`);
      assertMatch(error.message, message);
    }
    const infinite = await assertRejects(() =>
      sql`select akadze.enqueue('t', run_at => 'infinity')`
    ) as { code?: string; message: string };
    assertEquals(infinite.code, "22023", infinite.message);
    assertMatch(infinite.message, /pass NULL to run the job now/);
    const nullTask = await assertRejects(() => sql`select akadze.enqueue(null)`) as {
      code?: string;
    };
    assertEquals(nullTask.code, "23502");
    // NULL (what jsonb_agg gives for no rows) and [] are no jobs, like enqueueMany([]).
    assertEquals((await sql`select * from akadze.enqueue_many('t', null)`).length, 0);
    assertEquals((await sql`select * from akadze.enqueue_many('t', '[]')`).length, 0);
    assertEquals(await countJobs(sql), 0);
    // The boundaries are accepted by both.
    const key = "k".repeat(500);
    const queue = "a:b.c-d_".repeat(8);
    await task.using({ priority: 32767, maxAttempts: 2147483647, limitKey: key, queue }).enqueue();
    await task.using({ priority: -32768, uniqueKey: key }).enqueue();
    await sql`select akadze.enqueue('t', priority => 32767, max_attempts => 2147483647,
                                    limit_key => ${key}, queue => ${queue})`;
    await sql`select akadze.enqueue('t', priority => -32768, unique_key => ${"u".repeat(500)})`;
    assertEquals(await countJobs(sql), 4);
  });
});

Deno.test("a held unique_key raises AKDUP: a savepoint keeps the psql script's transaction", async () => {
  await withApp("sql_duplicate", async (_app, sql, db) => {
    await sql`create table public.notes (t text)`;
    const out = await psql(
      db.url,
      `begin;
       select akadze.enqueue('t', '{"n": 1}', unique_key => 'k');
       savepoint before_enqueue;
       select akadze.enqueue('t', '{"n": 2}', unique_key => 'k');
       rollback to savepoint before_enqueue;
       select coalesce(akadze.enqueue('t', '{"n": 3}', unique_key => 'k',
                                      on_duplicate => 'ignore')::text, 'ignored');
       select count(*) from akadze.enqueue_many('t', '[{"n": 4}]', unique_key => 'k',
                                                on_duplicate => 'ignore');
       do $$
       begin
         perform akadze.enqueue('t', '{"n": 6}', unique_key => 'k');
       exception when sqlstate 'AKDUP' then
         insert into public.notes values ('already queued');
       end $$;
       insert into public.notes values ('still usable');
       commit;`,
      { stopOnError: false },
    );
    assertEquals(out.code, 0, out.stderr);
    // The one error of the script, with its SQLSTATE, the constraint and what to do.
    assertMatch(
      out.stderr,
      /^ERROR: {2}AKDUP: a job with unique_key "k" is already waiting, queued or running\n/,
    );
    assertMatch(out.stderr, /HINT: {2}Catch SQLSTATE AKDUP in a savepoint, or pass on_duplicate/);
    assertEquals(out.stderr.match(/ERROR:/g)?.length, 1, out.stderr);
    assertEquals(out.stdout.trim().split("\n").slice(1), ["ignored", "0"]);
    const jobs = await sql`select args from akadze.jobs`;
    assertEquals(jobs.map((r) => r.args), [{ n: 1 }]);
    const notes = await sql`select t from public.notes order by t`;
    assertEquals(notes.map((r) => r.t), ["already queued", "still usable"]);
    // A batch of one whose key is held raises AKDUP too; a batch of several cannot share a key
    // at all (it would collide with itself), even with a key nobody holds: nothing is inserted.
    const held = await assertRejects(
      () => sql`select * from akadze.enqueue_many('t', '[{}]', unique_key => 'k')`,
    ) as { code?: string; message: string; constraint_name?: string };
    assertEquals([held.code, held.constraint_name], ["AKDUP", "jobs_active_unique_key_idx"]);
    const shared = await assertRejects(
      () => sql`select * from akadze.enqueue_many('t', '[{}, {}]', unique_key => 'fresh')`,
    ) as { code?: string; message: string };
    assertEquals(shared.code, "22023");
    assertMatch(shared.message, /"fresh".*; nothing of this batch was enqueued/);
    // A finished job no longer holds its key.
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now()`;
    const [{ id }] = await sql`select akadze.enqueue('t', unique_key => 'k') as id`;
    assertMatch(id, /^\d+$/);
    assertEquals(await countJobs(sql), 2);
  });
});

Deno.test("a trigger enqueues in the inserting transaction; a rollback removes its jobs", async () => {
  await withApp("sql_trigger", async (app, sql, db) => {
    await sql.unsafe(`
      create table public.signups (id bigint generated always as identity primary key,
                                   email text not null);
      create function public.signup_welcome() returns trigger language plpgsql as $$
      begin
        perform akadze.enqueue('mail.welcome',
                               jsonb_build_object('signup_id', new.id, 'email', new.email),
                               queue => 'mail');
        return null;
      end $$;
      create trigger signup_welcome after insert on public.signups
        for each row execute function public.signup_welcome();`);
    const out = await psql(
      db.url,
      `insert into public.signups (email) values ('ada@example.com'), ('bob@example.com');
       begin;
       insert into public.signups (email) values ('rolled@example.com');
       rollback;`,
    );
    assertEquals([out.code, out.stderr], [0, ""]);
    // The same from a statement-level trigger: one enqueue_many for the whole statement.
    await sql.unsafe(`
      drop trigger signup_welcome on public.signups;
      create function public.signups_welcome() returns trigger language plpgsql as $$
      begin
        perform akadze.enqueue_many('mail.welcome',
          (select jsonb_agg(jsonb_build_object('signup_id', id, 'email', email) order by id)
             from added),
          queue => 'mail');
        return null;
      end $$;
      create trigger signups_welcome after insert on public.signups
        referencing new table as added
        for each statement execute function public.signups_welcome();`);
    await sql`insert into public.signups (email) values ('cy@example.com'), ('di@example.com')`;
    await sql`insert into public.signups (email) select 'none' where false`;
    const jobs = await sql`select task, queue, args from akadze.jobs j order by j.id`;
    assertEquals(jobs.map((r) => [r.task, r.queue, r.args.email]), [
      ["mail.welcome", "mail", "ada@example.com"],
      ["mail.welcome", "mail", "bob@example.com"],
      ["mail.welcome", "mail", "cy@example.com"],
      ["mail.welcome", "mail", "di@example.com"],
    ]);
    // A worker runs them like jobs enqueued from TypeScript.
    const sent: string[] = [];
    app.task(
      "mail.welcome",
      { queue: "mail", args: v.object({ signup_id: v.number(), email: v.string() }) },
      ({ email }) => {
        sent.push(email);
      },
    );
    assertEquals(await drain(app), 4);
    assertEquals(sent.sort(), [
      "ada@example.com",
      "bob@example.com",
      "cy@example.com",
      "di@example.com",
    ]);
  });
});

Deno.test("arguments from SQL that fail the task's schema fail the run, not the enqueue", async () => {
  await withApp("sql_runtime_validation", async (app, sql) => {
    app.task("typed", { args: v.object({ n: v.number() }) }, () => {});
    const [{ id }] = await sql`
      select akadze.enqueue('typed', '{"n": "not a number"}', max_attempts => 5) as id`;
    assertEquals(await drain(app), 1);
    const [job] = await sql`select state, errors from akadze.jobs where id = ${id}`;
    assertEquals(job.state, "failed");
    assertEquals(job.errors[0].error, "InvalidArguments");
    assertMatch(job.errors[0].message, /do not match the schema of task "typed": n: /);
  });
});

Deno.test("akadze.enqueue from npm:pg: in the client's transaction, NOTIFY at commit", async () => {
  await withApp("sql_node_postgres", async (_app, sql, db) => {
    const listener = postgres(db.url, { max: 1, onnotice: () => {} });
    const got: string[] = [];
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await listener.listen(jobsChannel("akadze"), (payload) => got.push(payload));
      await client.query("begin");
      const { rows } = await client.query(
        "select akadze.enqueue($1, $2, queue => $3) as id",
        ["t", { to: "ada" }, "mail"],
      );
      assertMatch(rows[0].id, /^\d+$/);
      await client.query("rollback");
      assertEquals(await countJobs(sql), 0, "the rollback removed the job");

      await client.query("begin");
      const one = await client.query("select akadze.enqueue('t', $1::jsonb) as id", [
        JSON.stringify({ n: 1 }),
      ]);
      const many = await client.query(
        "select id from akadze.enqueue_many('t', $1, queue => 'bulk')",
        [JSON.stringify([{ n: 2 }, { n: 3 }])],
      );
      // A duplicate, caught in a savepoint: the transaction goes on.
      await client.query("select akadze.enqueue('t', unique_key => 'k')");
      await client.query("savepoint enqueue");
      const error = await assertRejects(() =>
        client.query("select akadze.enqueue('t', unique_key => 'k')")
      ) as { code?: string; constraint?: string };
      assertEquals([error.code, error.constraint], ["AKDUP", "jobs_active_unique_key_idx"]);
      await client.query("rollback to savepoint enqueue");
      await new Promise((r) => setTimeout(r, 100));
      assertEquals(got.length, 0, "nothing before commit");
      await client.query("commit");
      await listener.notify(jobsChannel("akadze"), "marker");
      await waitFor(() => got.includes("marker"), "the marker");
      // One per queue: PostgreSQL folds a transaction's identical notifications into one,
      // and the rolled-back transaction sent none.
      assertEquals(got, ["default", "bulk", "marker"]);
      const ids = [one.rows[0].id, ...many.rows.map((r: { id: string }) => r.id)];
      const stored = await sql`select id::text as id, args from akadze.jobs j order by j.id`;
      assertEquals(stored.slice(0, 3).map((r) => [r.id, r.args.n]), [
        [ids[0], 1],
        [ids[1], 2],
        [ids[2], 3],
      ]);
      assertEquals(await countJobs(sql), 4);
    } finally {
      await client.end();
      await listener.end();
    }
  });
});

Deno.test("a role with USAGE on the schema and INSERT, SELECT (id, state, unique_key) on jobs can enqueue", async () => {
  await withApp("sql_grants", async (_app, sql) => {
    const role = `akadze_writer_${crypto.randomUUID().slice(0, 8)}`;
    await sql.unsafe(`create role ${role}`);
    try {
      await sql.unsafe(`grant usage on schema akadze to ${role};
                        grant insert, select (id, state, unique_key) on akadze.jobs to ${role}`);
      await sql.begin(async (tx) => {
        await tx.unsafe(`set local role ${role}`);
        const [{ id }] = await tx`select akadze.enqueue('t', unique_key => 'k') as id`;
        assertMatch(id, /^\d+$/);
        const [{ again }] = await tx`
          select akadze.enqueue('t', unique_key => 'k', on_duplicate => 'ignore') as again`;
        assertEquals(again, null);
        const ids = await tx`select id from akadze.enqueue_many('t', '[{}, {}]')`;
        assertEquals(ids.length, 2);
      });
      assertEquals(await countJobs(sql), 3);
    } finally {
      await sql.unsafe(`drop owned by ${role}; drop role ${role}`);
    }
  });
});

Deno.test("TypeScript and SQL enqueue store identical rows for the same inputs, every option included", async () => {
  await withApp("sql_twins", async (app, sql) => {
    const runAt = new Date("2030-01-02T03:04:05.678Z");
    const expiresAt = new Date("2031-05-06T07:08:09.012Z");
    const args = { to: "ada@example.com", n: [1, { deep: true }], s: "é\u2028", z: null };
    // Every column but the id and the enqueue time; a run_at left to its default is "now".
    const stored = async (ids: readonly (string | null)[]) => {
      const rows = await sql`
        select to_jsonb(j) - 'id' - 'created_at' - 'run_at' || jsonb_build_object('run_at',
                 case when j.run_at = j.created_at then 'now' else j.run_at::text end) as row
          from akadze.jobs j where j.id = any(${ids as string[]}::bigint[]) order by j.id`;
      await sql`delete from akadze.jobs where id = any(${ids as string[]}::bigint[])`;
      await sql`delete from akadze.unique_windows`;
      assertEquals(rows.length, ids.length);
      return rows.map((r) => r.row);
    };
    // One task with defaults, one with its own queue, priority and budget.
    const tasks = [
      app.task("twin", () => {}),
      app.task("twin.own", {
        queue: "own",
        priority: 4,
        maxAttempts: 7,
      }, () => {}),
    ];
    const sqlDefaults = [{}, { queue: "own", priority: 4, max_attempts: 7 }];
    const cases: [string, EnqueueOptions, Record<string, unknown>][] = [
      ["defaults", {}, {}],
      ["every option", {
        queue: "mail.bulk",
        priority: -7,
        maxAttempts: 9,
        runAt,
        uniqueKey: "u-1",
        limitKey: "smtp",
        expiresAt,
      }, {
        queue: "mail.bulk",
        priority: -7,
        max_attempts: 9,
        run_at: runAt.toISOString(),
        unique_key: "u-1",
        limit_key: "smtp",
        expires_at: expiresAt.toISOString(),
      }],
      ["a unique key alone", { uniqueKey: "u-2" }, { unique_key: "u-2" }],
      // The unique-key modes (0015): a new job is stored alike, whatever the mode.
      ["every mode option", {
        queue: "mail.bulk",
        priority: -7,
        maxAttempts: 9,
        runAt,
        uniqueKey: "u-3",
        onDuplicate: "replace",
        whileRunning: "queueOne",
        throttle: 60_000,
        limitKey: "smtp",
        expiresAt,
      }, {
        queue: "mail.bulk",
        priority: -7,
        max_attempts: 9,
        run_at: runAt.toISOString(),
        unique_key: "u-3",
        on_duplicate: "replace",
        while_running: "queue_one",
        throttle: "60 seconds",
        limit_key: "smtp",
        expires_at: expiresAt.toISOString(),
      }],
      ["debounce", { uniqueKey: "u-4", onDuplicate: "debounce" }, {
        unique_key: "u-4",
        on_duplicate: "debounce",
      }],
      ["keep", { uniqueKey: "u-5", onDuplicate: "keep" }, {
        unique_key: "u-5",
        on_duplicate: "keep",
      }],
      ["extremes", { priority: 32767, maxAttempts: 2147483647 }, {
        priority: 32767,
        max_attempts: 2147483647,
      }],
    ];
    // SQL's named arguments, from a case's columns.
    const named = (columns: Record<string, unknown>) =>
      Object.keys(columns).map((k, i) => `, ${k} => $${i + 3}`).join("");
    const values = (columns: Record<string, unknown>) => Object.values(columns) as string[];
    // The TypeScript statement has three shapes (one row, several, and whole rows for
    // onEnqueue hooks); each is compared.
    for (const hooked of [false, true]) {
      app.hooks.onEnqueue.length = 0;
      if (hooked) app.hooks.onEnqueue.push(() => {});
      for (const [t, task] of tasks.entries()) {
        for (const [name, options, columns] of cases) {
          const what = `${task.name}, ${name}${hooked ? ", with a hook" : ""}`;
          const all = { ...sqlDefaults[t], ...columns };
          const ts = await stored([await task.using(options).enqueue(args)]);
          const [{ id }] = await sql.unsafe(
            `select akadze.enqueue($1, $2::text::jsonb${named(all)}) as id`,
            [task.name, JSON.stringify(args), ...values(all)],
          );
          assertEquals(await stored([id]), ts, `one job: ${what}`);
          if (options.uniqueKey) continue; // a batch cannot share one
          const list = [args, { i: 1 }, {}];
          const tsMany = await stored(await task.using(options).enqueueMany(list));
          const ids = (await sql.unsafe(
            `select id::text from akadze.enqueue_many($1, $2::text::jsonb${named(all)})`,
            [task.name, JSON.stringify(list), ...values(all)],
          )).map((r) => r.id as string);
          assertEquals(await stored(ids), tsMany, `several jobs: ${what}`);
        }
        // A job replaced (or debounced) by a second enqueue of its key: the same row too (each
        // with a run time: "now" differs between the two transactions).
        const replacements: [string, EnqueueOptions, Record<string, unknown>][] = [
          ["replace, every option", {
            onDuplicate: "replace",
            queue: "mail.bulk",
            priority: -7,
            maxAttempts: 9,
            runAt,
            limitKey: "smtp",
            expiresAt,
          }, {
            on_duplicate: "replace",
            queue: "mail.bulk",
            priority: -7,
            max_attempts: 9,
            run_at: runAt.toISOString(),
            limit_key: "smtp",
            expires_at: expiresAt.toISOString(),
          }],
          ["debounce, later", { onDuplicate: "debounce", runAt }, {
            on_duplicate: "debounce",
            run_at: runAt.toISOString(),
          }],
          ["debounce, sooner", {
            onDuplicate: "debounce",
            runAt: new Date("2000-01-01T00:00:00Z"),
          }, { on_duplicate: "debounce", run_at: "2000-01-01T00:00:00Z" }],
        ];
        const first = { uniqueKey: "r", runAt: new Date("2029-01-01T00:00:00Z") };
        const firstSql = { unique_key: "r", run_at: "2029-01-01T00:00:00Z" };
        for (const [name, options, columns] of replacements) {
          const what = `${task.name}, ${name}${hooked ? ", with a hook" : ""}`;
          const tsFirst = await tasks[0].using(first).enqueue({ first: true });
          const tsId = await task.using({ ...options, uniqueKey: "r" }).enqueue(args);
          assertEquals(tsId, tsFirst);
          const ts = await stored([tsId]);
          const all = { ...sqlDefaults[t], ...columns, unique_key: "r" };
          const [{ id: sqlFirst }] = await sql.unsafe(
            `select akadze.enqueue('twin', '{"first": true}'${named(firstSql)}) as id`.replace(
              /\$(\d+)/g,
              (_, n) => `$${Number(n) - 2}`,
            ),
            values(firstSql),
          );
          const [{ id }] = await sql.unsafe(
            `select akadze.enqueue($1, $2::text::jsonb${named(all)}) as id`,
            [task.name, JSON.stringify(args), ...values(all)],
          );
          assertEquals(id, sqlFirst);
          assertEquals(await stored([id]), ts, `replaced: ${what}`);
        }
      }
    }
  });
});

Deno.test("SQL enqueue refuses arguments over akadze.max_args_bytes, as TypeScript enqueue does", async () => {
  await withApp("sql_args_size", async (_app, sql) => {
    const big = JSON.stringify({ blob: "x".repeat(1_100_000) });
    const refused = await sql`select akadze.enqueue('t', ${big}::text::jsonb)`.then(
      () => null,
      (e) => e,
    );
    assertEquals(refused?.code, "54000");
    assertMatch(refused.message, /arguments for job 1 of this batch of task "t" are \d+ bytes/);
    assertMatch(refused.message, /akadze\.max_args_bytes/);
    assert(!refused.message.includes("xxxx"), "no argument value in the error");
    const batch = JSON.stringify([{ a: 1 }, JSON.parse(big)]);
    const many = await sql`select * from akadze.enqueue_many('t', ${batch}::text::jsonb)`.then(
      () => null,
      (e) => e,
    );
    assertMatch(String(many?.message), /job 2 of this batch/, String(many));
    assertEquals((await sql`select count(*)::int as n from akadze.jobs`)[0].n, 0);
    // The setting raises the limit, for this transaction here.
    const id = await sql.begin(async (tx) => {
      await tx`select set_config('akadze.max_args_bytes', '4194304', true)`;
      const [row] = await tx`select akadze.enqueue('t', ${big}::text::jsonb) as id`;
      return row.id;
    });
    assert(id, "enqueued under the raised limit");
  });
});

Deno.test("SQL enqueue stores the trace context its transaction set in akadze.traceparent, and ignores one that is not valid", async () => {
  await withApp("sql_trace_context", async (app, sql) => {
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const contextOf = async (settings: Record<string, string>, many = false) => {
      const ids = await sql.begin(async (tx) => {
        for (const [name, value] of Object.entries(settings)) {
          await tx`select set_config(${name}, ${value}, true)`;
        }
        return many
          ? (await tx`select id::text from akadze.enqueue_many('t', '[{}, {}]')`).map((r) => r.id)
          : [(await tx`select akadze.enqueue('t')::text as id`)[0].id];
      });
      const rows = await sql`
        select trace_context from akadze.jobs where id = any(${ids}::bigint[]) order by id`;
      return rows.map((r) => r.trace_context);
    };
    assertEquals(await contextOf({}), [null]);
    assertEquals(await contextOf({ "akadze.traceparent": traceparent }), [{ traceparent }]);
    assertEquals(
      await contextOf({ "akadze.traceparent": traceparent, "akadze.tracestate": "k=v" }, true),
      [{ traceparent, tracestate: "k=v" }, { traceparent, tracestate: "k=v" }],
    );
    for (const bad of ["", "not a traceparent", traceparent.toUpperCase(), `${traceparent}-x`]) {
      assertEquals(await contextOf({ "akadze.traceparent": bad }), [null], bad);
    }
    // SET LOCAL ends with its transaction: the next one stores none.
    assertEquals(await contextOf({}), [null]);
    // A flow's steps store it too; one given to enqueue_flow is checked.
    const flow = await sql.begin(async (tx) => {
      await tx`select set_config('akadze.traceparent', ${traceparent}, true)`;
      return await tx`select id from akadze.enqueue_flow('[{"name": "a", "task": "t"},
        {"name": "b", "task": "t", "depends_on": ["a"]}]')`;
    });
    const steps = await sql`select trace_context from akadze.jobs
      where id = any(${flow.map((r) => r.id)}::bigint[])`;
    assertEquals(steps.map((r) => r.trace_context), [{ traceparent }, { traceparent }]);
    const refused = await sql`select akadze.enqueue_flow('[{"name": "a", "task": "t"}]', null,
      '{"traceparent": "00-zz"}')`.catch((e) => e);
    assertEquals([refused.code, refused.message], [
      "22023",
      'trace_context must be {"traceparent": "<W3C traceparent>", "tracestate": "..."} or null',
    ]);
    // TypeScript enqueue without a tracer provider (tracing off) stores none either.
    const id = await app.task("t", () => {}).enqueue({});
    assertEquals((await sql`select trace_context from akadze.jobs where id = ${id}`)[0], {
      trace_context: null,
    });
  });
});
