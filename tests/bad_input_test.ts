// The bad-input sweep: every EnqueueError of an enqueue, every admin function's input
// errors (unknown ids, wrong states, negative and huge numbers, hostile queue, key and
// schema names with quotes, SQL and NUL) and the CLI's, each a clear error that writes
// nothing. "Writes nothing" is checked on a digest of every akadze table, not a count.
import * as v from "valibot";
import { Akadze } from "../src/app.ts";
import {
  clearLimit,
  getJob,
  listJobs,
  listLimits,
  listQueues,
  listWorkers,
  pauseQueue,
  pruneJobs,
  queueSnapshot,
  requestCancel,
  requeue,
  resumeQueue,
  setLimit,
} from "../admin.ts";
import type { Sql } from "../src/db.ts";
import { AkadzeError, DuplicateJob, EnqueueError } from "../src/errors.ts";
import { migrate } from "../src/migrate.ts";
import { renderMetrics } from "../src/metrics.ts";
import { assertEnqueued } from "../src/testing.ts";
import { Worker } from "../src/worker/worker.ts";
import { assertEquals, assertMatch, assertRejects, assertThrows } from "./assert.ts";
import { passthroughEnv, withApp, withDatabase } from "./_helpers.ts";

const TABLES = [
  "jobs",
  "workers",
  "periodic_runs",
  "queue_pauses",
  "limits",
  "limit_starts",
  "schema_migrations",
];

/** A digest of every row of every akadze table (changes when anything is written). */
async function digest(sql: Sql): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const table of TABLES) {
    const [{ d }] = await sql.unsafe(
      `select count(*) || ':' || coalesce(md5(string_agg(t::text, ',' order by t::text)), '-')
         as d from akadze.${table} t`,
    );
    out[table] = d;
  }
  const [{ schemas }] = await sql`
    select string_agg(nspname, ',' order by nspname) as schemas from pg_namespace`;
  out.schemas = schemas;
  return out;
}

/** Names a hostile caller might pass where a queue, key or schema name goes. */
const HOSTILE = [
  "",
  "x'; drop table akadze.jobs; --",
  'a"b',
  "q\u0000",
  "robert'); delete from akadze.jobs where ('1'='1",
  "a".repeat(65),
  " default",
  "default\n",
  "é",
  "$$",
];

/** Schema names that must be refused (quoted, SQL, NUL, reserved, too long). */
const HOSTILE_SCHEMAS = [
  'x"; drop schema akadze cascade; --',
  "Akadze",
  "pg_catalog",
  "1abc",
  "",
  "a".repeat(64),
  "a\u0000b",
  "akadze.jobs",
  "public; drop table akadze.jobs",
];

const BAD_IDS: unknown[] = [
  "0",
  "-1",
  "abc",
  "1 or 1=1",
  "1; drop table akadze.jobs",
  "9223372036854775808",
  "99999999999999999999",
  "",
  " 1",
  "1.5",
  "0x10",
  "1e3",
  "١٢",
  "1\u0000",
  null,
  undefined,
  -5,
  1.5,
  NaN,
];

/** Seed rows in every state, so that wrong-state errors have something to refuse. */
/**
 * A checker that records into `wrong` every call that was accepted, or refused with
 * anything but an `AkadzeError` whose message matches.
 */
function refusals(
  wrong: string[],
): (what: string, fn: () => Promise<unknown>, message: RegExp) => Promise<void> {
  return async (what, fn, message) => {
    try {
      await fn();
      wrong.push(`${what}: accepted`);
    } catch (error) {
      if (!(error instanceof AkadzeError) || !message.test(error.message)) {
        wrong.push(`${what}: ${error}`);
      }
    }
  };
}

async function seed(app: Akadze, sql: Sql) {
  const t = app.tasks.get("t")!;
  const [queued, running, succeeded, failed, cancelled] = await t.enqueueMany([
    {},
    {},
    {},
    {},
    {},
  ]);
  await sql`update akadze.jobs set state = 'running', worker_id = 'w', run_count = 1,
                                    started_at = now() where id = ${running}`;
  await sql`update akadze.jobs set state = 'succeeded', finished_at = now(), run_count = 1
             where id = ${succeeded}`;
  await sql`update akadze.jobs set state = 'failed', finished_at = now(), run_count = 3,
                                    attempt = 3 where id = ${failed}`;
  await sql`update akadze.jobs set state = 'cancelled', finished_at = now()
             where id = ${cancelled}`;
  await setLimit(sql, "api", { maxRunning: 2 });
  await pauseQueue(sql, "paused");
  await t.using({ uniqueKey: "u1" }).enqueue({});
  return { queued, running, succeeded, failed, cancelled };
}

// ---------------------------------------------------------------------------------------
// Enqueue

Deno.test("every EnqueueError of an enqueue is a clear error that inserts nothing", async () => {
  await withApp("bad_enqueue", async (app, sql) => {
    const t = app.task("t", () => {});
    const typed = app.task("typed", { args: v.object({ n: v.number() }) }, () => {});
    await seed(app, sql);
    const before = await digest(sql);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    let deep: Record<string, unknown> = {};
    for (let i = 0; i < 300; i++) deep = { deep };
    // deno-lint-ignore no-sparse-arrays
    const sparse = [1, , 3];
    class Point {
      x = 1;
    }
    const cases: [string, () => Promise<unknown>, RegExp][] = [
      [
        "delay and runAt",
        () => t.using({ delay: 1, runAt: new Date() }).enqueue(),
        /delay and runAt/,
      ],
      ["negative delay", () => t.using({ delay: -1 }).enqueue(), /delay must be a non-negative/],
      ["NaN delay", () => t.using({ delay: NaN }).enqueue(), /delay must be/],
      ["Infinity delay", () => t.using({ delay: Infinity }).enqueue(), /delay must be/],
      ["string delay", () => t.using({ delay: "5" as never }).enqueue(), /delay must be/],
      ["invalid runAt", () => t.using({ runAt: new Date("x") }).enqueue(), /runAt must be a valid/],
      ["string runAt", () => t.using({ runAt: "2030-01-01" as never }).enqueue(), /runAt must be/],
      [
        "invalid expiresAt",
        () => t.using({ expiresAt: new Date(NaN) }).enqueue(),
        /expiresAt must be a valid Date/,
      ],
      [
        "priority 32768",
        () => t.using({ priority: 32768 }).enqueue(),
        /priority must be an integer/,
      ],
      ["priority -32769", () => t.using({ priority: -32769 }).enqueue(), /priority must be/],
      ["priority 1.5", () => t.using({ priority: 1.5 }).enqueue(), /priority must be/],
      ["maxAttempts 0", () => t.using({ maxAttempts: 0 }).enqueue(), /maxAttempts must be/],
      ["maxAttempts -1", () => t.using({ maxAttempts: -1 }).enqueue(), /maxAttempts must be/],
      ["maxAttempts 2^31", () => t.using({ maxAttempts: 2 ** 31 }).enqueue(), /maxAttempts must/],
      ["maxAttempts NaN", () => t.using({ maxAttempts: NaN }).enqueue(), /maxAttempts must be/],
      ["schema failure", () => typed.enqueue({ n: "x" } as never), /task "typed".*n/],
      ["schema: missing", () => typed.enqueue({} as never), /invalid arguments for task "typed"/],
      ["BigInt", () => t.enqueue({ n: 1n }), /BigInt/],
      ["NaN", () => t.enqueue({ n: NaN }), /NaN/],
      ["Infinity", () => t.enqueue({ n: -Infinity }), /Infinity/],
      ["cycle", () => t.enqueue(cyclic), /circular/],
      ["function", () => t.enqueue({ f: () => 1 }), /function/],
      ["symbol", () => t.enqueue({ s: Symbol("x") }), /symbol/],
      ["undefined value", () => t.enqueue({ u: undefined }), /undefined/],
      ["NUL in a string", () => t.enqueue({ s: "a\u0000b" }), /NUL/],
      ["NUL in a key", () => t.enqueue({ ["a\u0000"]: 1 }), /NUL/],
      ["lone surrogate", () => t.enqueue({ s: "\ud800" }), /surrogate/],
      ["Date", () => t.enqueue({ d: new Date() }), /Date, not a plain object/],
      ["Map", () => t.enqueue({ m: new Map() }), /Map/],
      ["class instance", () => t.enqueue({ p: new Point() }), /Point/],
      ["sparse array", () => t.enqueue({ a: sparse }), /sparse/],
      ["nested too deep", () => t.enqueue(deep), /nested more than/],
      ["array as arguments", () => t.enqueue([1, 2] as never), /must be a JSON object/],
      ["string as arguments", () => t.enqueue("x" as never), /must be a JSON object/],
      ["null as arguments", () => t.enqueue(null as never), /must be a JSON object/],
      ["options not an object", () => t.using(null as never).enqueue(), /options must be/],
      ["unknown option", () => t.using({ prio: 1 } as never).enqueue(), /unknown enqueue option/],
      ["bad session", () => t.using({ session: {} as never }).enqueue(), /session must be/],
      ["enqueueMany of a string", () => t.enqueueMany("x" as never), /array/],
      [
        "enqueueMany with one bad element",
        () => t.enqueueMany([{}, { n: 1n }, {}]),
        /element 1.*BigInt/,
      ],
      ...HOSTILE.map((queue): [string, () => Promise<unknown>, RegExp] => [
        `queue ${JSON.stringify(queue)}`,
        () => t.using({ queue }).enqueue(),
        /queue name .* must be 1-64 characters/,
      ]),
      ["queue of another type", () => t.using({ queue: 5 as never }).enqueue(), /queue/],
      ["uniqueKey empty", () => t.using({ uniqueKey: "" }).enqueue(), /uniqueKey must be/],
      ["uniqueKey 501", () => t.using({ uniqueKey: "k".repeat(501) }).enqueue(), /uniqueKey/],
      ["uniqueKey NUL", () => t.using({ uniqueKey: "k\u0000" }).enqueue(), /uniqueKey.*NUL/],
      ["uniqueKey number", () => t.using({ uniqueKey: 5 as never }).enqueue(), /uniqueKey/],
      ["limitKey NUL", () => t.using({ limitKey: "\u0000" }).enqueue(), /limitKey.*NUL/],
      ["limitKey surrogate", () => t.using({ limitKey: "\udfff" }).enqueue(), /surrogate/],
    ];
    const wrong: string[] = [];
    for (const [name, enqueue, message] of cases) {
      try {
        await enqueue();
        wrong.push(`${name}: accepted`);
      } catch (error) {
        if (!(error instanceof EnqueueError)) wrong.push(`${name}: ${error}`);
        else if (!message.test(error.message)) wrong.push(`${name}: "${error.message}"`);
      }
    }
    assertEquals(wrong, []);
    assertEquals(await digest(sql), before, "nothing was written");
  });
});

Deno.test("an EnqueueError or DuplicateJob inside the caller's transaction leaves it usable", async () => {
  await withApp("bad_enqueue_tx", async (app, sql) => {
    const t = app.task("t", () => {});
    await t.using({ uniqueKey: "dup" }).enqueue({});
    const ids = await app.sql.begin(async (tx) => {
      await assertRejects(() => t.using({ session: tx }).enqueue({ n: 1n }), EnqueueError);
      await assertRejects(() => t.using({ session: tx, queue: "a'b" }).enqueue({}), EnqueueError);
      await assertRejects(
        () => t.using({ session: tx, uniqueKey: "dup" }).enqueue({}),
        DuplicateJob,
      );
      await assertRejects(
        () => t.using({ session: tx, uniqueKey: "dup" }).enqueueMany([{}, {}]),
        DuplicateJob,
      );
      return [await t.using({ session: tx }).enqueue({ ok: true })];
    });
    assertEquals(ids.length, 1);
    const rows = await sql`select args from akadze.jobs order by id`;
    assertEquals(rows.map((r) => r.args), [{}, { ok: true }]);
  });
});

Deno.test("hostile but valid keys and arguments are stored verbatim (parameters, never SQL)", async () => {
  await withApp("bad_verbatim", async (app, sql) => {
    const t = app.task("t", () => {});
    const nasty = 'x\'); drop table akadze.jobs; -- "quoted" $$ \\ \u2028 🦕';
    const id = await t.using({ uniqueKey: nasty, limitKey: nasty, queue: "a.b:c-d_e" })
      .enqueue({ [nasty]: nasty, nested: [nasty, { nasty }] });
    const [row] = await sql`select unique_key, limit_key, queue, args from akadze.jobs
                             where id = ${id}`;
    assertEquals(row, {
      unique_key: nasty,
      limit_key: nasty,
      queue: "a.b:c-d_e",
      args: { [nasty]: nasty, nested: [nasty, { nasty }] },
    });
    await setLimit(sql, nasty, { maxRunning: 1 });
    assertEquals((await listLimits(sql)).map((l) => l.key), [nasty]);
    assertEquals(await clearLimit(sql, nasty), true);
    await requestCancel(sql, id);
    assertEquals((await getJob(sql, id))?.cancelRequested, true);
  });
});

// ---------------------------------------------------------------------------------------
// Admin

Deno.test("requeue, requestCancel and getJob: malformed ids, unknown ids and wrong states write nothing", async () => {
  await withApp("bad_admin_ids", async (app, sql) => {
    app.task("t", () => {});
    const ids = await seed(app, sql);
    const before = await digest(sql);
    const wrong: string[] = [];
    const expect = refusals(wrong);
    for (const id of BAD_IDS) {
      const shown = JSON.stringify(id) ?? String(id);
      await expect(`requeue ${shown}`, () => requeue(sql, id as string), /job id must be/);
      await expect(`cancel ${shown}`, () => requestCancel(sql, id as string), /job id must be/);
      await expect(`getJob ${shown}`, () => getJob(sql, id as string), /job id must be/);
    }
    await expect("requeue unknown", () => requeue(sql, "987654321"), /job 987654321 does not/);
    for (const state of ["queued", "running", "succeeded", "cancelled"] as const) {
      await expect(
        `requeue ${state}`,
        () => requeue(sql, ids[state]),
        new RegExp(`is not failed \\(it is ${state}\\)`),
      );
    }
    assertEquals(wrong, []);
    // Unknown ids and finished jobs: a no-op for cancel, null for getJob.
    assertEquals(await requestCancel(sql, "987654321"), false);
    for (const state of ["succeeded", "failed", "cancelled"] as const) {
      assertEquals(await requestCancel(sql, ids[state]), false, state);
    }
    assertEquals(await getJob(sql, "987654321"), null);
    assertEquals(await digest(sql), before, "nothing was written");

    // In the caller's transaction, a refused requeue leaves the transaction usable.
    const after = await sql.begin(async (tx) => {
      await assertRejects(() => requeue(tx, ids.queued), AkadzeError);
      await assertRejects(() => requeue(tx, "abc"), AkadzeError);
      const [{ n }] = await tx`select count(*)::int as n from akadze.jobs`;
      return n;
    });
    assertEquals(after, 6);
  });
});

Deno.test("pauseQueue, resumeQueue, listJobs and pruneJobs refuse hostile names and bad numbers", async () => {
  await withApp("bad_admin_queues", async (app, sql) => {
    app.task("t", () => {});
    await seed(app, sql);
    const before = await digest(sql);
    const wrong: string[] = [];
    const expect = refusals(wrong);
    for (const queue of [...HOSTILE, null, 5, undefined]) {
      const shown = JSON.stringify(queue) ?? String(queue);
      await expect(`pause ${shown}`, () => pauseQueue(sql, queue as string), /queue name/);
      await expect(`resume ${shown}`, () => resumeQueue(sql, queue as string), /queue name/);
      if (queue !== undefined) {
        await expect(
          `listJobs queue ${shown}`,
          () => listJobs(sql, { queue: queue as string }),
          /queue name/,
        );
      }
    }
    for (const limit of [0, -1, 1001, 1.5, NaN, Infinity, "10"]) {
      await expect(
        `listJobs limit ${limit}`,
        () => listJobs(sql, { limit: limit as number }),
        /limit must be an integer from 1 to 1000/,
      );
    }
    for (const state of ["bogus", "Queued", "", "queued'--"]) {
      await expect(
        `listJobs state ${state}`,
        () => listJobs(sql, { state: state as "queued" }),
        /state must be one of/,
      );
    }
    for (const olderThan of [-1, NaN, Infinity, "1" as unknown as number]) {
      await expect(
        `pruneJobs olderThan ${olderThan}`,
        () => pruneJobs(sql, { olderThan }),
        /olderThan must be/,
      );
    }
    for (const batchSize of [0, -1, 1.5, 100_001]) {
      await expect(
        `pruneJobs batchSize ${batchSize}`,
        () => pruneJobs(sql, { batchSize }),
        /batchSize must be/,
      );
    }
    for (const name of ["includeFailed", "dryRun"]) {
      await expect(
        `pruneJobs ${name} "yes"`,
        () => pruneJobs(sql, { [name]: "yes" }),
        new RegExp(`${name} must be a boolean`),
      );
    }
    assertEquals(wrong, []);
    // Idempotent no-ops: resuming a queue that is not paused, pausing a paused one.
    assertEquals(await resumeQueue(sql, "never-paused"), false);
    assertEquals(await pauseQueue(sql, "paused"), false);
    assertEquals(await digest(sql), before, "nothing was written");
  });
});

Deno.test("setLimit and clearLimit refuse bad keys and bad numbers, writing nothing", async () => {
  await withApp("bad_admin_limits", async (app, sql) => {
    app.task("t", () => {});
    await seed(app, sql);
    const before = await digest(sql);
    const wrong: string[] = [];
    const expect = refusals(wrong);
    const badKeys: unknown[] = ["", "k".repeat(501), "k\u0000", "\ud800", null, 5, undefined];
    for (const key of badKeys) {
      const shown = JSON.stringify(key) ?? String(key);
      await expect(
        `setLimit ${shown}`,
        () => setLimit(sql, key as string, { maxRunning: 1 }),
        /key/,
      );
      await expect(`clearLimit ${shown}`, () => clearLimit(sql, key as string), /key/);
    }
    const badLimits: [unknown, RegExp][] = [
      [null, /setLimit needs/],
      [[], /at least one|setLimit needs/],
      [{}, /at least one of/],
      [{ max_running: 1 }, /unknown limit "max_running"/],
      [{ maxRunning: 0 }, /maxRunning must be an integer from 1/],
      [{ maxRunning: -1 }, /maxRunning must be/],
      [{ maxRunning: 1.5 }, /maxRunning must be/],
      [{ maxRunning: NaN }, /maxRunning must be/],
      [{ maxRunning: Infinity }, /maxRunning must be/],
      [{ maxRunning: 2 ** 31 }, /maxRunning must be/],
      [{ maxRunning: "5" }, /maxRunning must be/],
      [{ maxRunning: true }, /maxRunning must be/],
      [{ maxStarts: 0, window: 1000 }, /maxStarts must be/],
      [{ maxStarts: 5 }, /maxStarts and window must be set together/],
      [{ window: 1000 }, /maxStarts and window must be set together/],
      [{ maxStarts: 5, window: 0 }, /window must be/],
      [{ maxStarts: 5, window: -5 }, /window must be/],
      [{ maxStarts: 5, window: 1.5 }, /window must be/],
      [{ maxStarts: 5, window: 367 * 86_400_000 }, /window must be/],
    ];
    for (const [limits, message] of badLimits) {
      await expect(
        `setLimit ${JSON.stringify(limits)}`,
        () => setLimit(sql, "new-key", limits as never),
        message,
      );
      await expect(
        `setLimit (existing) ${JSON.stringify(limits)}`,
        () => setLimit(sql, "api", limits as never),
        message,
      );
    }
    // Refused inside the caller's transaction, which stays usable.
    const n = await sql.begin(async (tx) => {
      await assertRejects(() => setLimit(tx, "new-key", { maxStarts: 5 }), AkadzeError);
      const [{ n }] = await tx`select count(*)::int as n from akadze.limits`;
      return n;
    });
    assertEquals(n, 1);
    assertEquals(wrong, []);
    assertEquals(await clearLimit(sql, "no-such-key"), false, "clearLimit is idempotent");
    assertEquals(await digest(sql), before, "nothing was written");
  });
});

Deno.test("hostile schema names are refused by the app, migrate and every admin function", async () => {
  await withDatabase("bad_schema", async (db, sql) => {
    const before = await digest(sql);
    const wrong: string[] = [];
    for (const schema of HOSTILE_SCHEMAS) {
      const shown = JSON.stringify(schema);
      const check = async (what: string, fn: () => unknown) => {
        try {
          await fn();
          wrong.push(`${what} ${shown}: accepted`);
        } catch (error) {
          if (
            !(error instanceof AkadzeError) || !/schema must be a lower-case/.test(error.message)
          ) {
            wrong.push(`${what} ${shown}: ${error}`);
          }
        }
      };
      await check("new Akadze", () => new Akadze({ databaseUrl: db.url, schema }));
      await check("migrate", () => migrate(sql, { schema }));
      const options = { schema };
      await check("requeue", () => requeue(sql, "1", options));
      await check("requestCancel", () => requestCancel(sql, "1", options));
      await check("pauseQueue", () => pauseQueue(sql, "q", options));
      await check("resumeQueue", () => resumeQueue(sql, "q", options));
      await check("setLimit", () => setLimit(sql, "k", { maxRunning: 1 }, options));
      await check("clearLimit", () => clearLimit(sql, "k", options));
      await check("pruneJobs", () => pruneJobs(sql, options));
      await check("listJobs", () => listJobs(sql, options));
      await check("getJob", () => getJob(sql, "1", options));
      await check("listWorkers", () => listWorkers(sql, options));
      await check("listLimits", () => listLimits(sql, options));
      await check("listQueues", () => listQueues(sql, options));
      await check("queueSnapshot", () => queueSnapshot(sql, options));
    }
    assertEquals(wrong, []);
    assertEquals(await digest(sql), before, "no schema was created, nothing was written");
  });
});

Deno.test("every admin function, renderMetrics and a worker say to migrate a database without the schema", async () => {
  await withDatabase("bad_unmigrated", async (db, sql) => {
    const wrong: string[] = [];
    const check = async (what: string, fn: () => unknown) => {
      try {
        await fn();
        wrong.push(`${what}: accepted`);
      } catch (error) {
        if (
          !(error instanceof AkadzeError) ||
          !/schema "akadze" is not installed in this database.*run akadze migrate/.test(
            error.message,
          )
        ) {
          wrong.push(`${what}: ${error}`);
        }
      }
    };
    await check("requeue", () => requeue(sql, "1"));
    await check("requestCancel", () => requestCancel(sql, "1"));
    await check("pauseQueue", () => pauseQueue(sql, "q"));
    await check("resumeQueue", () => resumeQueue(sql, "q"));
    await check("setLimit", () => setLimit(sql, "k", { maxRunning: 1 }));
    await check("clearLimit", () => clearLimit(sql, "k"));
    await check("pruneJobs", () => pruneJobs(sql));
    await check("pruneJobs dryRun", () => pruneJobs(sql, { dryRun: true }));
    await check("listJobs", () => listJobs(sql));
    await check("getJob", () => getJob(sql, "1"));
    await check("listWorkers", () => listWorkers(sql));
    await check("listLimits", () => listLimits(sql));
    await check("listQueues", () => listQueues(sql));
    await check("queueSnapshot", () => queueSnapshot(sql));
    await check("renderMetrics", () => renderMetrics(sql));
    const app = new Akadze({ databaseUrl: db.url });
    try {
      app.task("t", () => {});
      await check("assertEnqueued", () => assertEnqueued(app, "t", {}));
      const exit = await new Worker(app, { batch: true }).run();
      assertEquals([exit.code, exit.reason], [1, "fatal"]);
      assertMatch(exit.message ?? "", /schema "akadze" is not installed.*run akadze migrate/);
    } finally {
      await app.close();
    }
    assertEquals(wrong, []);
  }, { migrated: false });
});

Deno.test("app, task and worker options: bad values are AkadzeErrors at construction", () => {
  const app = new Akadze({ databaseUrl: "postgres://u:Pw0rd@127.0.0.1:1/x" });
  const bad: [string, () => unknown, RegExp][] = [
    ["no url", () => new Akadze({}), /give databaseUrl/],
    ["not a url", () => new Akadze({ databaseUrl: "mysql://x" }), /postgres:\/\//],
    ["both", () => new Akadze({ databaseUrl: "postgres://x", sql: app.sql }), /not both/],
    ["unknown option", () => new Akadze({ databaseUrl: "postgres://x", pool: 1 } as never), /pool/],
    [
      "retention < 0",
      () => new Akadze({ databaseUrl: "postgres://x", retention: -1 }),
      /retention/,
    ],
    ["max 0", () => new Akadze({ databaseUrl: "postgres://x", max: 0 }), /max must be/],
    ["task name NUL", () => app.task("a\u0000", () => {}), /task name/],
    ["task name empty", () => app.task("", () => {}), /task name/],
    ["task queue", () => app.task("q1", { queue: "a'b" }, () => {}), /queue must be/],
    ["task maxAttempts", () => app.task("q2", { maxAttempts: 0 }, () => {}), /maxAttempts/],
    ["task timeout", () => app.task("q3", { timeout: -1 }, () => {}), /timeout/],
    ["task priority", () => app.task("q4", { priority: 1e6 }, () => {}), /priority/],
    ["task option", () => app.task("q5", { retries: 1 } as never, () => {}), /unknown option/],
  ];
  const wrong: string[] = [];
  for (const [name, fn, message] of bad) {
    try {
      fn();
      wrong.push(`${name}: accepted`);
    } catch (error) {
      if (!(error instanceof AkadzeError) || !message.test(error.message)) {
        wrong.push(`${name}: ${error}`);
      }
      if (String(error).includes("Pw0rd")) wrong.push(`${name}: the password is in "${error}"`);
    }
  }
  assertEquals(wrong, []);
  assertThrows(() => app.task("dup", () => {}) && app.task("dup", () => {}), AkadzeError);
  return app.close();
});

// ---------------------------------------------------------------------------------------
// CLI

const CLI = new URL("../cli.ts", import.meta.url).pathname;
const MOD = new URL("../mod.ts", import.meta.url).href;
const CLI_SOURCE = await Deno.readTextFile(CLI);
/** Whether the CLI has a command yet (others are adding them). */
const hasCommand = (name: string) => CLI_SOURCE.includes(`case "${name}":`);

/** One CLI call: arguments, expected exit code, and a pattern its one error line matches. */
type CliCase = [args: string[], code: number, pattern?: RegExp];

async function runAll(
  cases: CliCase[],
  env: Record<string, string>,
  password: string,
  cwd: string,
): Promise<string[]> {
  const wrong: string[] = [];
  const queue = [...cases];
  const passthrough = passthroughEnv();
  await Promise.all(Array.from({ length: 6 }, async () => {
    for (let c = queue.shift(); c; c = queue.shift()) {
      const [args, code, pattern] = c;
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "--allow-net", "--allow-env", "--allow-sys", "--allow-read", CLI, ...args],
        cwd,
        env: { NO_COLOR: "1", ...passthrough, ...env },
        clearEnv: true,
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      const stdout = new TextDecoder().decode(out.stdout);
      const stderr = new TextDecoder().decode(out.stderr);
      const shown = `akadze ${args.map((a) => JSON.stringify(a)).join(" ")}`;
      if (out.code !== code) {
        wrong.push(`${shown}: exit ${out.code}, expected ${code}: ${stderr.trim().slice(0, 300)}`);
        continue;
      }
      if (code === 0) continue;
      if (!/^error: [^\n]+\n$/.test(stderr)) {
        wrong.push(
          `${shown}: stderr is not one error line: ${JSON.stringify(stderr.slice(0, 300))}`,
        );
      } else if (pattern && !pattern.test(stderr)) {
        wrong.push(`${shown}: ${stderr.trim()} does not match ${pattern}`);
      }
      if (/\bat \S+:\d+:\d+/.test(stderr)) wrong.push(`${shown}: a stack trace`);
      if (code === 2 && stdout !== "") wrong.push(`${shown}: printed ${JSON.stringify(stdout)}`);
      if ((stdout + stderr).includes(password)) wrong.push(`${shown}: the password is printed`);
    }
  }));
  return wrong;
}

Deno.test("CLI input errors: one clear line, the right exit code, nothing written, no password", async () => {
  await withApp("bad_cli", async (app, sql, db) => {
    app.task("t", () => {});
    const ids = await seed(app, sql);
    const dir = await Deno.makeTempDir({ prefix: "akadze-bad-cli-" });
    try {
      await Deno.writeTextFile(
        `${dir}/app.ts`,
        `import { Akadze } from ${JSON.stringify(MOD)};\n` +
          `export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });\n` +
          `app.task("t", () => {});\nexport const notAnApp = 1;\n`,
      );
      // A password in the URL (trust auth ignores it), so that leaks would show.
      const url = new URL(db.url);
      const password = url.password || `BadInputPw${crypto.randomUUID().slice(0, 8)}`;
      url.password = password;
      const env = { AKADZE_DATABASE_URL: url.toString() };
      const before = await digest(sql);
      const usage = (...args: string[]): CliCase => [args, 2];
      const cases: CliCase[] = [
        usage("frobnicate"),
        [["migrate", "--bogus"], 2, /bogus/],
        usage("migrate", "extra"),
        usage("migrate", "--status=yes"),
        [["migrate", "--schema", 'x"; drop schema akadze cascade; --'], 2, /schema/],
        [["migrate", "--schema", "pg_catalog"], 2, /schema/],
        [["worker"], 2, /missing APP/],
        usage("worker", "app.ts", "other.ts"),
        [["worker", "missing.ts"], 2, /not found/],
        [["worker", "app.ts:nope"], 2, /no export "nope"/],
        [["worker", "app.ts:notAnApp"], 2, /not an Akadze app/],
        [["worker", "app.ts", "--bogus"], 2, /bogus/],
        ...["0", "abc", "1.5", "10001"].map((n): CliCase => [
          ["worker", "app.ts", `--slots=${n}`],
          2,
          /--slots must be an integer/,
        ]),
        ...["0", "NaN", "99999999"].map((s): CliCase => [
          ["worker", "app.ts", `--heartbeat-interval=${s}`],
          2,
          /--heartbeat-interval must be a positive number of seconds/,
        ]),
        [["worker", "app.ts", "--heartbeat-ttl", "1", "--heartbeat-interval", "2"], 2, /longer/],
        [["worker", "app.ts", "--poll-interval", "-0.5"], 2, /--poll-interval/],
        [["worker", "app.ts", "--shutdown-timeout", "x"], 2, /--shutdown-timeout/],
        [["worker", "app.ts", "--max-jobs", "0"], 2, /--max-jobs/],
        [["worker", "app.ts", "--queue", "a'b"], 2, /queue name/],
        [["worker", "app.ts", "--queue", "x; drop table akadze.jobs"], 2, /queue name/],
        [["worker", "app.ts", "--log-format", "xml"], 2, /--log-format/],
        [["worker", "app.ts", "--log-level", "loud"], 2, /--log-level/],
        [["worker", "app.ts", "--heartbeat-file="], 2, /--heartbeat-file/],
        [["worker", "app.ts", "--processes", "0"], 2, /--processes/],
        [["worker", "app.ts", "--processes", "2", "--batch"], 2, /--batch/],
        [["dev"], 2, /missing APP/],
        [["dev", "missing.ts"], 2, /not found/],
        [["dev", "app.ts", "--processes", "2"], 2, /--processes/],
        [["dev", "app.ts", "--slots", "-3"], 2, /--slots/],
      ];
      if (hasCommand("jobs")) {
        const badIds = ["abc", "0", "1.5", "99999999999999999999", "1; drop table", "", " 1"];
        badIds.forEach((id, i) => {
          cases.push([["jobs", ["show", "requeue", "cancel"][i % 3], id], 2, /job id must be/]);
        });
        cases.push(
          usage("jobs", "show"),
          usage("jobs", "show", "1", "2"),
          usage("jobs", "frobnicate"),
          [["jobs", "list", "--state", "bogus"], 2, /--state/],
          [["jobs", "list", "--limit", "0"], 2, /--limit/],
          [["jobs", "list", "--limit", "1001"], 2, /--limit/],
          [["jobs", "list", "--limit", "-1"], 2],
          [["jobs", "list", "--queue", "a'b"], 2, /queue/],
          [["jobs", "list", "--schema", 'x"y'], 2, /schema/],
          // Well-formed but wrong: failures (exit 1), still one line and nothing written.
          [["jobs", "show", "987654321"], 1, /987654321/],
          [["jobs", "requeue", "987654321"], 1, /987654321/],
          [["jobs", "requeue", ids.queued], 1, /not failed/],
          [["jobs", "requeue", ids.succeeded], 1, /not failed/],
          [["jobs", "cancel", "987654321"], 0],
          [["jobs", "cancel", ids.succeeded], 0],
        );
      }
      if (hasCommand("queues")) {
        ["a'b", "x; drop table akadze.jobs", 'a"b', "a".repeat(65), ""].forEach((name, i) => {
          cases.push([["queues", i % 2 ? "resume" : "pause", name], 2, /queue name/]);
        });
        cases.push(usage("queues", "pause"), usage("queues", "frobnicate"));
        cases.push([["queues", "list", "--schema", "Akadze"], 2, /schema/]);
      }
      if (hasCommand("limits")) {
        for (const n of ["0", "1.5", "2147483648"]) {
          cases.push([["limits", "set", "k", `--max-running=${n}`], 2, /--max-running/]);
        }
        cases.push([["limits", "set", "k", "--max-starts=-1", "--window", "60"], 2]);
        for (const s of ["0", "abc", "31622401"]) {
          cases.push([["limits", "set", "k", "--max-starts", "5", `--window=${s}`], 2, /--window/]);
        }
        cases.push(
          usage("limits", "set"),
          usage("limits", "set", "k"),
          usage("limits", "clear"),
          [["limits", "set", "", "--max-running", "1"], 2],
          [["limits", "clear", ""], 2],
          [["limits", "set", "k".repeat(501), "--max-running", "1"], 2],
        );
      }
      if (hasCommand("workers")) cases.push(usage("workers", "list", "--bogus"));
      if (hasCommand("metrics")) cases.push(usage("metrics", "--bogus"));
      if (hasCommand("prune")) {
        cases.push(
          [["prune", "--older-than", "-1"], 2, /--older-than/],
          [["prune", "--older-than", "abc"], 2, /--older-than/],
        );
      }
      const wrong = await runAll(cases, env, password, dir);
      assertEquals(wrong, []);
      assertEquals(await digest(sql), before, "nothing was written");
      // No URL at all, and a malformed one.
      const none = await runAll(
        [[["migrate"], 2, /AKADZE_DATABASE_URL is not set/]],
        {},
        password,
        dir,
      );
      assertEquals(none, []);
      const malformed = await runAll(
        [[["migrate"], 2, /postgres:\/\//]],
        { AKADZE_DATABASE_URL: `mysql://u:${password}@h/d` },
        password,
        dir,
      );
      assertEquals(malformed, []);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});
