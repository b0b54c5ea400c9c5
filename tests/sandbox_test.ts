// Sandboxed tasks: handlers that run in a pool of Web Workers. A CPU-bound one succeeds
// while the worker's loop, heartbeat and other slots go on; timeout and cancel terminate
// its thread; a crash inside fails only that job; permissions hold inside the sandbox.
import { requestCancel } from "../src/admin/jobs.ts";
import { Akadze } from "../src/app.ts";
import { AkadzeError } from "../src/errors.ts";
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import { startWorker, waitFor, waitForJob, withApp, withLogs } from "./_helpers.ts";
import { ended, HANDLERS, row, withTempDir } from "./_sandbox.ts";

/** A short lease: a handler blocking the loop this long would lose its job. */
const SCALED = {
  heartbeatInterval: 250,
  heartbeatTtl: 1_500,
  pollInterval: 100,
  shutdownTimeout: 2_000,
  schedules: false,
  slots: 4,
} as const;

Deno.test("a CPU-bound sandboxed task spinning past the heartbeat TTL succeeds on its first run while in-loop jobs run and the heartbeat goes on", async () => {
  await withLogs(async (records) => {
    await withTempDir(async (dir) => {
      await withApp("sandbox_cpu_bound", async (app, sql) => {
        const crunch = app.task("crunch", {
          sandbox: { module: HANDLERS, export: "spin" },
        });
        const tick = app.task("tick", () => "tock");
        const w = startWorker(app, { ...SCALED, id: "sandbox-cpu" });
        try {
          const release = `${dir}/release`;
          const id = await crunch.enqueue({ ms: 2 * SCALED.heartbeatTtl, release });
          await waitForJob(sql, id, (r) => r.state === "running");
          const [{ at: before }] = await sql`select heartbeat_at as at from akadze.workers`;
          // Other slots run while the thread spins.
          const ticks = await tick.enqueueMany([{}, {}, {}, {}, {}]);
          for (const t of ticks) await waitForJob(sql, t, (r) => r.state === "succeeded");
          // The worker beats on, past a whole TTL after the spin began.
          await waitFor(async () => {
            const [{ at }] = await sql`select heartbeat_at as at from akadze.workers`;
            return (at as Date).getTime() > (before as Date).getTime() + SCALED.heartbeatTtl;
          }, "a heartbeat a TTL after the spin began");
          assertEquals((await row(sql, id)).state, "running", "still spinning, still owned");
          await Deno.writeTextFile(release, "");
          // A loaded machine may give the spinning thread and the loop little CPU: wait long.
          const r = await row(
            sql,
            (await waitForJob(sql, id, ended, "the job", 120_000)).id as string,
          );
          assertEquals([r.state, r.attempt, r.run_count], ["succeeded", 0, 1]);
          assert(typeof r.result === "number" && r.result > 0);
          const blocked = records.filter((r) => r.properties.event === "loop_blocked");
          assertEquals(blocked.length, 0, "the loop was never blocked");
        } finally {
          const exit = await w.stop();
          assertEquals([exit.code, exit.reason], [0, "stopped"], exit.message);
        }
      });
    });
  });
});

Deno.test("a timeout terminates a sandboxed busy loop: each attempt fails with the timeout, the thread is replaced, the job ends failed", async () => {
  await withApp("sandbox_timeout", async (app, sql) => {
    const spin = app.task("spin", {
      // Room for a thread to start under load (the timeout counts from the claim).
      timeout: 4_000,
      maxAttempts: 2,
      backoff: () => 0,
      // One thread: the second attempt runs only if the first one's thread was stopped.
      sandbox: { module: HANDLERS, export: "spin", pool: 1 },
    });
    const w = startWorker(app, SCALED);
    try {
      // A first run loads the module (and type-checks it under `deno test`).
      const warm = await spin.enqueue({ ms: 1 });
      await waitForJob(sql, warm, (r) => r.state === "succeeded");
      const id = await spin.enqueue({});
      await waitForJob(sql, id, ended);
      const r = await row(sql, id);
      assertEquals([r.state, r.attempt, r.run_count], ["failed", 2, 2]);
      assertEquals(r.errors!.map((e) => e.error), ["TimeoutError", "TimeoutError"]);
      assertMatch(r.errors![0].message, /timed out after 4000 ms/);
      // The same pool runs the next job.
      const next = await spin.enqueue({ ms: 1 });
      await waitForJob(sql, next, (r) => r.state === "succeeded");
    } finally {
      const exit = await w.stop();
      assertEquals(exit.code, 0, exit.message);
    }
  });
});

Deno.test("requestCancel of a running sandboxed busy loop ends it cancelled; the signal is aborted in the thread before it is stopped", async () => {
  await withTempDir(async (dir) => {
    await withApp("sandbox_cancel", async (app, sql) => {
      const spin = app.task("spin", { sandbox: { module: HANDLERS, export: "spin", pool: 1 } });
      const watch = app.task("watch", { sandbox: { module: HANDLERS, export: "onAbort" } });
      const w = startWorker(app, SCALED);
      try {
        const id = await spin.enqueue({});
        await waitForJob(sql, id, (r) => r.state === "running");
        await requestCancel(sql, id);
        await waitForJob(sql, id, ended);
        assertEquals((await row(sql, id)).state, "cancelled");
        const next = await spin.enqueue({ ms: 1 });
        await waitForJob(sql, next, (r) => r.state === "succeeded", "a run in the new thread");

        const file = `${dir}/reason`;
        const watched = await watch.enqueue({ file });
        // Running in the database is not yet listening in the thread (a thread starts and
        // loads the module first, which a loaded machine can make take over a second).
        await waitFor(
          () => Deno.stat(`${file}.listening`).then(() => true, () => false),
          "the handler listening for the abort",
        );
        await requestCancel(sql, watched);
        await waitForJob(sql, watched, ended);
        assertEquals((await row(sql, watched)).state, "cancelled");
        const reason = await waitFor(
          () => Deno.readTextFile(file).catch(() => null),
          "the reason the handler saw",
        );
        assertEquals(reason, "AbortError: the job was cancelled");
      } finally {
        const exit = await w.stop();
        assertEquals(exit.code, 0, exit.message);
      }
    });
  });
});

Deno.test("a worker stopped while a sandboxed busy loop runs puts the job back without spending an attempt and stops its thread", async () => {
  await withApp("sandbox_shutdown", async (app, sql) => {
    const spin = app.task("spin", { sandbox: { module: HANDLERS, export: "spin" } });
    const w = startWorker(app, { ...SCALED, shutdownTimeout: 300 });
    const id = await spin.enqueue({});
    await waitForJob(sql, id, (r) => r.state === "running");
    const exit = await w.stop();
    assertEquals([exit.code, exit.reason], [0, "stopped"], exit.message);
    const r = await row(sql, id);
    assertEquals([r.state, r.attempt, r.run_count], ["queued", 0, 1]);
  });
});

Deno.test("Deno.exit(3), process.exit(4), a throw and an uncaught error inside the sandbox fail only their own job, with an error that says so", async () => {
  await withTempDir(async (dir) => {
    await withApp("sandbox_crashes", async (app, sql) => {
      const once = { maxAttempts: 1 };
      const exit = app.task("exit", { ...once, sandbox: { module: HANDLERS, export: "exit" } });
      const nodeExit = app.task("node_exit", {
        ...once,
        sandbox: { module: HANDLERS, export: "nodeExit" },
      });
      const boom = app.task("boom", { ...once, sandbox: { module: HANDLERS, export: "boom" } });
      const later = app.task("later", {
        ...once,
        sandbox: { module: HANDLERS, export: "crashLater" },
      });
      const bystander = app.task("bystander", {
        sandbox: { module: HANDLERS, export: "spin" },
      });
      let inLoop = 0;
      const loopTask = app.task("in_loop", async () => {
        await new Promise((resolve) => setTimeout(resolve, 10));
        return ++inLoop;
      });
      const w = startWorker(app, { ...SCALED, slots: 6 });
      try {
        const release = `${dir}/release`;
        const safe = await bystander.enqueue({ release });
        await waitForJob(sql, safe, (r) => r.state === "running");
        const loopJob = await loopTask.enqueue();
        const ids = [
          await exit.enqueue(),
          await boom.enqueue(),
          await later.enqueue(),
          await nodeExit.enqueue(),
        ];
        for (const id of ids) {
          await waitForJob(sql, id, ended).catch(async (err) => {
            console.log(id, await row(sql, id));
            throw err;
          });
        }
        const [e, b, l, n] = await Promise.all(ids.map((id) => row(sql, id)));
        assertEquals([e.state, e.errors![0].error], ["failed", "SandboxCrashed"]);
        assertMatch(e.errors![0].message, /exited its thread with code 3 \(Deno\.exit\(3\)\)/);
        assertEquals([n.state, n.errors![0].error], ["failed", "SandboxCrashed"]);
        assertMatch(n.errors![0].message, /exited its thread with code 4/);
        assertEquals([b.state, b.errors![0].error, b.errors![0].message], [
          "failed",
          "Error",
          "boom in the sandbox",
        ]);
        assertEquals([l.state, l.errors![0].error], ["failed", "SandboxCrashed"]);
        assertMatch(l.errors![0].message, /uncaught in the sandbox/);
        await Deno.writeTextFile(release, "");
        const s = await row(sql, (await waitForJob(sql, safe, ended)).id as string);
        assertEquals([s.state, s.attempt, s.run_count], ["succeeded", 0, 1]);
        assertEquals((await row(sql, loopJob)).state, "succeeded");
        // The crashed tasks run again in new threads.
        const again = await boom.enqueue();
        await waitForJob(sql, again, ended);
        assertEquals((await row(sql, again)).errors![0].message, "boom in the sandbox");
      } finally {
        const code = (await w.stop()).code;
        assertEquals(code, 0, "the worker itself never crashed");
      }
    });
  });
});

Deno.test("sandbox permissions: a read inside the allowed folder works, one outside is refused with Deno's error", async () => {
  await withTempDir(async (allowed) => {
    await withTempDir(async (other) => {
      await Deno.writeTextFile(`${allowed}/in.txt`, "inside");
      await Deno.writeTextFile(`${other}/out.txt`, "outside");
      await withApp("sandbox_permissions", async (app, sql) => {
        const read = app.task("read", {
          maxAttempts: 1,
          sandbox: { module: HANDLERS, export: "read", permissions: { read: [allowed] } },
        });
        const w = startWorker(app, SCALED);
        try {
          const ok = await read.enqueue({ path: `${allowed}/in.txt` });
          const refused = await read.enqueue({ path: `${other}/out.txt` });
          await waitForJob(sql, ok, ended);
          await waitForJob(sql, refused, ended);
          assertEquals((await row(sql, ok)).result, "inside");
          const r = await row(sql, refused);
          assertEquals([r.state, r.errors![0].error], ["failed", "NotCapable"]);
          assertMatch(r.errors![0].message, /Requires read access to/);
          // The worker itself reads what it likes.
          assertEquals(await Deno.readTextFile(`${other}/out.txt`), "outside");
        } finally {
          assertEquals((await w.stop()).code, 0);
        }
      });
    });
  });
});

Deno.test("a sandboxed handler gets its validated arguments, the job, progress (written by the worker) and control exceptions; completeTx says why it is missing", async () => {
  const v = await import("valibot");
  await withApp("sandbox_context", async (app, sql) => {
    const ctxTask = app.task("ctx", {
      args: v.object({ n: v.number() }),
      sandbox: { module: HANDLERS, export: "context" },
    });
    const missing = app.task("missing", {
      maxAttempts: 1,
      sandbox: { module: HANDLERS, export: "nope" },
    });
    const unsendable = app.task("unsendable", {
      maxAttempts: 1,
      sandbox: { module: HANDLERS, export: "unsendable" },
    });
    const w = startWorker(app, SCALED);
    try {
      const id = await ctxTask.enqueue({ n: 21 });
      await waitForJob(sql, id, ended);
      const r = await row(sql, id);
      assertEquals([r.state, r.attempt, r.errors![0].error], ["succeeded", 1, "Retry"]);
      assertEquals(r.progress, { done: 21 });
      const result = r.result as Record<string, unknown>;
      assertEquals([result.id, result.attempt, result.task, result.double, result.aborted], [
        id,
        2, // the second attempt, numbered from 1
        "ctx",
        42,
        false,
      ]);
      assertMatch(result.completeTx as string, /not available in a sandboxed task/);
      // Arguments that fail the schema never reach a thread.
      const [{ id: bad }] = await sql`insert into akadze.jobs (task, args)
        values ('ctx', '{"n": "5"}') returning id::text as id`;
      await waitForJob(sql, bad, ended);
      assertEquals((await row(sql, bad)).errors![0].error, "InvalidArguments");
      const m = await missing.enqueue();
      await waitForJob(sql, m, ended);
      assertMatch((await row(sql, m)).errors![0].message, /no function export "nope"/);
      const u = await unsendable.enqueue();
      await waitForJob(sql, u, ended);
      const ur = await row(sql, u);
      assertEquals([ur.state, ur.errors![0].error], ["failed", "ResultNotStorable"]);
    } finally {
      assertEquals((await w.stop()).code, 0);
    }
  });
});

Deno.test("a sandboxed task is declared with a module URL and no handler; bad declarations are refused at registration", () => {
  const app = new Akadze({ databaseUrl: "postgres://localhost/unused" });
  const task = app.task("ok", { sandbox: { module: HANDLERS, export: "noop", pool: 2 } });
  assertEquals(task.sandbox, {
    module: HANDLERS,
    export: "noop",
    pool: 2,
    permissions: "inherit",
    isolation: "thread",
    maxHeapMb: null,
  });
  const capped = { module: HANDLERS, isolation: "process", maxHeapMb: 64 } as const;
  assertEquals(app.task("capped", { sandbox: capped }).sandbox?.maxHeapMb, 64);
  const refused: [unknown, RegExp][] = [
    [{ module: "./relative.ts" }, /absolute URL of a module/],
    [{ module: HANDLERS, pool: 0 }, /pool must be an integer from 1/],
    [{ module: HANDLERS, threads: 2 }, /unknown sandbox option "threads"/],
    [{ module: HANDLERS, permissions: 7 }, /permissions must be/],
    [
      { module: HANDLERS, isolation: "fork" },
      /isolation must be "thread" or "process", got "fork"/,
    ],
    [{ module: HANDLERS, maxHeapMb: 64 }, /maxHeapMb needs isolation: "process"/],
    [{ ...capped, maxHeapMb: 8 }, /maxHeapMb must be an integer from 16 to 1048576 \(MiB\), got 8/],
  ];
  for (const [sandbox, message] of refused) {
    const error = assertThrows(() => app.task("bad", { sandbox } as never));
    assert(error instanceof AkadzeError);
    assertMatch(error.message, message);
  }
  const both = assertThrows(() =>
    app.register(() => 1, { name: "both", sandbox: { module: HANDLERS } })
  );
  assertMatch((both as Error).message, /give no handler function/);
  const none = assertThrows(() => app.task("none", {} as never));
  assertMatch((none as Error).message, /handler must be a function/);
  void app.close();
});

Deno.test("a sandboxed step of a flow reads its dependencies' results in the thread", async () => {
  await withApp("sandbox_flow", async (app, sql) => {
    const part = app.task("part", ({ n }) => n as number);
    const sum = app.task("sum", { sandbox: { module: HANDLERS, export: "sumDependencies" } });
    const flow = await app.enqueueFlow({
      a: { task: part, args: { n: 2 } },
      b: { task: part, args: { n: 3 } },
      total: { task: sum, dependsOn: ["a", "b"] },
    });
    const w = startWorker(app, SCALED);
    try {
      const done = await waitForJob(sql, flow.jobs.total, ended);
      assertEquals([done.state, done.result, done.errors], ["succeeded", 5, []]);
    } finally {
      await w.stop();
    }
  });
});
