// Workers behind a real PgBouncer in transaction mode: queries through the pooler with
// prepare: false, the LISTEN connection direct (listenUrl), and a worker told once that
// notifications cannot reach it when it listens through the pooler.
import type { LogRecord } from "@logtape/logtape";
import { Akadze } from "../src/app.ts";
import type { Sql } from "../src/db.ts";
import { assert, assertEquals } from "./assert.ts";
import {
  countJobs,
  setDatabaseDefault,
  startWorker,
  waitFor,
  withDatabase,
  within,
  withLogs,
} from "./_helpers.ts";
import { Listener } from "../src/worker/listener.ts";
import { applyMigrations, knownVersions, migrate, MIGRATIONS } from "../src/migrate.ts";
import { pgbouncerBinary, startPgBouncer, type ThrowawayPgBouncer } from "./_pgbouncer.ts";

const ignore = pgbouncerBinary() === undefined;

async function withPgBouncer(
  name: string,
  fn: (direct: string, pooled: string, sql: Sql) => Promise<void>,
): Promise<void> {
  await withDatabase(name, async (db, sql) => {
    const bouncer: ThrowawayPgBouncer = await startPgBouncer(db.url, "transaction");
    try {
      await fn(db.url, bouncer.url(db.url), sql);
    } finally {
      await bouncer.stop();
    }
  });
}

function events(records: LogRecord[], event: string): LogRecord[] {
  return records.filter((r) => r.properties.event === event);
}

async function states(sql: Sql): Promise<{ state: string; attempt: number; run_count: number }[]> {
  return [...await sql`select state, attempt, run_count from akadze.jobs order by id`] as never;
}

Deno.test({
  name:
    "through PgBouncer with a direct listenUrl, a job enqueued after start wakes the worker by notification",
  ignore,
  fn: () =>
    withPgBouncer("pgb_listen_url", async (direct, pooled, sql) => {
      await withLogs(async (records) => {
        const app = new Akadze({ databaseUrl: pooled, listenUrl: direct });
        let ran = 0;
        const work = app.task("work", () => {
          ran++;
        });
        // A poll far longer than the wait below: only a notification can wake it in time.
        const running = startWorker(app, { pollInterval: 60_000 });
        try {
          // Its probe went through the pooler and came back on the direct LISTEN connection.
          await waitFor(
            () => events(records, "listen_probed").length === 1,
            "the worker's probe notification",
          );
          await work.enqueue({});
          await waitFor(() => ran === 1, "the job to run", 20_000);
          assertEquals(events(records, "listen_unavailable").length, 0);
        } finally {
          await running.stop();
          await app.close();
        }
        assertEquals(await states(sql), [{ state: "succeeded", attempt: 0, run_count: 1 }]);
      });
    }),
});

Deno.test({
  name:
    "through PgBouncer without listenUrl the worker says once that LISTEN cannot work, and jobs run by polling with prepare: false",
  ignore,
  fn: () =>
    withPgBouncer("pgb_no_listen", async (_direct, pooled, sql) => {
      await withLogs(async (records) => {
        const app = new Akadze({ databaseUrl: pooled });
        assertEquals(app.sql.options.prepare, false);
        const work = app.task("work", async (args: { n?: unknown }) => {
          // A query of the task through the pooler, outside any transaction.
          const [{ n }] = await app.sql`select ${Number(args.n)}::int + 1 as n`;
          return n;
        });
        const running = startWorker(app, { pollInterval: 300 });
        try {
          await waitFor(
            () => events(records, "listen_unavailable").length > 0,
            "the listen_unavailable warning",
            30_000,
          );
          for (let n = 0; n < 20; n++) await work.enqueue({ n });
          await waitFor(
            async () => await countJobs(sql, "succeeded") === 20,
            "20 jobs to succeed by polling",
            30_000,
          );
        } finally {
          await running.stop();
          await app.close();
        }
        const warnings = events(records, "listen_unavailable");
        assertEquals(warnings.length, 1);
        assertEquals(warnings[0].level, "warning");
        const text = warnings[0].message.join("");
        assert(text.includes("listenUrl") && text.includes("notify: false"), text);
        const rows = await states(sql);
        assertEquals(rows.length, 20);
        for (const row of rows) assertEquals(row, { state: "succeeded", attempt: 0, run_count: 1 });
        const results = await sql`select result from akadze.jobs order by id`;
        assertEquals(results.map((r) => r.result), Array.from({ length: 20 }, (_, n) => n + 1));
      });
    }),
});

Deno.test({
  name: "a worker listening directly receives its probe and does not warn that LISTEN cannot work",
  fn: () =>
    withDatabase("pgb_direct_probe", async (db) => {
      await withLogs(async (records) => {
        const app = new Akadze({ databaseUrl: db.url });
        app.task("work", () => {});
        const running = startWorker(app, { pollInterval: 100 });
        try {
          await waitFor(
            () => events(records, "listen_probed").length === 1,
            "the worker's probe notification",
          );
        } finally {
          await running.stop();
          await app.close();
        }
        assertEquals(events(records, "listen_unavailable").length, 0);
      });
    }),
});

Deno.test({
  name: "a probe through PgBouncer that is still waiting ends when its run stops",
  ignore,
  fn: () =>
    withPgBouncer("pgb_probe_stop", async (_direct, pooled) => {
      const app = new Akadze({ databaseUrl: pooled });
      const listener = new Listener(app.sql, {
        schema: app.schema,
        queues: ["default"],
        onJobs: () => {},
        onCancel: () => {},
      });
      try {
        await listener.start();
        const stop = new AbortController();
        let sent = false;
        const probe = listener.probe(
          async (channel, payload) => {
            await app.sql`select pg_notify(${channel}, ${payload})`;
            sent = true;
          },
          600_000,
          stop.signal,
        );
        await waitFor(() => sent, "the probe notification to be sent");
        stop.abort();
        // Far below the probe's own bound: the abort ended it.
        assertEquals(await within(probe, 30_000, "the aborted probe"), false);
      } finally {
        await listener.stop();
        await app.close();
      }
    }),
});

Deno.test({
  name:
    "akadze migrate through PgBouncer in transaction mode applies every version, the concurrent index build too",
  ignore,
  fn: () =>
    withDatabase("pgb_migrate", async (db, sql) => {
      const bouncer = await startPgBouncer(db.url, "transaction");
      try {
        const pooled = bouncer.url(db.url);
        // From an empty database, and into a second schema from 0001 (the version before the
        // concurrent index build), both through the pooler.
        assertEquals(await migrate(pooled), knownVersions());
        await applyMigrations(pooled, MIGRATIONS.slice(0, 1), { schema: "pooled" });
        assertEquals(await migrate(pooled, { schema: "pooled" }), knownVersions().slice(1));
        assertEquals(await migrate(pooled, { schema: "pooled" }), []);
        const invalid = await sql`
          select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid
           where not (i.indisvalid and i.indisready)`;
        assertEquals(invalid.length, 0);
        const [{ n }] = await sql`
          select count(*)::int as n from pg_indexes where indexname = 'jobs_queued_key_idx'`;
        assertEquals(n, 2);
      } finally {
        await bouncer.stop();
      }
    }, { migrated: false }),
});

Deno.test({
  name:
    "through PgBouncer, on a database whose transactions default to serializable, a worker runs its jobs",
  ignore,
  fn: async () => {
    await withPgBouncer("pgbouncer_serializable", async (direct, pooled, sql) => {
      await setDatabaseDefault(sql, "default_transaction_isolation", "serializable");
      await sql`insert into akadze.jobs (task) select 'work' from generate_series(1, 200)`;
      const app = new Akadze({ databaseUrl: pooled, listenUrl: direct, max: 4 });
      app.task("work", () => {});
      try {
        const records = await withLogs(async () => {
          const worker = startWorker(app, { slots: 10, schedules: false });
          await waitFor(async () => await countJobs(sql, "succeeded") === 200, "the jobs to run");
          assertEquals((await worker.stop()).code, 0);
        });
        // PgBouncer refuses a startup parameter it does not know: the worker's own
        // connection goes on at the database's level, and says so.
        assertEquals(
          events(records, "session_setting_refused").map((r) => r.properties.name),
          ["default_transaction_isolation"],
        );
      } finally {
        await app.close();
      }
    });
  },
});
