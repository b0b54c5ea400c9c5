// app.waitForJob / waitForJobs against real PostgreSQL: woken by the trigger's NOTIFY, by
// the poll when notifications cannot arrive, every path that ends a job, timeouts, unknown
// ids, many waiters on one LISTEN, and waiters racing completions.
import { Akadze } from "../src/app.ts";
import { requestCancel } from "../src/admin/jobs.ts";
import type { Sql } from "../src/db.ts";
import { AkadzeError, JobNotFound, JobWaitTimeout } from "../src/errors.ts";
import { Rescuer } from "../src/worker/rescuer.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals, assertRejects } from "./assert.ts";
import { startWorker, waitFor, waitForJob, withApp, withDatabase, within } from "./_helpers.ts";
import { pgbouncerBinary, startPgBouncer } from "./_pgbouncer.ts";

/** `fn` rejects with a `cls` whose message contains `text`; returns the error. */
async function rejects<E extends Error>(
  fn: () => PromiseLike<unknown>,
  cls: new (...args: never[]) => E,
  text: string,
): Promise<E> {
  const error = await assertRejects(fn, cls);
  assert(error.message.includes(text), `"${error.message}" should contain "${text}"`);
  return error;
}

/** A promise and the function that resolves it. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => open = resolve);
  return { opened, open };
}

async function awaited(sql: Sql, id: string): Promise<boolean> {
  const [row] = await sql`select awaited from akadze.jobs where id = ${id}`;
  return row?.awaited === true;
}

/** Backends listening for finished jobs (their last statement was that LISTEN). */
async function doneListeners(sql: Sql): Promise<number> {
  const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
    where datname = current_database() and pid <> pg_backend_pid()
      and query ilike '%listen%akadze_done%'`;
  return n;
}

// No poll can answer within the tests' bounds: only a notification can.
const NO_POLL = { timeout: 120_000, pollInterval: 120_000 };

Deno.test("waitForJob returns an already finished job with its result at once", async () => {
  await withApp("await_done", async (app) => {
    const add = app.task("add", ({ a, b }) => (a as number) + (b as number));
    const id = await add.enqueue({ a: 2, b: 3 });
    await new Worker(app, { batch: true }).run();
    const job = await within(app.waitForJob(id, NO_POLL), 10_000, "the finished job");
    assertEquals(job.id, id);
    assertEquals(job.state, "succeeded");
    assertEquals(job.result, 5);
    assertEquals(job.task, "add");
    assert(job.finishedAt instanceof Date);
  });
});

Deno.test("a waiter is woken by the notification when the job finishes (no poll in time)", async () => {
  await withApp("await_notify", async (app, sql) => {
    const g = gate();
    const work = app.task("work", async () => {
      await g.opened;
      return { ok: true };
    });
    const running = startWorker(app);
    try {
      const id = await work.enqueue({});
      await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
      const wait = app.waitForJob(id, NO_POLL);
      wait.catch(() => {});
      await waitFor(() => awaited(sql, id), "the job to be marked awaited");
      g.open();
      const job = await within(wait, 15_000, "the notification");
      assertEquals([job.state, job.result], ["succeeded", { ok: true }]);
    } finally {
      await running.stop();
    }
  });
});

Deno.test("with listen: false the waiter finds the outcome by polling", async () => {
  await withApp("await_poll", async (app, sql) => {
    const g = gate();
    const work = app.task("work", async () => {
      await g.opened;
      throw new Error("boom");
    });
    const running = startWorker(app);
    try {
      const id = await work.using({ maxAttempts: 1 }).enqueue({});
      await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
      const wait = app.waitForJob(id, { timeout: 60_000, listen: false, pollInterval: 100 });
      wait.catch(() => {});
      await waitFor(() => awaited(sql, id), "the job to be marked awaited");
      assertEquals(await doneListeners(sql), 0, "no LISTEN was opened");
      g.open();
      const job = await within(wait, 15_000, "the poll");
      assertEquals(job.state, "failed");
      assertEquals(job.errors.at(-1)?.message, "boom");
    } finally {
      await running.stop();
    }
  });
});

Deno.test("a timeout rejects with JobWaitTimeout naming the state the job is still in", async () => {
  await withApp("await_timeout", async (app) => {
    const work = app.task("work", () => {});
    const id = await work.enqueue({});
    const error = await rejects(
      () => app.waitForJob(id, { timeout: 200 }),
      JobWaitTimeout,
      `job ${id} did not finish within 200 ms: it is still queued`,
    );
    assertEquals(error.unfinished, [{ id, state: "queued" }]);
    const other = await work.enqueue({});
    await new Worker(app, { batch: true, queues: ["none"] }).run();
    const many = await rejects(
      () => app.waitForJobs([id, other], { timeout: 100 }),
      JobWaitTimeout,
      `2 jobs did not finish within 100 ms: ${id} (queued), ${other} (queued)`,
    );
    assertEquals(many.unfinished.length, 2);
  });
});

Deno.test("an unknown or malformed id is a clear error", async () => {
  await withApp("await_unknown", async (app) => {
    await rejects(
      () => app.waitForJob("999999", { timeout: 5_000 }),
      JobNotFound,
      "job 999999 does not exist",
    );
    await rejects(
      () => app.waitForJob("abc", { timeout: 5_000 }),
      AkadzeError,
      'job id must be a positive decimal integer, got "abc"',
    );
    await rejects(
      () => app.waitForJob("1", {} as never),
      AkadzeError,
      "timeout must be a number of milliseconds",
    );
    await rejects(() => app.waitForJobs([], { timeout: 1 }), AkadzeError, "non-empty");
  });
});

Deno.test("an aborted signal ends the wait with its reason; close() ends pending waits", async () => {
  await withDatabase("await_abort", async (db, sql) => {
    const app = new Akadze({ databaseUrl: db.url });
    const work = app.task("work", () => {});
    const id = await work.enqueue({});
    const controller = new AbortController();
    const wait = app.waitForJob(id, { timeout: 60_000, signal: controller.signal });
    wait.catch(() => {});
    await waitFor(() => awaited(sql, id), "the job to be marked awaited");
    controller.abort(new Error("the request went away"));
    await rejects(() => wait, Error, "the request went away");
    const pending = app.waitForJob(id, { timeout: 60_000 });
    pending.catch(() => {});
    await waitFor(async () => (await doneListeners(sql)) === 1, "the LISTEN");
    await app.close();
    await rejects(() => pending, AkadzeError, "the app was closed while waiting");
    await waitFor(async () => (await doneListeners(sql)) === 0, "the LISTEN to end");
  });
});

Deno.test("many waiters share one LISTEN connection and all learn the outcomes", async () => {
  await withApp("await_many", async (app, sql) => {
    const g = gate();
    const work = app.task("work", async ({ n }) => {
      await g.opened;
      return n;
    });
    const waiterApp = new Akadze({ sql });
    const running = startWorker(app, { slots: 10 });
    try {
      const ids = await work.enqueueMany(Array.from({ length: 10 }, (_, n) => ({ n })));
      const single = [...ids, ...ids].map((id) => waiterApp.waitForJob(id, NO_POLL));
      const together = waiterApp.waitForJobs([...ids].reverse(), NO_POLL);
      together.catch(() => {});
      Promise.all(single).catch(() => {});
      await waitFor(async () => {
        const [{ n }] = await sql`select count(*)::int as n from akadze.jobs where awaited`;
        return n === 10;
      }, "every job marked awaited");
      assertEquals(await doneListeners(sql), 1);
      g.open();
      const done = await within(Promise.all(single), 20_000, "every waiter");
      for (let i = 0; i < 10; i++) {
        assertEquals([done[i].id, done[i].result], [ids[i], i]);
        assertEquals(done[10 + i].result, i);
      }
      const all = await within(together, 20_000, "the waiter of all");
      assertEquals(all.map((j) => j.id), [...ids].reverse());
    } finally {
      await running.stop();
      await waiterApp.close();
    }
  });
});

Deno.test("waiters racing completions are never left waiting (no lost wake-up)", async () => {
  await withApp("await_race", async (app) => {
    const work = app.task("work", async ({ ms }) => {
      await new Promise((r) => setTimeout(r, ms as number));
    });
    const running = startWorker(app, { slots: 50 });
    try {
      for (let round = 0; round < 4; round++) {
        const ids = await work.enqueueMany(
          Array.from({ length: 100 }, () => ({ ms: Math.floor(Math.random() * 4) })),
        );
        // Each waiter starts at a random moment around its job's run and outcome write.
        const waits = ids.map(async (id) => {
          await new Promise((r) => setTimeout(r, Math.random() * 15));
          return await app.waitForJob(id, NO_POLL);
        });
        const jobs = await within(Promise.all(waits), 30_000, `round ${round}'s waiters`);
        assert(jobs.every((j) => j.state === "succeeded"));
      }
    } finally {
      await running.stop();
    }
  });
});

Deno.test("cancelling a queued job and its expiry wake its waiters", async () => {
  await withApp("await_cancel", async (app, sql) => {
    const work = app.task("work", () => {});
    const later = work.using({ delay: 3_600_000 });
    const cancelled = await later.enqueue({});
    const expiring = await work.using({
      delay: 3_600_000,
      expiresAt: new Date(Date.now() + 1_500),
    }).enqueue({});
    const running = startWorker(app);
    try {
      const waits = app.waitForJobs([cancelled, expiring], NO_POLL);
      waits.catch(() => {});
      await waitFor(() => awaited(sql, expiring), "the jobs to be marked awaited");
      assert(await requestCancel(app.sql, cancelled));
      const jobs = await within(waits, 20_000, "the cancel pass");
      assertEquals(jobs.map((j) => j.state), ["cancelled", "cancelled"]);
    } finally {
      await running.stop();
    }
  });
});

Deno.test("a running job cancelled through its worker wakes its waiter", async () => {
  await withApp("await_cancel_running", async (app, sql) => {
    const work = app.task("work", async (_args, ctx) => {
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    });
    const running = startWorker(app);
    try {
      const id = await work.enqueue({});
      await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
      const wait = app.waitForJob(id, NO_POLL);
      wait.catch(() => {});
      await waitFor(() => awaited(sql, id), "the job to be marked awaited");
      await requestCancel(app.sql, id);
      assertEquals((await within(wait, 20_000, "the cancelled job")).state, "cancelled");
    } finally {
      await running.stop();
    }
  });
});

Deno.test("the rescuer failing a lost job wakes its waiter", async () => {
  await withApp("await_rescue", async (app, sql) => {
    const work = app.task("work", () => {});
    const id = await work.using({ maxAttempts: 1 }).enqueue({});
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at)
      values ('gone', 'h', 1, '{default}', now() - interval '1 hour')`;
    await sql`update akadze.jobs set state = 'running', worker_id = 'gone', run_count = 1,
      started_at = now() where id = ${id}`;
    const wait = app.waitForJob(id, NO_POLL);
    wait.catch(() => {});
    await waitFor(() => awaited(sql, id), "the job to be marked awaited");
    const rescued = await new Rescuer(app.sql, { schema: "akadze", hooks: [] }).runOnce();
    assertEquals(rescued.failed, 1);
    const job = await within(wait, 15_000, "the rescued job");
    assertEquals([job.state, job.errors.at(-1)?.error], ["failed", "WorkerLost"]);
  });
});

Deno.test("with retention 0 an awaited job is kept for its waiter, others are deleted", async () => {
  await withApp("await_retention0", async (app, sql) => {
    const g = gate();
    const work = app.task("work", async ({ wait }) => {
      if (wait) await g.opened;
      return "done";
    });
    const running = startWorker(app);
    try {
      const plain = await work.enqueue({ wait: false });
      await waitFor(async () =>
        (await sql`select 1 from akadze.jobs where id = ${plain}`)
          .length === 0, "the plain job's row to be deleted");
      const id = await work.enqueue({ wait: true });
      await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
      const wait = app.waitForJob(id, NO_POLL);
      wait.catch(() => {});
      await waitFor(() => awaited(sql, id), "the job to be marked awaited");
      g.open();
      const job = await within(wait, 15_000, "the awaited job");
      assertEquals([job.state, job.result], ["succeeded", "done"]);
      // A waiter that comes after the deletion is told so.
      await rejects(
        () => app.waitForJob(plain, { timeout: 1_000 }),
        JobNotFound,
        "already deleted by retention",
      );
    } finally {
      await running.stop();
    }
  }, { retention: 0 });
});

Deno.test("a retried job wakes its waiter only when it is finally terminal", async () => {
  await withApp("await_retry", async (app, sql) => {
    let runs = 0;
    const g = gate();
    const work = app.task("work", async () => {
      if (++runs === 1) {
        await g.opened;
        throw new Error("first run fails");
      }
      return runs;
    });
    const running = startWorker(app);
    try {
      const id = await work.using({ maxAttempts: 3 }).enqueue({});
      await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
      const wait = app.waitForJob(id, NO_POLL);
      wait.catch(() => {});
      await waitFor(() => awaited(sql, id), "the job to be marked awaited");
      g.open();
      // The retry has a backoff: the job is queued again meanwhile, not terminal.
      const job = await within(wait, 60_000, "the retried job");
      assertEquals([job.state, job.result, job.attempt], ["succeeded", 2, 2]);
    } finally {
      await running.stop();
    }
  });
});

const noBouncer = pgbouncerBinary() === undefined;

Deno.test({
  name:
    "behind PgBouncer (transaction mode) waiters poll; with a direct listenUrl they are notified",
  ignore: noBouncer,
  fn: () =>
    withDatabase("await_pgbouncer", async (db, sql) => {
      const bouncer = await startPgBouncer(db.url, "transaction");
      try {
        const pooled = bouncer.url(db.url);
        for (const listenUrl of [undefined, db.url]) {
          const app = new Akadze({ databaseUrl: pooled, listenUrl });
          const g = gate();
          const work = app.task("work", async () => {
            await g.opened;
            return 1;
          });
          const running = startWorker(app);
          try {
            const id = await work.enqueue({});
            await waitForJob(sql, id, (r) => r.state === "running", "the job to run");
            // Through the pooler the LISTEN never hears anything: only the poll can answer.
            const options = listenUrl === undefined
              ? { timeout: 60_000, pollInterval: 200 }
              : NO_POLL;
            const wait = app.waitForJob(id, options);
            wait.catch(() => {});
            await waitFor(() => awaited(sql, id), "the job to be marked awaited");
            g.open();
            assertEquals((await within(wait, 20_000, "the outcome")).state, "succeeded");
          } finally {
            await running.stop();
            await app.close();
          }
        }
      } finally {
        await bouncer.stop();
      }
    }),
});
