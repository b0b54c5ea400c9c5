// Claiming, running and stopping against a real server.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { current } from "../src/context.ts";
import { AkadzeError } from "../src/errors.ts";
import { requestCancel } from "../admin.ts";
import { drain } from "../src/testing.ts";
import { Worker } from "../src/worker/worker.ts";
import { LoopConnection } from "../src/loop_connection.ts";
import { assert, assertEquals, assertMatch, assertRejects, assertThrows } from "./assert.ts";
import { connect } from "../src/db.ts";
import {
  holdLocks,
  jobsSeqScans,
  startWorker,
  waitFor,
  waitForJob,
  waitForLockWait,
  withApp,
  withDatabase,
  withLogs,
  workClaimer,
} from "./_helpers.ts";

Deno.test("worker options are validated with precise messages", async () => {
  const app = new Akadze({ databaseUrl: "postgres://u@127.0.0.1:1/x_test" });
  try {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ queues: [] }, /queues must be a non-empty array/],
      [{ queues: ["bad queue"] }, /queue name "bad queue"/],
      [{ queues: ["a", "a"] }, /duplicates/],
      [{ slots: 0 }, /slots must be an integer/],
      [{ heartbeatInterval: -1 }, /heartbeatInterval must be a positive/],
      [{ heartbeatInterval: 5000, heartbeatTtl: 4000 }, /heartbeatTtl .* must be longer/],
      [{ maxJobs: 0 }, /maxJobs must be an integer/],
      [{ pruneInterval: 0 }, /pruneInterval must be a positive/],
      [{ fair: "yes" }, /fair must be a boolean/],
      [{ slot: 2 }, /unknown worker option "slot"/],
    ];
    for (const [options, message] of cases) {
      const error = assertThrows(() => new Worker(app, options as never), AkadzeError);
      assert(message.test(error.message), error.message);
    }
  } finally {
    await app.close();
  }
});

Deno.test("jobs are claimed in priority order, then run_at, then id; only ready ones", async () => {
  await withApp("w_priority", async (app, sql) => {
    const order: string[] = [];
    const t = app.task("t", ({ name }) => {
      order.push(name as string);
    });
    await t.using({ priority: 0 }).enqueue({ name: "low-1" });
    await t.using({ priority: 5 }).enqueue({ name: "high" });
    await t.using({ priority: 0 }).enqueue({ name: "low-2" });
    await t.using({ priority: -3 }).enqueue({ name: "lowest" });
    await t.using({ priority: 9, delay: 60_000 }).enqueue({ name: "future" });
    await t.using({ priority: 0, runAt: new Date(Date.now() - 60_000) }).enqueue({ name: "old" });
    await drain(app);
    assertEquals(order, ["high", "old", "low-1", "low-2", "lowest"]);
    const [{ state }] = await sql`select state from akadze.jobs where args->>'name' = 'future'`;
    assertEquals(state, "queued");
  });
});

Deno.test("the run starts after the claim has committed", async () => {
  await withApp("w_claim_commit", async (app, _sql, db) => {
    const observer = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      let seen: unknown;
      const t = app.task("t", async (_args, ctx) => {
        const [row] = await observer`select state, run_count, worker_id from akadze.jobs
                                     where id = ${ctx.job.id}`;
        seen = row;
      });
      await t.enqueue();
      const w = startWorker(app, { id: "w-commit" });
      await waitFor(() => seen, "the handler");
      await w.stop();
      assertEquals(seen, { state: "running", run_count: 1, worker_id: "w-commit" });
    } finally {
      await observer.end();
    }
  });
});

Deno.test("two workers never claim the same job; every job runs exactly once", async () => {
  await withApp("w_no_double", async (app, sql) => {
    await sql`create table public.runs (job_id bigint, worker text)`;
    const t = app.task("t", async (_args, ctx) => {
      await app.sql`insert into public.runs values (${ctx.job.id}, ${ctx.job.workerId})`;
    });
    await t.enqueueMany(Array.from({ length: 300 }, (_, i) => ({ i })));
    const a = startWorker(app, { slots: 8, id: "a" });
    const b = startWorker(app, { slots: 8, id: "b" });
    await waitFor(
      async () => {
        const [{ n }] =
          await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
        return n === 300;
      },
      "all jobs to succeed",
      60_000,
    );
    await Promise.all([a.stop(), b.stop()]);
    const [{ runs, distinct, workers }] = await sql`
      select count(*)::int as runs, count(distinct job_id)::int as distinct,
             count(distinct worker)::int as workers from public.runs`;
    assertEquals([runs, distinct], [300, 300]);
    assertEquals(workers, 2);
  });
});

Deno.test("paused queues are not claimed; expired and cancel-requested queued jobs are cancelled", async () => {
  await withApp("w_pause_expire", async (app, sql) => {
    const ran: string[] = [];
    const t = app.task("t", { queue: "q" }, ({ name }) => {
      ran.push(name as string);
    });
    const other = app.task("o", { queue: "other" }, ({ name }) => {
      ran.push(name as string);
    });
    await sql`insert into akadze.queue_pauses (queue) values ('q')`;
    const paused = await t.enqueue({ name: "paused" });
    await other.enqueue({ name: "other" });
    const expired = await other.using({ expiresAt: new Date(Date.now() - 1000) }).enqueue({
      name: "expired",
    });
    const cancelled = await other.using({ delay: 60_000 }).enqueue({ name: "cancelled" });
    await app.sql.begin((tx) => requestCancel(tx, cancelled));
    await drain(app, { queues: ["q", "other"] });
    assertEquals(ran, ["other"]);
    const states = await sql`select id::text as id, state, attempt from akadze.jobs`;
    const byId = new Map(states.map((r) => [r.id, [r.state, r.attempt]]));
    assertEquals(byId.get(paused), ["queued", 0]);
    assertEquals(byId.get(expired), ["cancelled", 0]);
    assertEquals(byId.get(cancelled), ["cancelled", 0]);
    await sql`delete from akadze.queue_pauses`;
    await drain(app, { queues: ["q"] });
    assertEquals(ran, ["other", "paused"]);
  });
});

Deno.test("jobs of tasks this worker does not know are left for other workers", async () => {
  await withApp("w_unknown_task", async (app, sql) => {
    app.task("known", () => {});
    await sql`insert into akadze.jobs (task) values ('unknown.elsewhere')`;
    const [id] = await app.tasks.get("known")!.enqueueMany([{}]);
    await drain(app);
    const rows = await sql`select task, state from akadze.jobs order by jobs.id`;
    assertEquals(rows.map((r) => [r.task, r.state]), [
      ["unknown.elsewhere", "queued"],
      ["known", "succeeded"],
    ]);
    assert(id);
  });
});

Deno.test("a timeout aborts ctx.signal and counts as an error retried with backoff", async () => {
  await withApp("w_timeout", async (app, sql) => {
    let reason: unknown;
    const slow = app.task("slow", { timeout: 200 }, (_args, ctx) =>
      new Promise((resolve) => {
        ctx.signal.addEventListener("abort", () => {
          reason = ctx.signal.reason;
          resolve("too late");
        });
      }));
    const id = await slow.enqueue();
    const w = startWorker(app);
    const row = await waitForJob(sql, id, (r) => r.attempt === 1, "the timeout");
    await w.stop();
    assertEquals(row.state, "queued");
    assertEquals((row.errors as { error: string }[])[0].error, "TimeoutError");
    assertEquals((reason as Error).name, "TimeoutError");
    assertEquals(row.result, null);
  });
});

Deno.test("ctx exposes the job, deadline and remaining(); current() works inside and throws outside", async () => {
  await withApp("w_ctx", async (app) => {
    let seen: Record<string, unknown> = {};
    async function nested() {
      await Promise.resolve();
      return current().job.task;
    }
    const t = app.task("ctx.task", { timeout: 60_000, queue: "q" }, async (_args, ctx) => {
      seen = {
        task: await nested(),
        same: current() === ctx,
        queue: ctx.job.queue,
        attempt: ctx.job.attempt,
        runCount: ctx.job.runCount,
        deadline: ctx.deadline instanceof Date,
        remaining: (ctx.remaining() ?? 0) > 59_000,
      };
    });
    await t.enqueue();
    await drain(app);
    assertEquals(seen, {
      task: "ctx.task",
      same: true,
      queue: "q",
      attempt: 1, // the first run is attempt 1
      runCount: 1,
      deadline: true,
      remaining: true,
    });
    const error = assertThrows(() => current(), AkadzeError);
    assertEquals(error.message, "current() is only valid inside a running job");
  });
});

Deno.test("requestCancel of a running job aborts its signal promptly; the job ends cancelled", async () => {
  await withApp("w_cancel_running", async (app, sql) => {
    let started = false;
    let aborted = false;
    const t = app.task("t", { maxAttempts: 3 }, (_args, ctx) =>
      new Promise((resolve) => {
        started = true;
        ctx.signal.addEventListener("abort", () => {
          aborted = true;
          resolve("result that must be dropped");
        });
      }));
    const id = await t.enqueue();
    // Heartbeats every 30 s: the cancel must arrive through NOTIFY, well before that.
    const w = startWorker(app, { heartbeatInterval: 30_000, heartbeatTtl: 90_000 });
    await waitFor(() => started, "the run to start");
    const t0 = performance.now();
    assert(await app.sql.begin((tx) => requestCancel(tx, id)));
    const row = await waitForJob(sql, id, (r) => r.state === "cancelled", "the cancel", 15_000);
    assert(performance.now() - t0 < 15_000);
    await w.stop();
    assert(aborted);
    assertEquals([row.attempt, row.result, row.run_count], [0, null, 1]);
    // Terminal and unknown jobs: a no-op.
    assertEquals(await app.sql.begin((tx) => requestCancel(tx, id)), false);
    assertEquals(await app.sql.begin((tx) => requestCancel(tx, "999999")), false);
    await assertRejects(() => app.sql.begin((tx) => requestCancel(tx, "1; drop")), AkadzeError);
  });
});

Deno.test("with notify: false a cancel reaches the running job at the next heartbeat", async () => {
  await withApp("w_cancel_poll", async (app, sql) => {
    let started = false;
    const t = app.task("t", (_args, ctx) =>
      new Promise((resolve) => {
        started = true;
        ctx.signal.addEventListener("abort", () => resolve(null));
      }));
    const id = await t.enqueue();
    const w = startWorker(app, { heartbeatInterval: 300, heartbeatTtl: 3_000 });
    await waitFor(() => started, "the run to start");
    await app.sql.begin((tx) => requestCancel(tx, id));
    await waitForJob(sql, id, (r) => r.state === "cancelled", "the cancel");
    await w.stop();
  }, { notify: false });
});

Deno.test("NOTIFY wakes an idle worker: a job starts well under the poll interval", async () => {
  await withApp("w_notify", async (app, sql) => {
    let startedAt = 0;
    const t = app.task("t", () => {
      startedAt = performance.now();
    });
    // Its next pass without a NOTIFY is at least 30 s away (the heartbeat interval).
    const w = startWorker(app, {
      pollInterval: 60_000,
      heartbeatInterval: 30_000,
      heartbeatTtl: 120_000,
    });
    // Idle once its LISTEN is set up (the first pass's claim comes after it).
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
        where datname = current_database() and state = 'idle' and query ilike 'listen %'`;
      return n > 0;
    }, "the worker to listen");
    const enqueuedAt = performance.now();
    await t.enqueue();
    await waitFor(() => startedAt, "the job to start", 25_000);
    await w.stop();
    assert(startedAt - enqueuedAt < 15_000, `latency ${startedAt - enqueuedAt} ms`);
  });
});

Deno.test("slots are per queue; fair shares one pool round-robin", async () => {
  await withApp("w_fair", async (app, sql) => {
    let running = 0;
    let peak = 0;
    const order: string[] = [];
    const make = (queue: string) =>
      app.task(`t.${queue}`, { queue }, async () => {
        order.push(queue);
        running++;
        peak = Math.max(peak, running);
        await new Promise((r) => setTimeout(r, 30));
        running--;
      });
    const busy = make("busy");
    const quiet = make("quiet");
    await busy.enqueueMany(Array.from({ length: 12 }, () => ({})));
    await quiet.enqueueMany(Array.from({ length: 3 }, () => ({})));
    const w = startWorker(app, { queues: ["busy", "quiet"], slots: 2, fair: true });
    await waitFor(
      async () => {
        const [{ n }] =
          await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
        return n === 15;
      },
      "all jobs",
      30_000,
    );
    await w.stop();
    assert(peak <= 2, `peak ${peak} with a shared pool of 2`);
    // The quiet queue is not starved behind the busy one: all of it runs early.
    const lastQuiet = order.lastIndexOf("quiet");
    assert(lastQuiet < 8, `quiet jobs ran at ${order.map((q) => q[0]).join("")}`);
    peak = 0;
    order.length = 0;
    await busy.enqueueMany(Array.from({ length: 6 }, () => ({})));
    await quiet.enqueueMany(Array.from({ length: 6 }, () => ({})));
    const perQueue = startWorker(app, { queues: ["busy", "quiet"], slots: 2 });
    await waitFor(
      async () => {
        const [{ n }] =
          await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
        return n === 27;
      },
      "all jobs",
      30_000,
    );
    await perQueue.stop();
    assert(peak <= 4 && peak >= 3, `peak ${peak} with 2 slots in each of 2 queues`);
  });
});

Deno.test("batch stops after nothing is claimable and maxJobs after N claims, both exit 0", async () => {
  await withApp("w_batch", async (app, sql) => {
    const t = app.task("t", () => {});
    await t.enqueueMany([{}, {}, {}, {}, {}]);
    const limited = await startWorker(app, { maxJobs: 2, slots: 1 }).exit;
    assertEquals(limited, { code: 0, reason: "max_jobs" });
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
    assertEquals(n, 2);
    const batch = await startWorker(app, { batch: true, slots: 2 }).exit;
    assertEquals(batch, { code: 0, reason: "batch_done" });
    const [{ m }] = await sql`select count(*)::int as m from akadze.jobs where state = 'succeeded'`;
    assertEquals(m, 5);
    const [{ w }] = await sql`select count(*)::int as w from akadze.workers`;
    assertEquals(w, 0, "a clean stop removes the worker row");
  });
});

Deno.test("stop waits for a short job; a long one goes back to queued without spending an attempt", async () => {
  await withApp("w_shutdown", async (app, sql) => {
    let abortedLong = false;
    const short = app.task("short", { queue: "s" }, async () => {
      await new Promise((r) => setTimeout(r, 300));
      return "done";
    });
    const long = app.task("long", { queue: "l" }, (_args, ctx) =>
      new Promise(() => {
        ctx.signal.addEventListener("abort", () => abortedLong = true);
      }));
    const s = await short.enqueue();
    const l = await long.enqueue();
    const w = startWorker(app, { queues: ["s", "l"], shutdownTimeout: 1_000 });
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from akadze.jobs where state = 'running'`;
      return n === 2;
    }, "both to run");
    const exit = await w.stop();
    assertEquals(exit, { code: 0, reason: "stopped" });
    const rows = await sql`select id::text as id, state, attempt, run_count, worker_id
                           from akadze.jobs`;
    const byId = new Map(rows.map((r) => [r.id, r]));
    assertEquals(byId.get(s)?.state, "succeeded");
    assertEquals(
      [byId.get(l)?.state, byId.get(l)?.attempt, byId.get(l)?.worker_id],
      ["queued", 0, w.worker.id], // it keeps the worker that ran it
    );
    assert(abortedLong);
  });
});

Deno.test("completeTx commits the caller's writes with the transition to succeeded", async () => {
  await withApp("w_complete_tx", async (app, sql) => {
    await sql`create table public.reports (id int, built boolean)`;
    const next = app.task("notify", () => {});
    const build = app.task("build", async ({ id }, ctx) => {
      await ctx.completeTx(async (tx) => {
        await tx`insert into public.reports values (${id as number}, true)`;
        await next.using({ session: tx }).enqueue({ id });
      });
      await assertRejects(() => ctx.completeTx(async () => {}), AkadzeError);
      return "ignored after completeTx";
    });
    const id = await build.enqueue({ id: 7 });
    await drain(app, { queues: ["default"], limit: 1 }).catch(() => 0);
    const [row] = await sql`select state, result, attempt from akadze.jobs where id = ${id}`;
    assertEquals(row, { state: "succeeded", result: null, attempt: 0 });
    assertEquals((await sql`select * from public.reports`).length, 1);
    const follow = await sql`select args from akadze.jobs where task = 'notify'`;
    assertEquals(follow.map((r) => r.args), [{ id: 7 }]);
  });
});

Deno.test("a task registered after the worker was made is named in a warning, once", async () => {
  const records = await withLogs(async () => {
    await withApp("w_late_task", async (app) => {
      app.task("early", () => {});
      const worker = new Worker(app, { batch: true });
      app.task("late", () => {});
      assertEquals((await worker.run()).code, 0);
    });
  });
  const late = records.filter((r) => r.properties.event === "task_after_worker");
  assertEquals(late.map((r) => [r.level, r.properties.task]), [["warning", "late"]]);
});

Deno.test("an error thrown after completeTx is logged as ignored, and the success stands", async () => {
  const records = await withLogs(async () => {
    await withApp("w_complete_tx_throw", async (app, sql) => {
      const build = app.task("build", async (_args, ctx) => {
        await ctx.completeTx(async () => {});
        throw new TypeError("cleanup failed");
      });
      const id = await build.enqueue();
      await drain(app, { queues: ["default"], limit: 1 }).catch(() => 0);
      const [row] = await sql`select state, attempt, errors from akadze.jobs where id = ${id}`;
      assertEquals(row, { state: "succeeded", attempt: 0, errors: [] });
    });
  });
  const after = records.filter((r) => r.properties.event === "error_after_outcome");
  assertEquals(after.length, 1);
  assertEquals(after[0].level, "warning");
  assertEquals([after[0].properties.error, after[0].properties.message], [
    "TypeError",
    "cleanup failed",
  ]);
});

Deno.test("a success written through completeTx is logged once, like any other", async () => {
  await withApp("w_complete_tx_log", async (app, sql) => {
    const viaTx = app.task("viaTx", async (_args, ctx) => {
      await ctx.completeTx(async () => {});
    });
    const plain = app.task("plain", () => {});
    const ids = [await viaTx.enqueue(), await viaTx.enqueue(), await viaTx.enqueue()];
    const other = await plain.enqueue();
    const records = await withLogs(async () => {
      await new Worker(app, { batch: true, shutdownTimeout: 1_000 }).run();
    });
    const succeeded = records
      .filter((r) => r.properties.event === "job_succeeded")
      .map((r) => r.properties.jobId as string);
    assertEquals(succeeded.sort(), [...ids, other].sort());
    const states = await sql`select state from akadze.jobs where task = 'viaTx'`;
    assertEquals(states.map((r) => r.state), ["succeeded", "succeeded", "succeeded"]);
  });
});

Deno.test("a success written through completeTx is seen once by afterRun and onTransition hooks", async () => {
  await withApp("w_complete_tx_hooks", async (app) => {
    const after: string[] = [];
    const transitions: string[] = [];
    app.hooks.afterRun.push((job) => {
      after.push(job.id);
    });
    app.hooks.onTransition.push((_tx, job, from, to) => {
      if (from === "running") transitions.push(`${job.id}:${to}`);
    });
    const viaTx = app.task("viaTx", async (_args, ctx) => {
      await ctx.completeTx(async () => {});
    });
    const ids = [await viaTx.enqueue(), await viaTx.enqueue(), await viaTx.enqueue()];
    await new Worker(app, { batch: true, shutdownTimeout: 1_000 }).run();
    assertEquals(after.sort(), [...ids].sort());
    assertEquals(transitions.sort(), ids.map((id) => `${id}:succeeded`).sort());
  });
});

Deno.test("completeTx rolls back on an error, a nested call, lost ownership and cancel", async () => {
  await withApp("w_complete_tx_fail", async (app, sql, db) => {
    await sql`create table public.writes (tag text)`;
    const other = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const errors: Record<string, string> = {};
      const t = app.task("t", { maxAttempts: 5 }, async ({ tag }, ctx) => {
        const write = (tx: import("../src/db.ts").TransactionSql) =>
          tx`insert into public.writes values (${tag as string})`;
        if (tag === "lost") {
          // Another run took the job over (as after a rescue and a new claim).
          await other`update akadze.jobs set run_count = run_count + 1 where id = ${ctx.job.id}`;
        }
        try {
          await ctx.completeTx(async (tx) => {
            await write(tx);
            if (tag === "error") throw new Error("inside");
            if (tag === "nested") await ctx.completeTx(write);
          });
        } catch (error) {
          errors[tag as string] = (error as Error).message;
          throw error;
        }
      });
      const cancelJob = app.task("c", async (_args, ctx) => {
        await other`update akadze.jobs set cancel_requested_at = now() where id = ${ctx.job.id}`;
        try {
          await ctx.completeTx(async (tx) => {
            await tx`insert into public.writes values ('cancel')`;
          });
        } catch (error) {
          errors.cancel = (error as Error).message;
          throw error;
        }
      });
      const ids = {
        error: await t.enqueue({ tag: "error" }),
        nested: await t.enqueue({ tag: "nested" }),
        cancel: await cancelJob.enqueue(),
      };
      await drain(app);
      assertEquals((await sql`select * from public.writes`).length, 0);
      assertEquals(errors.error, "inside");
      assertMatch(errors.nested, /cannot be nested/);
      assertMatch(errors.cancel, /was cancelled/);
      const rows = await sql`select id::text as id, state, attempt from akadze.jobs`;
      const byId = new Map(rows.map((r) => [r.id, [r.state, r.attempt]]));
      assertEquals(byId.get(ids.error), ["queued", 1]);
      assertEquals(byId.get(ids.nested), ["queued", 1]);
      assertEquals(byId.get(ids.cancel), ["cancelled", 0]);
      // Lost ownership: the run_count moved on before the transition, so nothing commits.
      const lost = await t.enqueue({ tag: "lost" });
      const w = startWorker(app);
      await waitFor(() => errors.lost, "the lost-ownership error", 30_000);
      await w.stop();
      assertMatch(errors.lost, /no longer owned by this run/);
      assertEquals((await sql`select * from public.writes where tag = 'lost'`).length, 0);
      assert(lost);
    } finally {
      await other.end();
    }
  });
});

Deno.test("hooks: beforeRun and afterRun around the handler; onTransition in the changing transaction", async () => {
  await withApp("w_hooks", async (app, sql) => {
    await sql`create table public.transitions (job_id bigint, from_state text, to_state text)`;
    const events: string[] = [];
    app.hooks.beforeRun.push((job) => {
      events.push(`before:${job.task}`);
    });
    app.hooks.afterRun.push((job, result) => {
      events.push(`after:${job.task}:${result}`);
    });
    app.hooks.onTransition.push(async (tx, job, from, to) => {
      await tx`insert into public.transitions values (${job.id}, ${from}, ${to})`;
      if (job.task === "veto" && to === "running") throw new Error("veto the claim");
    });
    const t = app.task("t", () => {
      events.push("handler");
      return "r";
    });
    const failing = app.task("bad", { maxAttempts: 1 }, () => {
      throw new Error("x");
    });
    const veto = app.task("veto", () => {
      events.push("veto ran");
    });
    const a = await t.enqueue();
    const b = await failing.enqueue();
    const v = await veto.enqueue();
    await drain(app);
    assertEquals(events.filter((e) => !e.includes("bad")), ["before:t", "handler", "after:t:r"]);
    const rows = await sql`select job_id::text as id, from_state, to_state from public.transitions
                           order by ctid`;
    const of = (id: string) =>
      rows.filter((r) => r.id === id).map((r) => `${r.from_state}>${r.to_state}`);
    assertEquals(of(a), ["queued>running", "running>succeeded"]);
    assertEquals(of(b), ["queued>running", "running>failed"]);
    // The vetoed claim rolled back, its transition row with it; the job stays queued.
    assertEquals(of(v), []);
    const [row] = await sql`select state, run_count from akadze.jobs where id = ${v}`;
    assertEquals(row, { state: "queued", run_count: 0 });
  });
});

Deno.test("an error in beforeRun or afterRun fails the run", async () => {
  await withApp("w_run_hook_error", async (app, sql) => {
    app.hooks.afterRun.push((job) => {
      if (job.task === "after") throw new Error("after hook broke");
    });
    const t = app.task("after", () => "x");
    const id = await t.enqueue();
    await drain(app);
    const [row] = await sql`select state, attempt, errors from akadze.jobs where id = ${id}`;
    assertEquals([row.state, row.attempt, row.errors[0].message], [
      "queued",
      1,
      "after hook broke",
    ]);
  });
});

Deno.test("the worker keeps claiming while its prune waits on a lock, and prunes after", async () => {
  await withApp("w_prune_beside", async (app, sql, db) => {
    const done: number[] = [];
    const job = app.task("job", ({ n }) => {
      done.push(n as number);
    });
    await sql`insert into akadze.jobs (task, state, finished_at)
              values ('job', 'succeeded', now() - interval '8 days')`;
    await sql`insert into akadze.periodic_runs (name, fire_at, created_at)
              values ('a', now() - interval '3 days', now() - interval '3 days'), ('a', now(), now())`;
    // A lock the claim path never asks for (no schedules here), but the prune does.
    const held = await holdLocks(
      db.url,
      (tx) => tx`lock table akadze.periodic_runs in access exclusive mode`,
    );
    const w = startWorker(app, { pruneInterval: 50, schedules: false });
    try {
      await waitForLockWait(sql, "a prune waiting on the lock", "delete from %periodic_runs%");
      for (let n = 0; n < 5; n++) await job.enqueue({ n });
      await waitFor(() => done.length === 5, "the jobs to run while the prune waits", 30_000);
    } finally {
      await held.release();
    }
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from akadze.periodic_runs`;
      return n === 1; // the schedule's last fire stays
    }, "the prune to finish once the lock is gone");
    assertEquals((await w.stop()).code, 0);
    assertEquals(done.sort(), [0, 1, 2, 3, 4]);
  });
});

Deno.test("drain runs jobs enqueued by jobs, leaves future jobs, and raises past its limit", async () => {
  await withApp("w_drain", async (app, sql) => {
    const chain = app.task("chain", async ({ n }) => {
      if ((n as number) < 3) await chain.enqueue({ n: (n as number) + 1 });
    });
    const later = app.task("later", () => {});
    await chain.enqueue({ n: 0 });
    await later.using({ delay: 60_000 }).enqueue();
    assertEquals(await drain(app), 4);
    const [{ q }] = await sql`select count(*)::int as q from akadze.jobs where state = 'queued'`;
    assertEquals(q, 1);
    const forever = app.task("forever", async () => {
      await forever.enqueue();
    });
    await forever.enqueue();
    const error = await assertRejects(() => drain(app, { limit: 5 }), AkadzeError);
    assertMatch(error.message, /still ready/);
  });
});

Deno.test("four workers racing on one queue run every job exactly once", async () => {
  await withApp("w_race", async (app, sql) => {
    const runs = new Map<number, number>();
    const t = app.task("t", async ({ n }) => {
      runs.set(n as number, (runs.get(n as number) ?? 0) + 1);
      if ((n as number) % 7 === 0) await new Promise((r) => setTimeout(r, 1));
    });
    const n = 2_000;
    await t.enqueueMany(Array.from({ length: n }, (_, i) => ({ n: i })));
    const workers = Array.from(
      { length: 4 },
      () => new Worker(app, { slots: 50, batch: true, pollInterval: 50, schedules: false }),
    );
    const exits = await Promise.all(workers.map((w) => w.run()));
    assertEquals(exits.map((e) => e.code), [0, 0, 0, 0]);
    assertEquals(runs.size, n);
    assert([...runs.values()].every((count) => count === 1), "a job ran twice");
    // Several workers took a share: the claims really raced.
    const shares = workers.map((w) => w.claimed);
    assert(shares.filter((c) => c > 0).length >= 2, shares.join(","));
    const [{ succeeded }] = await sql`
      select count(*) filter (where state = 'succeeded')::int as succeeded from akadze.jobs`;
    assertEquals(succeeded, n);
  });
});

Deno.test("with prepare: true, plans a worker made on a near-empty table still use indexes when it grows", async () => {
  await withDatabase("w_prepared_plans", async (db, sql) => {
    // No autovacuum: its statistics update would re-plan and hide a plan made too early.
    // The table is vacuumed while small (one page), which invites a sequential scan most.
    await sql`alter table akadze.jobs set (autovacuum_enabled = off)`;
    await sql`insert into akadze.jobs (task, state, run_count, started_at, finished_at)
              select 'work', 'succeeded', 1, now(), now() from generate_series(1, 20)`;
    await sql`vacuum analyze akadze.jobs`;
    const app = new Akadze({ sql: connect(db.url, { max: 4, prepare: true }) });
    let ran = 0;
    const work = app.task("work", () => {
      ran++;
    });
    // Two queues: the multi-queue claim, which stays a statement in claimer.ts. Fast
    // intervals, so that every statement of the loop runs more than the five times after
    // which PostgreSQL may keep a generic plan of a prepared statement.
    const w = startWorker(app, {
      queues: ["default", "other"],
      slots: 2,
      pollInterval: 20,
      heartbeatInterval: 100,
      heartbeatTtl: 5_000,
      pruneInterval: 100,
      schedules: false,
    });
    try {
      for (let i = 0; i < 10; i++) {
        await work.enqueue({});
        await work.using({ queue: "other" }).enqueue({});
        await waitFor(() => ran === 2 * (i + 1), "the jobs to run");
      }
      // The cancel pass runs once a second: six of them before the table grows.
      await new Promise((r) => setTimeout(r, 6_500));
      await sql`insert into akadze.jobs (task, state, run_count, started_at, finished_at)
                select 'work', 'succeeded', 1, now(), now() from generate_series(1, 20000)`;
      // Other backends report their counts up to a second late: wait until the scans made
      // on the small table (custom plans may rightly scan it) are all counted.
      await new Promise((r) => setTimeout(r, 1_200));
      const before = await jobsSeqScans(sql);
      for (let i = 0; i < 5; i++) {
        await work.enqueue({});
        await work.using({ queue: "other" }).enqueue({});
      }
      await waitFor(() => ran === 30, "the jobs to run");
      await new Promise((r) => setTimeout(r, 1_500));
      assertEquals(
        await jobsSeqScans(sql) - before,
        0,
        "a statement of the worker scanned the table",
      );
    } finally {
      await w.stop();
      await app.close();
    }
  });
});

Deno.test("the worker and the enqueue prepare their statements when the pool does, and only then", async () => {
  await withDatabase("w_prepare_option", async (db) => {
    for (const prepare of [true, false]) {
      // One connection: what the worker and the enqueue prepared is visible to the last query.
      const app = new Akadze({ sql: connect(db.url, { max: 1, prepare }) });
      let ran = 0;
      const work = app.task("work", () => {
        ran++;
      });
      const w = startWorker(app, { pollInterval: 20, schedules: false });
      try {
        for (let i = 0; i < 3; i++) await work.enqueue({});
        await waitFor(() => ran === 3, "the jobs to run");
      } finally {
        await w.stop();
      }
      const prepared = async (sql: typeof app.sql) =>
        (await sql.unsafe("select statement from pg_prepared_statements")).map((r) =>
          String(r.statement)
        );
      const statements = await prepared(app.sql);
      // The claim runs on the worker loop's own connection, made with the pool's settings.
      const loop = new LoopConnection(app.sql);
      try {
        await work.enqueue({});
        const claimed = await workClaimer(loop.sql).claim([{ queue: "default", slots: 1 }], 1, 0);
        assertEquals(claimed.claimed.length, 1);
        statements.push(...await prepared(loop.sql));
        // Not left running for the next round's worker to rescue and run.
        await loop.sql`delete from akadze.jobs where id = ${claimed.claimed[0].id}`;
      } finally {
        await loop.close();
      }
      await app.close();
      const ours = ["claim_one(", "complete_jobs", 'insert into "akadze".jobs'];
      for (const text of ours) {
        assertEquals(
          statements.some((s) => s.includes(text)),
          prepare,
          `prepare: ${prepare}, a statement with ${text}: ${statements.join(" | ")}`,
        );
      }
    }
  });
});
