// Sandboxed tasks with `isolation: "process"`: each handler runs in a `deno run` subprocess.
// A crash, Deno.exit or running out of the heap cap there fails only that job's attempt,
// says how the process ended, and the next run gets a new process; timeout and cancel kill
// it; its permissions are its own.
import { requestCancel } from "../src/admin/jobs.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import type { Sql } from "../src/db.ts";
import { ProcessStderr } from "../src/worker/sandbox_pool.ts";
import { startWorker, waitForJob, withApp, withDatabase } from "./_helpers.ts";
import { MOD, SLOW, spawnCli, withDir, withProcesses, WORKER_PERMISSIONS } from "./_processes.ts";
import { ended, HANDLERS, row } from "./_sandbox.ts";

const OPTIONS = {
  heartbeatInterval: 250,
  heartbeatTtl: 3_000,
  pollInterval: 100,
  shutdownTimeout: 3_000,
  schedules: false,
  slots: 4,
} as const;

async function enqueueRow(sql: Sql, task: string): Promise<string> {
  const [{ id }] =
    await sql`insert into akadze.jobs (task) values (${task}) returning id::text as id`;
  return id;
}

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

Deno.test("a sandbox process that prints without a final newline still returns its result, which is not printed", async () => {
  const app = `
import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("partial", {
  maxAttempts: 1,
  timeout: 60_000,
  sandbox: { module: ${JSON.stringify(HANDLERS)}, export: "printPartial", isolation: "process" },
});
`;
  await withDir({ "app.ts": app }, async (dir) => {
    await withDatabase("sandbox_process_partial", async (db, sql) => {
      await withProcesses(async () => {
        const id = await enqueueRow(sql, "partial");
        const worker = spawnCli(
          ["worker", `${dir}/app.ts`, "--log-format", "json", "--poll-interval", "0.1"],
          { AKADZE_DATABASE_URL: db.url },
          { permissions: [...WORKER_PERMISSIONS, "--allow-run"] },
        );
        // Before the fix the result was lost and the run waited for its timeout.
        await waitForJob(sql, id, ended, "the partial printer", SLOW);
        const r = await row(sql, id);
        assertEquals([r.state, r.result], ["succeeded", 42], JSON.stringify(r.errors));
        worker.child.kill("SIGTERM");
        const out = await worker.done();
        assertEquals(out.code, 0, out.stderr);
        assertMatch(out.stdout, /progress 50%/);
        assert(!out.stdout.includes("\x1eakadze"), out.stdout); // no message passed on
      });
    });
  });
});

Deno.test("a sandbox process's result that JSON cannot carry fails the run as in a thread, not stored changed", async () => {
  await withApp("sandbox_process_not_json", async (app, sql) => {
    const notJson = app.task("notJson", { maxAttempts: 1, sandbox: process("notJson") });
    const w = startWorker(app, OPTIONS);
    try {
      const map = await notJson.enqueue({ kind: "map" });
      const undef = await notJson.enqueue({ kind: "u" });
      for (const id of [map, undef]) await waitForJob(sql, id, ended, "the run", SLOW);
      const [a, b] = [await row(sql, map), await row(sql, undef)];
      assertEquals([a.state, a.errors?.[0].error], ["failed", "ResultNotStorable"], `${a.result}`);
      assertMatch(a.errors![0].message, /result is a Map/);
      assertEquals([b.state, b.errors?.[0].error], ["failed", "ResultNotStorable"]);
      assertMatch(b.errors![0].message, /result\.b is undefined/);
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

Deno.test("a sandbox process that runs out of memory leaves the worker's JSON log whole: V8's report is not passed on", async () => {
  const app = `
import { Akadze } from ${JSON.stringify(MOD)};
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("hog", {
  maxAttempts: 1,
  sandbox: { module: ${
    JSON.stringify(HANDLERS)
  }, export: "hog", isolation: "process", maxHeapMb: 32 },
});
app.task("say", { sandbox: { module: ${
    JSON.stringify(HANDLERS)
  }, export: "whereAmI", isolation: "process" } });
`;
  await withDir({ "app.ts": app }, async (dir) => {
    await withDatabase("sandbox_process_oom_log", async (db, sql) => {
      await withProcesses(async () => {
        const hog = await enqueueRow(sql, "hog");
        const say = await enqueueRow(sql, "say");
        const worker = spawnCli(
          ["worker", `${dir}/app.ts`, "--log-format", "json", "--poll-interval", "0.1"],
          { AKADZE_DATABASE_URL: db.url },
          { permissions: [...WORKER_PERMISSIONS, "--allow-run"] },
        );
        await waitForJob(sql, hog, ended, "the hog to run out of memory", SLOW);
        await waitForJob(sql, say, ended, "the printing job", SLOW);
        const r = await row(sql, hog);
        assertMatch(
          r.errors![0].message,
          /the handler's process ran out of memory \(maxHeapMb 32\)/,
        );
        worker.child.kill("SIGTERM");
        const out = await worker.done();
        assertEquals(out.code, 0, out.stderr);
        // What the handler itself prints is passed on as it is (on standard output here).
        assertMatch(out.stdout, /printed by the handler/);
        const stray = out.stderr.split("\n").filter((line) => {
          if (line === "") return false;
          try {
            JSON.parse(line);
            return false;
          } catch {
            return true;
          }
        });
        assertEquals(stray, [], out.stderr);
      });
    });
  });
});

Deno.test("a sandbox process's standard error is passed on, blank lines too, all but V8's out-of-memory report", () => {
  const passed: string[] = [];
  const plain = new ProcessStderr((line) => passed.push(line));
  for (const line of ["one", "", "#", "two", ""]) plain.line(line);
  plain.end();
  assertEquals([passed, plain.outOfMemory], [["one", "", "#", "two", ""], false]);
  passed.length = 0;
  const dying = new ProcessStderr((line) => passed.push(line));
  for (
    const line of [
      "printed before",
      "",
      "<--- Last few GCs --->",
      "",
      "[1:0x1]  123 ms: Mark-Compact (reduce) 31.9 (32.4) -> 31.9 (32.4) MB",
      "#",
      "# Fatal JavaScript out of memory: Reached heap limit",
      "#",
      "==== C stack trace ===============================",
      "    deno(+0x28b0d2e) [0x559f47055d2e]",
    ]
  ) dying.line(line);
  dying.end();
  assertEquals([passed, dying.outOfMemory], [["printed before"], true]);
});
