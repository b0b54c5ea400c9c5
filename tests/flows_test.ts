// Flows against real PostgreSQL: steps that wait for their dependencies, promotion in the
// transaction of the last dependency's outcome, each failure policy, cancellation down the
// flow, requeue reviving cancelled dependents, results read by dependents, bad flows refused
// with nothing inserted, the SQL function, and siblings finishing together across workers.
import pg from "pg";
import type { Akadze } from "../src/app.ts";
import { requestCancel, requeue } from "../src/admin/jobs.ts";
import type { Sql } from "../src/db.ts";
import { DuplicateJob, EnqueueError, Fail, JobNotFound } from "../src/errors.ts";
import { chain, chord, dependencyOrder, group } from "../src/flow.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals, assertMatch, assertRejects } from "./assert.ts";
import { countJobs, startWorker, waitFor, withApp } from "./_helpers.ts";

async function states(sql: Sql, ids: Record<string, string>): Promise<Record<string, string>> {
  const rows = await sql`select id::text as id, state from akadze.jobs
    where id = any(${Object.values(ids)}::bigint[])`;
  const byId = new Map(rows.map((r) => [r.id as string, r.state as string]));
  return Object.fromEntries(Object.entries(ids).map(([name, id]) => [name, byId.get(id)!]));
}

async function lastError(sql: Sql, id: string): Promise<Record<string, string>> {
  const [row] = await sql`select errors -> -1 as e from akadze.jobs where id = ${id}`;
  return row.e as Record<string, string>;
}

/** Run every ready job (and the ones they release) until none is left. */
async function drain(app: Akadze): Promise<void> {
  const exit = await new Worker(app, { batch: true, pollInterval: 50 }).run();
  assertEquals(exit.reason, "batch_done");
}

Deno.test("a step waits for its dependencies and runs after they succeed, reading their results", async () => {
  await withApp("flows_chain", async (app, sql) => {
    const order: string[] = [];
    const fetch = app.task("fetch", ({ url }) => {
      order.push("fetch");
      return { body: `page of ${url}` };
    });
    const size = app.task("size", async (_args, ctx) => {
      order.push("size");
      const page = await ctx.resultOf(fetch);
      return page.body.length;
    });
    const report = app.task("report", async (_args, ctx) => {
      order.push("report");
      const deps = await ctx.dependencies();
      return { size: deps.size.result, fetched: deps.fetch.state, keys: Object.keys(deps) };
    });
    const flow = await app.enqueueFlow({
      fetch: { task: fetch, args: { url: "x" } },
      size: { task: size, dependsOn: ["fetch"] },
      report: { task: report, dependsOn: ["size", "fetch"] },
    });
    assertEquals(flow.id, flow.jobs.fetch);
    assertEquals(await states(sql, flow.jobs), {
      fetch: "queued",
      size: "waiting",
      report: "waiting",
    });
    await drain(app);
    assertEquals(order, ["fetch", "size", "report"]);
    const [row] = await sql`select result, flow_id::text as flow, step from akadze.jobs
      where id = ${flow.jobs.report}`;
    assertEquals(row.result, { size: 9, fetched: "succeeded", keys: ["fetch", "size"] });
    assertEquals([row.flow, row.step], [flow.id, "report"]);
  });
});

Deno.test("a fan-in step is queued exactly once, when its last dependency finishes", async () => {
  await withApp("flows_fanin", async (app, sql) => {
    const part = app.task("part", ({ i }) => i);
    const sum = app.task("sum", async (_args, ctx) => {
      const deps = await ctx.dependencies();
      return Object.values(deps).reduce((a, d) => a + (d.result as number), 0);
    });
    const steps: Record<string, Parameters<Akadze["enqueueFlow"]>[0][string]> = {};
    for (let i = 0; i < 50; i++) steps[`p${i}`] = { task: part, args: { i } };
    steps.sum = { task: sum, dependsOn: Object.keys(steps) };
    const flow = await app.enqueueFlow(steps);
    const [{ pending }] = await sql`select pending_deps as pending from akadze.jobs
      where id = ${flow.jobs.sum}`;
    assertEquals(pending, 50);
    await drain(app);
    const [row] = await sql`select state, result, run_count from akadze.jobs
      where id = ${flow.jobs.sum}`;
    assertEquals([row.state, row.result, row.run_count], ["succeeded", 1225, 1]);
  });
});

Deno.test("by default a failed dependency cancels its dependents down the flow, naming it", async () => {
  await withApp("flows_cancel", async (app, sql) => {
    const bad = app.task("bad", () => {
      throw new Fail("no such page");
    });
    const ok = app.task("ok", () => 1);
    const flow = await app.enqueueFlow({
      a: { task: bad },
      b: { task: ok, dependsOn: ["a"] },
      c: { task: ok, dependsOn: ["b"] },
      d: { task: ok, dependsOn: ["c"] },
      side: { task: ok },
    });
    await drain(app);
    assertEquals(await states(sql, flow.jobs), {
      a: "failed",
      b: "cancelled",
      c: "cancelled",
      d: "cancelled",
      side: "succeeded",
    });
    const b = await lastError(sql, flow.jobs.b);
    assertEquals(b.error, "DependencyFailed");
    assert(b.message.includes(`step "a" (job ${flow.jobs.a}) failed`), b.message);
    const d = await lastError(sql, flow.jobs.d);
    assert(d.message.includes(`job ${flow.jobs.c} was cancelled`), d.message);
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
      where finished_at is null`;
    assertEquals(n, 0);
  });
});

Deno.test("onFailure ignore runs the step after the others, seeing the failure", async () => {
  await withApp("flows_ignore", async (app, sql) => {
    const bad = app.task("bad", () => {
      throw new Fail("broken");
    });
    const slow = app.task("slow", () => "done");
    const seen: unknown[] = [];
    const after = app.task("after", async (_args, ctx) => {
      const deps = await ctx.dependencies();
      seen.push(deps.bad.state, deps.bad.error?.message, deps.slow.state);
    });
    const flow = await app.enqueueFlow({
      bad: { task: bad },
      slow: { task: slow, delay: 300 },
      after: {
        task: after,
        dependsOn: [{ step: "bad", onFailure: "ignore" }, "slow"],
      },
    });
    const worker = startWorker(app);
    try {
      await waitFor(() => seen.length > 0, "the dependent's run");
    } finally {
      await worker.stop();
    }
    assertEquals(seen, ["failed", "broken", "succeeded"]);
    assertEquals((await states(sql, flow.jobs)).after, "succeeded");
  });
});

Deno.test("onFailure continue runs the step at once, before its other dependencies finish", async () => {
  await withApp("flows_continue", async (app, sql) => {
    const bad = app.task("bad", () => {
      throw new Fail("broken");
    });
    const later = app.task("later", () => "late");
    const seen: unknown[] = [];
    const handler = app.task("handler", async (_args, ctx) => {
      const deps = await ctx.dependencies();
      seen.push(deps.bad.state, deps.later.state);
    });
    const flow = await app.enqueueFlow({
      bad: { task: bad },
      // Far in the future: it is still queued when the handler runs.
      later: { task: later, delay: 3_600_000 },
      handler: { task: handler, dependsOn: [{ step: "bad", onFailure: "continue" }, "later"] },
    });
    await drain(app);
    assertEquals(seen, ["failed", "queued"]);
    assertEquals(await states(sql, flow.jobs), {
      bad: "failed",
      later: "queued",
      handler: "succeeded",
    });
  });
});

Deno.test("cancelling a waiting step cancels it at once and its dependents with it", async () => {
  await withApp("flows_cancel_waiting", async (app, sql) => {
    const ok = app.task("ok", () => 1);
    const flow = await app.enqueueFlow({
      a: { task: ok, delay: 3_600_000 },
      b: { task: ok, dependsOn: ["a"] },
      c: { task: ok, dependsOn: ["b"] },
      d: { task: ok, dependsOn: [{ step: "b", onFailure: "ignore" }] },
    });
    assert(await requestCancel(sql, flow.jobs.b));
    assertEquals(await states(sql, flow.jobs), {
      a: "queued",
      b: "cancelled",
      c: "cancelled",
      // b was its only dependency, and it ignores b's failure.
      d: "queued",
    });
    const c = await lastError(sql, flow.jobs.c);
    assert(c.message.includes(`step "b" (job ${flow.jobs.b}) was cancelled`), c.message);
    assertEquals(await lastError(sql, flow.jobs.b), null);
  });
});

Deno.test("requeueing a failed step lets its cancelled dependents run when it succeeds", async () => {
  await withApp("flows_requeue", async (app, sql) => {
    let fail = true;
    const flaky = app.task("flaky", { maxAttempts: 1 }, () => {
      if (fail) throw new Error("down");
      return "up";
    });
    const ran: string[] = [];
    const next = app.task("next", (_args, ctx) => {
      ran.push(ctx.job.id);
    });
    const flow = await app.enqueueFlow({
      a: { task: flaky },
      b: { task: next, dependsOn: ["a"] },
      c: { task: next, dependsOn: ["b"] },
    });
    await drain(app);
    assertEquals(await states(sql, flow.jobs), { a: "failed", b: "cancelled", c: "cancelled" });
    fail = false;
    await requeue(sql, flow.jobs.a);
    assertEquals(await states(sql, flow.jobs), { a: "queued", b: "waiting", c: "waiting" });
    await drain(app);
    assertEquals(await states(sql, flow.jobs), { a: "succeeded", b: "succeeded", c: "succeeded" });
    assertEquals(ran, [flow.jobs.b, flow.jobs.c]);
  });
});

Deno.test("a step may depend on an existing job, finished or not", async () => {
  await withApp("flows_existing", async (app, sql) => {
    const ok = app.task("ok", () => "r");
    const bad = app.task("bad", () => {
      throw new Fail("x");
    });
    const done = await ok.enqueue();
    const failed = await bad.enqueue();
    await drain(app);
    const pending = await ok.enqueue();
    const flow = await app.enqueueFlow({
      afterDone: { task: ok, dependsOn: [{ job: done }] },
      afterFailed: { task: ok, dependsOn: [{ job: failed }] },
      afterPending: { task: ok, dependsOn: [{ job: pending }] },
    });
    assertEquals(await states(sql, flow.jobs), {
      afterDone: "queued",
      afterFailed: "cancelled",
      afterPending: "waiting",
    });
    await drain(app);
    assertEquals((await states(sql, flow.jobs)).afterPending, "succeeded");
  });
});

Deno.test("a bad flow is an EnqueueError naming the problem, and nothing is inserted", async () => {
  await withApp("flows_bad", async (app, sql) => {
    const ok = app.task("ok", () => 1);
    const cases: [Parameters<Akadze["enqueueFlow"]>[0], string][] = [
      [{ a: { task: ok, dependsOn: ["b"] }, b: { task: ok, dependsOn: ["a"] } }, "cycle"],
      [{ a: { task: ok, dependsOn: ["a"] } }, "cycle"],
      [{ a: { task: ok, dependsOn: ["nope"] } }, `"nope", which is not a step`],
      [{ a: { task: "unknown" } }, `task "unknown", which this app does not have`],
      [{ a: { task: ok, args: [] as unknown as object } }, `step "a"`],
      [{ a: { task: ok, priority: 1e6 } }, "priority must be"],
      [{
        a: { task: ok, dependsOn: [{ step: "b", onFailure: "explode" as "cancel" }] },
        b: { task: ok },
      }, "onFailure"],
      [{ a: { task: ok, dependsOn: [{ job: "999999" }] } }, "job 999999, which does not exist"],
      [{ a: { task: ok, wat: 1 } as never }, `unknown key "wat"`],
      [{}, "object of named steps"],
    ];
    for (const [steps, text] of cases) {
      const error = await assertRejects(() => app.enqueueFlow(steps), EnqueueError);
      assert(error.message.includes(text), `"${error.message}" should contain "${text}"`);
    }
    assertEquals(await countJobs(sql), 0);
    assertEquals((await sql`select count(*)::int as n from akadze.job_dependencies`)[0].n, 0);
  });
});

Deno.test("a flow is enqueued in the caller's transaction: a rollback removes all of it", async () => {
  await withApp("flows_tx", async (app, sql) => {
    const ok = app.task("ok", () => 1);
    await assertRejects(
      () =>
        app.sql.begin(async (tx) => {
          await app.enqueueFlow({ a: { task: ok }, b: { task: ok, dependsOn: ["a"] } }, {
            session: tx,
          });
          throw new Error("rolled back");
        }),
    );
    assertEquals(await countJobs(sql), 0);
    const flow = await app.sql.begin((tx) =>
      app.enqueueFlow({ a: { task: ok }, b: { task: ok, dependsOn: ["a"] } }, { session: tx })
    );
    assertEquals(Object.keys(flow.jobs), ["a", "b"]);
    assertEquals(await countJobs(sql), 2);
  });
});

Deno.test("a step's unique key is held while it waits; a duplicate refuses the whole flow", async () => {
  await withApp("flows_unique", async (app, sql) => {
    const ok = app.task("ok", () => 1);
    await app.enqueueFlow({
      a: { task: ok, delay: 3_600_000 },
      b: { task: ok, dependsOn: ["a"], uniqueKey: "report-1" },
    });
    await assertRejects(() => ok.using({ uniqueKey: "report-1" }).enqueue(), DuplicateJob);
    await assertRejects(
      () => app.enqueueFlow({ x: { task: ok }, y: { task: ok, uniqueKey: "report-1" } }),
      DuplicateJob,
    );
    assertEquals(await countJobs(sql), 2);
  });
});

Deno.test("SQL enqueue_flow takes steps in any order and refuses a cycle with 22023", async () => {
  await withApp("flows_sql", async (app, sql) => {
    app.task("ok", () => 1);
    const rows = await sql`select step, id::text as id from akadze.enqueue_flow(${
      JSON.stringify([
        { name: "last", task: "ok", depends_on: ["first", { step: "mid", on_failure: "ignore" }] },
        { name: "mid", task: "ok", depends_on: ["first"], queue: "default" },
        { name: "first", task: "ok", args: { n: 1 } },
      ])
    }::text::jsonb)`;
    assertEquals(rows.map((r) => r.step), ["last", "mid", "first"]);
    const ids = Object.fromEntries(rows.map((r) => [r.step, BigInt(r.id)]));
    assert(ids.first < ids.mid && ids.mid < ids.last, "ids follow the dependencies");
    await drain(app);
    assertEquals(await countJobs(sql, "succeeded"), 3);
    const error = await assertRejects(() =>
      sql`select * from akadze.enqueue_flow(${
        JSON.stringify([
          { name: "a", task: "ok", depends_on: ["b"] },
          { name: "b", task: "ok", depends_on: ["a"] },
        ])
      }::text::jsonb)`
    ) as { code?: string; message: string };
    assertEquals(error.code, "22023");
    assert(error.message.includes("cycle"), error.message);
    const missing = await assertRejects(() =>
      sql`select * from akadze.enqueue_flow(${
        JSON.stringify([{ name: "a", task: "ok", depends_on: [{ job: 424242 }] }])
      }::text::jsonb)`
    ) as { code?: string };
    assertEquals(missing.code, "23503");
    for (const step of [{ run_at: "infinity" }, { expires_at: "-Infinity" }]) {
      const infinite = await assertRejects(() =>
        sql`select * from akadze.enqueue_flow(${
          JSON.stringify([{ name: "a", task: "ok" }, { name: "b", task: "ok", ...step }])
        }::text::jsonb)`
      ) as { code?: string; message: string };
      assertEquals(infinite.code, "22023", infinite.message);
      assertMatch(infinite.message, /step 2 of this flow .* must be finite times/);
    }
    assertEquals(await countJobs(sql), 3);
  });
});

Deno.test("SQL enqueue_flow_steps (app.enqueueFlow's, 0019) refuses what enqueue_flow refuses, nothing inserted", async () => {
  await withApp("flows_sql_steps", async (app, sql) => {
    app.task("ok", () => 1);
    /** Call it with two steps "a" and "b" (b after a), `deps` of b, and `change`d arrays. */
    const call = (deps: unknown[][], change: Record<number, unknown> = {}) => {
      const params: unknown[] = [
        ["a", "b"],
        ["ok", "ok"],
        ["default", "default"],
        [0, 0],
        [3, 3],
        '[{"n":1},{}]',
        null,
        null,
        null,
        null,
        null,
        deps.map((d) => d[0]),
        deps.map((d) => d[1]),
        deps.map((d) => d[2]),
        deps.map((d) => d[3]),
      ];
      for (const [i, value] of Object.entries(change)) params[Number(i)] = value;
      return sql.unsafe(
        `select unnest(akadze.enqueue_flow_steps($1::text[], $2::text[],
           $3::text[], $4::int4[], $5::int4[], $6::text, $7::timestamptz[], $8::float8[],
           $9::timestamptz[], $10::text[], $11::text[], $12::int4[], $13::int4[], $14::int8[],
           $15::text[]))::text as id`,
        params as never,
      );
    };
    const refused = async (deps: unknown[][], change: Record<number, unknown>, part: string) => {
      const error = await assertRejects(() => call(deps, change)) as { message: string };
      assert(error.message.includes(part), `${part}: ${error.message}`);
    };
    const rows = await call([[2, 1, null, "ignore"]]);
    assertEquals(rows.length, 2);
    const [a] = await sql`select step from akadze.jobs where id = ${rows[0].id}`;
    assertEquals(a.step, "a");
    const [b] = await sql`select state, pending_deps, args from akadze.jobs where id = ${
      rows[1].id
    }`;
    assertEquals([b.state, b.pending_deps, b.args], ["waiting", 1, {}]);
    await refused([[2, 2, null, null]], {}, "does not come before it");
    await refused([[1, 2, null, null]], {}, "does not come before it");
    await refused([[2, 1, 5, null]], {}, "neither a step nor an existing job");
    await refused([[2, 1, null, "maybe"]], {}, '"on_failure"');
    await refused([[2, 1, null, null], [2, 1, null, "ignore"]], {}, "the same dependency twice");
    await refused([], { 0: ["a", "a"] }, "two steps named");
    await refused([], { 2: ["default", "bad queue"] }, '"queue"');
    await refused([], { 3: [0, 40000] }, '"priority"');
    await refused([], { 5: '[{"n":1}]' }, "one object per step");
    await refused([], { 5: '[{"n":1}, 2]' }, "must be a JSON object");
    await refused([], { 1: ["ok"] }, "one element per step");
    await refused([], { 7: [1, 2], 6: [null, "2030-01-01T00:00:00Z"] }, "cannot both be set");
    const missing = await assertRejects(() => call([[2, null, 424242, null]])) as {
      code?: string;
    };
    assertEquals(missing.code, "23503");
    assertEquals(await countJobs(sql), 2);
  });
});

Deno.test("dependencyOrder keeps the given order when it is one, and names a cycle", () => {
  const deps = new Map([["c", ["a", "b"]], ["b", ["a"]]]);
  assertEquals(dependencyOrder(["a", "b", "c"], deps), ["a", "b", "c"]);
  assertEquals(dependencyOrder(["c", "b", "a"], deps), ["a", "b", "c"]);
  let message = "";
  try {
    dependencyOrder(["x", "y", "z"], new Map([["x", ["y"]], ["y", ["z"]], ["z", ["x"]]]));
  } catch (error) {
    message = (error as Error).message;
  }
  assert(message.includes(`"x" → "y" → "z" → "x"`), message);
});

Deno.test("siblings finishing together in several workers queue their dependent exactly once", async () => {
  await withApp("flows_race", async (app, sql) => {
    const part = app.task("part", () => 1);
    let sinks = 0;
    const sink = app.task("sink", () => {
      sinks++;
    });
    const flows: string[] = [];
    for (let round = 0; round < 10; round++) {
      const steps: Record<string, Parameters<Akadze["enqueueFlow"]>[0][string]> = {};
      for (let i = 0; i < 40; i++) steps[`p${i}`] = { task: part };
      steps.sink = { task: sink, dependsOn: Object.keys(steps) };
      flows.push((await app.enqueueFlow(steps)).jobs.sink);
    }
    const workers = [0, 1, 2].map(() => startWorker(app, { slots: 8 }));
    try {
      await waitFor(
        async () => (await countJobs(sql, "succeeded")) === 10 * 41,
        "every job of the ten flows",
        60_000,
      );
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
    }
    assertEquals(sinks, 10);
    const rows = await sql`select run_count from akadze.jobs where id = any(${flows}::bigint[])`;
    assertEquals(rows.map((r) => r.run_count), Array(10).fill(1));
  });
});

Deno.test("one outcome batch finishing several dependencies counts each down once, beside failures settled per job", async () => {
  await withApp("flows_batch", async (_app, sql) => {
    const steps = await sql`select step, id::text as id from akadze.enqueue_flow('[
      {"name": "a", "task": "t"}, {"name": "b", "task": "t"}, {"name": "c", "task": "t"},
      {"name": "d", "task": "t", "max_attempts": 1},
      {"name": "sink", "task": "t", "depends_on": ["a", "b", "c"]},
      {"name": "ignoring", "task": "t", "depends_on": ["a", {"step": "d", "on_failure": "ignore"}]},
      {"name": "cancelled", "task": "t", "depends_on": ["b", "d"]}]')`;
    const ids = Object.fromEntries(steps.map((r) => [r.step as string, r.id as string]));
    const claimed = await sql`select id::text as id, run_count
      from akadze.claim_one('default', '{t}', 4, '{}', 'w1')`;
    assertEquals(claimed.length, 4);
    const runCount = new Map(claimed.map((r) => [r.id as string, r.run_count as number]));
    const write = (names: string[], kinds: string[]) =>
      sql`select * from akadze.complete_jobs(
        ${names.map((n) => ids[n])}::bigint[], ${names.map((n) => runCount.get(ids[n])!)}::int[],
        ${kinds}::text[], ${kinds.map(() => null)}::text[],
        ${kinds.map((k) => k === "fail" ? '{"error":"E","message":"m"}' : null)}::text[],
        ${kinds.map(() => 0)}::float8[])`;
    await write(["a", "b", "d"], ["succeeded", "succeeded", "fail"]);
    assertEquals(await states(sql, ids), {
      a: "succeeded",
      b: "succeeded",
      c: "running",
      d: "failed",
      sink: "waiting",
      ignoring: "queued",
      cancelled: "cancelled",
    });
    const [waiting] = await sql`select pending_deps from akadze.jobs where id = ${ids.sink}`;
    assertEquals(waiting.pending_deps, 1);
    await write(["c"], ["succeeded"]);
    const [sink] = await sql`select state, pending_deps from akadze.jobs where id = ${ids.sink}`;
    assertEquals([sink.state, sink.pending_deps], ["queued", 0]);
  });
});

Deno.test("an outcome batch finishing a fan-in's siblings updates the waiting job once", async () => {
  await withApp("flows_batch_once", async (_app, sql) => {
    const [sink] = await sql`select id::text as id from akadze.enqueue_flow('[
      {"name": "a", "task": "t"}, {"name": "b", "task": "t"}, {"name": "c", "task": "t"},
      {"name": "d", "task": "t"},
      {"name": "sink", "task": "t", "depends_on": ["a", "b", "c", "d"]}]') where step = 'sink'`;
    const claimed = await sql`select id, run_count
      from akadze.claim_one('default', '{t}', 4, '{}', 'w1')`;
    const updates = await sql.begin(async (tx) => {
      // The counts not yet flushed to the statistics: earlier statements' too, so a difference.
      const tupleUpdates = async () =>
        (await tx`select n_tup_upd::int as n from pg_stat_xact_user_tables
          where relid = 'akadze.jobs'::regclass`)[0].n as number;
      const before = await tupleUpdates();
      await tx`select * from akadze.complete_jobs(
        ${claimed.map((r) => r.id)}::bigint[], ${claimed.map((r) => r.run_count)}::int[],
        '{succeeded,succeeded,succeeded,succeeded}', '{null,null,null,null}',
        '{null,null,null,null}', '{0,0,0,0}')`;
      return (await tupleUpdates()) - before;
    });
    // The four siblings' rows, and the waiting job's once (not once per sibling).
    assertEquals(updates, 5);
    const [row] = await sql`select state from akadze.jobs where id = ${sink.id}`;
    assertEquals(row.state, "queued");
  });
});

Deno.test("chain, group and chord build flows as Celery's canvas does", async () => {
  await withApp("flows_canvas", async (app, sql) => {
    const order: string[] = [];
    const step = app.task("step", ({ n }) => {
      order.push(`step ${n}`);
      return n;
    });
    const sum = app.task("sum", async (_args, ctx) => {
      const deps = await ctx.dependencies();
      order.push("sum");
      return Object.values(deps).reduce((a, d) => a + (d.result as number), 0);
    });
    const chained = await app.enqueueFlow(
      chain([{ task: step, args: { n: 1 } }, { task: step, args: { n: 2 } }, {
        task: step,
        args: { n: 3 },
      }]),
    );
    assertEquals(Object.keys(chained.jobs), ["1", "2", "3"]);
    await drain(app);
    assertEquals(order, ["step 1", "step 2", "step 3"]);
    order.length = 0;
    const fanned = await app.enqueueFlow(
      chord(group([1, 2, 3, 4].map((n) => ({ task: step, args: { n } }))), { task: sum }),
    );
    await drain(app);
    assertEquals(order.at(-1), "sum");
    const [row] = await sql`select result from akadze.jobs where id = ${fanned.jobs.callback}`;
    assertEquals(row.result, 10);
    await assertRejects(
      () => Promise.resolve().then(() => chain([{ task: step, dependsOn: ["x"] }])),
      EnqueueError,
    );
  });
});

Deno.test("a running job adds children, waits without a slot, and runs again with their results", async () => {
  await withApp("flows_children", async (app, sql) => {
    const row = app.task("row", ({ n }) => (n as number) * 10);
    const runs: number[] = [];
    const file = app.task("file", async ({ rows }, ctx) => {
      runs.push(ctx.job.runCount);
      const done = await ctx.dependencies();
      if (Object.keys(done).length === 0) {
        const ids = await ctx.waitForChildren(
          Object.fromEntries(
            (rows as number[]).map((n) => [`row-${n}`, { task: row, args: { n } }]),
          ),
        );
        assertEquals(Object.keys(ids), ["row-1", "row-2", "row-3"]);
        return "ignored: the job now waits";
      }
      return Object.values(done).reduce((a, d) => a + (d.result as number), 0);
    });
    const id = await file.enqueue({ rows: [1, 2, 3] });
    await drain(app);
    const [job] = await sql`select state, result, attempt, run_count, flow_id::text as flow
      from akadze.jobs where id = ${id}`;
    assertEquals([job.state, job.result, job.attempt, job.run_count], ["succeeded", 60, 0, 2]);
    assertEquals(job.flow, id);
    assertEquals(runs, [1, 2]);
    const children = await sql`select step, state, flow_id::text as flow from akadze.jobs
      where id <> ${id} order by id`;
    assertEquals(children.map((c) => [c.step, c.state, c.flow]), [
      ["row-1", "succeeded", id],
      ["row-2", "succeeded", id],
      ["row-3", "succeeded", id],
    ]);
  });
});

Deno.test("a failed child cancels its parent, unless the parent ignores failures", async () => {
  await withApp("flows_children_fail", async (app, sql) => {
    const bad = app.task("bad", () => {
      throw new Fail("unreadable row");
    });
    const seen: string[] = [];
    const parent = app.task("parent", async ({ policy }, ctx) => {
      const done = await ctx.dependencies();
      if (Object.keys(done).length === 0) {
        await ctx.waitForChildren({ child: { task: bad } }, {
          onFailure: policy as "cancel" | "ignore",
        });
        return;
      }
      seen.push(`${policy}: ${done.child.state} ${done.child.error?.message}`);
    });
    const strict = await parent.enqueue({ policy: "cancel" });
    const lenient = await parent.enqueue({ policy: "ignore" });
    await drain(app);
    const rows = await sql`select id::text as id, state from akadze.jobs
      where id = any(${[strict, lenient]}::bigint[]) order by id`;
    assertEquals(rows.map((r) => r.state), ["cancelled", "succeeded"]);
    assertEquals(seen, ["ignore: failed unreadable row"]);
    assertEquals((await lastError(sql, strict)).error, "DependencyFailed");
  });
});

Deno.test("waitForChildren refuses a child named as a dependency the job has: dependencies() would lose one", async () => {
  await withApp("flows_children_names", async (app, sql) => {
    const page = app.task("page", ({ n }) => n);
    const refusals: string[] = [];
    const pager = app.task("pager", async (_args, ctx) => {
      const done = await ctx.dependencies();
      const pages = Object.keys(done).filter((key) => key.startsWith("page"));
      if (pages.length < 2) {
        const name = ctx.job.runCount === 1 ? "page" : "page-2";
        if (ctx.job.runCount === 2) {
          // The name of the first round's child, and of a step the job depends on.
          for (const taken of ["page", "first"]) {
            try {
              await ctx.waitForChildren({ [taken]: { task: page, args: { n: 0 } } });
              refusals.push(`${taken}: accepted`);
            } catch (error) {
              refusals.push(`${taken}: ${(error as Error).name} ${(error as Error).message}`);
            }
          }
        }
        await ctx.waitForChildren({ [name]: { task: page, args: { n: ctx.job.runCount } } });
        return;
      }
      return pages.map((key) => done[key].result);
    });
    const first = app.task("first", () => "go");
    const flow = await app.enqueueFlow({
      first: { task: first },
      pager: { task: pager, dependsOn: ["first"] },
    });
    await drain(app);
    const [job] = await sql`select state, result from akadze.jobs where id = ${flow.jobs.pager}`;
    assertEquals([job.state, job.result], ["succeeded", [1, 2]]);
    assertEquals(refusals.length, 2);
    assertMatch(
      refusals[0],
      /^page: EnqueueError .*step "page" is already a dependency of this job/,
    );
    assertMatch(refusals[1], /^first: EnqueueError .*step "first" is already a dependency/);
    const steps = await sql`select step from akadze.jobs where flow_id = ${flow.id} order by id`;
    assertEquals(steps.map((r) => r.step), ["first", "pager", "page", "page-2"]);
  });
});

Deno.test("waitForFlow resolves when every step, and every child added meanwhile, is finished", async () => {
  await withApp("flows_wait", async (app) => {
    const leaf = app.task("leaf", ({ n }) => n);
    const fan = app.task("fan", async (_args, ctx) => {
      const done = await ctx.dependencies();
      const children = Object.values(done).filter((d) => d.task === "leaf");
      if (children.length === 0) {
        await ctx.waitForChildren({ "leaf-1": { task: leaf, args: { n: 1 } } });
        return;
      }
      return children.length;
    });
    const first = app.task("first", () => "go");
    const flow = await app.enqueueFlow({
      first: { task: first },
      fan: { task: fan, dependsOn: ["first"] },
    });
    const worker = startWorker(app);
    try {
      const steps = await app.waitForFlow(flow.id, { timeout: 60_000 });
      assertEquals(Object.keys(steps).sort(), ["fan", "first", "leaf-1"]);
      assertEquals(steps.fan.state, "succeeded");
      assertEquals(steps.fan.result, 1);
      assertEquals(steps["leaf-1"].result, 1);
    } finally {
      await worker.stop();
    }
    await assertRejects(() => app.waitForFlow("987654", { timeout: 1_000 }), JobNotFound);
  });
});

Deno.test("waitForFlow keeps both children when two steps each add one of the same name", async () => {
  await withApp("flows_wait_names", async (app) => {
    const leaf = app.task("leaf", ({ n }) => n);
    const fan = app.task("fan", async ({ n }, ctx) => {
      const done = await ctx.dependencies();
      if (!done["page-1"]) {
        await ctx.waitForChildren({ "page-1": { task: leaf, args: { n } } });
        return;
      }
      return done["page-1"].result;
    });
    const flow = await app.enqueueFlow({
      a: { task: fan, args: { n: 1 } },
      b: { task: fan, args: { n: 2 } },
    });
    const worker = startWorker(app);
    try {
      const jobs = await app.waitForFlow(flow.id, { timeout: 60_000 });
      assertEquals(Object.keys(jobs).length, 4);
      assertEquals([jobs.a.result, jobs.b.result].sort(), [1, 2]);
      const pages = Object.values(jobs).filter((j) => j.task === "leaf");
      assertEquals(pages.map((j) => j.result).sort(), [1, 2]);
      assertEquals(jobs["page-1"].task, "leaf");
    } finally {
      await worker.stop();
    }
  });
});

Deno.test("a node-postgres session enqueues a flow in the client's transaction", async () => {
  await withApp("flows_pg", async (app, sql, db) => {
    const ok = app.task("ok", () => 1);
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query("begin");
      const flow = await app.enqueueFlow({ a: { task: ok }, b: { task: ok, dependsOn: ["a"] } }, {
        session: client,
      });
      assertEquals(await countJobs(sql), 0, "not committed yet");
      await client.query("commit");
      assertEquals(await states(sql, flow.jobs), { a: "queued", b: "waiting" });
    } finally {
      await client.end();
    }
  });
});
