// Regressions found by the chaos soak (chaos/run.ts, docs/reliability.md), each turned
// into a deterministic test: a broken socket (EPIPE) is transient; a job left running under
// a worker's id that it does not know of is given back by the worker's own heartbeat; a worker frozen
// while holding a limit key's lock, or a schedule fire's row, stalls nobody else.
import { setLimit } from "../admin.ts";
import { connect, isTransientError } from "../src/db.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { assert, assertEquals } from "./assert.ts";
import { startWorker, waitFor, waitForJob, withApp } from "./_helpers.ts";

const FAST = { heartbeatInterval: 200, heartbeatTtl: 1_500, pollInterval: 100 } as const;

Deno.test("EPIPE (a write to a socket the server closed) is a transient error", () => {
  const epipe = Object.assign(new Error("This socket has been ended by the other party"), {
    code: "EPIPE",
  });
  assert(isTransientError(epipe));
  assert(isTransientError(new Error("wrapped", { cause: epipe })));
});

Deno.test("after a brief outage the app's pool answers within about a second (no 20 s reconnect backoff)", async () => {
  const pg = await startThrowawayPostgres();
  const sql = connect(pg.url, { max: 10 });
  try {
    await Promise.all(Array.from({ length: 10 }, () => sql`select 1`));
    await pg.halt();
    // Two seconds of failing connects: postgres.js counts them across the pool.
    const pending: Promise<unknown>[] = [];
    for (const until = Date.now() + 2_000; Date.now() < until;) {
      for (let i = 0; i < 10; i++) pending.push(sql`select 1`.catch(() => {}));
      await new Promise((r) => setTimeout(r, 100));
    }
    await pg.resume();
    const started = performance.now();
    await Promise.all(pending);
    await Promise.all(Array.from({ length: 30 }, () => sql`select pg_sleep(0.02)`));
    const took = performance.now() - started;
    assert(took < 2_500, `queries after the outage took ${Math.round(took)} ms`);
  } finally {
    await sql.end({ timeout: 1 });
    await pg.stop();
  }
});

Deno.test("a job left running under a worker's id by an earlier process with that id is settled by the restarted worker at once, its attempt charged, so a job that kills its process cannot run forever", async () => {
  await withApp("rel_orphan", async (app, sql) => {
    const task = app.task("t", () => "ran");
    // What a process that ran under this id and died left: the worker cannot tell a job that
    // killed it from one beside it, so each is charged (maxAttempts then ends a job that kills
    // every process it runs in); the restarted worker does it before its first claim.
    const id = await task.enqueue({});
    await sql`update akadze.jobs set state = 'running', run_count = run_count + 1,
                worker_id = 'rel-orphan-w', started_at = now() where id = ${id}`;
    const w = startWorker(app, { ...FAST, id: "rel-orphan-w", queues: ["other"] });
    try {
      const settled = await waitForJob(
        sql,
        id,
        (r) => r.state !== "running",
        "the settlement",
        5 * FAST.heartbeatTtl,
      );
      assertEquals(
        [settled.state, settled.attempt, settled.run_count, settled.worker_id],
        ["queued", 1, 1, "rel-orphan-w"], // the worker of its last run is kept
      );
      assertEquals((settled.errors as { error: string }[]).map((e) => e.error), ["WorkerLost"]);
    } finally {
      assertEquals((await w.stop()).code, 0);
    }
  });
});

Deno.test("a claimer frozen while holding a limit key's row lock does not stall another worker", async () => {
  await withApp("rel_limit_lock", async (app, sql) => {
    const task = app.task("t", () => "ran");
    await setLimit(sql, "k", { maxRunning: 1 });
    const limited = await task.using({ limitKey: "k" }).enqueue({});
    // A frozen claimer: its transaction holds the key's limits row and never ends.
    const frozen = await sql.reserve();
    await frozen`begin`;
    await frozen`select key from akadze.limits where key = 'k' for update`;
    const w = startWorker(app, { ...FAST, slots: 2 });
    try {
      // The worker keeps its loop (and heartbeat) alive well past its TTL...
      const free = await task.enqueue({});
      await waitForJob(sql, free, (r) => r.state === "succeeded", "the job without a limit");
      await new Promise((r) => setTimeout(r, 2 * FAST.heartbeatTtl));
      assertEquals(await Promise.race([w.exit, Promise.resolve("running")]), "running");
      const [{ fresh }] = await sql`
        select heartbeat_at > now() - interval '1 second' as fresh from akadze.workers
         where id = ${w.worker.id}`;
      assert(fresh, "the heartbeat kept going");
      assertEquals(
        (await sql`select state from akadze.jobs where id = ${limited}`)[0].state,
        "queued",
      );
      // ...and claims the key's job once the lock is gone.
      await frozen`rollback`;
      await waitForJob(sql, limited, (r) => r.state === "succeeded", "the limited job");
    } finally {
      await frozen`rollback`.catch(() => {});
      frozen.release();
      assertEquals((await w.stop()).code, 0);
    }
  });
});

Deno.test("a scheduler frozen while holding a fire's row does not stall another worker", async () => {
  await withApp("rel_sched_lock", async (app, sql) => {
    app.periodic("tick", { every: 1_000 }, () => "tick");
    const other = app.task("t", () => "ran");
    // A frozen worker's dispatch: the next fires' rows inserted in a transaction that never
    // ends, so another worker's insert of the same fire has to wait for it.
    const frozen = await sql.reserve();
    await frozen`begin`;
    await frozen`insert into akadze.periodic_runs (name, fire_at)
                 select 'tick', to_timestamp(ceil(extract(epoch from now())) + s)
                   from generate_series(-1, 30) s`;
    const w = startWorker(app, FAST);
    try {
      await new Promise((r) => setTimeout(r, 2 * FAST.heartbeatTtl));
      assertEquals(await Promise.race([w.exit, Promise.resolve("running")]), "running");
      const id = await other.enqueue({});
      await waitForJob(sql, id, (r) => r.state === "succeeded", "a job while a fire is held");
      assertEquals((await sql`select 1 from akadze.jobs where task = 'tick'`).length, 0);
      // Once the holder is gone (its transaction ended without the fire), a fire happens.
      await frozen`rollback`;
      await waitFor(
        async () => (await sql`select 1 from akadze.jobs where task = 'tick'`).length > 0,
        "a tick after the holder rolled back",
      );
    } finally {
      await frozen`rollback`.catch(() => {});
      frozen.release();
      const exit = await w.stop();
      assertEquals([exit.code, exit.reason], [0, "stopped"]);
    }
  });
});
