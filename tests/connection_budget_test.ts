// The connection budget: --pool-size reaches the app's pool, a worker group that may open
// more connections than the server has free is told so at start, and connections refused
// for a while (too many clients) neither fail nor re-run a job.
import postgres from "postgres";
import { configure, type LogRecord, reset } from "@logtape/logtape";
import { Akadze } from "../src/app.ts";
import { migrate } from "../src/migrate.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { assert, assertEquals, assertThrows } from "./assert.ts";
import { AkadzeError } from "../src/errors.ts";
import { countJobs, passthroughEnv, startWorker, waitFor, withDatabase } from "./_helpers.ts";
import {
  APP_MODULE,
  SLOW,
  spawnCli,
  supervisorPermissions,
  withDir,
  withProcesses,
} from "./_processes.ts";

type Row = { state: string; attempt: number; run_count: number };

Deno.test("worker processes that may open more connections than the server has free are warned once and run every job exactly once", async () => {
  // Superusers may take every slot: 3 processes × (pool 5 + 2) = 21 cannot fit in 20.
  const pg = await startThrowawayPostgres({ settings: { max_connections: 20 } });
  const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
  try {
    await migrate(sql);
    await withDir({ "app.ts": APP_MODULE }, (dir) =>
      withProcesses(async () => {
        const env = { ...passthroughEnv(), AKADZE_DATABASE_URL: pg.url };
        const supervisor = spawnCli(
          [
            "worker",
            `${dir}/app.ts`,
            "--processes",
            "3",
            "--log-format",
            "json",
            "--poll-interval",
            "0.2",
          ],
          env,
          { permissions: supervisorPermissions(dir) },
        );
        const [warning] = await supervisor.waitForEvent("connection_budget", undefined, 1, SLOW);
        assertEquals(warning.level, "WARN");
        assertEquals(
          [warning.processes, warning.pool, warning.perProcess, warning.needed],
          [3, 5, 7, 21],
        );
        assertEquals(warning.maxConnections, 20);
        assert(warning.message.includes("--pool-size"), warning.message);
        await sql`insert into akadze.jobs (task, args)
          select 'hello', '{"name":"x"}'::jsonb from generate_series(1, 150)`;
        await waitFor(
          async () => {
            const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
            where state in ('succeeded', 'failed')`;
            return n === 150;
          },
          "150 jobs to finish",
          SLOW,
        );
        supervisor.child.kill("SIGTERM");
        assertEquals((await supervisor.done()).code, 0);
        assertEquals(supervisor.events("connection_budget").length, 1);
        const rows =
          await sql`select state, attempt, run_count from akadze.jobs` as unknown as Row[];
        assertEquals(
          rows.filter((r) => r.state !== "succeeded" || r.attempt !== 0 || r.run_count !== 1),
          [],
        );
      }));
  } finally {
    await sql.end({ timeout: 1 });
    await pg.stop();
  }
});

Deno.test("--pool-size sets the pool of an app whose code gives none, and a budget that fits is not warned about", async () => {
  await withDatabase(
    "budget_pool_size",
    (db) =>
      withDir({ "app.ts": APP_MODULE }, (dir) =>
        withProcesses(async () => {
          const env = { ...passthroughEnv(), AKADZE_DATABASE_URL: db.url };
          const worker = spawnCli(
            [
              "worker",
              `${dir}/app.ts`,
              "--pool-size",
              "2",
              "--batch",
              "--log-format",
              "json",
              "--log-level",
              "debug",
            ],
            env,
          );
          const out = await worker.done();
          assertEquals(out.code, 0, out.stderr);
          const [budget] = worker.events("connection_budget");
          assertEquals(budget.level, "DEBUG");
          assertEquals([budget.processes, budget.pool, budget.needed], [1, 2, 4]);
        })),
  );
});

Deno.test("a LISTEN the server refuses (too many connections) leaves the worker polling: jobs run once and the lease holds", async () => {
  await withDatabase("budget_listen_refused", async (db, sql) => {
    // A role of two connections: the app's pool (one, already open) and the worker loop's.
    // The LISTEN connection is refused with 53300 for as long as the test runs.
    const role = `akadze_budget_${crypto.randomUUID().slice(0, 8)}`;
    await sql.unsafe(`create role ${role} login connection limit 2`);
    await sql.unsafe(`grant usage on schema akadze to ${role}`);
    await sql.unsafe(`grant all on all tables in schema akadze to ${role}`);
    await sql.unsafe(`grant all on all sequences in schema akadze to ${role}`);
    const url = new URL(db.url);
    url.username = role;
    const records: LogRecord[] = [];
    await configure({
      sinks: { memory: (record: LogRecord) => records.push(record) },
      loggers: [
        { category: ["akadze"], lowestLevel: "debug", sinks: ["memory"] },
        { category: ["logtape", "meta"], lowestLevel: "error", sinks: [] },
      ],
    });
    const app = new Akadze({ databaseUrl: url.toString(), max: 1 });
    try {
      let runs = 0;
      const work = app.task("work", () => {
        runs++;
      });
      await app.sql`select 1`;
      const running = startWorker(app, {
        heartbeatInterval: 200,
        heartbeatTtl: 1_500,
        pollInterval: 100,
        schedules: false,
      });
      try {
        await waitFor(
          () => records.some((r) => r.properties.event === "listen_failed"),
          "the refused LISTEN",
        );
        for (let i = 0; i < 5; i++) await work.enqueue({});
        await waitFor(
          async () => await countJobs(sql, "succeeded") === 5,
          "5 jobs to succeed by polling",
          30_000,
        );
        // Once the server accepts it, the worker listens again.
        await sql.unsafe(`alter role ${role} connection limit -1`);
        await waitFor(
          () => records.some((r) => r.properties.event === "listen_started"),
          "the LISTEN to succeed",
          30_000,
        );
      } finally {
        const exit = await running.stop();
        assertEquals(exit.code, 0, exit.message);
      }
      assertEquals(runs, 5);
      const rows = await sql`select state, attempt, run_count from akadze.jobs` as unknown as Row[];
      for (const row of rows) {
        assertEquals({ ...row }, { state: "succeeded", attempt: 0, run_count: 1 });
      }
      assertEquals(records.filter((r) => r.properties.event === "job_rescued").length, 0);
      assertEquals(records.filter((r) => r.properties.event === "listen_failed").length, 1);
    } finally {
      await app.close();
      await reset();
      await sql.unsafe(`drop owned by ${role}`);
      await sql.unsafe(`drop role ${role}`);
    }
  });
});

Deno.test("AKADZE_POOL_SIZE sizes the pool of an app that gives no max; a max in code wins", () => {
  const url = "postgres://postgres@127.0.0.1:1/none";
  Deno.env.set("AKADZE_POOL_SIZE", "3");
  try {
    assertEquals(new Akadze({ databaseUrl: url }).sql.options.max, 3);
    assertEquals(new Akadze({ databaseUrl: url, max: 7 }).sql.options.max, 7);
    Deno.env.set("AKADZE_POOL_SIZE", "zero");
    const error = assertThrows(() => new Akadze({ databaseUrl: url }), AkadzeError);
    assert(error.message.includes("AKADZE_POOL_SIZE"), error.message);
  } finally {
    Deno.env.delete("AKADZE_POOL_SIZE");
  }
  assertEquals(new Akadze({ databaseUrl: url }).sql.options.max, 10);
  assertThrows(() => new Akadze({ databaseUrl: url, listenUrl: "db:5432" }), AkadzeError);
});

Deno.test("the worker says when the app's code sets a pool size other than --pool-size", async () => {
  const module = APP_MODULE.replace(
    `Deno.env.get("AKADZE_DATABASE_URL") }`,
    `Deno.env.get("AKADZE_DATABASE_URL"), max: 3 }`,
  );
  assert(module !== APP_MODULE);
  await withDatabase(
    "budget_pool_conflict",
    (db) =>
      withDir({ "app.ts": module }, (dir) =>
        withProcesses(async () => {
          const env = { ...passthroughEnv(), AKADZE_DATABASE_URL: db.url };
          const worker = spawnCli(
            ["worker", `${dir}/app.ts`, "--pool-size", "2", "--batch", "--log-format", "json"],
            env,
          );
          const out = await worker.done();
          assertEquals(out.code, 0, out.stderr);
          const [ignored] = worker.events("pool_size_ignored");
          assertEquals([ignored.max, ignored.asked], [3, 2]);
        })),
  );
});
