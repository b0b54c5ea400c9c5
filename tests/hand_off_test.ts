// The hand-off (migrations/0016_hand_off.sql) against real PostgreSQL: a worker writing a success
// whose dependent becomes ready claims that dependent in the same transaction and runs it in the
// slot the finished job kept. Observable: the dependent's started_at is its dependency's
// finished_at (both the transaction's now()), where a claim after the NOTIFY is a later
// transaction. A worker keeps the slot of a task's success once a job of that task that finished
// there had dependents, so each test first runs a flow of two steps that teaches it (`learn`).
// Not handed when its queue is paused, its limit key has a limits row, the worker is stopping,
// or does not serve its queue or task, or when another ready job comes first; run once when
// siblings finish together in several workers; recovered by the rescuer when the worker dies
// while running it.
import type { Sql } from "../src/db.ts";
import { pauseQueue, resumeQueue } from "../src/admin/queues.ts";
import { Akadze } from "../src/app.ts";
import { assert, assertEquals } from "./assert.ts";
import { startWorker, waitForJob, withApp } from "./_helpers.ts";

const FIXTURE = new URL("./fixtures/worker_process.ts", import.meta.url).pathname;
const CONFIG = new URL("../deno.json", import.meta.url).pathname;

/** Enqueue a flow with SQL `enqueue_flow` (any task name, any queue); its ids by step. */
async function flow(sql: Sql, steps: object[]): Promise<Record<string, string>> {
  const rows = await sql`select step, id::text as id
    from akadze.enqueue_flow(${JSON.stringify(steps)}::text::jsonb)`;
  return Object.fromEntries(rows.map((r) => [r.step as string, r.id as string]));
}

/** Job `id`'s row. */
async function job(sql: Sql, id: string): Promise<Record<string, unknown>> {
  const [row] = await sql`select id::text as id, state, run_count, worker_id, attempt,
      started_at, finished_at, errors from akadze.jobs where id = ${id}`;
  return row;
}

/** Whether job `id` was started in the transaction that finished job `dep` (handed off). */
async function handedAfter(sql: Sql, dep: string, id: string): Promise<boolean> {
  const [row] = await sql`select j.started_at = d.finished_at as handed
    from akadze.jobs j, akadze.jobs d where j.id = ${id} and d.id = ${dep}`;
  return row.handed === true;
}

/**
 * Run a flow of two jobs of `task` (with `args`) to its end: the worker that runs them learns
 * that the task's jobs have dependents, and from then on keeps their slots for a hand-off.
 */
async function learn(sql: Sql, task: string, args: object = {}): Promise<void> {
  const ids = await flow(sql, [
    { name: "teach", task, args },
    { name: "taught", task, args, depends_on: ["teach"] },
  ]);
  await waitForJob(sql, ids.taught, (r) => r.state === "succeeded", `a flow of ${task}`);
}

/** A promise with its resolve function. */
function latch(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => resolve = r);
  return { promise, resolve };
}

Deno.test("a chain runs with each step handed off in the transaction of its dependency's outcome", async () => {
  await withApp("hand_off_chain", async (app, sql) => {
    const ran: string[] = [];
    app.task("step", (_args, ctx) => {
      ran.push(ctx.job.id);
    });
    const n = 30;
    const steps = Array.from({ length: n }, (_, i) => ({
      name: `s${i}`,
      task: "step",
      ...(i > 0 ? { depends_on: [`s${i - 1}`] } : {}),
    }));
    const w = startWorker(app);
    let ids: Record<string, string>;
    try {
      await learn(sql, "step");
      ran.length = 0;
      ids = await flow(sql, steps);
      await waitForJob(sql, ids[`s${n - 1}`], (r) => r.state === "succeeded", "the last step");
    } finally {
      await w.stop();
    }
    assertEquals(ran, steps.map((s) => ids[s.name]), "each step once, in order");
    for (let i = 1; i < n; i++) {
      assert(await handedAfter(sql, ids[`s${i - 1}`], ids[`s${i}`]), `step ${i} was handed off`);
      const row = await job(sql, ids[`s${i}`]);
      assertEquals([row.run_count, row.worker_id], [1, w.worker.id]);
    }
    // Counted as claims (with the two of the first flow).
    assertEquals(w.worker.claimed, n + 2);
  });
});

Deno.test("a dependent is not handed off when its queue is paused, or not served, or its task not run, by the worker", async () => {
  await withApp("hand_off_refused", async (app, sql) => {
    app.task("step", () => {});
    await pauseQueue(sql, "paused");
    // One pool of slots for both queues: the slot a keeps may take a job of either.
    const w = startWorker(app, { queues: ["default", "paused"], fair: true });
    await learn(sql, "step");
    const ids = await flow(sql, [
      { name: "a", task: "step" },
      // Before "ok" in claim order (lower ids): each would take a's one kept slot first.
      { name: "paused", task: "step", queue: "paused", depends_on: ["a"] },
      { name: "elsewhere", task: "step", queue: "elsewhere", depends_on: ["a"] },
      { name: "unknown", task: "not_here", depends_on: ["a"] },
      { name: "ok", task: "step", depends_on: ["a"] },
    ]);
    try {
      await waitForJob(sql, ids.a, (r) => r.state === "succeeded", "a");
      await waitForJob(sql, ids.ok, (r) => r.state === "succeeded", "ok");
      assert(await handedAfter(sql, ids.a, ids.ok), "the step it may take was handed off");
      // Queued in a's outcome transaction, and left queued.
      for (const name of ["paused", "elsewhere", "unknown"]) {
        const row = await job(sql, ids[name]);
        assertEquals([name, row.state, row.run_count], [name, "queued", 0]);
      }
      await resumeQueue(sql, "paused");
      await waitForJob(sql, ids.paused, (r) => r.state === "succeeded", "the resumed step");
      assert(!await handedAfter(sql, ids.a, ids.paused), "claimed later, not handed off");
    } finally {
      await w.stop();
    }
  });
});

Deno.test("a dependent whose limit key is full is not handed off, and runs once the key has room", async () => {
  await withApp("hand_off_limit", async (app, sql) => {
    app.task("step", () => {});
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    // The key's one place is taken by a job of another worker, alive (not to be rescued).
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_ttl_ms)
      values ('elsewhere', 'h', 1, '{default}', 600000)`;
    const [{ id: holder }] = await sql`insert into akadze.jobs
        (task, limit_key, state, worker_id, started_at, run_count)
      values ('other', 'k', 'running', 'elsewhere', now(), 1) returning id::text as id`;
    const w = startWorker(app);
    await learn(sql, "step");
    const ids = await flow(sql, [
      { name: "a", task: "step" },
      // b comes first in claim order (a lower id): it would take a's one kept slot.
      { name: "b", task: "step", limit_key: "k", depends_on: ["a"] },
      { name: "ok", task: "step", limit_key: "free", depends_on: ["a"] },
    ]);
    try {
      await waitForJob(sql, ids.a, (r) => r.state === "succeeded", "a");
      await waitForJob(sql, ids.ok, (r) => r.state === "succeeded", "ok");
      assert(await handedAfter(sql, ids.a, ids.ok), "a key without limits is handed off");
      const row = await job(sql, ids.b);
      assertEquals([row.state, row.run_count], ["queued", 0]);
      await sql`update akadze.jobs set state = 'succeeded', finished_at = now()
        where id = ${holder}`;
      await waitForJob(sql, ids.b, (r) => r.state === "succeeded", "b");
      assert(!await handedAfter(sql, ids.a, ids.b));
    } finally {
      await w.stop();
    }
  });
});

Deno.test("a stopping worker is handed nothing: the dependent stays queued for others", async () => {
  await withApp("hand_off_stopping", async (app, sql) => {
    app.task("step", ({ stop }) => {
      if (stop) w.worker.stop();
    });
    const w = startWorker(app);
    await learn(sql, "step");
    const ids = await flow(sql, [
      { name: "a", task: "step", args: { stop: true } },
      { name: "b", task: "step", depends_on: ["a"] },
    ]);
    const exit = await w.exit;
    assertEquals(exit.reason, "stopped");
    assertEquals((await job(sql, ids.a)).state, "succeeded");
    const b = await job(sql, ids.b);
    assertEquals([b.state, b.run_count], ["queued", 0]);
  });
});

Deno.test("a dependent is not handed off ahead of a ready job of its queue", async () => {
  await withApp("hand_off_order", async (app, sql) => {
    const order: string[] = [];
    const plain = app.task("plain", () => {
      order.push("plain");
    });
    app.task("step", async ({ first }: { first?: boolean }, ctx) => {
      order.push(ctx.job.id);
      // Ready before this run's outcome is written; the one slot is kept meanwhile. Told by
      // its arguments: the worker may run it before the test has read the flow's ids.
      if (first) await plain.enqueue({});
    });
    const w = startWorker(app, { slots: 1 });
    let ids: Record<string, string> | undefined;
    try {
      await learn(sql, "step");
      order.length = 0;
      ids = await flow(sql, [
        { name: "a", task: "step", args: { first: true } },
        { name: "b", task: "step", depends_on: ["a"] },
      ]);
      await waitForJob(sql, ids.b, (r) => r.state === "succeeded", "b");
    } finally {
      await w.stop();
    }
    assertEquals(order, [ids.a, "plain", ids.b]);
    assert(!await handedAfter(sql, ids.a, ids.b));
  });
});

Deno.test("siblings finishing together in several workers hand their dependent off at most once, and it runs once", async () => {
  await withApp("hand_off_siblings", async (app, sql) => {
    const runs = new Map<string, number>();
    let barrier = latch();
    let started = 0;
    const width = 6;
    app.task("sibling", async () => {
      if (++started === width) barrier.resolve();
      await barrier.promise;
    });
    app.task("join", (_args, ctx) => {
      runs.set(ctx.job.id, (runs.get(ctx.job.id) ?? 0) + 1);
    });
    const workers = [1, 2, 3].map(() => startWorker(app, { slots: 2 }));
    try {
      for (let round = 0; round < 5; round++) {
        started = 0;
        barrier = latch();
        const siblings = Array.from({ length: width }, (_, i) => ({
          name: `s${i}`,
          task: "sibling",
        }));
        const ids = await flow(sql, [
          ...siblings,
          { name: "join", task: "join", depends_on: siblings.map((s) => s.name) },
        ]);
        const row = await waitForJob(sql, ids.join, (r) => r.state === "succeeded", "the join");
        assertEquals(row.run_count, 1);
        assertEquals(runs.get(ids.join), 1);
      }
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
    }
  });
});

Deno.test("a handed-off job whose worker dies is rescued like any running job", async () => {
  await withApp("hand_off_crash", async (app, sql, db) => {
    const options = { heartbeatInterval: 200, heartbeatTtl: 1_500, pollInterval: 100 };
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "--config", CONFIG, FIXTURE, JSON.stringify(options)],
      env: { AKADZE_DATABASE_URL: db.url, NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    let killed = false;
    try {
      await learn(sql, "sleep", { ms: 0 });
      const ids = await flow(sql, [
        { name: "a", task: "sleep", args: { ms: 0 } },
        { name: "b", task: "sleep", args: { ms: 600_000 }, depends_on: ["a"] },
      ]);
      const row = await waitForJob(sql, ids.b, (r) => r.state === "running", "b running");
      assert(await handedAfter(sql, ids.a, ids.b), "b was handed off");
      assertEquals(row.run_count, 1);
      child.kill("SIGKILL");
      killed = true;
      await child.status;
      // Another worker's rescuer finds b's worker gone and queues it again, an attempt spent.
      const rescuer = new Akadze({ databaseUrl: db.url });
      rescuer.task("sleep", (_args, ctx) => ctx.job.runCount);
      const w = startWorker(rescuer, { heartbeatInterval: 200 });
      try {
        const done = await waitForJob(
          sql,
          ids.b,
          (r) => r.state === "succeeded",
          "b rescued and run again",
          60_000,
        );
        assertEquals([done.run_count, done.attempt], [2, 1]);
      } finally {
        await w.stop();
        await rescuer.close();
      }
    } finally {
      if (!killed) {
        child.kill("SIGKILL");
        await child.status;
      }
    }
    void app;
  });
});

Deno.test("the 8-argument complete_jobs of earlier workers still queues and announces the dependent", async () => {
  await withApp("hand_off_old_signature", async (_app, sql) => {
    const ids = await flow(sql, [
      { name: "a", task: "t" },
      { name: "b", task: "t", depends_on: ["a"] },
    ]);
    const [a] =
      await sql`select id, run_count from akadze.claim_one('default', '{t}', 1, '{}', 'w1')`;
    const written = await sql`select * from akadze.complete_jobs(${[a.id]}::bigint[],
      ${[a.run_count]}::int[], '{succeeded}', '{"{}"}', '{null}', '{0}', null, null)`;
    assertEquals(written.map((r) => [r.id, r.state]), [[ids.a, "succeeded"]]);
    const b = await job(sql, ids.b);
    assertEquals([b.state, b.run_count], ["queued", 0]);
  });
});
