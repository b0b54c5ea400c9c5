// A handler that ends its worker process (Deno.exit, running out of memory) costs only its
// own job an attempt: the jobs merely in the same process go back without spending theirs
// where the worker can tell, the crashing job's stored error says how the process ended,
// and a restarted worker settles what its predecessor left at once, not after the lease.
import type { Sql } from "../src/db.ts";
import { UsageError } from "../src/cli/common.ts";
import { childArguments } from "../src/cli/supervisor.ts";
import { parseWorkerCommandLine } from "../src/cli/worker_flags.ts";
import { describeProcessEnd } from "../src/worker/process_end.ts";
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import { startWorker, waitForJob, withApp, withDatabase } from "./_helpers.ts";
import {
  MOD,
  SLOW,
  spawnCli,
  supervisorPermissions,
  withDir,
  withProcesses,
  WORKER_PERMISSIONS,
} from "./_processes.ts";

type Entry = { error: string; message: string; attempt: number; worker: string };
type Row = {
  id: string;
  state: string;
  attempt: number;
  run_count: number;
  worker_id: string | null;
  result: unknown;
  errors: Entry[];
};

async function job(sql: Sql, id: string): Promise<Row> {
  const [row] = await sql`
    select id::text, state, attempt, run_count, worker_id, result, errors
      from akadze.jobs where id = ${id}`;
  return row as unknown as Row;
}

async function insertJob(sql: Sql, task: string, maxAttempts = 3): Promise<string> {
  const [{ id }] = await sql`
    insert into akadze.jobs (task, max_attempts) values (${task}, ${maxAttempts})
    returning id::text as id`;
  return id;
}

async function jobWhen(
  sql: Sql,
  id: string,
  check: (r: Row) => boolean,
  what: string,
): Promise<Row> {
  return await waitForJob(sql, id, (r) => check(r as Row), what, SLOW) as Row;
}

/**
 * The test app: `innocent` runs until aborted on its first run and returns its 1-based
 * attempt on a later one; `exit_three` calls Deno.exit(3) (once `innocent` jobs run beside
 * it); `exit_sync` calls process.exit(4) synchronously; `hog` fills the heap.
 */
const CRASH_APP = `
import process from "node:process";
import { Akadze } from ${JSON.stringify(MOD)};

export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

app.task("innocent", async (_args, ctx) => {
  if (ctx.job.runCount === 1) await sleep(60_000, ctx.signal);
  return { attempt: ctx.job.attempt };
});

app.task("exit_three", { backoff: () => 100 }, async () => {
  await new Promise((resolve) => setTimeout(resolve, 50));
  Deno.exit(3);
});

// node:process's exit goes through Deno.exit; called before the handler returns.
app.task("exit_sync", () => process.exit(4));

app.task("hog", () => {
  const kept = [];
  for (;;) kept.push(new Array(100_000).fill(Math.random()));
});
`;

function worker(dir: string, url: string, flags: string[], permissions = WORKER_PERMISSIONS) {
  return spawnCli(
    ["worker", `${dir}/app.ts`, "--log-format", "json", "--poll-interval", "0.1", ...flags],
    { AKADZE_DATABASE_URL: url },
    { permissions },
  );
}

Deno.test("how a process ended, in words: an exit code, a signal, out of memory", () => {
  assertEquals(describeProcessEnd({ code: 3 }), "exited with code 3");
  assertMatch(describeProcessEnd({ code: 133, signal: "SIGTRAP" }), /^ran out of memory \(/);
  assertMatch(describeProcessEnd({ code: 133 }), /^ran out of memory/);
  assertMatch(describeProcessEnd({ code: 134, signal: "SIGABRT" }), /^aborted/);
  assertMatch(describeProcessEnd({ code: 137, signal: "SIGKILL" }), /^was killed by SIGKILL/);
  assertEquals(
    describeProcessEnd({ code: 139, signal: "SIGSEGV" }),
    "was killed by SIGSEGV (exit code 139)",
  );
});

Deno.test("a restarted worker process is told which process ran its slot and how it ended", () => {
  const previous = { pid: 77, end: { code: 133, signal: "SIGTRAP" } };
  const args = childArguments(["./app.ts"], 1, 4242, undefined, previous);
  assertEquals(args.slice(7), ["--previous-exit", "77:133:SIGTRAP", "./app.ts"]);
  const child = parseWorkerCommandLine(args.slice(1), "worker");
  assertEquals(child.previousExit, previous);
  assertEquals(child.passthrough, ["./app.ts"]);
  const exited = parseWorkerCommandLine(
    childArguments(["./app.ts"], 0, 4242, undefined, { pid: 78, end: { code: 3 } }).slice(1),
    "worker",
  );
  assertEquals(exited.previousExit, { pid: 78, end: { code: 3, signal: null } });
  for (const bad of [["--previous-exit", "x:3"], ["--previous-exit", "77:three"]]) {
    assertThrows(
      () =>
        parseWorkerCommandLine(
          ["./app.ts", ...childArguments([], 0, 1).slice(1), ...bad],
          "worker",
        ),
      (e: Error) => e instanceof UsageError && e.message.includes("is set by the supervisor"),
    );
  }
  assertThrows(
    () => parseWorkerCommandLine(["./app.ts", "--previous-exit", "77:3"], "worker"),
    (e: Error) => e instanceof UsageError && e.message === "--previous-exit goes with --slot",
  );
});

Deno.test("a handler's Deno.exit(3): its job is charged with the exit code, the two beside it keep their attempts", async () => {
  await withDir({ "app.ts": CRASH_APP }, async (dir) => {
    await withDatabase("process_crash_exit", async (db, sql) => {
      await withProcesses(async () => {
        const innocents = [await insertJob(sql, "innocent"), await insertJob(sql, "innocent")];
        const first = worker(dir, db.url, ["--slots", "3"]);
        for (const id of innocents) {
          await jobWhen(sql, id, (r) => r.state === "running", "the innocent jobs to run")
            .catch((error) => {
              throw new Error(`${error.message}; the worker said:\n${first.stderr()}`);
            });
        }
        const bad = await insertJob(sql, "exit_three", 2);
        const out = await first.done();
        assertEquals(out.code, 3, out.stderr);
        // Written before the process exited: no lease had to lapse.
        const charged = await job(sql, bad);
        assertEquals([charged.state, charged.attempt, charged.errors.length], ["queued", 1, 1]);
        assertEquals(charged.errors[0].error, "ProcessExited");
        assertMatch(charged.errors[0].message, /called Deno\.exit\(3\).*exits with code 3/);
        assertEquals(charged.errors[0].attempt, 1);
        for (const id of innocents) {
          const row = await job(sql, id);
          assertEquals([row.state, row.attempt, row.errors], ["queued", 0, []], `job ${id}`);
        }
        assertEquals(first.events("handler_exit")[0].jobId, bad);
        // The next process: the bad job (maxAttempts 2) crashes it once more and fails;
        // an innocent job still running then goes back again, unspent.
        const second = await worker(dir, db.url, ["--slots", "3"]).done();
        assertEquals(second.code, 3, second.stderr);
        const failed = await job(sql, bad);
        assertEquals([failed.state, failed.attempt], ["failed", 2]);
        assertEquals(failed.errors.map((e) => e.error), ["ProcessExited", "ProcessExited"]);
        const last = worker(dir, db.url, ["--slots", "3"]);
        for (const id of innocents) {
          const done = await jobWhen(sql, id, (r) => r.state === "succeeded", "innocents done");
          assertEquals([done.attempt, done.result, done.errors], [0, { attempt: 1 }, []]);
        }
        await last.waitForEvent("worker_started");
        last.child.kill("SIGTERM");
        assertEquals((await last.done()).code, 0);
      });
    });
  });
});

Deno.test("process.exit(4) before the handler returns: its job is charged, the process exits 4", async () => {
  await withDir({ "app.ts": CRASH_APP }, async (dir) => {
    await withDatabase("process_crash_exit_sync", async (db, sql) => {
      await withProcesses(async () => {
        const bad = await insertJob(sql, "exit_sync", 1);
        const out = await worker(dir, db.url, []).done();
        assertEquals(out.code, 4, out.stderr);
        const failed = await job(sql, bad);
        assertEquals([failed.state, failed.attempt], ["failed", 1]);
        assertEquals(failed.errors[0].error, "ProcessExited");
        assertMatch(failed.errors[0].message, /Deno\.exit\(4\)/);
      });
    });
  });
});

Deno.test("out of memory under the supervisor: the restarted process charges the job at once, saying so; maxAttempts 2 ends it after two crashes", async () => {
  await withDir({ "app.ts": CRASH_APP }, async (dir) => {
    await withDatabase("process_crash_oom", async (db, sql) => {
      await withProcesses(async () => {
        // A heap small enough to fill in a moment (the processes inherit the flag).
        const permissions = [...supervisorPermissions(dir), "--v8-flags=--max-old-space-size=128"];
        const sup = worker(dir, db.url, ["--processes", "2"], permissions);
        await sup.waitForEvent("worker_started", undefined, 2);
        const hog = await insertJob(sql, "hog", 2);
        const failed = await jobWhen(sql, hog, (r) => r.state === "failed", "two crashes")
          .catch((error) => {
            throw new Error(`${error.message}; the supervisor said:\n${sup.stderr()}`);
          });
        assertEquals([failed.attempt, failed.errors.length], [2, 2]);
        for (const entry of failed.errors) {
          // Settled by the restarted process, not rescued after the 30 s lease.
          assertEquals(entry.error, "ProcessExited");
          assertMatch(
            entry.message,
            /^the worker process \S+ ran out of memory .*during this run$/,
          );
        }
        const exits = await sup.waitForEvent("worker_process_exited", undefined, 2);
        assert(exits.every((e) => e.signal === "SIGTRAP" && e.code === 133), sup.stderr());
        // Logged once the settling statement returned: maybe after the row was read.
        await sup.waitForEvent("previous_process_settled", undefined, 2);
        sup.child.kill("SIGTERM");
        assertEquals((await sup.done()).code, 0);
      });
    });
  });
});

/** Job `id` as a worker `workerId` (whose row beats now) left it: running, first claim. */
async function leftRunning(sql: Sql, task: string, workerId: string): Promise<string> {
  await sql`
    insert into akadze.workers (id, hostname, pid, queues, heartbeat_ttl_ms)
    values (${workerId}, 'old-host', 1, '{default}', 600000) on conflict (id) do nothing`;
  const [{ id }] = await sql`
    insert into akadze.jobs (task, state, run_count, worker_id, started_at)
    values (${task}, 'running', 1, ${workerId}, now()) returning id::text as id`;
  return id;
}

Deno.test("a worker started again under its fixed id settles its old jobs at once, charging them", async () => {
  await withApp("process_crash_restart", async (app, sql) => {
    app.task("work", (_args, ctx) => ({ attempt: ctx.job.attempt }));
    const old = await leftRunning(sql, "work", "fixed-worker");
    // The lease is long: only the start can have settled it.
    const w = startWorker(app, { id: "fixed-worker", heartbeatTtl: 600_000 });
    try {
      const done = await jobWhen(sql, old, (r) => r.state === "succeeded", "the old job to rerun");
      assertEquals([done.attempt, done.run_count, done.result], [1, 2, { attempt: 2 }]);
      assertEquals(done.errors.length, 1);
      assertEquals(done.errors[0].error, "WorkerLost");
      assertMatch(
        done.errors[0].message,
        /^the previous process of worker fixed-worker ended \(how is unknown\) during this run$/,
      );
      assertEquals([done.errors[0].attempt, done.errors[0].worker], [1, "fixed-worker"]);
    } finally {
      await w.stop();
    }
  });
});

Deno.test("previousProcess: the jobs a killed process left are charged at once, saying how it ended", async () => {
  await withApp("process_crash_previous", async (app, sql) => {
    app.task("work", () => "done");
    // With a transition hook, each job is settled in a transaction of its own.
    const settled: string[] = [];
    app.hooks.onTransition.push((_tx, job, from, to) => {
      if (from === "running" && to === "queued") settled.push(job.id);
    });
    const ids = [
      await leftRunning(sql, "work", "host:4242:0"),
      await leftRunning(sql, "work", "host:4242:0"),
    ];
    const previousProcess = { id: "host:4242:0", code: 137, signal: "SIGKILL" };
    const w = startWorker(app, { heartbeatTtl: 600_000, previousProcess });
    try {
      for (const id of ids) {
        const done = await jobWhen(sql, id, (r) => r.state === "succeeded", "the jobs to rerun");
        assertEquals([done.attempt, done.errors.length], [1, 1]);
        assertEquals(done.errors[0].error, "ProcessExited");
        assertEquals(
          done.errors[0].message,
          "the worker process host:4242:0 was killed by SIGKILL (exit code 137: kill -9, or " +
            "the system's out-of-memory killer) while it also ran another job: which one " +
            "ended it is unknown, so each is charged an attempt",
        );
      }
      assertEquals(settled.slice(0, 2).sort(), [...ids].sort());
    } finally {
      await w.stop();
    }
  });
});

Deno.test("akadze worker --worker-id: killed and started again under that id, it settles its old job at once", async () => {
  await withDir({ "app.ts": CRASH_APP }, async (dir) => {
    await withDatabase("process_crash_worker_id", async (db, sql) => {
      await withProcesses(async () => {
        const id = await insertJob(sql, "innocent");
        const flags = ["--worker-id", "fixed-cli"];
        const first = worker(dir, db.url, flags);
        await jobWhen(sql, id, (r) => r.state === "running", "the job to run");
        first.child.kill("SIGKILL");
        await first.done();
        // The default lease is 30 s: only the start under the same id settles it this soon.
        const again = worker(dir, db.url, flags);
        const done = await jobWhen(sql, id, (r) => r.state === "succeeded", "the job to rerun");
        assertEquals([done.attempt, done.worker_id, done.result], [1, "fixed-cli", { attempt: 2 }]);
        assertEquals(done.errors.map((e) => [e.error, e.message]), [[
          "WorkerLost",
          "the previous process of worker fixed-cli ended (how is unknown) during this run",
        ]]);
        await again.waitForEvent("previous_process_settled");
        again.child.kill("SIGTERM");
        assertEquals((await again.done()).code, 0);
      });
    });
  });
  assertThrows(
    () => parseWorkerCommandLine(["./app.ts", "--processes", "2", "--worker-id", "w"], "worker"),
    (e: Error) => e instanceof UsageError && e.message.includes("each is named after its slot"),
  );
  assertEquals(parseWorkerCommandLine(["./app.ts", "--worker-id", "w"], "worker").worker.id, "w");
  assertThrows(
    () => parseWorkerCommandLine(["./app.ts", "--worker-id", "a\nb"], "worker"),
    (e: Error) => e instanceof UsageError && e.message.includes("printable"),
  );
});
