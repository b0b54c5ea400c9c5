// The batch completer driven directly through runOnce: batching, splitting, unstorable
// results, outcomes whose onTransition hook rolled back, and the hand-off of kept slots.
import { BatchCompleter } from "../src/worker/batch_completer.ts";
import type { Sql } from "../src/db.ts";
import { assertEquals, assertThrows } from "./assert.ts";
import { withApp, withLogs } from "./_helpers.ts";

/** `n` jobs running under worker w1 with run_count 1. */
async function running(sql: Sql, n: number): Promise<string[]> {
  const rows = await sql`insert into akadze.jobs (task, state, worker_id, run_count, started_at)
                         select 't', 'running', 'w1', 1, now() from generate_series(1, ${n})
                         returning id::text as id`;
  return rows.map((r) => r.id as string);
}

const job = { task: "t", queue: "default", attempt: 0, max_attempts: 3 };

Deno.test("outcomes queued in one turn are written together; a stale run's is discarded", async () => {
  await withApp("bc_batch", async (app, sql) => {
    const settled: string[] = [];
    const completer = new BatchCompleter(app.sql, {
      schema: app.schema,
      hooks: [],
      onSettled: (id) => settled.push(id),
    });
    const [a, b, c] = await running(sql, 3);
    completer.complete({ id: a, runCount: 1, kind: "succeeded", result: { ok: 1 } }, job);
    completer.complete({ id: b, runCount: 1, kind: "snooze", delayMs: 60_000 }, job);
    completer.complete({ id: c, runCount: 7, kind: "succeeded", result: null }, job);
    assertEquals(completer.unwritten, 3);
    const written = completer.untilAllWritten();
    assertEquals(await completer.runOnce(), {
      written: 2,
      discarded: 1,
      unstorable: 0,
      failed: 0,
      rolledBack: 0,
      split: 0,
    });
    await written;
    assertEquals([completer.unwritten, settled.sort()], [0, [a, b, c].sort()]);
    const rows = await sql`select id::text as id, state from akadze.jobs order by id`;
    assertEquals(rows.map((r) => r.state), ["succeeded", "queued", "running"]);
  });
});

Deno.test("a batch the database refuses is split: the others are written, the refused result ends the job", async () => {
  await withApp("bc_split", async (app, sql) => {
    const completer = new BatchCompleter(app.sql, { schema: app.schema, hooks: [] });
    const [good, bad, other] = await running(sql, 3);
    const records = await withLogs(async () => {
      completer.complete({ id: good, runCount: 1, kind: "succeeded", result: 1 }, job);
      // A lone surrogate: valid JavaScript, refused by jsonb (SQLSTATE class 22).
      completer.complete({ id: bad, runCount: 1, kind: "succeeded", result: "\ud800" }, job);
      completer.complete({ id: other, runCount: 1, kind: "succeeded", result: 2 }, job);
      assertEquals(await completer.runOnce(), {
        written: 3,
        discarded: 0,
        unstorable: 1,
        failed: 0,
        rolledBack: 0,
        split: 1,
      });
    });
    const rows = await sql`select id::text as id, state, result, errors from akadze.jobs
                            order by id`;
    assertEquals(rows.map((r) => [r.state, r.result]), [
      ["succeeded", 1],
      ["failed", null],
      ["succeeded", 2],
    ]);
    assertEquals(rows[1].errors[0].error, "ResultNotStorable");
    const events = records.map((r) => r.properties.event);
    assertEquals(events.filter((e) => e === "outcome_not_storable").length, 1);
    assertEquals(events.filter((e) => e === "job_failed").length, 1);
  });
});

Deno.test("an outcome whose onTransition hook fails is written again; an orphan release is fenced", async () => {
  await withApp("bc_rolled_back", async (app, sql) => {
    let failures = 1;
    const completer = new BatchCompleter(app.sql, {
      schema: app.schema,
      rolledBackRetry: 0,
      hooks: [() => {
        if (failures-- > 0) throw new Error("not yet");
      }],
    });
    const [a, orphan] = await running(sql, 2);
    completer.complete({ id: a, runCount: 1, kind: "succeeded", result: null }, job);
    completer.release([{ id: orphan, runCount: 1 }, { id: orphan, runCount: 1 }]);
    const counts = await completer.runOnce();
    assertEquals([counts.written, counts.rolledBack], [2, 1]);
    const rows = await sql`select state, attempt from akadze.jobs order by id`;
    assertEquals(rows.map((r) => [r.state, r.attempt]), [["succeeded", 0], ["queued", 0]]);
    assertThrows(() => new BatchCompleter(app.sql, { schema: "akadze", hooks: [], batchSize: 0 }));
  });
});

Deno.test("a keyed success hands its key's next job over, and wakes no claim for the place it took", async () => {
  await withApp("bc_key_hand_off", async (app, sql) => {
    const handOffs: { handed: string[]; keyed: boolean }[] = [];
    const freed: string[][] = [];
    let keyed = false;
    const completer = new BatchCompleter(app.sql, {
      schema: app.schema,
      hooks: [],
      offer: (queues, anyKeyed) => {
        keyed = anyKeyed;
        return {
          workerId: "w1",
          requests: [{ queue: "default", slots: queues.length }],
          total: queues.length,
          tasks: ["t"],
          keys: anyKeyed,
        };
      },
      onHandOff: (_queues, handed) => handOffs.push({ handed: handed.map((r) => r.id), keyed }),
      onLimitFreed: (queues) => freed.push(queues),
    });
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    const [a, b] = (await sql`insert into akadze.jobs (task, limit_key)
      values ('t', 'k'), ('t', 'k') returning id::text as id`).map((r) => r.id as string);
    await sql`update akadze.jobs set state = 'running', worker_id = 'w1', run_count = 1,
      started_at = now() where id = ${a}`;
    completer.complete({ id: a, runCount: 1, kind: "succeeded" }, { ...job, limit_key: "k" }, true);
    await completer.runOnce();
    assertEquals(handOffs, [{ handed: [b], keyed: true }]);
    assertEquals(freed, [], "the place went to b: no claim to wake");
    // b's success: nothing left to hand, so its place wakes the claims.
    completer.complete({ id: b, runCount: 1, kind: "succeeded" }, { ...job, limit_key: "k" }, true);
    await completer.runOnce();
    assertEquals(handOffs[1], { handed: [], keyed: true });
    assertEquals(freed, [["default"]]);
  });
});

Deno.test("a write of a success that kept its slot hands the dependent over; a failed try that offered slots reports a hand-off possibly lost", async () => {
  await withApp("bc_hand_off", async (app, sql) => {
    const handOffs: { queues: string[]; handed: string[]; lost: boolean }[] = [];
    const completer = new BatchCompleter(app.sql, {
      schema: app.schema,
      hooks: [],
      offer: (queues) => ({
        workerId: "w1",
        requests: [{ queue: "default", slots: queues.length }],
        total: queues.length,
        tasks: ["t"],
      }),
      onHandOff: (queues, handed, lost) =>
        handOffs.push({ queues, handed: handed.map((r) => r.id), lost }),
    });
    const chain = async () => {
      const steps = await sql`select step, id::text as id from akadze.enqueue_flow(${
        JSON.stringify([{ name: "a", task: "t" }, { name: "b", task: "t", depends_on: ["a"] }])
      }::text::jsonb)`;
      const ids = Object.fromEntries(steps.map((s) => [s.step, s.id]));
      const [a] = await sql`select id, run_count from akadze.claim_one('default', '{t}', 1,
        '{}', 'w1')`;
      assertEquals(a.id, ids.a);
      return ids;
    };
    const first = await chain();
    completer.complete({ id: first.a, runCount: 1, kind: "succeeded" }, job, true);
    await completer.runOnce();
    assertEquals(handOffs, [{ queues: ["default"], handed: [first.b], lost: false }]);
    const [b] = await sql`select state, worker_id, run_count from akadze.jobs
      where id = ${first.b}`;
    assertEquals([b.state, b.worker_id, b.run_count], ["running", "w1", 1]);
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now()
      where id = ${first.b}`;

    // The first try commits, then its reply is lost: the retry finds the outcome written.
    const second = await chain();
    const write = completer.writer.write.bind(completer.writer);
    let tries = 0;
    completer.writer.write = async (outcomes, offer) => {
      const result = await write(outcomes, offer);
      if (++tries === 1) throw Object.assign(new Error("connection lost"), { code: "08006" });
      return result;
    };
    completer.complete({ id: second.a, runCount: 1, kind: "succeeded" }, job, true);
    const counts = await completer.runOnce();
    assertEquals([counts.written, counts.discarded], [0, 1]);
    assertEquals(handOffs[1], { queues: ["default"], handed: [], lost: true });
    const [orphan] = await sql`select state, worker_id from akadze.jobs where id = ${second.b}`;
    assertEquals([orphan.state, orphan.worker_id], ["running", "w1"]);
  });
});

Deno.test("after a job with dependents is written, its task's batches take the full write; both settle the dependent", async () => {
  await withApp("bc_plain_learns", async (app, sql) => {
    const completer = new BatchCompleter(app.sql, { schema: app.schema, hooks: [] });
    const steps = await sql`select step, id::text as id from akadze.enqueue_flow(${
      JSON.stringify([
        { name: "a1", task: "t" },
        { name: "a2", task: "t" },
        { name: "j", task: "t", depends_on: ["a1", "a2"] },
      ])
    }::text::jsonb)`;
    const ids = Object.fromEntries(steps.map((s) => [s.step, s.id]));
    await sql`update akadze.jobs set state = 'running', worker_id = 'w1', run_count = 1,
      started_at = now() where id in (${ids.a1}, ${ids.a2})`;
    const plain: (boolean | undefined)[] = [];
    const write = completer.writer.write.bind(completer.writer);
    completer.writer.write = (outcomes, offer, options) => {
      plain.push(options?.plain);
      return write(outcomes, offer, options);
    };
    const state = async () =>
      (await sql`select state from akadze.jobs where id = ${ids.j}`)[0].state;
    completer.complete({ id: ids.a1, runCount: 1, kind: "succeeded" }, job);
    await completer.runOnce();
    assertEquals(await state(), "waiting");
    completer.complete({ id: ids.a2, runCount: 1, kind: "succeeded" }, job);
    await completer.runOnce();
    assertEquals(plain, [true, false]);
    assertEquals(await state(), "queued");
  });
});
