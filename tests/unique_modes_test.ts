// What a held uniqueKey does (migrations/0015_unique_key_modes.sql, src/enqueue.ts): the
// options onDuplicate ("raise", "keep", "replace", "debounce"), whileRunning ("keep",
// "queueOne") and throttle, from TypeScript and from SQL; a duplicate never aborts the
// caller's transaction, and concurrent enqueues of one key never make two jobs.
// @ts-types="@types/pg"
import pg from "pg";
import postgres from "postgres";
import { DuplicateJob, EnqueueError } from "../src/errors.ts";
import { assert, assertEquals, assertMatch, assertRejects } from "./assert.ts";
import {
  countJobs,
  holdLocks,
  psql,
  setDatabaseDefault,
  startWorker,
  waitFor,
  waitForJob,
  withApp,
} from "./_helpers.ts";

/** The key's jobs, oldest first: what a test compares. */
async function keyed(sql: postgres.Sql, key: string) {
  return await sql`
    select id::text as id, state, task, queue, priority, max_attempts, args, run_at, expires_at,
           limit_key, unique_key
      from akadze.jobs where unique_key = ${key} or args ->> 'key' = ${key} order by id`;
}

Deno.test("replace: the queued holder takes the new task, arguments and options; a running holder is kept", async () => {
  await withApp("unique_replace", async (app, sql) => {
    const a = app.task("a", () => {});
    const b = app.task("b", { queue: "bq", priority: 3, maxAttempts: 4 }, () => {});
    const first = await a.using({ uniqueKey: "k", onDuplicate: "replace", delay: 60_000 })
      .enqueue({ n: 1 });
    const runAt = new Date("2031-01-01T00:00:00Z");
    const expiresAt = new Date("2032-01-01T00:00:00Z");
    const second = await b.using({
      uniqueKey: "k",
      onDuplicate: "replace",
      runAt,
      expiresAt,
      limitKey: "lim",
      priority: -2,
      maxAttempts: 9,
    }).enqueue({ n: 2 });
    assertEquals(second, first);
    const [row] = await keyed(sql, "k");
    assertEquals(
      [row.id, row.task, row.queue, row.priority, row.max_attempts, row.args, row.limit_key],
      [first, "b", "bq", -2, 9, { n: 2 }, "lim"],
    );
    assertEquals([row.run_at, row.expires_at], [runAt, expiresAt]);
    // Without a run time: now, as a new job would be (the run time may move earlier).
    await b.using({ uniqueKey: "k", onDuplicate: "replace" }).enqueue({ n: 3 });
    const [{ ready }] = await sql`select run_at <= now() as ready from akadze.jobs`;
    assert(ready);
    // A running holder is not changed: its id comes back and nothing is queued.
    await sql`update akadze.jobs set state = 'running', worker_id = 'w'`;
    const third = await a.using({ uniqueKey: "k", onDuplicate: "replace" }).enqueue({ n: 4 });
    assertEquals(third, first);
    const rows = await keyed(sql, "k");
    assertEquals(rows.map((r) => [r.state, r.args.n]), [["running", 3]]);
  });
});

Deno.test("debounce: the queued holder takes the new arguments, and its run time only moves later", async () => {
  await withApp("unique_debounce", async (app, sql) => {
    const t = app.task("t", () => {});
    const debounce = (delay: number, n: number) =>
      t.using({ uniqueKey: "d", onDuplicate: "debounce", delay }).enqueue({ n });
    const id = await debounce(10_000, 1);
    const runAt = async () => (await keyed(sql, "d"))[0].run_at as Date;
    const before = await runAt();
    assertEquals(await debounce(60_000, 2), id);
    const pushed = await runAt();
    // 60 s after the second enqueue's now(), no sooner than 50 s after the first one's.
    assert(pushed.getTime() - before.getTime() >= 50_000);
    assertEquals(await debounce(1_000, 3), id); // earlier: the run time stays
    assertEquals(await runAt(), pushed);
    assertEquals((await keyed(sql, "d")).map((r) => r.args.n), [3]);
    assertEquals(await countJobs(sql), 1);
  });
});

Deno.test("keep: a duplicate returns the holder's id and changes nothing; raise is the default", async () => {
  await withApp("unique_keep", async (app, sql) => {
    const t = app.task("t", () => {});
    const id = await t.using({ uniqueKey: "k" }).enqueue({ n: 1 });
    assertEquals(await t.using({ uniqueKey: "k", onDuplicate: "keep" }).enqueue({ n: 2 }), id);
    await assertRejects(() => t.using({ uniqueKey: "k" }).enqueue({ n: 3 }), DuplicateJob);
    await assertRejects(
      () => t.using({ uniqueKey: "k", onDuplicate: "raise" }).enqueue({ n: 3 }),
      DuplicateJob,
    );
    // A waiting flow step keeps its key and is kept as it is, even by replace.
    const flow = await app.enqueueFlow({
      first: { task: "t", args: { n: 10 } },
      then: { task: "t", args: { n: 11 }, uniqueKey: "step", dependsOn: ["first"] },
    });
    const replaced = await t.using({ uniqueKey: "step", onDuplicate: "replace" }).enqueue({
      n: 12,
    });
    assertEquals(replaced, flow.jobs.then);
    assertEquals((await keyed(sql, "step")).map((r) => [r.state, r.args.n]), [["waiting", 11]]);
    assertEquals((await keyed(sql, "k")).map((r) => r.args.n), [1]);
  });
});

Deno.test("whileRunning queueOne: one more job after the running one, which gives its key up", async () => {
  await withApp("unique_queue_one", async (app, sql) => {
    const t = app.task("t", () => {});
    const opts = { uniqueKey: "q", onDuplicate: "replace", whileRunning: "queueOne" } as const;
    const running = await t.using(opts).enqueue({ n: 1 });
    await sql`update akadze.jobs set state = 'running', worker_id = 'w'`;
    const next = await t.using(opts).enqueue({ n: 2 });
    assert(next !== running);
    // The queued one holds the key now: the next duplicates replace it.
    assertEquals(await t.using(opts).enqueue({ n: 3 }), next);
    assertEquals(await t.using({ ...opts, onDuplicate: "keep" }).enqueue({ n: 4 }), next);
    const rows = await sql`select id::text as id, state, unique_key, args from akadze.jobs
      order by id`;
    assertEquals(rows.map((r) => [r.id, r.state, r.unique_key, r.args.n]), [
      [running, "running", null, 1],
      [next, "queued", "q", 3],
    ]);
    // raise with queueOne: a running holder gets one more, a queued one raises.
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now()`;
    const r1 = await t.using({ uniqueKey: "r" }).enqueue({ n: 5 });
    await sql`update akadze.jobs set state = 'running', worker_id = 'w' where id = ${r1}`;
    await assertRejects(() => t.using({ uniqueKey: "r" }).enqueue({ n: 6 }), DuplicateJob);
    const r2 = await t.using({ uniqueKey: "r", whileRunning: "queueOne" }).enqueue({ n: 6 });
    await assertRejects(
      () => t.using({ uniqueKey: "r", whileRunning: "queueOne" }).enqueue({ n: 7 }),
      DuplicateJob,
    );
    assertEquals((await keyed(sql, "r")).map((r) => [r.id, r.state]), [[r2, "queued"]]);
    // The running job's retry queues without the key: no clash with the queued one.
    await sql`update akadze.jobs set state = 'queued', worker_id = null where id = ${r1}`;
    assertEquals((await keyed(sql, "r")).map((r) => [r.id, r.state]), [[r2, "queued"]]);
    assertEquals(await countJobs(sql, "queued"), 2);
  });
});

Deno.test("throttle: one job per key per window, whatever its state; the next window a new one", async () => {
  await withApp("unique_throttle", async (app, sql) => {
    const t = app.task("t", () => {});
    const throttled = (n: number) => t.using({ uniqueKey: "th", throttle: 60_000 }).enqueue({ n });
    const id = await throttled(1);
    // A duplicate in the window is that job, not an error, while it is queued, running, done.
    assertEquals(await throttled(2), id);
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now()`;
    assertEquals(await throttled(3), id);
    assertEquals(await countJobs(sql), 1);
    // The window over (moved back here, not waited for): a new job, a new window.
    await sql`update akadze.unique_windows set until = now() - interval '1 second'`;
    const next = await throttled(4);
    assert(next !== id);
    assertEquals(await throttled(5), next);
    assertEquals((await sql`select job_id::text as id from akadze.unique_windows`)[0].id, next);
    // A new window that finds an older holder still queued: the holder, by onDuplicate (here
    // replace), and the window is its.
    await sql`update akadze.unique_windows set until = now() - interval '1 second'`;
    const replaced = await t.using({ uniqueKey: "th", throttle: 1_000, onDuplicate: "replace" })
      .enqueue({ n: 6 });
    assertEquals(replaced, next);
    assertEquals((await keyed(sql, "th")).filter((r) => r.state === "queued")[0].args, { n: 6 });
    // A new window whose holder is refused ("raise") opens no window: the next one raises too.
    await sql`update akadze.unique_windows set until = now() - interval '1 second'`;
    for (let i = 0; i < 2; i++) {
      await assertRejects(
        () => t.using({ uniqueKey: "th", throttle: 60_000 }).enqueue({ n: 7 }),
        DuplicateJob,
      );
    }
    await sql`delete from akadze.unique_windows`;
    // Expired windows of other keys are deleted by new ones.
    await sql`insert into akadze.unique_windows values ('old', 1, now() - interval '1 hour')`;
    await t.using({ uniqueKey: "fresh", throttle: 5_000 }).enqueue();
    assertEquals(
      (await sql`select unique_key from akadze.unique_windows order by 1`).map((r) => r.unique_key),
      ["fresh"],
    );
  });
});

Deno.test("a duplicate never aborts the caller's transaction, in any mode, from TypeScript and SQL", async () => {
  await withApp("unique_tx", async (app, sql, db) => {
    await sql`create table public.notes (t text)`;
    const t = app.task("t", () => {});
    await app.sql.begin(async (tx) => {
      const id = await t.using({ session: tx, uniqueKey: "x" }).enqueue({ n: 1 });
      for (
        const options of [
          { onDuplicate: "keep" },
          { onDuplicate: "replace" },
          { onDuplicate: "debounce", delay: 1_000 },
          { throttle: 1_000, onDuplicate: "keep" },
        ] as const
      ) {
        assertEquals(await t.using({ session: tx, uniqueKey: "x", ...options }).enqueue(), id);
      }
      await assertRejects(
        () => t.using({ session: tx, uniqueKey: "x", whileRunning: "queueOne" }).enqueue(),
        DuplicateJob,
      );
      await tx`insert into public.notes values ('still usable')`;
    });
    assertEquals((await sql`select t from public.notes`).length, 1);
    // From SQL, in one psql transaction: every mode but raise answers without an error.
    const out = await psql(
      db.url,
      `begin;
       select akadze.enqueue('t', '{"n": 2}', unique_key => 'y') is not null;
       select akadze.enqueue('t', '{"n": 3}', unique_key => 'y', on_duplicate => 'keep')
            = akadze.enqueue('t', '{"n": 4}', unique_key => 'y', on_duplicate => 'replace');
       select akadze.enqueue('t', '{"n": 5}', unique_key => 'y', on_duplicate => 'debounce',
                             run_at => now() + interval '1 minute') is not null;
       select akadze.enqueue('t', '{"n": 6}', unique_key => 'y', throttle => '1 minute',
                             on_duplicate => 'keep') is not null;
       select akadze.enqueue('t', '{"n": 7}', unique_key => 'y', on_duplicate => 'ignore',
                             while_running => 'queue_one') is null;
       select count(*) from akadze.enqueue_many('t', '[{"n": 8}]', unique_key => 'y',
                                                on_duplicate => 'replace');
       insert into public.notes values ('still usable');
       commit;`,
    );
    assertEquals(out.code, 0, out.stderr);
    assertEquals(out.stdout.trim().split("\n").join(","), "t,t,t,t,t,1");
    const rows = await keyed(sql, "y");
    assertEquals(rows.map((r) => r.args.n), [8]);
    assertEquals((await sql`select t from public.notes`).length, 2);
  });
});

Deno.test("concurrent enqueues of one key, in every mode, never make two jobs", async () => {
  await withApp("unique_race", async (app, sql, db) => {
    const t = app.task("t", () => {});
    const clients = Array.from(
      { length: 8 },
      () => postgres(db.url, { max: 1, onnotice: () => {} }),
    );
    try {
      const modes = [
        { onDuplicate: "keep" },
        { onDuplicate: "replace" },
        { onDuplicate: "debounce", delay: 1_000 },
        { throttle: 60_000 },
        { onDuplicate: "replace", whileRunning: "queueOne" },
      ] as const;
      for (const [m, mode] of modes.entries()) {
        for (let round = 0; round < 15; round++) {
          const key = `race:${m}:${round}`;
          // With queueOne, a running holder first: all of them must share one queued job.
          const holder = "whileRunning" in mode
            ? await t.using({ uniqueKey: key }).enqueue({ key, n: -1 })
            : null;
          if (holder) {
            await sql`update akadze.jobs set state = 'running', worker_id = 'w' where id = ${holder}`;
          }
          const ids = await Promise.all(
            clients.map((client, n) =>
              client.begin((tx) =>
                t.using({ session: tx, uniqueKey: key, ...mode }).enqueue({ key, n })
              )
            ),
          );
          assertEquals(new Set(ids).size, 1, `${key}: ${ids}`);
          const rows = (await keyed(sql, key)).filter((r) => r.id !== holder);
          assertEquals(rows.map((r) => [r.id, r.state, r.unique_key]), [[ids[0], "queued", key]]);
        }
      }
      // From SQL too, with replace.
      for (let round = 0; round < 15; round++) {
        const key = `sql:${round}`;
        const ids = await Promise.all(
          clients.map((client, n) =>
            client.begin(async (tx) =>
              (await tx`select akadze.enqueue('t', ${
                JSON.stringify({ key, n })
              }::text::jsonb, unique_key => ${key},
                                            on_duplicate => 'replace')::text as id`)[0].id
            )
          ),
        );
        assertEquals(new Set(ids).size, 1, `${key}: ${ids}`);
        assertEquals((await keyed(sql, key)).length, 1);
      }
    } finally {
      await Promise.all(clients.map((c) => c.end({ timeout: 1 })));
    }
  });
});

Deno.test("onEnqueue hooks see an inserted or a replaced job, not a kept one", async () => {
  await withApp("unique_hooks", async (app) => {
    const seen: unknown[] = [];
    app.hooks.onEnqueue.push((_tx, job) => {
      seen.push(job.args.n);
    });
    const t = app.task("t", () => {});
    await t.using({ uniqueKey: "h", onDuplicate: "replace" }).enqueue({ n: 1 });
    await t.using({ uniqueKey: "h", onDuplicate: "replace" }).enqueue({ n: 2 });
    await t.using({ uniqueKey: "h", onDuplicate: "keep" }).enqueue({ n: 3 });
    await assertRejects(
      () => t.using({ uniqueKey: "h", whileRunning: "queueOne" }).enqueue({ n: 4 }),
      DuplicateJob,
    );
    assertEquals(seen, [1, 2]);
  });
});

Deno.test("the modes' options are checked: an EnqueueError, nothing enqueued", async () => {
  await withApp("unique_checks", async (app, sql) => {
    const t = app.task("t", () => {});
    const refused = async (options: Record<string, unknown>, message: RegExp) => {
      const error = await assertRejects(
        // deno-lint-ignore no-explicit-any
        () => t.using(options as any).enqueue(),
        EnqueueError,
      );
      assertMatch(error.message, message);
    };
    await refused({ onDuplicate: "replace" }, /^onDuplicate needs a uniqueKey$/);
    await refused(
      { throttle: 5, whileRunning: "keep" },
      /^whileRunning, throttle need a uniqueKey/,
    );
    await refused({ uniqueKey: "k", onDuplicate: "update" }, /onDuplicate must be "raise", "keep"/);
    await refused({ uniqueKey: "k", whileRunning: "queue_one" }, /whileRunning must be "keep" or/);
    for (const throttle of [0, -1, NaN, Infinity, "5"]) {
      await refused({ uniqueKey: "k", throttle }, /throttle must be a positive number/);
    }
    await assertRejects(
      () => t.using({ uniqueKey: "k", onDuplicate: "replace" }).enqueueMany([{}, {}]),
      DuplicateJob,
    );
    // Flow steps take a uniqueKey that refuses a duplicate, not these.
    const error = await assertRejects(
      () =>
        app.enqueueFlow({
          // deno-lint-ignore no-explicit-any
          a: { task: "t", uniqueKey: "k", onDuplicate: "replace" } as any,
        }),
      EnqueueError,
    );
    assertMatch(error.message, /onDuplicate/);
    // From SQL: SQLSTATE 22023, nothing inserted.
    for (
      const call of [
        sql`select akadze.enqueue('t', on_duplicate => 'replace')`,
        sql`select akadze.enqueue('t', unique_key => 'k', on_duplicate => 'update')`,
        sql`select akadze.enqueue('t', unique_key => 'k', while_running => 'queueOne')`,
        sql`select akadze.enqueue('t', unique_key => 'k', throttle => '0 seconds')`,
        sql`select akadze.enqueue('t', throttle => '1 minute')`,
        sql`select akadze.enqueue_many('t', '[{}, {}]', unique_key => 'k', on_duplicate => 'keep')`,
      ]
    ) {
      const e = await assertRejects(() => call) as { code?: string };
      assertEquals(e.code, "22023");
    }
    assertEquals(await countJobs(sql), 0);
  });
});

Deno.test("the modes on a node-postgres session: in the client's transaction", async () => {
  await withApp("unique_node_postgres", async (app, sql, db) => {
    const t = app.task("t", () => {});
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query("begin");
      const id = await t.using({ session: client, uniqueKey: "n", onDuplicate: "replace" })
        .enqueue({ n: 1 });
      const again = await t.using({
        session: client,
        uniqueKey: "n",
        onDuplicate: "replace",
        throttle: 1_000,
      }).enqueue({ n: 2 });
      assertEquals(again, id);
      await assertRejects(
        () => t.using({ session: client, uniqueKey: "n", whileRunning: "queueOne" }).enqueue(),
        DuplicateJob,
      );
      await client.query("select 1"); // still usable
      assertEquals(await countJobs(sql), 0); // not committed yet
      await client.query("commit");
    } finally {
      await client.end();
    }
    assertEquals((await keyed(sql, "n")).map((r) => r.args), [{ n: 2 }]);
  });
});

Deno.test("a worker: the job queued while one runs runs after it, with the last arguments; the first finishes as usual", async () => {
  await withApp("unique_worker", async (app, sql) => {
    const runs: unknown[] = [];
    let release!: () => void;
    const released = new Promise<void>((resolve) => release = resolve);
    const sync = app.task("sync", async (args) => {
      runs.push(args.n);
      if (args.n === 1) await released;
    });
    const mode = {
      uniqueKey: "sync",
      onDuplicate: "replace",
      whileRunning: "queueOne",
      limitKey: "sync",
    } as const;
    // maxRunning 1: the queued one waits for the running one.
    await sql`insert into akadze.limits (key, max_running) values ('sync', 1)`;
    const first = await sync.using(mode).enqueue({ n: 1 });
    const w = startWorker(app, { slots: 2 });
    try {
      await waitForJob(sql, first, (r) => r.state === "running", "the first run");
      const second = await sync.using(mode).enqueue({ n: 2 });
      assertEquals(await sync.using(mode).enqueue({ n: 3 }), second);
      release();
      const done = await waitForJob(sql, second, (r) => r.state === "succeeded", "the second");
      assertEquals(done.args, { n: 3 });
      const [row] = await sql`select state, unique_key from akadze.jobs where id = ${first}`;
      assertEquals([row.state, row.unique_key], ["succeeded", null]);
      assertEquals(runs, [1, 3]);
    } finally {
      release();
      await w.stop();
    }
  });
});

Deno.test("enqueues of one key while its jobs are claimed and finished: no error, never two queued", async () => {
  await withApp("unique_churn", async (app, sql, db) => {
    const t = app.task("t", () => {});
    const clients = Array.from(
      { length: 4 },
      () => postgres(db.url, { max: 1, onnotice: () => {} }),
    );
    const worker = postgres(db.url, { max: 1, onnotice: () => {} });
    let stop = false;
    let most = 0;
    try {
      // A stand-in worker: claims the key's queued job, then finishes it, over and over.
      const working = (async () => {
        while (!stop) {
          await worker`update akadze.jobs set state = 'running', worker_id = 'w'
            where state = 'queued' and args ->> 'key' = 'churn'`;
          const [{ n }] = await worker`select count(*)::int as n from akadze.jobs
            where state = 'queued' and args ->> 'key' = 'churn'`;
          most = Math.max(most, n);
          await worker`update akadze.jobs set state = 'succeeded', finished_at = now(),
            worker_id = null where state = 'running' and args ->> 'key' = 'churn'`;
        }
      })();
      const modes = [
        { onDuplicate: "replace", whileRunning: "queueOne" },
        { onDuplicate: "keep" },
        { onDuplicate: "debounce" },
        { onDuplicate: "keep", throttle: 1 },
      ] as const;
      let calls = 0;
      await Promise.all(clients.map(async (client, c) => {
        for (let i = 0; i < 60; i++) {
          const mode = modes[(c + i) % modes.length];
          const id = await client.begin((tx) =>
            t.using({ session: tx, uniqueKey: "churn", ...mode }).enqueue({ key: "churn", c, i })
          );
          assertMatch(id, /^\d+$/);
          calls++;
        }
      }));
      stop = true;
      await working;
      assertEquals(calls, 240);
      assert(most <= 1, `${most} queued jobs of one key`);
      const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
        where state in ('waiting', 'queued', 'running') and unique_key = 'churn'`;
      assert(n <= 1);
    } finally {
      stop = true;
      await Promise.all([...clients, worker].map((c) => c.end({ timeout: 1 })));
    }
  });
});

Deno.test("an enqueue without the modes never calls enqueue_keyed: the plain statement, as before", async () => {
  await withApp("unique_plain_path", async (app, sql, db) => {
    await setDatabaseDefault(sql, "track_functions", "pl");
    const t = app.task("t", () => {});
    // One connection, opened after the setting: its calls are counted.
    const one = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await t.using({ session: one }).enqueue({ n: 1 });
      await t.using({ session: one }).enqueueMany([{ n: 2 }, { n: 3 }]);
      await t.using({ session: one, uniqueKey: "p" }).enqueue({ n: 4 });
      await assertRejects(() => t.using({ session: one, uniqueKey: "p" }).enqueue(), DuplicateJob);
      await t.using({ session: one, uniqueKey: "p", onDuplicate: "raise", whileRunning: "keep" })
        .enqueue().catch(() => {});
      // Then one that does: once it is counted, the others would have been too.
      await t.using({ session: one, uniqueKey: "p", onDuplicate: "keep" }).enqueue();
      await one.end(); // a session's statistics are flushed when it ends
      const calls = await waitFor(async () => {
        const [row] = await sql`select calls::int from pg_stat_user_functions
          where schemaname = 'akadze' and funcname = 'enqueue_keyed'`;
        return row?.calls;
      }, "the statistics of enqueue_keyed");
      assertEquals(calls, 1);
    } finally {
      await one.end({ timeout: 1 });
    }
  });
});

Deno.test("a duplicate kept or refused in an open transaction locks nothing: claims and outcomes go on", async () => {
  await withApp("unique_no_locks", async (app, sql, db) => {
    const t = app.task("t", () => {});
    const queued = await t.using({ uniqueKey: "q" }).enqueue({ n: 1 });
    const running = await t.using({ uniqueKey: "r" }).enqueue({ n: 2 });
    await sql`update akadze.jobs set state = 'running', worker_id = 'w' where id = ${running}`;
    const held = await holdLocks(db.url, async (tx) => {
      assertEquals(
        await t.using({ session: tx, uniqueKey: "q", onDuplicate: "keep" }).enqueue(),
        queued,
      );
      assertEquals(
        await t.using({ session: tx, uniqueKey: "r", onDuplicate: "replace" }).enqueue(),
        running,
      );
      await assertRejects(
        () => t.using({ session: tx, uniqueKey: "r", throttle: 1_000 }).enqueue(),
        DuplicateJob,
      );
    });
    try {
      await sql.begin(async (tx) => {
        await tx`set local lock_timeout = '2s'`;
        const claimed = await tx`select id::text as id from akadze.jobs
          where state = 'queued' for update skip locked`;
        assertEquals(claimed.map((r) => r.id), [queued]);
        await tx`update akadze.jobs set state = 'succeeded', finished_at = now(), worker_id = null
          where id = ${running}`;
      });
    } finally {
      await held.release();
    }
  });
});
