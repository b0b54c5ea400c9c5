import * as v from "valibot";
import { z } from "zod";
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { AkadzeError, DuplicateJob, EnqueueError } from "../src/errors.ts";
import { jobsChannel } from "../src/db.ts";
import { assertEnqueued, drain } from "../src/testing.ts";
import { assert, assertEquals, assertMatch, assertRejects, assertThrows } from "./assert.ts";
import { migrate } from "../src/migrate.ts";
import { countJobs, waitFor, withApp, withDatabase } from "./_helpers.ts";

Deno.test("a committed enqueue keeps every column as given", async () => {
  await withApp("enq_columns", async (app, sql) => {
    const task = app.task("mail.send", { queue: "mail", priority: 3, maxAttempts: 4 }, () => {});
    const runAt = new Date(Date.now() + 3_600_000);
    const expiresAt = new Date(Date.now() + 7_200_000);
    let id = "";
    await app.sql.begin(async (tx) => {
      id = await task.using({
        session: tx,
        runAt,
        priority: -7,
        maxAttempts: 9,
        uniqueKey: "u-1",
        limitKey: "smtp",
        expiresAt,
        queue: "mail.bulk",
      }).enqueue({ to: "ada@example.com", n: [1, { deep: true }] });
    });
    assertMatch(id, /^\d+$/);
    const [row] = await sql`select * from akadze.jobs where id = ${id}`;
    assertEquals(row.task, "mail.send");
    assertEquals(row.queue, "mail.bulk");
    assertEquals(row.priority, -7);
    assertEquals(row.max_attempts, 9);
    assertEquals(row.unique_key, "u-1");
    assertEquals(row.limit_key, "smtp");
    assertEquals(row.run_at.getTime(), runAt.getTime());
    assertEquals(row.expires_at.getTime(), expiresAt.getTime());
    assertEquals(row.args, { to: "ada@example.com", n: [1, { deep: true }] });
    assertEquals(
      [row.state, row.attempt, row.run_count, row.snoozes, row.worker_id, row.result],
      ["queued", 0, 0, 0, null, null],
    );
    assertEquals(row.errors, []);
    const defaults = await task.enqueue({});
    const [d] = await sql`select queue, priority, max_attempts, run_at <= now() as ready
                          from akadze.jobs where id = ${defaults}`;
    assertEquals(d, { queue: "mail", priority: 3, max_attempts: 4, ready: true });
  });
});

Deno.test("a rollback removes the job", async () => {
  await withApp("enq_rollback", async (app, sql) => {
    const task = app.task("t", () => {});
    await assertRejects(() =>
      app.sql.begin(async (tx) => {
        await task.using({ session: tx }).enqueue({ a: 1 });
        throw new Error("abort");
      })
    );
    assertEquals(await countJobs(sql), 0);
  });
});

Deno.test("every enqueue check raises EnqueueError, in order, and inserts nothing", async () => {
  await withApp("enq_checks", async (app, sql) => {
    const task = app.task("t", () => {});
    const schemaTask = app.task("s", { args: v.object({ n: v.number() }) }, () => {});
    const cases: [() => Promise<unknown>, RegExp][] = [
      [
        () => task.using({ delay: 1, runAt: new Date(), priority: 1e6 }).enqueue(),
        /delay and runAt/,
      ],
      [() => task.using({ delay: -1, priority: 1e6 }).enqueue(), /delay must be a non-negative/],
      [() => task.using({ delay: NaN }).enqueue(), /delay must be/],
      [
        () => task.using({ runAt: new Date("nope"), priority: 1e6 }).enqueue(),
        /runAt must be a valid Date/,
      ],
      [
        () => task.using({ expiresAt: "2030-01-01" as never }).enqueue(),
        /expiresAt must be a valid Date/,
      ],
      [
        () => task.using({ priority: 32768, maxAttempts: 0 }).enqueue(),
        /priority must be an integer/,
      ],
      [() => task.using({ priority: -32769 }).enqueue(), /priority must be/],
      [
        () => task.using({ maxAttempts: 0 }).enqueue({ bad: 1n }),
        /maxAttempts must be an integer from 1/,
      ],
      [() => task.using({ maxAttempts: 2 ** 31 }).enqueue(), /maxAttempts must be/],
      [() => task.using({ queue: "bad queue" }).enqueue({ bad: 1n }), /BigInt/],
      [() => schemaTask.using({ queue: "bad queue" }).enqueue({ n: "x" } as never), /task "s".*n/],
      [() => task.using({ queue: "bad queue" }).enqueue(), /queue name "bad queue"/],
      [() => task.using({ queue: "" }).enqueue(), /queue name/],
      [() => task.using({ uniqueKey: "" }).enqueue(), /uniqueKey must be a non-empty string/],
      [() => task.using({ limitKey: 5 as never }).enqueue(), /limitKey must be/],
      [
        () => task.using({ unique_key: "x" } as never).enqueue(),
        /unknown enqueue option "unique_key"/,
      ],
      [() => task.using({ session: {} as never }).enqueue(), /session must be/],
      [() => task.enqueueMany("x" as never), /array/],
    ];
    for (const [enqueue, message] of cases) {
      const error = await assertRejects(enqueue, EnqueueError);
      assert(message.test(error.message), `${message}: ${error.message}`);
    }
    assertEquals(await countJobs(sql), 0);
  });
});

Deno.test("arguments JSON cannot carry faithfully are refused at enqueue", async () => {
  await withApp("enq_json", async (app, sql) => {
    const task = app.task("t", () => {});
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    class Point {
      x = 1;
    }
    const cases: [unknown, RegExp][] = [
      [{ n: 10n }, /args\.n is a BigInt/],
      [{ n: NaN }, /args\.n is NaN/],
      [{ n: -Infinity }, /args\.n is -Infinity/],
      [cyclic, /args\.self is a circular reference/],
      [{ f() {} }, /args\.f is a function/],
      [{ u: undefined }, /args\.u is undefined/],
      [{ when: new Date() }, /args\.when is a Date/],
      [{ s: "a\u0000b" }, /args\.s contains a NUL/],
      [{ ["k\u0000"]: 1 }, /key .* NUL/],
      [{ s: "\ud800" }, /lone UTF-16 surrogate/],
      [{ p: new Point() }, /args\.p is a Point/],
      [{ a: [1, , 3] }, /args\.a\[1\] is a hole/],
      [{ m: new Map() }, /Map/],
      [[1, 2], /must be a JSON object/],
      [null, /must be a JSON object/],
      ["text", /must be a JSON object/],
    ];
    for (const [args, message] of cases) {
      const error = await assertRejects(() => task.enqueue(args as never), EnqueueError);
      assert(message.test(error.message), `${message}: ${error.message}`);
      assert(error.message.includes('task "t"'), error.message);
    }
    const many = await assertRejects(() => task.enqueueMany([{ ok: 1 }, { n: 1n }]), EnqueueError);
    assertMatch(many.message, /element 1/);
    assertEquals(await countJobs(sql), 0);
    await task.enqueue({ emoji: "😀", nested: { list: [null, true, 1.5, "é"] } });
    assertEquals(await countJobs(sql), 1);
  });
});

Deno.test("enqueue options are not task arguments", async () => {
  await withApp("enq_options", async (app, sql) => {
    const task = app.task("t", { priority: 2 }, () => {});
    const id = await task.enqueue({ priority: 99, delay: 5, queue: "x y" });
    const [row] = await sql`select priority, queue, args, run_at <= now() as ready
                            from akadze.jobs where id = ${id}`;
    assertEquals(row, {
      priority: 2,
      queue: "default",
      args: { priority: 99, delay: 5, queue: "x y" },
      ready: true,
    });
  });
});

Deno.test("delay counts on the database clock; runAt is stored exactly", async () => {
  await withApp("enq_delay", async (app, sql) => {
    const task = app.task("t", () => {});
    const id = await task.using({ delay: 90_000 }).enqueue();
    const [row] = await sql`select extract(epoch from run_at - created_at)::float8 as d
                            from akadze.jobs where id = ${id}`;
    assert(row.d >= 89.9 && row.d <= 91, `delay ${row.d}`);
    const runAt = new Date("2031-05-06T07:08:09.123Z");
    const at = await task.using({ runAt }).enqueue();
    const [r2] = await sql`select run_at from akadze.jobs where id = ${at}`;
    assertEquals(r2.run_at.toISOString(), runAt.toISOString());
  });
});

Deno.test("an expiresAt already in the past is accepted at enqueue", async () => {
  await withApp("enq_expired", async (app, sql) => {
    const task = app.task("t", () => {});
    const id = await task.using({ expiresAt: new Date(Date.now() - 60_000) }).enqueue();
    const [row] =
      await sql`select state, expires_at < now() as past from akadze.jobs where id = ${id}`;
    assertEquals(row, { state: "queued", past: true });
  });
});

Deno.test("a duplicate uniqueKey raises DuplicateJob and keeps the caller's transaction usable", async () => {
  await withApp("enq_unique", async (app, sql) => {
    await sql`create table public.notes (t text)`;
    const task = app.task("t", () => {});
    await app.sql.begin(async (tx) => {
      await task.using({ session: tx, uniqueKey: "k" }).enqueue({ n: 1 });
      const error = await assertRejects(
        () => task.using({ session: tx, uniqueKey: "k" }).enqueue({ n: 2 }),
        DuplicateJob,
      );
      assert(error instanceof EnqueueError);
      assertMatch(error.message, /"k" is already waiting, queued or running/);
      await tx`insert into public.notes values ('still usable')`;
      await task.using({ session: tx, uniqueKey: "other" }).enqueue({ n: 3 });
    });
    const rows = await sql`select unique_key, args from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => [r.unique_key, r.args.n]), [["k", 1], ["other", 3]]);
    assertEquals((await sql`select t from public.notes`).map((r) => r.t), ["still usable"]);
    // Outside a transaction, and while the holder is running.
    await sql`update akadze.jobs set state = 'running', worker_id = 'w' where unique_key = 'k'`;
    await assertRejects(() => task.using({ uniqueKey: "k" }).enqueue(), DuplicateJob);
    // A finished job no longer holds its key.
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now() where unique_key = 'k'`;
    await task.using({ uniqueKey: "k" }).enqueue();
    assertEquals(await countJobs(sql), 3);
  });
});

Deno.test("enqueueMany inserts N rows in one statement and returns N ids in order", async () => {
  await withApp("enq_many", async (app, sql) => {
    await sql`create table public.stmts (n int)`;
    await sql.unsafe(`
      create function public.count_stmt() returns trigger language plpgsql as $$
      begin insert into public.stmts values (1); return null; end $$;
      create trigger count_stmt after insert on akadze.jobs
        for each statement execute function public.count_stmt();`);
    const task = app.task("t", { args: v.object({ i: v.number() }) }, () => {});
    const list = Array.from({ length: 500 }, (_, i) => ({ i }));
    const ids = await task.enqueueMany(list);
    assertEquals(ids.length, 500);
    const rows =
      await sql`select id::text as id, (args->>'i')::int as i from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => r.id), ids);
    assertEquals(rows.map((r) => r.i), list.map((x) => x.i));
    assertEquals((await sql`select count(*)::int as n from public.stmts`)[0].n, 1);
    assertEquals(await task.enqueueMany([]), []);
    assertEquals((await sql`select count(*)::int as n from public.stmts`)[0].n, 1);
  });
});

Deno.test("enqueueMany with a colliding uniqueKey inserts nothing and keeps the transaction", async () => {
  await withApp("enq_many_unique", async (app, sql) => {
    const task = app.task("t", () => {});
    await task.using({ uniqueKey: "taken" }).enqueue();
    await app.sql.begin(async (tx) => {
      const error = await assertRejects(
        () => task.enqueueMany([{ a: 1 }, { a: 2 }], { session: tx, uniqueKey: "taken" }),
        DuplicateJob,
      );
      assertMatch(error.message, /nothing of this batch was enqueued/);
      await task.using({ session: tx }).enqueue({ after: true });
    });
    // Two elements of one batch with the same key collide with each other.
    await assertRejects(
      () => task.enqueueMany([{ a: 1 }, { a: 2 }], { uniqueKey: "fresh" }),
      DuplicateJob,
    );
    const rows = await sql`select unique_key, args from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => [r.unique_key, r.args]), [["taken", {}], [null, { after: true }]]);
  });
});

Deno.test("NOTIFY arrives after commit, once per statement, and not after a rollback", async () => {
  await withApp("enq_notify", async (app, _sql, db) => {
    const listener = postgres(db.url, { max: 1, onnotice: () => {} });
    const got: string[] = [];
    try {
      await listener.listen(jobsChannel("akadze"), (payload) => got.push(payload));
      const mail = app.task("m", { queue: "mail" }, () => {});
      const other = app.task("o", { queue: "other" }, () => {});
      await app.sql.begin(async (tx) => {
        await mail.using({ session: tx }).enqueue();
        await assertRejects(() =>
          tx.savepoint(async (sp) => {
            await other.using({ session: sp }).enqueue();
            throw new Error("undo");
          })
        );
        await new Promise((r) => setTimeout(r, 100));
        assertEquals(got, [], "nothing before commit");
      });
      await waitFor(() => got.length === 1, "the commit's notification");
      assertEquals(got, ["mail"]);
      await assertRejects(() =>
        app.sql.begin(async (tx) => {
          await other.using({ session: tx }).enqueue();
          throw new Error("rollback");
        })
      );
      await mail.enqueueMany([{}, {}, {}]);
      await waitFor(() => got.length >= 2, "the batch's notification");
      // Notifications arrive in commit order: the rolled-back one never came.
      assertEquals(got, ["mail", "mail"]);
    } finally {
      await listener.end();
    }
  });
});

Deno.test("notify: false sends no NOTIFY", async () => {
  await withApp("enq_no_notify", async (app, _sql, db) => {
    const listener = postgres(db.url, { max: 1, onnotice: () => {} });
    const got: string[] = [];
    try {
      await listener.listen(jobsChannel("akadze"), (payload) => got.push(payload));
      const task = app.task("t", () => {});
      await task.enqueue();
      await listener.notify(jobsChannel("akadze"), "marker");
      await waitFor(() => got.length >= 1, "the marker");
      assertEquals(got, ["marker"]);
    } finally {
      await listener.end();
    }
  }, { notify: false });
});

Deno.test("argument schemas: valibot and zod, errors name the task and field, output stored", async () => {
  await withApp("enq_schema", async (app, sql) => {
    const withValibot = app.task(
      "vb",
      {
        args: v.object({
          email: v.pipe(v.string(), v.email()),
          tags: v.optional(v.array(v.string()), []),
        }),
      },
      () => {},
    );
    const withZod = app.task(
      "zd",
      {
        args: z.object({
          count: z.number().int().min(1),
          when: z.coerce.date().transform((d) => d.toISOString()),
        }),
      },
      () => {},
    );
    const e1 = await assertRejects(() => withValibot.enqueue({ email: "nope" }), EnqueueError);
    assertMatch(e1.message, /task "vb".*email/);
    const e2 = await assertRejects(
      () => withZod.enqueue({ count: 0, when: new Date() }),
      EnqueueError,
    );
    assertMatch(e2.message, /task "zd".*count/);
    assertEquals(await countJobs(sql), 0);
    const a = await withValibot.enqueue({ email: "ada@example.com" });
    const when = new Date("2030-01-02T03:04:05.000Z");
    const b = await withZod.enqueue({ count: 2, when });
    const rows = await sql`select id::text as id, args from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => r.args), [
      { email: "ada@example.com", tags: [] },
      { count: 2, when: "2030-01-02T03:04:05.000Z" },
    ]);
    assertEquals(rows.map((r) => r.id), [a, b]);
  });
});

Deno.test("onEnqueue hooks run in the enqueue's transaction; an error undoes that enqueue only", async () => {
  await withApp("enq_hooks", async (app, sql) => {
    await sql`create table public.audit (job_id bigint, task text)`;
    const seen: string[] = [];
    app.hooks.onEnqueue.push(async (tx, job) => {
      seen.push(`${job.task}:${job.queue}:${JSON.stringify(job.args)}`);
      await tx`insert into public.audit values (${job.id}, ${job.task})`;
      if (job.args.explode) throw new Error("hook refused");
    });
    const task = app.task("t", { queue: "q" }, () => {});
    await app.sql.begin(async (tx) => {
      await task.using({ session: tx }).enqueue({ n: 1 });
      const error = await assertRejects(() =>
        task.using({ session: tx }).enqueue({ explode: true })
      );
      assertEquals(error.message, "hook refused");
      await task.using({ session: tx }).enqueue({ n: 2 });
    });
    // Without a session: the enqueue's own transaction.
    await assertRejects(() => task.enqueue({ explode: true }));
    await task.enqueue({ n: 3 });
    const jobs = await sql`select args->>'n' as n from akadze.jobs j order by j.id`;
    assertEquals(jobs.map((r) => r.n), ["1", "2", "3"]);
    const audit =
      await sql`select a.task from public.audit a join akadze.jobs j on j.id = a.job_id`;
    assertEquals(audit.length, 3);
    assertEquals((await sql`select count(*)::int as n from public.audit`)[0].n, 3);
    assertEquals(seen.length, 5);
    await assertRejects(() =>
      app.sql.begin(async (tx) => {
        await task.using({ session: tx }).enqueue({ n: 4 });
        throw new Error("caller rolls back");
      })
    );
    assertEquals((await sql`select count(*)::int as n from public.audit`)[0].n, 3);
  });
});

Deno.test("assertEnqueued matches a subset of the arguments and names the task otherwise", async () => {
  await withApp("enq_assert", async (app) => {
    const task = app.task("mail.welcome", () => {});
    await assertRejects(
      () => assertEnqueued(app, "mail.welcome", { to: "ada" }),
      (e: Error) => e.name === "AssertionError" && e.message.includes('"mail.welcome"'),
    );
    const id = await task.enqueue({ to: "ada", lang: "en", meta: { a: 1, b: 2 } });
    assertEquals(await assertEnqueued(app, "mail.welcome", { to: "ada" }), id);
    assertEquals(await assertEnqueued(app, "mail.welcome", { meta: { a: 1 } }), id);
    assertEquals(await assertEnqueued(app, "mail.welcome"), id);
    const error = await assertRejects(() => assertEnqueued(app, "mail.welcome", { to: "alan" }));
    assertMatch(error.message, /1 queued or running job\(s\) of task "mail.welcome"/);
  });
});

Deno.test("enqueue into a database without akadze's schema says to run akadze migrate", async () => {
  await withDatabase("enq_unmigrated", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url });
    const hooked = new Akadze({ databaseUrl: db.url });
    try {
      const task = app.task("mail.send", () => {});
      const says =
        /^cannot enqueue task "mail\.send": the akadze schema "akadze" is not installed in this database \(or is out of date\): run akadze migrate/;
      for (
        const enqueue of [
          () => task.enqueue({}),
          () => task.enqueueMany([{}, {}]),
          () => app.sql.begin((tx) => task.using({ session: tx }).enqueue({})),
          () => app.sql.begin((tx) => task.using({ session: tx }).enqueueMany([{}, {}])),
        ]
      ) {
        const error = await assertRejects(enqueue, EnqueueError);
        assertMatch(error.message, says);
      }
      // A hook's own error about a table of the application is not akadze's to explain.
      hooked.hooks.onEnqueue.push(async (tx) => {
        await tx`select * from app_missing_table`;
      });
      const other = hooked.task("other", () => {});
      await migrate(sql);
      const error = await assertRejects(() => other.enqueue({}));
      assert(!(error instanceof EnqueueError), String(error));
      assertMatch(String(error), /relation "app_missing_table" does not exist/);
      // A schema other than the one migrated is named.
      const custom = new Akadze({ databaseUrl: db.url, schema: "custom" });
      try {
        const t = custom.task("t", () => {});
        const missing = await assertRejects(() => t.enqueue({}), EnqueueError);
        assertMatch(missing.message, /the akadze schema "custom" is not installed/);
      } finally {
        await custom.close();
      }
    } finally {
      await app.close();
      await hooked.close();
    }
  }, { migrated: false });
});

Deno.test("a schema that rejects or changes its own output is refused at enqueue, naming the task", async () => {
  await withApp("enq_own_output", async (app, sql) => {
    const parse = app.task(
      "parse",
      { args: v.object({ n: v.pipe(v.string(), v.transform(Number)) }) },
      () => {},
    );
    const zodParse = app.task(
      "zod.parse",
      { args: z.object({ n: z.string().transform(Number) }) },
      () => {},
    );
    const bump = app.task(
      "bump",
      { args: v.object({ n: v.pipe(v.number(), v.transform((n) => n + 1)) }) },
      () => {},
    );
    const rejects =
      /^cannot enqueue task "parse": its args schema does not accept its own output \(n: [^)]+\), so every run would fail; nothing was enqueued\. The worker validates/;
    assertMatch(
      (await assertRejects(() => parse.enqueue({ n: "5" }), EnqueueError)).message,
      rejects,
    );
    const many = await assertRejects(
      () => parse.enqueueMany([{ n: "1" }, { n: "2" }]),
      EnqueueError,
    );
    assertMatch(many.message, /task "parse" \(element 0\): its args schema does not accept/);
    await assertRejects(
      () => app.sql.begin((tx) => parse.using({ session: tx }).enqueue({ n: "5" })),
      EnqueueError,
    );
    const zodError = await assertRejects(() => zodParse.enqueue({ n: "5" }), EnqueueError);
    assertMatch(
      zodError.message,
      /task "zod\.parse": its args schema does not accept its own output/,
    );
    const changes = await assertRejects(() => bump.enqueue({ n: 1 }), EnqueueError);
    assertMatch(changes.message, /task "bump": its args schema changes its own output again/);
    assertEquals(await countJobs(sql), 0);

    // Schemas whose output they accept unchanged still transform at enqueue: stripped keys,
    // filled defaults, trimmed strings; the handler gets what was stored.
    const seen: unknown[] = [];
    const tidy = app.task(
      "tidy",
      {
        args: v.object({
          name: v.pipe(v.string(), v.trim()),
          tags: v.optional(v.array(v.string()), []),
        }),
      },
      (args) => {
        seen.push(args);
      },
    );
    await tidy.enqueue({ name: "  ada  ", extra: 1 } as never);
    await tidy.enqueueMany([{ name: "alan" }, { name: " grace", tags: ["x"] }]);
    const rows = await sql`select args from akadze.jobs j order by j.id`;
    const stored = [{ name: "ada", tags: [] }, { name: "alan", tags: [] }, {
      name: "grace",
      tags: ["x"],
    }];
    assertEquals(rows.map((r) => r.args), stored);
    assertEquals(await drain(app), 3);
    assertEquals(seen, stored);
  });
});

Deno.test("arguments over maxArgsBytes are an EnqueueError naming the limit; nothing is inserted", async () => {
  await withApp("enq_size", async (app, sql) => {
    const task = app.task("big", () => {});
    // 1 MiB by default, counted in bytes of JSON text: 2 bytes per "é".
    const error = await assertRejects(
      () => task.enqueue({ blob: "é".repeat(530_000) }),
      EnqueueError,
    );
    assertMatch(error.message, /task "big" are \d+ bytes of JSON, over the limit of 1048576 bytes/);
    assertMatch(error.message, /maxArgsBytes/);
    const many = await assertRejects(
      () => task.enqueueMany([{ n: 1 }, { blob: "x".repeat(2_000_000) }]),
      EnqueueError,
    );
    assertMatch(many.message, /task "big" \(element 1\) are at least 2000\d+ bytes/);
    assertEquals(await countJobs(sql), 0);
    // Just under the limit is fine, and the batch text is what one JSON.stringify makes.
    const fits = { blob: "x".repeat(1_048_576 - 11) };
    assertEquals(JSON.stringify(fits).length, 1_048_576);
    const [a, b] = await task.enqueueMany([fits, { n: 2 }]);
    const rows = await sql`select id::text as id, args from akadze.jobs j order by j.id`;
    assertEquals(rows.map((r) => r.id), [a, b]);
    assertEquals(rows[0].args, fits);
    assertEquals(rows[1].args, { n: 2 });
  });
  await withApp("enq_size_option", async (app, sql) => {
    assertEquals(app.maxArgsBytes, 1_048_576);
    const small = new Akadze({ sql: app.sql, maxArgsBytes: 100 });
    const task = small.task("t", () => {});
    await task.enqueue({ s: "x".repeat(80) });
    const error = await assertRejects(() => task.enqueue({ s: "x".repeat(100) }), EnqueueError);
    assertMatch(error.message, /over the limit of 100 bytes/);
    assertEquals(await countJobs(sql), 1);
    for (const bad of [0, -1, 1.5, "1" as never, Infinity]) {
      assertThrows(() => new Akadze({ sql: app.sql, maxArgsBytes: bad }), AkadzeError);
    }
  });
});

Deno.test("a delay over 365 days is an EnqueueError", async () => {
  await withApp("enq_delay_max", async (app, sql) => {
    const task = app.task("t", () => {});
    const error = await assertRejects(() => task.using({ delay: 1e16 }).enqueue(), EnqueueError);
    assertMatch(error.message, /at most 31536000000 \(365 days\), got 10000000000000000/);
    await task.using({ delay: 31_536_000_000 }).enqueue();
    assertEquals(await countJobs(sql), 1);
  });
});
