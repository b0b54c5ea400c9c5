// A database whose session defaults are not what the worker's statements need (`ALTER
// DATABASE … SET`): transactions at serializable, where workers that skip each other's locked
// rows fail against each other; fewer float digits, which round the epoch times of claims and
// schedules; a DateStyle postgres.js cannot read. The worker's own connection sets them for
// itself, its outcome writes run at read committed, and the application's sessions keep the
// database's defaults.
import { Akadze } from "../src/app.ts";
import { connect, type Sql } from "../src/db.ts";
import { Completer } from "../src/worker/completer.ts";
import { neededSettings } from "../src/worker/session_settings.ts";
import { assert, assertEquals, assertRejects } from "./assert.ts";
import {
  setDatabaseDefault,
  startWorker,
  waitFor,
  waitForLockWait,
  withDatabase,
  withLogs,
} from "./_helpers.ts";

/** Rolled-back transactions of this database, once no other session is connected to it. */
async function rollbacksAfterOthersLeft(sql: Sql): Promise<number> {
  await waitFor(async () => {
    const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
      where datname = current_database() and pid <> pg_backend_pid()`;
    return n === 0;
  }, "the workers' sessions to end");
  await sql`select pg_stat_force_next_flush()`;
  const [{ n }] = await sql`select xact_rollback::int as n from pg_stat_database
    where datname = current_database()`;
  return n;
}

Deno.test("under a serializable default, workers claim and write at read committed and nothing is rolled back", async () => {
  await withDatabase("isolation_drain", async (db, sql) => {
    await setDatabaseDefault(sql, "default_transaction_isolation", "serializable");
    const jobs = 4_000;
    await sql`insert into akadze.jobs (task) select 'work' from generate_series(1, ${jobs}::int)`;
    const runs = new Map<string, number>();
    const apps = [1, 2, 3, 4].map(() => new Akadze({ databaseUrl: db.url, max: 4 }));
    const before = await rollbacksAfterOthersLeft(sql);
    const records = await withLogs(async () => {
      try {
        for (const app of apps) {
          app.task("work", (_args: unknown, ctx) => {
            runs.set(ctx.job.id, (runs.get(ctx.job.id) ?? 0) + 1);
          });
        }
        const workers = apps.map((app) => startWorker(app, { slots: 20, schedules: false }));
        await waitFor(
          async () => {
            const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
            where state = 'succeeded'`;
            return n === jobs;
          },
          "every job to succeed",
          60_000,
        );
        // The application's own transactions keep the database's level.
        const [{ level }] = await apps[0]
          .sql`select current_setting('transaction_isolation') as level`;
        assertEquals(level, "serializable");
        await Promise.all(workers.map((w) => w.stop()));
      } finally {
        await Promise.all(apps.map((app) => app.close()));
      }
    });
    assertEquals(runs.size, jobs);
    assertEquals([...runs.values()].filter((n) => n > 1).length, 0, "a job ran twice");
    // Serializable claims and writes failed against each other (hundreds of rollbacks in a
    // drain like this one), each retried after a pause.
    assertEquals(await rollbacksAfterOthersLeft(sql) - before, 0, "transactions rolled back");
    const said = records.filter((r) => r.properties.event === "session_settings");
    assertEquals(said.length, apps.length, "each worker says so once");
    assertEquals(said[0].properties.isolation, "serializable");
    assertEquals(said[0].properties.settings, { default_transaction_isolation: "read committed" });
  });
});

Deno.test("an outcome write at read committed goes through a change committed while it waited", async () => {
  await withDatabase("isolation_write", async (db, sql) => {
    await setDatabaseDefault(sql, "default_transaction_isolation", "repeatable read");
    const write = async (readCommitted: boolean) => {
      const [{ id }] = await sql`insert into akadze.jobs (task, state, worker_id, run_count,
          started_at) values ('work', 'running', 'w1', 1, now()) returning id::text as id`;
      // Another session requests the job's cancellation and holds the row until told.
      const other = connect(db.url, { max: 1 });
      const one = connect(db.url, { max: 1 });
      try {
        let release!: () => void;
        const held = other.begin(async (tx) => {
          await tx`update akadze.jobs set cancel_requested_at = now() where id = ${id}`;
          await new Promise<void>((r) => release = r);
        });
        await waitFor(() => release !== undefined, "the other session to hold the row");
        const completer = new Completer(one, "akadze", []);
        if (readCommitted) completer.use({ default_transaction_isolation: "read committed" });
        // Settled either way before it is awaited: it may fail while the other session ends.
        const written = completer.write([{ id, runCount: 1, kind: "succeeded" }]).then(
          (result) => ({ result }),
          (error: unknown) => ({ error }),
        );
        await waitForLockWait(sql, "the write to wait for the row");
        release();
        await held;
        const settled = await written;
        if ("error" in settled) throw settled.error;
        return { id, result: settled.result };
      } finally {
        await other.end();
        await one.end();
      }
    };
    // At the session's repeatable read, the row changed after the write's snapshot.
    const error = await assertRejects(() => write(false)) as { code?: string };
    assertEquals(error.code, "40001");
    const { id, result } = await write(true);
    assertEquals(result.written.map((r) => [r.id, r.state]), [[id, "cancelled"]]);
    const [row] = await sql`select state from akadze.jobs where id = ${id}`;
    assert(row.state === "cancelled", `the job is ${row.state}`);
  });
});

Deno.test("the settings a session needs: read committed, ISO dates, at least 15 float digits", () => {
  const fine = { isolation: "read committed", dateStyle: "ISO, DMY", floatDigits: 0 };
  assertEquals(neededSettings(fine), {});
  assertEquals(neededSettings({ ...fine, isolation: "repeatable read" }), {
    default_transaction_isolation: "read committed",
  });
  assertEquals(neededSettings({ ...fine, dateStyle: "SQL, DMY" }), { DateStyle: "ISO" });
  assertEquals(neededSettings({ ...fine, dateStyle: "German, DMY" }), { DateStyle: "ISO" });
  assertEquals(neededSettings({ ...fine, floatDigits: -1 }), { extra_float_digits: "1" });
  assertEquals(neededSettings({ ...fine, floatDigits: NaN }), { extra_float_digits: "1" });
});

Deno.test("with fewer float digits and another DateStyle by default, claimed jobs and schedules keep their times", async () => {
  await withDatabase("session_times", async (db, sql) => {
    await setDatabaseDefault(sql, "extra_float_digits", "-15");
    await setDatabaseDefault(sql, "DateStyle", "SQL, DMY");
    const app = new Akadze({ databaseUrl: db.url, max: 2 });
    const seen = new Map<string, Date>();
    app.task("work", (_args: unknown, ctx) => {
      seen.set(ctx.job.id, ctx.job.createdAt);
    });
    app.periodic("tick", { every: 60_000 }, () => {});
    try {
      const records = await withLogs(async () => {
        const worker = startWorker(app, { schedules: true });
        try {
          // Jobs of a key that runs one at a time: the first is claimed, each next one handed
          // over by the outcome write of the one before (on the app's pool, not the loop's).
          await sql`insert into akadze.limits (key, max_running) values ('one', 1)`;
          const created = new Map(
            (await sql`insert into akadze.jobs (task, limit_key)
              select 'work', 'one' from generate_series(1, 4)
              returning id::text as id,
                        (extract(epoch from created_at) * 1000)::bigint::text as ms`)
              .map((r) => [r.id as string, Number(r.ms)]),
          );
          await waitFor(() => seen.size === created.size, "the jobs to run");
          // Times as the database has them, to the millisecond (-15 float digits rounded them
          // to another day: 2033 for an epoch in milliseconds).
          for (const [id, ms] of created) {
            const got = seen.get(id)!;
            assert(
              Math.abs(got.getTime() - ms) <= 1,
              `createdAt ${got.toISOString()} of job ${id}`,
            );
          }
          // Each next job started in the write that ended the one before (handed over).
          const handed = await sql`select j.started_at = p.finished_at as handed
            from akadze.jobs j join akadze.jobs p on p.id = j.id - 1
           where j.limit_key = 'one' and p.limit_key = 'one' order by j.id`;
          assertEquals(handed.map((r) => r.handed), [true, true, true]);
          // The schedule's first fire runs now (read with rounded epoch numbers, it was due in
          // 2033, and the schedule silent until then).
          await waitFor(async () => {
            const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
              where task = 'tick' and state = 'succeeded'`;
            return n === 1;
          }, "the schedule's first fire to run");
        } finally {
          await worker.stop();
        }
      });
      const said = records.filter((r) => r.properties.event === "session_settings");
      assertEquals(said.map((r) => r.properties.settings), [{
        DateStyle: "ISO",
        extra_float_digits: "1",
      }]);
    } finally {
      await app.close();
    }
  });
});
