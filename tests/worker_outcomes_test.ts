// The outcome of every way a run can end, written fenced on run_count.
import * as v from "valibot";
import { Cancel, Fail, Retry, Snooze } from "../src/errors.ts";
import { Completer } from "../src/worker/completer.ts";
import { defaultBackoff, nextDelay } from "../src/worker/backoff.ts";
import { drain } from "../src/testing.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import {
  type HeldLocks,
  holdLocks,
  startWorker,
  waitFor,
  waitForJob,
  waitForLockWait,
  withApp,
} from "./_helpers.ts";

type Row = Record<string, unknown> & { errors: { error: string; message: string; at: string }[] };

async function job(sql: import("../src/db.ts").Sql, id: string): Promise<Row> {
  const [row] = await sql`select *, extract(epoch from run_at - now())::float8 as wait_s
                          from akadze.jobs where id = ${id}`;
  return row as unknown as Row;
}

Deno.test("a returned value succeeds and is stored as JSON; undefined stores NULL", async () => {
  await withApp("out_success", async (app, sql) => {
    const value = app.task("value", () => ({ ok: true, list: [1, "two", null] }));
    const nothing = app.task("nothing", () => {});
    const a = await value.enqueue();
    const b = await nothing.enqueue();
    await drain(app);
    const ra = await job(sql, a);
    assertEquals([ra.state, ra.result, ra.attempt, ra.run_count], [
      "succeeded",
      {
        ok: true,
        list: [1, "two", null],
      },
      0,
      1,
    ]);
    assert(ra.finished_at instanceof Date && typeof ra.worker_id === "string"); // kept
    const rb = await job(sql, b);
    assertEquals([rb.state, rb.result], ["succeeded", null]);
  });
});

Deno.test("an error spends an attempt and retries with backoff; the last attempt fails", async () => {
  await withApp("out_error", async (app, sql) => {
    let calls = 0;
    const flaky = app.task("flaky", { maxAttempts: 2 }, () => {
      calls++;
      throw new TypeError(`boom ${calls}`);
    });
    const id = await flaky.enqueue();
    await drain(app);
    let row = await job(sql, id);
    assertEquals([row.state, row.attempt, row.run_count], ["queued", 1, 1]);
    assert((row.wait_s as number) > 0.5 && (row.wait_s as number) < 1.5, `backoff ${row.wait_s}`);
    assertEquals(row.errors.map((e) => [e.error, e.message]), [["TypeError", "boom 1"]]);
    await sql`update akadze.jobs set run_at = now() where id = ${id}`;
    await drain(app);
    row = await job(sql, id);
    assertEquals([row.state, row.attempt, row.run_count], ["failed", 2, 2]);
    assertEquals(row.errors.map((e) => e.message), ["boom 1", "boom 2"]);
    assert(row.finished_at instanceof Date);
    assertEquals(calls, 2);
  });
});

Deno.test("Retry spends an attempt with its own delay; Snooze does not spend one", async () => {
  await withApp("out_retry_snooze", async (app, sql) => {
    const retry = app.task("retry", () => {
      throw new Retry({ delay: 60_000 });
    });
    const snooze = app.task("snooze", () => {
      throw new Snooze(30_000);
    });
    const r = await retry.enqueue();
    const s = await snooze.enqueue();
    await drain(app);
    const rr = await job(sql, r);
    assertEquals([rr.state, rr.attempt, rr.snoozes, rr.errors[0].error], ["queued", 1, 0, "Retry"]);
    assert(Math.abs((rr.wait_s as number) - 60) < 2, `retry delay ${rr.wait_s}`);
    const rs = await job(sql, s);
    assertEquals([rs.state, rs.attempt, rs.snoozes, rs.errors], ["queued", 0, 1, []]);
    assert(Math.abs((rs.wait_s as number) - 30) < 2, `snooze delay ${rs.wait_s}`);
  });
});

Deno.test("Fail ends failed now; Cancel ends cancelled without spending an attempt", async () => {
  await withApp("out_fail_cancel", async (app, sql) => {
    const fail = app.task("fail", { maxAttempts: 5 }, () => {
      throw new Fail("user deleted");
    });
    const cancel = app.task("cancel", () => {
      throw new Cancel("order withdrawn");
    });
    const f = await fail.enqueue();
    const c = await cancel.enqueue();
    await drain(app);
    const rf = await job(sql, f);
    assertEquals([rf.state, rf.attempt, rf.errors[0].error, rf.errors[0].message], [
      "failed",
      1,
      "Fail",
      "user deleted",
    ]);
    const rc = await job(sql, c);
    assertEquals([rc.state, rc.attempt, rc.result], ["cancelled", 0, null]);
  });
});

Deno.test("a result that cannot be stored fails at once and the handler is not run again", async () => {
  await withApp("out_unstorable", async (app, sql) => {
    const calls: string[] = [];
    const nul = app.task("nul", { maxAttempts: 5 }, () => {
      calls.push("nul");
      return "a\u0000b";
    });
    const nan = app.task("nan", { maxAttempts: 5 }, () => {
      calls.push("nan");
      return { x: NaN };
    });
    const date = app.task("date", { maxAttempts: 5 }, () => {
      calls.push("date");
      return new Date();
    });
    const ids = [await nul.enqueue(), await nan.enqueue(), await date.enqueue()];
    await drain(app);
    for (const id of ids) {
      const row = await job(sql, id);
      assertEquals([row.state, row.attempt, row.result, row.errors[0].error], [
        "failed",
        1,
        null,
        "ResultNotStorable",
      ]);
    }
    assertEquals(calls.sort(), ["date", "nan", "nul"]);
  });
});

Deno.test("the task's backoff overrides the default; null fails now", async () => {
  await withApp("out_backoff", async (app, sql) => {
    const seen: [number, string][] = [];
    const custom = app.task("custom", {
      maxAttempts: 5,
      backoff: (attempt, error) => {
        seen.push([attempt, (error as Error).message]);
        return 120_000;
      },
    }, () => {
      throw new Error("x");
    });
    const stop = app.task("stop", { maxAttempts: 5, backoff: () => null }, () => {
      throw new Error("permanent");
    });
    const a = await custom.enqueue();
    const b = await stop.enqueue();
    await drain(app);
    const ra = await job(sql, a);
    assertEquals(ra.state, "queued");
    assert(Math.abs((ra.wait_s as number) - 120) < 2);
    assertEquals(seen, [[1, "x"]]);
    const rb = await job(sql, b);
    assertEquals([rb.state, rb.attempt], ["failed", 1]);
  });
});

Deno.test("default backoff doubles from 1 s to a 300 s cap with ±10 % jitter", () => {
  assertEquals(defaultBackoff(1, () => 0.5), 1000);
  assertEquals(defaultBackoff(2, () => 0.5), 2000);
  assertEquals(defaultBackoff(5, () => 0.5), 16000);
  assertEquals(defaultBackoff(30, () => 0.5), 300_000);
  assertEquals(defaultBackoff(1, () => 0), 900);
  assertEquals(defaultBackoff(1, () => 1), 1100);
  // A backoff callback that throws or returns nonsense falls back to the default.
  const d = nextDelay(
    () => {
      throw new Error("bug");
    },
    1,
    null,
  );
  assert(d !== null && d >= 900 && d <= 1100);
  const n = nextDelay(() => -5, 2, null);
  assert(n !== null && n >= 1800 && n <= 2200);
});

Deno.test("error history keeps the last 10 entries, redacted and at most 500 characters", async () => {
  await withApp("out_errors", async (app, sql, db) => {
    const password = new URL(db.url).password || "nopassword";
    const noisy = app.task("noisy", { maxAttempts: 20, backoff: () => 0 }, () => {
      throw new Error(
        `cannot reach postgres://app:hunter2@db/app password=${password} ${"x".repeat(900)}`,
      );
    });
    const id = await noisy.enqueue();
    await drain(app); // backoff 0: every attempt is ready again at once
    const row = await job(sql, id);
    assertEquals([row.state, row.attempt], ["failed", 20]);
    assertEquals(row.errors.length, 10);
    for (const entry of row.errors) {
      assert(!entry.message.includes("hunter2"), entry.message);
      assertMatch(entry.message, /postgres:\/\/app:\*\*\*@db\/app/);
      assert(entry.message.length <= 500, `length ${entry.message.length}`);
      assert(!Number.isNaN(Date.parse(entry.at)));
    }
  });
});

Deno.test("arguments are validated again at run time; a mismatch fails the job at once", async () => {
  await withApp("out_revalidate", async (app, sql) => {
    let calls = 0;
    const typed = app.task("typed", { maxAttempts: 5, args: v.object({ n: v.number() }) }, () => {
      calls++;
    });
    const id = await typed.enqueue({ n: 1 });
    // A deploy changed the payload shape under the job.
    await sql`update akadze.jobs set args = '{"n": "one"}' where id = ${id}`;
    await drain(app);
    const row = await job(sql, id);
    assertEquals([row.state, row.attempt, row.run_count, row.errors.length], ["failed", 1, 1, 1]);
    assertEquals(row.errors[0].error, "InvalidArguments");
    assertMatch(
      row.errors[0].message,
      /^the job's arguments do not match the schema of task "typed": n: /,
    );
    assert(!row.errors[0].message.includes("one"), "no argument value in the error");
    assertEquals(calls, 0);
  });
});

Deno.test("a stale outcome (run_count moved on) is discarded and the row is untouched", async () => {
  await withApp("out_stale", async (app, sql) => {
    const task = app.task("t", () => {});
    const id = await task.enqueue();
    await sql`update akadze.jobs set state = 'running', run_count = 2, worker_id = 'w2',
              started_at = now() where id = ${id}`;
    const completer = new Completer(app.sql, app.schema, []);
    const result = await completer.write([
      { id, runCount: 1, kind: "succeeded", result: "late" },
    ]);
    assertEquals(result.written, []);
    assertEquals(result.stale.map((o) => o.id), [id]);
    const row = await job(sql, id);
    assertEquals([row.state, row.run_count, row.result, row.worker_id], ["running", 2, null, "w2"]);
    const ok = await completer.write([{ id, runCount: 2, kind: "succeeded", result: "now" }]);
    assertEquals(ok.written.map((r) => r.state), ["succeeded"]);
  });
});

Deno.test("one outcome write puts each result, error and delay on its own job, whichever columns the batch leaves empty", async () => {
  await withApp("out_columns", async (app, sql) => {
    const task = app.task("t", { maxAttempts: 3 }, () => {});
    const completer = new Completer(app.sql, app.schema, []);
    async function running(n: number): Promise<string[]> {
      const ids = await task.enqueueMany(Array.from({ length: n }, () => ({})));
      await sql`update akadze.jobs set state = 'running', run_count = 1, worker_id = 'w',
                started_at = now() where id = any(${ids}::bigint[])`;
      return ids;
    }
    const err = (message: string) => ({ error: "E", message });
    // Every column in use, each with nulls between values.
    const [a, b, c, d, e] = await running(5);
    await completer.write([
      { id: a, runCount: 1, kind: "succeeded", result: { n: 1 } },
      { id: b, runCount: 1, kind: "succeeded" },
      { id: c, runCount: 1, kind: "retry", error: err("c"), delayMs: 60_000 },
      { id: d, runCount: 1, kind: "snooze", delayMs: 120_000 },
      { id: e, runCount: 1, kind: "fail", error: err("e") },
    ]);
    // Results only; errors only; delays only; nothing but kinds.
    const [f, g] = await running(2);
    await completer.write([
      { id: f, runCount: 1, kind: "succeeded" },
      { id: g, runCount: 1, kind: "succeeded", result: "g" },
    ]);
    const [h, i] = await running(2);
    await completer.write([
      { id: h, runCount: 1, kind: "fail", error: err("h") },
      { id: i, runCount: 1, kind: "succeeded" },
    ]);
    const [j, k] = await running(2);
    await completer.write([
      { id: j, runCount: 1, kind: "succeeded" },
      { id: k, runCount: 1, kind: "snooze", delayMs: 180_000 },
    ]);
    const [l, m] = await running(2);
    await completer.write([
      { id: l, runCount: 1, kind: "succeeded" },
      { id: m, runCount: 1, kind: "cancel" },
    ]);
    const rows = new Map<string, Row>();
    for (const id of [a, b, c, d, e, f, g, h, i, j, k, l, m]) rows.set(id, await job(sql, id));
    const view = (id: string) => {
      const r = rows.get(id)!;
      return [
        r.state,
        r.result,
        r.errors.map((x) => x.message),
        r.state === "queued" ? Math.round(Number(r.wait_s) / 60) : null,
      ];
    };
    assertEquals(view(a), ["succeeded", { n: 1 }, [], null]);
    assertEquals(view(b), ["succeeded", null, [], null]);
    assertEquals(view(c), ["queued", null, ["c"], 1]);
    assertEquals(view(d), ["queued", null, [], 2]);
    assertEquals(view(e), ["failed", null, ["e"], null]);
    assertEquals(view(f), ["succeeded", null, [], null]);
    assertEquals(view(g), ["succeeded", "g", [], null]);
    assertEquals(view(h), ["failed", null, ["h"], null]);
    assertEquals(view(i), ["succeeded", null, [], null]);
    assertEquals(view(j), ["succeeded", null, [], null]);
    assertEquals(view(k), ["queued", null, [], 3]);
    assertEquals(view(l), ["succeeded", null, [], null]);
    assertEquals(view(m), ["cancelled", null, [], null]);
  });
});

Deno.test("retention 0 deletes a succeeded job as its outcome is written; other outcomes keep their row", async () => {
  await withApp("out_retention0", async (app, sql) => {
    const ok = app.task("ok", () => "done");
    const bad = app.task("bad", () => {
      throw new Fail("no");
    });
    const again = app.task("again", { maxAttempts: 2, backoff: () => 60_000 }, () => {
      throw new Error("later");
    });
    const ids = await ok.enqueueMany([{}, {}, {}]);
    const [failed] = await bad.enqueueMany([{}]);
    const [retried] = await again.enqueueMany([{}]);
    // One batch of succeeded, failed and retried outcomes: the mixed path.
    await drain(app);
    const rows = await sql`select id::text as id, state from akadze.jobs order by id`;
    assertEquals(rows.map((r) => [r.id, r.state]), [[failed, "failed"], [retried, "queued"]]);
    assert(!ids.some((id) => rows.some((r) => r.id === id)));

    // A cancel request on a running job wins over its success: cancelled, row kept.
    const completer = new Completer(app.sql, app.schema, [], { deleteSucceeded: true });
    const [id] = await ok.enqueueMany([{}]);
    await sql`update akadze.jobs set state = 'running', run_count = 1, worker_id = 'w',
              started_at = now(), cancel_requested_at = now() where id = ${id}`;
    const result = await completer.write([{ id, runCount: 1, kind: "succeeded", result: 1 }]);
    assertEquals(result.written.map((r) => [r.id, r.state]), [[id, "cancelled"]]);
    // One statement pair for a mixed batch: the success deleted, the failure written.
    const [a, b] = await ok.enqueueMany([{}, {}]);
    await sql`update akadze.jobs set state = 'running', run_count = 1, worker_id = 'w',
              started_at = now() where id in (${a}, ${b})`;
    const mixed = await completer.write([
      { id: a, runCount: 1, kind: "succeeded" },
      { id: b, runCount: 1, kind: "fail", error: { error: "E", message: "m" } },
    ]);
    assertEquals(mixed.written.map((r) => [r.id, r.state]), [[a, "succeeded"], [b, "failed"]]);
    const left = await sql`select id::text as id from akadze.jobs where id in (${a}, ${b})`;
    assertEquals(left.map((r) => r.id), [b]);
    // A stale run deletes nothing.
    const [other] = await ok.enqueueMany([{}]);
    await sql`update akadze.jobs set state = 'running', run_count = 2, worker_id = 'w2',
              started_at = now() where id = ${other}`;
    const stale = await completer.write([{ id: other, runCount: 1, kind: "succeeded" }]);
    assertEquals([stale.written, stale.stale.map((o) => o.id)], [[], [other]]);
    assertEquals((await job(sql, other)).state, "running");
  }, { retention: 0 });
});

Deno.test("control exceptions from another copy of akadze are recognised by their brand", async () => {
  await withApp("out_brand", async (app, sql) => {
    // What a Snooze made by a second copy of the library looks like to this worker.
    const foreign = Object.defineProperty(
      Object.assign(new Error("snooze 45000 ms"), { name: "Snooze", delay: 45_000 }),
      Symbol.for("akadze.control"),
      { value: "Snooze" },
    );
    const t = app.task("t", () => {
      throw foreign;
    });
    const id = await t.enqueue();
    await drain(app);
    const row = await job(sql, id);
    assertEquals([row.state, row.attempt, row.snoozes], ["queued", 0, 1]);
  });
});

Deno.test("a stalled outcome write stops the claiming near twice the slots; nothing is lost", async () => {
  await withApp("out_write_room", async (app, sql, db) => {
    let openGate!: () => void;
    const gate = new Promise<void>((r) => openGate = r);
    let calls = 0;
    const work = app.task("work", async ({ i }) => {
      calls++;
      if (i === 0) await gate;
    });
    const first = await work.enqueue({ i: 0 });
    const slots = 2;
    const w = startWorker(app, { slots });
    let held: HeldLocks | null = null;
    try {
      await waitForJob(sql, first, (r) => r.state === "running", "the first job to run");
      // Another transaction holds the first job's row: its outcome write will wait for it.
      held = await holdLocks(
        db.url,
        (tx) => tx`select 1 from akadze.jobs where id = ${first} for update`,
      );
      openGate();
      await waitForLockWait(sql, "the outcome write to wait for the row lock");

      await work.enqueueMany(Array.from({ length: 30 }, (_, k) => ({ i: k + 1 })));
      const counts = async () =>
        Object.fromEntries(
          (await sql`select state, count(*)::int as n from akadze.jobs group by state`)
            .map((r) => [r.state, r.n]),
        ) as Record<string, number>;
      await waitFor(async () => (await counts()).running >= 2 * slots, "claims after the stall");
      // Several poll intervals and NOTIFYs later, the worker still claims no more: at most
      // twice its slots of runs wait for their write (plus what one claim took meanwhile).
      await new Promise((r) => setTimeout(r, 1_000));
      const stalled = await counts();
      assert(stalled.running <= 3 * slots, `claimed on: ${JSON.stringify(stalled)}`);
      assert(stalled.queued >= 31 - 3 * slots, JSON.stringify(stalled));
      assertEquals(calls, stalled.running);

      await held.release();
      held = null;
      await waitFor(async () => (await counts()).succeeded === 31, "every job to succeed");
      assertEquals(calls, 31);
    } finally {
      await held?.release();
      await w.stop();
    }
  });
});
