// Tasks that throw, return or ask for odd things: whatever a handler does, the worker
// survives, the job ends in a truthful state within its attempts (never an endless loop),
// and no argument value or password reaches a stored error, `jobs show` or a log line.
import * as v from "valibot";
import { Akadze } from "../src/app.ts";
import { Cancel, Fail, Retry, Snooze } from "../src/errors.ts";
import { Completer } from "../src/worker/completer.ts";
import { unstorableOutcome } from "../src/worker/completer.ts";
import { errorEntry } from "../src/worker/error_entry.ts";
import { drain } from "../src/testing.ts";
import { describeError, type Sql } from "../src/db.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { runCli, startWorker, waitForJob, withApp, withDatabase, withLogs } from "./_helpers.ts";

type Entry = { error: string; message: string; at: string };
type Row = Record<string, unknown> & { errors: Entry[] };

const TERMINAL = ["succeeded", "failed", "cancelled"];

/** Job `id`'s row once it is finished, or as soon as it has been claimed a second time. */
async function finishedOrRerun(sql: Sql, id: string): Promise<Row> {
  return await waitForJob(
    sql,
    id,
    (r) => TERMINAL.includes(r.state as string) || (r.run_count as number) > 1,
    `job ${id} to finish`,
    30_000,
  ) as Row;
}

async function row(sql: Sql, id: string): Promise<Row> {
  const [r] = await sql`select * from akadze.jobs where id = ${id}`;
  return r as unknown as Row;
}

/** An error entry the database stored: short, well-formed text. */
function assertStorableEntry(entry: Entry, what: string): void {
  assert(typeof entry.error === "string" && entry.error.length > 0, `${what}: name`);
  assert(entry.error.length <= 200, `${what}: name length ${entry.error.length}`);
  assert(typeof entry.message === "string", `${what}: message`);
  assert(entry.message.length <= 500, `${what}: message length ${entry.message.length}`);
  assert(entry.message.isWellFormed() && entry.error.isWellFormed(), `${what}: well-formed`);
  assert(!entry.message.includes("\u0000"), `${what}: NUL`);
}

/** A Proxy on which every operation throws. */
function hostileProxy<T extends object>(target: T): T {
  return new Proxy(
    target,
    new Proxy({}, {
      get: () => () => {
        throw new Error("trap");
      },
    }),
  );
}

Deno.test("an outcome that could not be stored no longer re-runs forever: each case fails after one run", async () => {
  await withApp("hostile_repro", async (app, sql) => {
    let runs = 0;
    const surrogate = app.task("surrogate", { maxAttempts: 1 }, () => {
      runs++;
      // The emoji straddles the cut: half a surrogate pair is no text PostgreSQL stores.
      throw new Error("a".repeat(498) + "😀" + "and more");
    });
    const snooze = app.task("snooze", { maxAttempts: 1 }, () => {
      runs++;
      throw new Snooze(1e16);
    });
    const key = app.task("key", { maxAttempts: 1 }, () => {
      runs++;
      return { ["😀".repeat(300)]: undefined };
    });
    const ids = [await surrogate.enqueue(), await snooze.enqueue(), await key.enqueue()];
    const worker = startWorker(app);
    try {
      const rows = [];
      for (const id of ids) rows.push(await finishedOrRerun(sql, id));
      assertEquals(rows.map((r) => [r.state, r.attempt, r.run_count]), [
        ["failed", 1, 1],
        ["failed", 1, 1],
        ["failed", 1, 1],
      ]);
      assertEquals(runs, 3);
      const [a, b, c] = rows.map((r) => r.errors);
      assertEquals(a[0].error, "Error");
      assertEquals(a[0].message, "a".repeat(498) + "…");
      assertEquals(b[0].error, "InvalidDelay");
      assertMatch(b[0].message, /Snooze delay must be .*, got 10000000000000000/);
      assertEquals(c[0].error, "ResultNotStorable");
      for (const [i, errors] of [a, b, c].entries()) assertStorableEntry(errors[0], `job ${i}`);
    } finally {
      const exit = await worker.stop();
      assertEquals(exit.code, 0, exit.message);
    }
  });
});

Deno.test("odd things thrown: the worker survives and each job fails after its one attempt", async () => {
  await withApp("hostile_throws", async (app, sql) => {
    const cyclic = new Error("loop");
    cyclic.cause = cyclic;
    const throwing = () => {
      throw new Error("no");
    };
    const cases: [string, () => unknown][] = [
      ["null", () => {
        throw null;
      }],
      ["undefined", () => {
        throw undefined;
      }],
      ["string", () => {
        throw "a plain string";
      }],
      ["number", () => {
        throw 42;
      }],
      ["bigint", () => {
        throw 10n;
      }],
      ["symbol", () => {
        throw Symbol("odd");
      }],
      ["function", () => {
        throw throwing;
      }],
      ["frozen object", () => {
        throw Object.freeze({ code: 1 });
      }],
      ["null-prototype object", () => {
        throw Object.create(null);
      }],
      ["toString throws", () => {
        throw { toString: throwing };
      }],
      ["message getter throws", () => {
        throw Object.defineProperty(new Error("x"), "message", { get: throwing });
      }],
      ["name getter throws", () => {
        throw Object.defineProperty(new Error("x"), "name", { get: throwing });
      }],
      ["huge name", () => {
        throw Object.assign(new Error("x"), { name: "N".repeat(100_000) });
      }],
      ["non-string name", () => {
        throw Object.assign(new Error("x"), { name: { nested: true } });
      }],
      ["non-string message", () => {
        throw Object.assign(new Error(), { message: { nested: true } });
      }],
      ["proxy", () => {
        throw hostileProxy({});
      }],
      ["proxy of an Error", () => {
        throw hostileProxy(new Error("x"));
      }],
      ["async proxy", async () => {
        await null;
        throw hostileProxy(new Error("x"));
      }],
      ["aggregate", () => {
        throw new AggregateError([new Error("a"), null], "several");
      }],
      ["cyclic cause", () => {
        throw cyclic;
      }],
      ["huge message", () => {
        throw new Error("😀".repeat(100_000));
      }],
      ["megabyte of letters", () => {
        throw new Error("x".repeat(1_000_000));
      }],
      ["lone surrogate and NUL", () => {
        throw new Error("bad \ud800 and \u0000 text");
      }],
      ["rejected null", () => Promise.reject(null)],
      ["thenable whose then throws", () => ({ then: throwing })],
    ];
    const ids = new Map<string, string>();
    for (const [name, handler] of cases) {
      const task = app.task(name.replaceAll(" ", "_"), { maxAttempts: 1 }, handler);
      ids.set(name, await task.enqueue());
    }
    const fine = app.task("fine", () => "ok");
    const worker = startWorker(app, { slots: 4 });
    try {
      for (const [name, id] of ids) {
        const r = await finishedOrRerun(sql, id);
        assertEquals([r.state, r.attempt, r.run_count], ["failed", 1, 1], name);
        assertEquals(r.errors.length, 1, name);
        assertStorableEntry(r.errors[0], name);
      }
      const okId = await fine.enqueue();
      assertEquals((await finishedOrRerun(sql, okId)).state, "succeeded");
    } finally {
      const exit = await worker.stop();
      assertEquals(exit.code, 0, exit.message);
    }
    const messages = new Map<string, Entry>();
    for (const [name, id] of ids) messages.set(name, (await row(sql, id)).errors[0]);
    assertEquals(messages.get("null")!.message, "non-Error thrown: null");
    assertEquals(messages.get("symbol")!.message, "non-Error thrown: Symbol(odd)");
    assertEquals(messages.get("huge name")!.error, "N".repeat(199) + "…");
    assertEquals(messages.get("non-string name")!.error, "Error");
    assertEquals(messages.get("aggregate")!.error, "AggregateError");
    assertEquals(messages.get("lone surrogate and NUL")!.message, "bad \ufffd and  text");
  });
});

Deno.test("Retry and Snooze with an unusable delay spend an attempt with a clear error; a bad backoff falls back to the default", async () => {
  await withApp("hostile_delays", async (app, sql) => {
    const delays = [NaN, -1, Infinity, 1e16, "5" as unknown as number];
    const ids: [string, string][] = [];
    for (const [i, delay] of delays.entries()) {
      const snooze = app.task(`snooze${i}`, { maxAttempts: 1 }, () => {
        throw new Snooze(delay);
      });
      const retry = app.task(`retry${i}`, { maxAttempts: 2 }, () => {
        throw new Retry({ delay });
      });
      ids.push([`Snooze ${delay}`, await snooze.enqueue()]);
      ids.push([`Retry ${delay}`, await retry.enqueue()]);
    }
    const backoffs: [string, () => number][] = [
      ["throws", () => {
        throw new Error("backoff bug");
      }],
      ["NaN", () => NaN],
      ["huge", () => 1e16],
      ["negative", () => -5],
    ];
    for (const [name, backoff] of backoffs) {
      const task = app.task(`backoff_${name}`, { maxAttempts: 2, backoff }, () => {
        throw new Error("x");
      });
      ids.push([`backoff ${name}`, await task.enqueue()]);
    }
    await drain(app);
    for (const [what, id] of ids) {
      const r = await row(sql, id);
      const wait = (r.run_at as Date).getTime() - Date.now();
      if (what.startsWith("Snooze")) {
        assertEquals([r.state, r.attempt, r.snoozes, r.run_count], ["failed", 1, 0, 1], what);
      } else {
        assertEquals([r.state, r.attempt, r.run_count], ["queued", 1, 1], what);
        assert(wait < 2_000, `${what}: the default backoff, not ${wait} ms`);
      }
      if (!what.startsWith("backoff")) {
        assertEquals(r.errors[0].error, "InvalidDelay", what);
        assertMatch(r.errors[0].message, /delay must be a number of milliseconds from 0 to/);
      }
    }
  });
});

Deno.test("results that cannot be stored fail at once, even ones that change between reads", async () => {
  await withApp("hostile_results", async (app, sql) => {
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    let reads = 0;
    const cases: [string, () => unknown][] = [
      ["bigint", () => ({ n: 1n })],
      ["top-level bigint", () => 1n],
      ["cycle", () => cycle],
      ["huge key", () => ({ ["k".repeat(10_000)]: undefined })],
      ["lone surrogate", () => "\ud800"],
      ["NUL", () => ({ s: "a\u0000b" })],
      ["getter throws", () => ({
        get x() {
          throw new Error("no");
        },
      })],
      ["proxy", () => hostileProxy({})],
      ["then getter throws", () =>
        Object.defineProperty({}, "then", {
          get() {
            throw new Error("no");
          },
          enumerable: true,
        })],
      // Checked once, then read again to be written: the database refuses the second value.
      ["lone surrogate on the second read", () => ({
        get x() {
          return reads++ === 0 ? "fine" : "\ud800";
        },
      })],
    ];
    const ids = new Map<string, string>();
    for (const [name, handler] of cases) {
      const task = app.task(name.replaceAll(" ", "_"), { maxAttempts: 3 }, handler);
      ids.set(name, await task.enqueue());
    }
    const worker = startWorker(app, { slots: 2 });
    try {
      for (const [name, id] of ids) {
        const r = await finishedOrRerun(sql, id);
        assertEquals([r.state, r.attempt, r.run_count, r.result], ["failed", 1, 1, null], name);
        assertEquals(r.errors.map((e) => e.error), ["ResultNotStorable"], name);
        assertStorableEntry(r.errors[0], name);
      }
      // Refused by the database itself, after the check: the worker's last line of defence.
      const late = await row(sql, ids.get("lone surrogate on the second read")!);
      assertMatch(late.errors[0].message, /result was refused by the database \(SQLSTATE 22/);
    } finally {
      assertEquals((await worker.stop()).code, 0);
    }
  });
});

Deno.test("an outcome the database refuses is written as failed with a fixed error, attempt spent", async () => {
  await withApp("hostile_refused", async (app, sql) => {
    const task = app.task("t", { maxAttempts: 5 }, () => {});
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push(await task.enqueue());
    await sql`update akadze.jobs set state = 'running', run_count = 1, worker_id = 'w',
                started_at = now()`;
    const completer = new Completer(app.sql, "akadze", []);
    // Values no part of akadze makes any more, but a write must survive all the same.
    const refused = [
      { id: ids[0], runCount: 1, kind: "retry" as const, delayMs: 1e16 },
      { id: ids[1], runCount: 1, kind: "fail" as const, error: { error: "E", message: "\ud800" } },
      { id: ids[2], runCount: 1, kind: "snooze" as const, delayMs: 1e16 },
    ];
    for (const outcome of refused) {
      const error = await completer.write([outcome]).then(() => null, (e) => e);
      assert(error !== null, "the database refuses it");
      const fallback = unstorableOutcome(outcome, error);
      assert(fallback !== null);
      assertEquals((await completer.write([fallback])).written.length, 1);
      const fallbackError = await completer.write([fallback]).then(() => null, (e) => e);
      assertEquals(unstorableOutcome(fallback, fallbackError ?? new Error("x")), null);
    }
    const rows = await sql`select state, attempt, errors from akadze.jobs order by id`;
    for (const r of rows) {
      assertEquals([r.state, r.attempt], ["failed", 1]);
      assertEquals(r.errors[0].error, "OutcomeNotStorable");
      assertMatch(r.errors[0].message, /SQLSTATE 22/);
    }
    // A release carries no values: refusing it is not the outcome's fault.
    const release = { id: ids[0], runCount: 1, kind: "release" as const };
    assertEquals(
      unstorableOutcome(release, Object.assign(new Error("x"), { code: "22P05" })),
      null,
    );
  });
});

const CARD = "4111-CARD-0000-1234";
const OTHER_CARD = "5500-OTHER-9999-0001";
const PASSWORD = "s3cret-db-pass";
/** What the "driver derived" task sends to the database: only the masking of quoted input hides it. */
const DERIVED = CARD.replaceAll("-", "");
const SECRETS = [CARD, OTHER_CARD, PASSWORD, DERIVED];

Deno.test("argument values and the password never reach a stored error, jobs show or a log line", async () => {
  const records = await withLogs(() =>
    withDatabase("hostile_secrets", async (db, sql) => {
      // Trust authentication ignores the password; the app still knows it and must hide it.
      const url = new URL(db.url);
      url.password = PASSWORD;
      const app = new Akadze({ databaseUrl: url.toString() });
      try {
        await leakingJobs(app, sql, db.url);
      } finally {
        await app.close();
      }
    })
  );
  const logged = records.map((r) => JSON.stringify([r.message, r.properties], safeJson));
  assert(logged.length > 0);
  for (const line of logged) {
    for (const secret of SECRETS) {
      assert(!line.includes(secret), `a log record shows ${secret}: ${line}`);
    }
  }
});

function safeJson(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? String(value) : value;
}

async function leakingJobs(app: Akadze, sql: Sql, cliUrl: string): Promise<void> {
  const card = v.object({ card: v.string() });
  const follow = app.task("follow", { args: v.object({ card: v.number() }) }, () => {});
  const handlers: [string, (args: { card: string }) => unknown][] = [
    ["message", ({ card }) => {
      throw new Error(`charge failed for ${card} (login ${PASSWORD})`);
    }],
    ["name", ({ card }) => {
      throw Object.assign(new Error("x"), { name: `Card${card}` });
    }],
    ["driver", async ({ card }) => await app.sql`select ${card}::int`],
    ["driver derived", async ({ card }) => await app.sql`select ${card.replaceAll("-", "")}::int`],
    ["fail", ({ card }) => {
      throw new Fail(`declined: ${card}`);
    }],
    ["cancel", ({ card }) => {
      throw new Cancel(`withdrawn: ${card}`);
    }],
    ["follow-up", async () => await follow.enqueue({ card: OTHER_CARD as unknown as number })],
    ["result key", ({ card }) => ({ [card]: undefined })],
    ["thrown string", ({ card }) => {
      throw `card ${card}`;
    }],
  ];
  const ids: string[] = [];
  for (const [name, handler] of handlers) {
    const task = app.task(name.replaceAll(" ", "_"), { args: card, maxAttempts: 1 }, handler);
    ids.push(await task.enqueue({ card: CARD }));
  }
  // A deploy changed the schema under a stored job: the run-time check quotes the value.
  const drifted = app.task("drifted", { args: v.object({ card: v.number() }) }, () => {});
  const [{ id: driftId }] = await sql`
    insert into akadze.jobs (task, queue, args, max_attempts)
    values (${drifted.name}, 'default', ${sql.json({ card: CARD })}, 1) returning id::text as id`;
  ids.push(driftId);
  // The enqueue error the caller sees does not quote the value either.
  const refused = await follow.enqueue({ card: OTHER_CARD as unknown as number })
    .then(() => null, (e: Error) => e.message);
  assert(refused !== null && refused.includes("card"), String(refused));
  assert(!refused.includes(OTHER_CARD), refused);

  await drain(app);
  const rows = await sql`select id::text as id, task, state, errors from akadze.jobs
                          where id = any(${ids}::bigint[]) order by id`;
  assertEquals(rows.length, ids.length);
  const stored = new Map(rows.map((r) => [r.task, r.errors[0].message]));
  assertEquals(stored.get("message"), "charge failed for *** (login ***)");
  assertEquals(stored.get("driver"), 'invalid input syntax for type integer: "***"');
  assertEquals(stored.get("driver_derived"), 'invalid input syntax for type integer: "***"');
  assertMatch(stored.get("follow-up"), /card: Invalid type: Expected number but received \*\*\*$/);
  assertMatch(stored.get("drifted"), /card: Invalid type: Expected number but received \*\*\*$/);
  for (const r of rows) {
    assert(r.state === "failed" || r.state === "cancelled", `${r.id}: ${r.state}`);
    const text = JSON.stringify(r.errors);
    for (const secret of SECRETS) {
      assert(!text.includes(secret), `job ${r.id} stored ${secret}: ${text}`);
    }
  }
  const env = { AKADZE_DATABASE_URL: cliUrl };
  for (let i = 0; i < ids.length; i += 4) {
    const outs = await Promise.all(
      ids.slice(i, i + 4).flatMap((id) => [
        runCli(["jobs", "show", id], env),
        runCli(["jobs", "show", id, "--json"], env),
      ]),
    );
    for (const out of outs) {
      assertEquals(out.code, 0, out.stderr);
      assert(out.stdout.includes("error"), out.stdout);
      for (const secret of SECRETS) {
        assert(!out.stdout.includes(secret), `jobs show printed ${secret}: ${out.stdout}`);
      }
    }
  }
}

Deno.test("an error entry never throws and never keeps a secret, whatever was thrown", () => {
  const secrets = ["4111-CARD"];
  const odd: unknown[] = [
    null,
    undefined,
    hostileProxy({}),
    hostileProxy(new Error("x")),
    Object.defineProperty(new Error("4111-CARD"), "name", {
      get() {
        throw new Error("no");
      },
    }),
    { message: "plain object 4111-CARD", name: "Plain" },
    Object.assign(new Error('invalid input syntax for type integer: "abc"def"'), {
      code: "22P02",
    }),
  ];
  for (const thrown of odd) {
    const entry = errorEntry(thrown, secrets);
    assertStorableEntry({ ...entry, at: "" }, String(typeof thrown));
    assert(!JSON.stringify(entry).includes("4111-CARD"), JSON.stringify(entry));
  }
  assertEquals(errorEntry(odd[5], secrets), { error: "Plain", message: "plain object ***" });
  assertEquals(errorEntry(odd[6], secrets).message, 'invalid input syntax for type integer: "***"');
  // What the worker logs about a database error (or a hook's) never throws either.
  assertEquals(describeError(odd[2]), "an error that cannot be described");
  assertEquals(describeError(odd[6]), 'invalid input syntax for type integer: "***" (22P02)');
});

Deno.test("jobs show hides argument values in errors stored by an older version unless --args is given", async () => {
  await withDatabase("hostile_show_old", async (db, sql) => {
    const errors = [{
      error: `Card${CARD}`,
      message: `declined ${CARD}`,
      at: "2030-01-01T00:00:00Z",
    }];
    const [{ id }] = await sql`
      insert into akadze.jobs (task, queue, state, attempt, max_attempts, args, errors,
                               finished_at, run_count, started_at)
      values ('pay', 'default', 'failed', 1, 1, ${sql.json({ card: CARD })},
              ${sql.json(errors)}, now(), 1, now())
      returning id::text as id`;
    const env = { AKADZE_DATABASE_URL: db.url };
    const [text, json, full] = await Promise.all([
      runCli(["jobs", "show", id], env),
      runCli(["jobs", "show", id, "--json"], env),
      runCli(["jobs", "show", id, "--args"], env),
    ]);
    assert(text.stdout.includes("Card***: declined ***"), text.stdout);
    assert(!text.stdout.includes(CARD), text.stdout);
    assertEquals(JSON.parse(json.stdout).errors[0].message, "declined ***");
    assert(full.stdout.includes(`args: {"card":"${CARD}"}`), full.stdout);
  });
});
