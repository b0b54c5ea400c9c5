// Operating flows against real PostgreSQL: list, requeue and cancel by flow (admin and CLI),
// the waiting state in every state filter, `jobs show` printing the flow as a tree, getJob's
// includeFlow, and retention: a flow pruned as a whole, never a job a live job still needs,
// its job_dependencies rows with it, the plain prune statement planned as before.
import type { Akadze } from "../src/app.ts";
import { cancelJobs, getJob, listJobs, requeue, requeueJobs } from "../src/admin/jobs.ts";
import { pruneJobs } from "../src/admin/prune.ts";
import type { Sql } from "../src/db.ts";
import type { Task } from "../src/task.ts";
import { AkadzeError, DuplicateJob } from "../src/errors.ts";
import { pruneStatements } from "../src/old_jobs.ts";
import { Pruner } from "../src/worker/pruner.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals, assertMatch, assertRejects } from "./assert.ts";
import { holdLocks, runCli, startWorker, waitFor, waitForJob, withApp } from "./_helpers.ts";

async function states(sql: Sql, ids: Record<string, string>): Promise<Record<string, string>> {
  const rows = await sql`select id::text as id, state from akadze.jobs
    where id = any(${Object.values(ids)}::bigint[])`;
  const byId = new Map(rows.map((r) => [r.id as string, r.state as string]));
  return Object.fromEntries(
    Object.entries(ids).map(([name, id]) => [name, byId.get(id) ?? "deleted"]),
  );
}

/** Run every ready job (and the ones they release) until none is left. */
async function drain(app: Akadze): Promise<void> {
  const exit = await new Worker(app, { batch: true, pollInterval: 50 }).run();
  assertEquals(exit.reason, "batch_done");
}

const steps = new WeakMap<Akadze, Task<Record<string, unknown>, Record<string, unknown>, string>>();

/** A diamond a → (b, c) → d of task "step", and a plain job beside it. */
async function diamond(app: Akadze) {
  const step = steps.get(app) ?? app.task("step", () => "ok");
  steps.set(app, step);
  const flow = await app.enqueueFlow({
    a: { task: step },
    b: { task: step, dependsOn: ["a"] },
    c: { task: step, dependsOn: ["a"] },
    d: { task: step, dependsOn: ["b", "c"] },
  });
  const plain = await step.enqueue();
  return { step, flow, plain };
}

Deno.test("listJobs, requeueJobs and cancelJobs take a flow; waiting is a state like the others", async () => {
  await withApp("flow_ops_admin", async (app, sql) => {
    const { flow, plain } = await diamond(app);
    const other = await diamond(app);
    const ids = (jobs: { id: string }[]) =>
      jobs.map((j) => j.id).sort((x, y) => Number(x) - Number(y));
    const all = Object.values(flow.jobs);
    assertEquals(ids(await listJobs(app, { flow: flow.id })), all);
    assertEquals(ids(await listJobs(app, { flow: flow.id, state: "waiting" })), all.slice(1));
    assertEquals(ids(await listJobs(app, { state: "queued" })), [
      flow.jobs.a,
      plain,
      other.flow.jobs.a,
      other.plain,
    ]);
    const summary = (await listJobs(app, { flow: flow.id, state: "queued" }))[0];
    assertEquals([summary.flowId, summary.step], [flow.id, "a"]);
    assertEquals(await listJobs(app, { flow: plain }), [], "a job outside flows is no flow");
    for (const flowId of ["0", "x", "1.5", "99999999999999999999"]) {
      const error = await assertRejects(() => listJobs(app, { flow: flowId }), AkadzeError);
      assertMatch(error.message, /^flow must be a flow id/);
    }

    // Cancel a flow: its waiting steps at once, its queued one marked; the other flow and
    // the plain job untouched.
    assertEquals(await cancelJobs(sql, { flow: flow.id }, { dryRun: true }), 4);
    assertEquals(await cancelJobs(sql, { flow: flow.id }), 4);
    assertEquals(await states(sql, flow.jobs), {
      a: "queued",
      b: "cancelled",
      c: "cancelled",
      d: "cancelled",
    });
    const [a] = await sql`select cancel_requested_at from akadze.jobs where id = ${flow.jobs.a}`;
    assert(a.cancel_requested_at !== null);
    assertEquals(
      (await states(sql, other.flow.jobs)).d,
      "waiting",
      "another flow is not touched",
    );
    // A waiting state filter cancels only the waiting steps.
    assertEquals(await cancelJobs(sql, { flow: other.flow.id, state: "waiting" }), 3);
    assertEquals((await states(sql, other.flow.jobs)).a, "queued");
    const refused = await assertRejects(() => cancelJobs(sql, { state: "failed" }), AkadzeError);
    assertMatch(refused.message, /only waiting, queued, running jobs can be cancelled/);
    await drain(app);
    assertEquals((await states(sql, flow.jobs)).a, "cancelled");
    assertEquals(
      (await sql`select state from akadze.jobs where id = ${plain}`)[0].state,
      "succeeded",
    );
  });
});

Deno.test("requeueJobs by flow requeues its failed steps; the steps they cancelled wait and run again", async () => {
  await withApp("flow_ops_requeue", async (app, sql) => {
    let fail = true;
    const flaky = app.task("flaky", { maxAttempts: 1 }, () => {
      if (fail) throw new Error("down");
      return "up";
    });
    const ok = app.task("ok", () => "ok");
    const flow = await app.enqueueFlow({
      a: { task: flaky },
      b: { task: flaky },
      c: { task: ok, dependsOn: ["a", "b"] },
      d: { task: ok, dependsOn: ["c"] },
    });
    const elsewhere = await flaky.enqueue();
    await drain(app);
    assertEquals(await states(sql, flow.jobs), {
      a: "failed",
      b: "failed",
      c: "cancelled",
      d: "cancelled",
    });
    fail = false;
    assertEquals(await requeueJobs(sql, { flow: flow.id }, { dryRun: true }), {
      requeued: 2,
      skipped: [],
    });
    assertEquals(await requeueJobs(sql, { flow: flow.id }), { requeued: 2, skipped: [] });
    assertEquals(await states(sql, flow.jobs), {
      a: "queued",
      b: "queued",
      c: "waiting",
      d: "waiting",
    });
    const [c] = await sql`select pending_deps from akadze.jobs where id = ${flow.jobs.c}`;
    assertEquals(c.pending_deps, 2);
    assertEquals(
      (await sql`select state from akadze.jobs where id = ${elsewhere}`)[0].state,
      "failed",
      "a failed job outside the flow stays failed",
    );
    await drain(app);
    assertEquals(await states(sql, flow.jobs), {
      a: "succeeded",
      b: "succeeded",
      c: "succeeded",
      d: "succeeded",
    });
  });
});

Deno.test("requeueing a failed step whose cancelled dependent's uniqueKey is now held says whose key it is", async () => {
  await withApp("flows_ops_requeue_key", async (app, sql) => {
    const fails = app.task("fails", { maxAttempts: 1 }, () => {
      throw new Error("down");
    });
    const step = app.task("keyed", () => "ok");
    const flow = await app.enqueueFlow({
      a: { task: fails },
      b: { task: step, dependsOn: ["a"], uniqueKey: "report:7" },
    });
    await drain(app);
    assertEquals(await states(sql, flow.jobs), { a: "failed", b: "cancelled" });
    await step.using({ uniqueKey: "report:7", delay: 60_000 }).enqueue({});
    const one = await assertRejects(
      () => sql.begin((tx) => requeue(tx, flow.jobs.a)),
      DuplicateJob,
    );
    // Job a has no uniqueKey: the key is its dependent's, which the requeue would put back.
    assertMatch(one.message, /uniqueKey "report:7"/);
    assertMatch(one.message, /flow step/);
    const bulk = await assertRejects(
      () => sql.begin((tx) => requeueJobs(tx, { flow: flow.id })),
      DuplicateJob,
    );
    assertMatch(bulk.message, /uniqueKey "report:7"/);
    assert(!bulk.message.includes("try again"), bulk.message);
    assertEquals(await states(sql, flow.jobs), { a: "failed", b: "cancelled" });
  });
});

Deno.test("cancelling a flow signals its running step and cancels what waits for it", async () => {
  await withApp("flow_ops_cancel_running", async (app, sql) => {
    let started = false;
    const slow = app.task("slow", async (_args, ctx) => {
      started = true;
      await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
      ctx.signal.throwIfAborted();
    });
    const ok = app.task("ok", () => "ok");
    const flow = await app.enqueueFlow({
      slow: { task: slow },
      later: { task: ok, dependsOn: ["slow"] },
      cleanup: { task: ok, dependsOn: [{ step: "slow", onFailure: "continue" }] },
    });
    const worker = startWorker(app);
    try {
      await waitFor(() => started, "the slow step to start");
      assertEquals(await cancelJobs(sql, { flow: flow.id }), 3);
      await waitForJob(sql, flow.jobs.slow, (r) => r.state === "cancelled", "the slow step");
    } finally {
      await worker.stop();
    }
    // Every step was cancelled by the flow's cancel, the fallback too: nothing of a
    // cancelled flow runs.
    assertEquals(await states(sql, flow.jobs), {
      slow: "cancelled",
      later: "cancelled",
      cleanup: "cancelled",
    });
  });
});

Deno.test("getJob includeFlow lists the steps in dependency order with their dependencies", async () => {
  await withApp("flow_ops_get_job", async (app, sql) => {
    const { step, flow } = await diamond(app);
    const outside = await step.enqueue();
    const late = await app.enqueueFlow({
      x: { task: step, dependsOn: [{ job: outside, onFailure: "ignore" }] },
    });
    const job = await getJob(app, flow.jobs.d, { includeFlow: true });
    assert(job?.flow);
    assertEquals([job.flowId, job.step], [flow.id, "d"]);
    assertEquals(job.flow.map((s) => s.step), ["a", "b", "c", "d"]);
    assertEquals(job.flow[3].dependsOn, [
      { id: flow.jobs.b, onFailure: "cancel" },
      { id: flow.jobs.c, onFailure: "cancel" },
    ]);
    assertEquals(Object.keys(job.flow[0]), [
      "id",
      "task",
      "queue",
      "attempt",
      "state",
      "finishedAt",
      "step",
      "dependsOn",
    ]);
    assertEquals([job.flow[0].state, job.flow[1].state], ["queued", "waiting"]);
    assertEquals((await getJob(app, flow.jobs.d))?.flow, undefined, "only when asked");
    assertEquals((await getJob(app, outside, { includeFlow: true }))?.flow, undefined);
    const x = await getJob(app, late.id, { includeFlow: true });
    assertEquals(x?.flow?.map((s) => s.dependsOn), [[{ id: outside, onFailure: "ignore" }]]);

    // A running job's children come before it: it waits for them.
    const child = app.task("child", () => 1);
    const parent = app.task("parent", async (_args, ctx) => {
      if (Object.keys(await ctx.dependencies()).length === 0) {
        await ctx.waitForChildren({ one: { task: child }, two: { task: child } });
      }
    });
    const id = await parent.enqueue();
    await sql`update akadze.jobs set state = 'cancelled', finished_at = now()
               where state = 'queued' and id <> ${id}`;
    await drain(app);
    const tree = await getJob(app, id, { includeFlow: true });
    assertEquals(tree?.flow?.map((s) => [s.step, s.state]), [
      ["one", "succeeded"],
      ["two", "succeeded"],
      [null, "succeeded"],
    ]);
    assertEquals(tree?.flow?.[2].id, id);
  });
});

Deno.test("akadze jobs list/show/requeue/cancel --flow, and --state waiting", async () => {
  await withApp("flow_ops_cli", async (app, sql, db) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const { flow, plain } = await diamond(app);
    const list = await runCli(["jobs", "list", "--flow", flow.id, "--json"], env);
    assertEquals([list.code, list.stderr], [0, ""]);
    const listed = JSON.parse(list.stdout);
    assertEquals(listed.map((j: { step: string }) => j.step), ["a", "b", "c", "d"]);
    assert(listed.every((j: { flowId: string }) => j.flowId === flow.id));
    const waiting = await runCli(["jobs", "list", "--state", "waiting"], env);
    assertEquals(
      waiting.stdout.trimEnd().split("\n").slice(1).map((l) => l.split("\t")[0]),
      [flow.jobs.b, flow.jobs.c, flow.jobs.d],
    );

    const show = await runCli(["jobs", "show", flow.jobs.b], env);
    assertEquals([show.code, show.stderr], [0, ""]);
    const lines = show.stdout.trimEnd().split("\n");
    assert(lines.includes(`flowId: ${flow.id}`) && lines.includes("step: b"), show.stdout);
    const at = lines.indexOf(`flow: ${flow.id} (4 steps: 3 waiting, 1 queued)`);
    assert(at > 0, show.stdout);
    assertEquals(lines.slice(at + 1), [
      `  a  job ${flow.jobs.a}  step  queued`,
      `    b  job ${flow.jobs.b}  step  waiting  (this job)`,
      `    c  job ${flow.jobs.c}  step  waiting`,
      `      d  job ${flow.jobs.d}  step  waiting  after: b, c`,
    ]);
    const json = JSON.parse((await runCli(["jobs", "show", flow.jobs.b, "--json"], env)).stdout);
    assertEquals([json.flowId, json.step], [flow.id, "b"]);
    assertEquals(json.flow.map((s: { step: string }) => s.step), ["a", "b", "c", "d"]);
    assertEquals(json.flow[3].dependsOn.map((d: { id: string }) => d.id), [
      flow.jobs.b,
      flow.jobs.c,
    ]);
    assertEquals(json.flow[0].finishedAt, null);
    const outside = await runCli(["jobs", "show", plain], env);
    assert(!outside.stdout.includes("flow: "), outside.stdout);
    assert(outside.stdout.includes("flowId: -"), outside.stdout);
    assert(!("flow" in JSON.parse((await runCli(["jobs", "show", plain, "--json"], env)).stdout)));

    const dry = await runCli(["jobs", "cancel", "--flow", flow.id, "--dry-run"], env);
    assertEquals([dry.code, dry.stdout], [0, "would request the cancellation of 4 jobs\n"]);
    const cancel = await runCli(["jobs", "cancel", "--flow", flow.id], env);
    assertEquals([cancel.code, cancel.stdout, cancel.stderr], [
      0,
      "cancel requested for 4 jobs\n",
      "",
    ]);
    assertEquals(await states(sql, flow.jobs), {
      a: "queued",
      b: "cancelled",
      c: "cancelled",
      d: "cancelled",
    });

    // A flow whose first step failed: requeue --flow resumes it.
    const flaky = app.task("flaky", { maxAttempts: 1 }, () => {
      throw new Error("down");
    });
    const second = await app.enqueueFlow({
      first: { task: flaky },
      then: { task: "step", dependsOn: ["first"] },
    });
    await sql`update akadze.jobs set state = 'cancelled', finished_at = now()
               where state = 'queued' and flow_id is distinct from ${second.id}`;
    await drain(app);
    assertEquals(await states(sql, second.jobs), { first: "failed", then: "cancelled" });
    const requeue = await runCli(["jobs", "requeue", "--flow", second.id], env);
    assertEquals([requeue.code, requeue.stdout, requeue.stderr], [0, "requeued 1 job\n", ""]);
    assertEquals(await states(sql, second.jobs), { first: "queued", then: "waiting" });

    for (
      const [args, pattern] of [
        [["jobs", "list", "--flow", "x"], /--flow must be a flow id/],
        [["jobs", "cancel", "--flow", "0"], /--flow must be a flow id/],
        [["jobs", "requeue", "--state", "waiting"], /--state must be failed, got "waiting"/],
        [["jobs", "list", "--state", "sleeping"], /one of waiting, queued, running/],
      ] as [string[], RegExp][]
    ) {
      const out = await runCli(args, env);
      assertEquals(out.code, 2, out.stderr);
      assertMatch(out.stderr, pattern);
    }
  });
});

/** Finish every job of `ids` `ago` ago, in `state`. */
async function finish(sql: Sql, ids: string[], ago: string, state = "succeeded"): Promise<void> {
  await sql`update akadze.jobs set state = ${state}, finished_at = now() - ${ago}::interval
             where id = any(${ids}::bigint[])`;
}

function pruner(app: Akadze, batchSize = 1000): Pruner {
  return new Pruner(app.sql, { schema: app.schema, retention: 86_400_000, grace: 0, batchSize });
}

async function dependencyRows(sql: Sql): Promise<number> {
  const [{ n }] = await sql`select count(*)::int as n from akadze.job_dependencies`;
  return n;
}

Deno.test("retention deletes a flow as a whole, once every step is old, with its dependency rows", async () => {
  await withApp("flow_ops_prune_whole", async (app, sql) => {
    const { flow, plain } = await diamond(app);
    const young = await diamond(app);
    const live = await diamond(app);
    const all = (f: { jobs: Record<string, string> }) => Object.values(f.jobs);
    await finish(sql, [...all(flow), plain], "2 days");
    // One step of this flow finished an hour ago: the flow is kept, its old steps too.
    await finish(sql, all(young.flow), "2 days");
    await finish(sql, [young.flow.jobs.d], "1 hour");
    // One step still waits: the flow is kept.
    await finish(sql, all(live.flow).slice(0, 3), "2 days");
    await sql`update akadze.jobs set state = 'waiting', finished_at = null
               where id = ${live.flow.jobs.d}`;
    assertEquals(await dependencyRows(sql), 12);

    assertEquals(await pruneJobs(sql, { olderThan: 86_400_000, dryRun: true }), 5);
    const pruned = await pruner(app).runOnce();
    assertEquals(pruned.jobs, 5);
    assertEquals(await states(sql, flow.jobs), {
      a: "deleted",
      b: "deleted",
      c: "deleted",
      d: "deleted",
    });
    assertEquals((await sql`select 1 from akadze.jobs where id = ${plain}`).length, 0);
    assertEquals(Object.values(await states(sql, young.flow.jobs)), Array(4).fill("succeeded"));
    assertEquals(Object.values(await states(sql, live.flow.jobs)), [
      "succeeded",
      "succeeded",
      "succeeded",
      "waiting",
    ]);
    assertEquals(await dependencyRows(sql), 8, "the deleted flow's dependency rows are gone");

    await finish(sql, [young.flow.jobs.d, live.flow.jobs.d], "2 days");
    assertEquals((await pruner(app).runOnce()).jobs, 8);
    assertEquals(await dependencyRows(sql), 0);
    assertEquals((await sql`select count(*)::int as n from akadze.jobs`)[0].n, 2);
  });
});

Deno.test("retention keeps a finished job that a live job depends on, and a flow with a failed step without includeFailed", async () => {
  await withApp("flow_ops_prune_needed", async (app, sql) => {
    const step = app.task("step", () => "ok");
    const base = await step.enqueue();
    const source = await app.enqueueFlow({ s: { task: step } });
    await finish(sql, [base, source.id], "2 days");
    // Flows enqueued later depend on them: they run, or wait.
    const user = await app.enqueueFlow({
      u: { task: step, dependsOn: [{ job: base }, { job: source.id }] },
      v: { task: step, dependsOn: ["u"] },
    });
    assertEquals(await states(sql, user.jobs), { u: "queued", v: "waiting" });
    assertEquals((await pruner(app).runOnce()).jobs, 0, "needed by live jobs");
    assertEquals(await pruneJobs(sql, { olderThan: 86_400_000, dryRun: true }), 0);

    await finish(sql, Object.values(user.jobs), "1 hour");
    // Their dependents finished: the two are free (the user flow is too young).
    assertEquals((await pruner(app).runOnce()).jobs, 2);
    assertEquals(
      (await sql`select count(*)::int as n from akadze.job_dependencies
                  where depends_on = any(${[base, source.id]}::bigint[])`)[0].n,
      0,
    );
    assertEquals(await states(sql, user.jobs), { u: "succeeded", v: "succeeded" });

    // A flow with a failed step goes only with includeFailed.
    await sql`update akadze.jobs set state = 'failed', finished_at = now() - interval '2 days'
               where id = ${user.jobs.u}`;
    await finish(sql, [user.jobs.v], "2 days");
    assertEquals(await pruneJobs(sql, { olderThan: 86_400_000 }), 0);
    assertEquals(await states(sql, user.jobs), { u: "failed", v: "succeeded" });
    assertEquals(await pruneJobs(sql, { olderThan: 86_400_000, includeFailed: true }), 2);
    assertEquals((await sql`select count(*)::int as n from akadze.jobs`)[0].n, 0);
    assertEquals(await dependencyRows(sql), 0);
  });
});

Deno.test("retention skips a whole flow while another session holds one of its steps locked", async () => {
  await withApp("flow_ops_prune_locked", async (app, sql, db) => {
    const { flow } = await diamond(app);
    await sql`delete from akadze.jobs where flow_id is null`;
    await finish(sql, Object.values(flow.jobs), "2 days");
    const held = await holdLocks(db.url, async (tx) => {
      await tx`select 1 from akadze.jobs where id = ${flow.jobs.c} for update`;
    });
    try {
      assertEquals((await pruner(app).runOnce()).jobs, 0);
      assertEquals(Object.values(await states(sql, flow.jobs)), Array(4).fill("succeeded"));
    } finally {
      await held.release();
    }
    assertEquals((await pruner(app).runOnce()).jobs, 4);
  });
});

Deno.test("retention of many flows runs in bounded batches, a flow never split", async () => {
  await withApp("flow_ops_prune_batches", async (app, sql) => {
    const step = app.task("step", () => "ok");
    const flows = [];
    for (let i = 0; i < 6; i++) {
      flows.push(
        await app.enqueueFlow({
          a: { task: step },
          b: { task: step, dependsOn: ["a"] },
          c: { task: step, dependsOn: ["b"] },
        }),
      );
    }
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now() - interval '2 days'`;
    // Batches of 4 rows: each takes whole flows of 3 until it holds 4 or more.
    const p = new Pruner(app.sql, {
      schema: app.schema,
      retention: 86_400_000,
      grace: 0,
      batchSize: 4,
      maxBatches: 1,
    });
    assertEquals((await p.runOnce()).jobs, 6);
    const left = await sql`select flow_id::text as flow, count(*)::int as n from akadze.jobs
                            group by flow_id`;
    assertEquals(left.length, 4);
    assert(left.every((r) => r.n === 3), "no flow split");
    assertEquals(await pruneJobs(sql, { olderThan: 86_400_000, batchSize: 2 }), 12);
  });
});

/** The plan of `text` (costs off, one line per node, filters left out). */
async function planShape(sql: Sql, text: string): Promise<string[]> {
  const rows = await sql.unsafe(`explain (costs off) ${text}`, [86_400_000, 1000]);
  return rows.map((r) => r["QUERY PLAN"] as string).filter((line) => !/^\s*Filter:/.test(line));
}

Deno.test("jobs outside flows are pruned by the plain statement, with the plan it had before flows", async () => {
  await withApp("flow_ops_prune_plan", async (app, sql) => {
    // Recent finished jobs, a few old ones (what a prune finds), and queued ones.
    await sql`insert into akadze.jobs (task, state, finished_at)
              select 't', 'succeeded', now() - (i % 600) * interval '1 minute'
                from generate_series(1, 20000) i`;
    await sql`insert into akadze.jobs (task, state, finished_at)
              select 't', 'cancelled', now() - interval '2 days' from generate_series(1, 300)`;
    await sql`insert into akadze.jobs (task) select 't' from generate_series(1, 2000)`;
    await sql`analyze akadze.jobs`;
    const before = `delete from akadze.jobs where id in (
      select id from akadze.jobs where state in ('succeeded', 'failed', 'cancelled')
         and finished_at < now() - $1::float8 * interval '1 millisecond'
       limit $2 for update skip locked)`;
    const now = pruneStatements("akadze", true).plain;
    const shape = await planShape(sql, now);
    assertEquals(shape, await planShape(sql, before));
    assert(shape.some((line) => line.includes("jobs_finished_idx")), shape.join("\n"));
    const [{ old }] = await sql`select count(*)::int as old from akadze.jobs
      where finished_at < now() - interval '1 day'`;
    assertEquals(old, 300);
    assertEquals((await pruner(app).runOnce()).jobs, 300);
    assertEquals((await sql`select count(*)::int as n from akadze.jobs`)[0].n, 22000);
  });
});
