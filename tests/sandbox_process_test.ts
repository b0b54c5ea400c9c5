// Sandboxed tasks with `isolation: "process"`: each handler runs in a `deno run` subprocess.
// A crash, Deno.exit or running out of the heap cap there fails only that job's attempt,
// says how the process ended, and the next run gets a new process; timeout and cancel kill
// it; its permissions are its own.
import { requestCancel } from "../src/admin/jobs.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { startWorker, waitForJob, withApp } from "./_helpers.ts";
import { ended, HANDLERS, row } from "./_sandbox.ts";

const OPTIONS = {
  heartbeatInterval: 250,
  heartbeatTtl: 3_000,
  pollInterval: 100,
  shutdownTimeout: 3_000,
  schedules: false,
  slots: 4,
} as const;

function process(exportName: string, extra: Record<string, unknown> = {}) {
  return { module: HANDLERS, export: exportName, isolation: "process" as const, ...extra };
}

Deno.test("a process-isolated task runs in a process of its own: result, progress, a retry, the job's dates", async () => {
  await withApp("sandbox_process_run", async (app, sql) => {
    const where = app.task("where", { sandbox: process("whereAmI") });
    const context = app.task("context", { backoff: () => 0, sandbox: process("context") });
    const w = startWorker(app, OPTIONS);
    try {
      const a = await where.enqueue({});
      const b = await context.enqueue({ n: 21 });
      await waitForJob(sql, a, ended);
      await waitForJob(sql, b, ended);
      const ra = await row(sql, a);
      assertEquals(ra.state, "succeeded", JSON.stringify(ra.errors));
      const result = ra.result as { pid: number; runAtIsDate: boolean };
      assert(result.pid !== Deno.pid, "run in another process");
      assertEquals(result.runAtIsDate, true);
      const rb = await row(sql, b);
      assertEquals([rb.state, rb.run_count], ["succeeded", 2], JSON.stringify(rb.errors));
      const r = rb.result as Record<string, unknown>;
      assertEquals([r.id, r.double, r.task, r.aborted], [b, 42, "context", false]);
      assertMatch(r.completeTx as string, /not available in a sandboxed task/);
      assertEquals(rb.progress, { done: 21 });
    } finally {
      const exit = await w.stop();
      assertEquals(exit.code, 0, exit.message);
    }
  });
});

Deno.test("Deno.exit in a sandbox process fails only that job's attempt with the exit code; the next run gets a new process", async () => {
  await withApp("sandbox_process_exit", async (app, sql) => {
    const exit = app.task("exit", { maxAttempts: 1, sandbox: process("exit", { pool: 1 }) });
    const noop = app.task("noop", { sandbox: process("noop", { pool: 1 }) });
    const tick = app.task("tick", () => "tock");
    const w = startWorker(app, OPTIONS);
    try {
      const id = await exit.enqueue({});
      const t = await tick.enqueue({});
      await waitForJob(sql, id, ended);
      const r = await row(sql, id);
      assertEquals([r.state, r.errors?.map((e) => e.error)], ["failed", ["SandboxCrashed"]]);
      assertMatch(r.errors![0].message, /the handler's process exited with code 3/);
      assertEquals((await waitForJob(sql, t, ended)).state, "succeeded");
      const n = await noop.enqueue({});
      assertEquals((await waitForJob(sql, n, ended)).state, "succeeded");
    } finally {
      const stopped = await w.stop();
      assertEquals(stopped.code, 0, stopped.message);
    }
  });
});

Deno.test("a sandbox process that runs out of its heap cap fails its attempt saying so, and the worker runs on", async () => {
  await withApp("sandbox_process_oom", async (app, sql) => {
    const hog = app.task("hog", { maxAttempts: 1, sandbox: process("hog", { maxHeapMb: 32 }) });
    const tick = app.task("tick", () => "tock");
    const w = startWorker(app, OPTIONS);
    try {
      const id = await hog.enqueue({});
      await waitForJob(sql, id, ended, "the hog to run out of memory", 60_000);
      const r = await row(sql, id);
      assertEquals([r.state, r.errors?.map((e) => e.error)], ["failed", ["SandboxCrashed"]]);
      assertMatch(r.errors![0].message, /the handler's process ran out of memory \(maxHeapMb 32\)/);
      const t = await tick.enqueue({});
      assertEquals((await waitForJob(sql, t, ended)).state, "succeeded");
    } finally {
      const stopped = await w.stop();
      assertEquals(stopped.code, 0, stopped.message);
    }
  });
});

Deno.test("timeout and cancel kill a sandbox process stuck in a loop; the pool's next run gets a new process", async () => {
  await withApp("sandbox_process_stop", async (app, sql) => {
    const spin = app.task("spin", {
      // Room for a process to start under load (the timeout counts from the claim).
      timeout: 8_000,
      maxAttempts: 1,
      sandbox: process("spin", { pool: 1 }),
    });
    const w = startWorker(app, OPTIONS);
    try {
      const timed = await spin.enqueue({});
      await waitForJob(sql, timed, ended);
      const r = await row(sql, timed);
      assertEquals([r.state, r.errors?.[0].error], ["failed", "TimeoutError"]);
      const cancelled = await spin.enqueue({});
      await waitForJob(sql, cancelled, (r) => r.state === "running");
      await requestCancel(sql, cancelled);
      assertEquals((await waitForJob(sql, cancelled, ended)).state, "cancelled");
      const next = await spin.enqueue({ ms: 1 });
      assertEquals((await waitForJob(sql, next, ended)).state, "succeeded");
    } finally {
      const stopped = await w.stop();
      assertEquals(stopped.code, 0, stopped.message);
    }
  });
});

Deno.test("a sandbox process has its own permissions: none refuses a read, a folder grant allows it there", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze_sandbox_process_" });
  try {
    await Deno.writeTextFile(`${dir}/in.txt`, "inside");
    await withApp("sandbox_process_permissions", async (app, sql) => {
      const none = app.task("none", {
        maxAttempts: 1,
        sandbox: process("read", { permissions: "none" }),
      });
      const folder = app.task("folder", {
        maxAttempts: 1,
        sandbox: process("read", { permissions: { read: [dir] } }),
      });
      const w = startWorker(app, OPTIONS);
      try {
        const refused = await none.enqueue({ path: `${dir}/in.txt` });
        const allowed = await folder.enqueue({ path: `${dir}/in.txt` });
        const outside = await folder.enqueue({ path: "/etc/hostname" });
        for (const id of [refused, allowed, outside]) await waitForJob(sql, id, ended);
        const [a, b, c] = [
          await row(sql, refused),
          await row(sql, allowed),
          await row(sql, outside),
        ];
        assertEquals([a.state, a.errors?.[0].error], ["failed", "NotCapable"]);
        assertEquals([b.state, b.result], ["succeeded", "inside"]);
        assertEquals([c.state, c.errors?.[0].error], ["failed", "NotCapable"]);
      } finally {
        const stopped = await w.stop();
        assertEquals(stopped.code, 0, stopped.message);
      }
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
