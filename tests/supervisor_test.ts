// `akadze worker APP --processes N`: the supervisor's pure logic (restart backoff, restart
// cap, exit code, child command line), then real supervisor and worker processes against
// a real PostgreSQL.
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import type { Sql } from "../src/db.ts";
import { UsageError } from "../src/cli/common.ts";
import { heartbeatFiles } from "../src/cli/heartbeat_files.ts";
import {
  childArguments,
  commandPrefix,
  NO_RESTARTS,
  planRestart,
  RESTART_CAP,
  type RestartHistory,
  supervisorExitCode,
  supervisorGone,
} from "../src/cli/supervisor.ts";
import { parseWorkerCommandLine } from "../src/cli/worker_flags.ts";
import { waitFor, withDatabase } from "./_helpers.ts";
import {
  APP_MODULE,
  type CliProcess,
  isAlive,
  SLOW,
  spawnCli,
  supervisorPermissions,
  withDir,
  within,
  withProcesses,
} from "./_processes.ts";

// ---- pure logic ----

/** Deaths `uptimes[i]` ms after each (re)start, the restart delay in between. */
function simulate(uptimes: number[]): { delays: number[]; capped: boolean[] } {
  let history: RestartHistory = NO_RESTARTS;
  let now = 0;
  const delays: number[] = [], capped: boolean[] = [];
  for (const uptime of uptimes) {
    const startedAt = now;
    now += uptime;
    const plan = planRestart(history, startedAt, now);
    history = plan.history;
    delays.push(plan.delay);
    capped.push(plan.capped);
    now += plan.delay;
  }
  return { delays, capped };
}

Deno.test("restart delays: 1 s, doubling per quick death; the sixth death within 60 s is the cap", () => {
  const { delays, capped } = simulate([100, 100, 100, 100, 100, 100]);
  assertEquals(delays.slice(0, 5), [1000, 2000, 4000, 8000, 16000]);
  assertEquals(capped, [false, false, false, false, false, true]);
  assertEquals(RESTART_CAP, 5);
});

Deno.test("restart delays: capped at 30 s; deaths spread over more than 60 s never trip the cap", () => {
  // Each run lasts 50 s: short of the 60 s reset, but the deaths are 51+ s apart.
  const { delays, capped } = simulate(Array(9).fill(50_000));
  assertEquals(delays, [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
  assert(capped.every((c) => !c));
});

Deno.test("restart delays: 60 s of uptime starts the sequence over at 1 s", () => {
  const { delays } = simulate([100, 100, 100, 60_000, 100]);
  assertEquals(delays, [1000, 2000, 4000, 1000, 2000]);
});

Deno.test("restart cap: only deaths within the last 60 s count", () => {
  let history: RestartHistory = { delay: 1000, deaths: [0, 1_000, 2_000, 3_000, 4_000] };
  // Five earlier deaths, the first of them 60 s ago: it no longer counts.
  let plan = planRestart(history, 59_000, 60_000);
  assertEquals([plan.capped, plan.history.deaths], [false, [1_000, 2_000, 3_000, 4_000, 60_000]]);
  history = plan.history;
  plan = planRestart(history, 60_200, 60_500);
  assertEquals(plan.capped, true);
});

Deno.test("supervisor exit code: cap 1, forced 130, else the first non-zero worker code", () => {
  assertEquals(supervisorExitCode({ capped: false, forced: false, exits: [0, 0] }), 0);
  assertEquals(supervisorExitCode({ capped: false, forced: false, exits: [] }), 0);
  assertEquals(supervisorExitCode({ capped: false, forced: false, exits: [0, 1, 137] }), 1);
  assertEquals(supervisorExitCode({ capped: false, forced: true, exits: [130, 130] }), 130);
  assertEquals(supervisorExitCode({ capped: true, forced: false, exits: [0, 0] }), 1);
  assertEquals(supervisorExitCode({ capped: true, forced: true, exits: [130] }), 1);
});

Deno.test("worker process command line: same flags, --processes 1 --slot K first", () => {
  const line = parseWorkerCommandLine(
    ["./app.ts", "--processes", "3", "-q", "a", "--processes=3", "--heartbeat-file", "/x/hb"],
    "worker",
  );
  assertEquals(line.processes, 3);
  assertEquals(line.passthrough, ["./app.ts", "-q", "a", "--heartbeat-file", "/x/hb"]);
  assertEquals(childArguments(line.passthrough, 2, 4242), [
    "worker",
    "--processes",
    "1",
    "--slot",
    "2",
    "--supervisor-pid",
    "4242",
    "./app.ts",
    "-q",
    "a",
    "--heartbeat-file",
    "/x/hb",
  ]);
  const child = parseWorkerCommandLine(
    childArguments(line.passthrough, 2, 4242).slice(1),
    "worker",
  );
  assertEquals([child.processes, child.slot, child.supervisorPid], [1, 2, 4242]);
  assertEquals(child.worker.heartbeatFile, "/x/hb");
  assertEquals(child.passthrough, line.passthrough);
  // Durations are seconds on the command line, milliseconds in the options.
  const pruning = parseWorkerCommandLine(["./app.ts", "--prune-interval", "2.5"], "worker");
  assertEquals(pruning.worker.pruneInterval, 2_500);
  // A "--" before APP stays last, so the added flags are never taken for positionals.
  const dashed = parseWorkerCommandLine(["--processes", "2", "--", "./app.ts"], "worker");
  assertEquals(childArguments(dashed.passthrough, 0, 1).slice(-2), ["--", "./app.ts"]);
});

Deno.test("the runtime arguments come from this process's command line minus its script arguments", () => {
  const argv = ["deno", "run", "--allow-net=db:5432", "/srv/cli.ts", "worker", "app.ts"];
  assertEquals(commandPrefix(argv, ["worker", "app.ts"]), [
    "run",
    "--allow-net=db:5432",
    "/srv/cli.ts",
  ]);
  // A compiled binary: nothing between the executable and the arguments.
  assertEquals(commandPrefix(["/usr/local/bin/akadze", "worker", "a.ts"], ["worker", "a.ts"]), []);
  assertThrows(() => commandPrefix(["deno", "run", "x.ts", "other"], ["worker"]));
  assertThrows(() => commandPrefix(["worker"], ["worker"]));
});

Deno.test("a worker process is orphaned when its parent is no longer the supervisor", () => {
  assertEquals(supervisorGone(100, 100), false);
  assertEquals(supervisorGone(100, 1), true);
});

Deno.test("--processes flag rules: batch, max-jobs, dev, slot", () => {
  const usage = (args: string[], message: RegExp, command = "worker") => {
    const error = assertThrows(() => parseWorkerCommandLine(args, command), UsageError);
    assertMatch(error.message, message);
  };
  usage(["a.ts", "--processes", "2", "--batch"], /--batch runs a single process/);
  usage(["a.ts", "--processes", "2", "--max-jobs", "3"], /--max-jobs runs a single process/);
  usage(["a.ts", "--processes", "2"], /akadze dev runs one worker process/, "dev");
  usage(["a.ts", "--processes", "0"], /--processes must be an integer from 1/);
  usage(
    ["a.ts", "--processes", "2", "--slot", "0", "--supervisor-pid", "5"],
    /--slot is set by the supervisor/,
  );
  // A typo for --slots is refused, not run as a supervised worker.
  usage(["a.ts", "--slot", "4"], /unknown option --slot: did you mean --slots/);
  usage(["a.ts", "--processes", "2", "--slot", "0"], /unknown option --slot/);
  usage(["a.ts", "--supervisor-pid", "5"], /--supervisor-pid goes with --slot/);
  // One process may run a batch; --processes 1 is the plain worker.
  assertEquals(
    parseWorkerCommandLine(["a.ts", "--processes", "1", "--batch"], "worker").processes,
    1,
  );
  assertEquals(heartbeatFiles("/run/hb", 1), ["/run/hb"]);
  assertEquals(heartbeatFiles("/run/hb", 2), ["/run/hb.supervisor", "/run/hb.0", "/run/hb.1"]);
});

// ---- real processes ----

async function insertJob(sql: Sql, task: string): Promise<string> {
  const [{ id }] =
    await sql`insert into akadze.jobs (task) values (${task}) returning id::text as id`;
  return id;
}

async function job(sql: Sql, id: string) {
  const [row] = await sql`
    select state, attempt, run_count, worker_id, result from akadze.jobs where id = ${id}`;
  return row as {
    state: string;
    attempt: number;
    run_count: number;
    worker_id: string | null;
    result: unknown;
  };
}

type JobRow = Awaited<ReturnType<typeof job>>;

/** Wait until job `id` satisfies `check`; returns that row. */
async function jobWhen(
  sql: Sql,
  id: string,
  check: (row: JobRow) => boolean,
  what: string,
): Promise<JobRow> {
  return await waitFor(
    async () => {
      const row = await job(sql, id);
      return check(row) ? row : null;
    },
    what,
    SLOW,
  ) as JobRow;
}

async function workerRows(sql: Sql): Promise<{ id: string; pid: number }[]> {
  const rows = await sql`select id, pid from akadze.workers order by id`;
  return rows.map((r) => ({ id: r.id as string, pid: r.pid as number }));
}

function supervise(
  dir: string,
  url: string,
  flags: string[],
  options: { detached?: boolean } = {},
): CliProcess {
  return spawnCli(
    ["worker", `${dir}/app.ts`, "--log-format", "json", "--poll-interval", "0.1", ...flags],
    { AKADZE_DATABASE_URL: url },
    { permissions: supervisorPermissions(dir), detached: options.detached },
  );
}

Deno.test("--batch and --max-jobs with --processes 2: exit 2 with one line, nothing started", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    const env = { AKADZE_DATABASE_URL: "postgres://app:Sup3rSecretPw@127.0.0.1:1/app" };
    for (const flags of [["--batch"], ["--max-jobs", "3"]]) {
      const out = await spawnCli(["worker", `${dir}/app.ts`, "--processes", "2", ...flags], env)
        .done();
      assertEquals(out.code, 2, out.stderr);
      assertMatch(out.stderr, /^error: --(batch|max-jobs) runs a single process[^\n]*\n$/);
    }
    const dev = await spawnCli(["dev", `${dir}/app.ts`, "--processes", "2"], env).done();
    assertEquals(dev.code, 2, dev.stderr);
    assertMatch(dev.stderr, /akadze dev runs one worker process/);
    // Without --allow-run the supervisor cannot start workers: a usage error naming it.
    const noRun = await spawnCli(["worker", `${dir}/app.ts`, "--processes", "2"], env).done();
    assertEquals(noRun.code, 2, noRun.stderr);
    assertMatch(
      noRun.stderr,
      /^error: --processes starts worker processes: allow it with --allow-run=/,
    );
    const missing = await spawnCli(
      ["worker", `${dir}/missing.ts`, "--processes", "2"],
      env,
      { permissions: supervisorPermissions(dir) },
    ).done();
    assertEquals(missing.code, 2, missing.stderr);
    assertMatch(missing.stderr, /app module not found/);
  });
});

Deno.test("a SIGKILLed worker process: its job is rescued by a sibling and the slot restarted", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("supervisor_restart", async (db, sql) => {
      await withProcesses(async () => {
        const sup = supervise(dir, db.url, [
          "--processes",
          "2",
          "--heartbeat-interval",
          "0.2",
          "--heartbeat-ttl",
          "1.5",
          "--shutdown-timeout",
          "1",
        ]);
        await sup.waitForEvent("worker_started", undefined, 2);
        const id = await insertJob(sql, "sleep_first");
        const running = await jobWhen(sql, id, (r) => r.state === "running", "the job to run");
        const [, pidText, slotText] = running.worker_id!.split(":").slice(-3);
        const victim = Number(pidText);
        const slot = Number(slotText);
        assert(victim !== sup.child.pid, "the job runs in a worker process, not the supervisor");
        Deno.kill(victim, "SIGKILL");
        const [exited] = await sup.waitForEvent("worker_process_exited", (r) => r.pid === victim);
        assertEquals([exited.slot, exited.code, exited.signal], [slot, 137, "SIGKILL"]);
        const [restarted] = await sup.waitForEvent(
          "worker_process_restarted",
          (r) => r.slot === slot,
        );
        assertEquals([restarted.delay, restarted.previousCode], [1, 137]);
        assert(restarted.pid !== victim);
        // The lease of the dead worker lapses (1.5 s) and a live one rescues and reruns it,
        // unless the restarted slot settled it first (tests/process_crash_test.ts).
        const done = await jobWhen(
          sql,
          id,
          (r) => r.state === "succeeded",
          "the job to be rescued and run again",
        );
        // 2, unless a loaded machine delayed a heartbeat past 1.5 s and it was rescued again.
        assert(done.run_count >= 2, `run_count ${done.run_count}`);
        assertEquals(done.result, `run ${done.run_count}`);
        assert(done.worker_id !== running.worker_id, `${done.worker_id} ran it again`);
        // The restarted slot registers with its own worker id: host:pid:slot.
        await waitFor(
          async () =>
            (await workerRows(sql)).some((w) =>
              w.pid === restarted.pid && w.id.endsWith(`:${restarted.pid}:${slot}`)
            ),
          "the restarted worker to register",
          SLOW,
        );
        sup.child.kill("SIGTERM");
        const out = await sup.done();
        assertEquals(out.code, 0, out.stderr);
        assertEquals(sup.events("supervisor_stopped")[0].code, 0);
      });
    });
  });
});

Deno.test("one SIGINT to the supervisor's process group (Ctrl-C) drains every worker once: exit 0", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("supervisor_sigint", async (db, sql) => {
      await withProcesses(async () => {
        const ids = [await insertJob(sql, "sleepy"), await insertJob(sql, "sleepy")];
        // detached: the supervisor leads its own process group, as in a terminal.
        const sup = supervise(dir, db.url, ["--processes", "2", "--shutdown-timeout", "0.5"], {
          detached: true,
        });
        await waitFor(
          async () => {
            const rows = await Promise.all(ids.map((id) => job(sql, id)));
            return rows.every((r) => r.state === "running") &&
              new Set(rows.map((r) => r.worker_id)).size === 2;
          },
          "both jobs to run, one per worker process",
          SLOW,
        );
        Deno.kill(-sup.child.pid, "SIGINT");
        const out = await sup.done();
        assertEquals(out.code, 0, out.stderr);
        // Each worker saw one signal (a second would have forced it: 130).
        assertEquals(sup.events("stop_requested").length, 2, out.stderr);
        assertEquals(sup.events("stop_forced").length, 0, out.stderr);
        assertEquals(sup.events("worker_process_exited").map((r) => r.code), [0, 0]);
        assertEquals(sup.events("supervisor_signal").map((r) => [r.signal, r.action]), [
          ["SIGINT", "drain"],
        ]);
        // The lifecycle, with stable event names, from the supervisor's own logger.
        const lifecycle = sup.records().filter((r) => r.logger === "akadze.supervisor");
        assertEquals(lifecycle.map((r) => r.event), [
          "supervisor_started",
          "worker_process_started",
          "worker_process_started",
          "supervisor_signal",
          "worker_process_exited",
          "worker_process_exited",
          "supervisor_stopped",
        ]);
        assertEquals(lifecycle[0].processes, 2);
        assertEquals(lifecycle[6].code, 0);
        for (const id of ids) {
          const row = await job(sql, id);
          assertEquals([row.state, row.attempt], ["queued", 0], "released, attempt unchanged");
        }
        assertEquals(await workerRows(sql), []);
      });
    });
  });
});

Deno.test("a SIGTERM while the worker processes are still starting: exit 0, nothing claimed", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("supervisor_early", async (db, sql) => {
      await withProcesses(async () => {
        const id = await insertJob(sql, "hello");
        const sup = supervise(dir, db.url, ["--processes", "2"]);
        await sup.waitForEvent("worker_process_started", undefined, 2);
        sup.child.kill("SIGTERM");
        const out = await sup.done();
        assertEquals(out.code, 0, out.stderr);
        // Each was either killed before it could listen for the signal, or drained.
        const ends = [
          ...sup.events("worker_process_stopped_early").map(() => "early"),
          ...sup.events("worker_process_exited").map((r) => r.code),
        ];
        assertEquals(ends.length, 2, out.stderr);
        assert(ends.every((end) => end === "early" || end === 0), out.stderr);
        assertEquals((await job(sql, id)).state, "queued");
      });
    });
  });
});

Deno.test("a second SIGTERM forces the workers (130); the supervisor exits 130", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("supervisor_force", async (db, sql) => {
      await withProcesses(async () => {
        const ids = [await insertJob(sql, "sleepy"), await insertJob(sql, "sleepy")];
        const sup = supervise(dir, db.url, ["--processes", "2", "--shutdown-timeout", "120"]);
        await waitFor(
          async () => {
            const rows = await Promise.all(ids.map((id) => job(sql, id)));
            return rows.every((r) => r.state === "running");
          },
          "both jobs to run",
          SLOW,
        );
        sup.child.kill("SIGTERM");
        await sup.waitForEvent("stop_requested", undefined, 2);
        sup.child.kill("SIGTERM");
        const out = await sup.done();
        assertEquals(out.code, 130, out.stderr);
        assertEquals(sup.events("worker_process_exited").map((r) => r.code), [130, 130]);
        assertEquals(sup.events("supervisor_signal").map((r) => r.action), ["drain", "force"]);
        // Left to the lease.
        for (const id of ids) assertEquals((await job(sql, id)).state, "running");
      });
    });
  });
});

Deno.test("a SIGKILLed supervisor: its worker processes notice, drain and exit on their own", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("supervisor_orphans", async (db, sql) => {
      await withProcesses(async () => {
        const id = await insertJob(sql, "sleepy");
        const sup = supervise(dir, db.url, ["--processes", "2", "--shutdown-timeout", "0.5"]);
        await sup.waitForEvent("worker_started", undefined, 2);
        await waitFor(async () => (await job(sql, id)).state === "running", "the job to run", SLOW);
        const pids = sup.events("worker_process_started").map((r) => Number(r.pid));
        assertEquals(pids.length, 2);
        const killedAt = Date.now();
        sup.child.kill("SIGKILL");
        // The output ends when every process holding stderr (the workers) has exited.
        const out = await within(sup.done(), 30_000, "the orphaned workers to exit");
        assertEquals(out.code, 137);
        const orphaned = sup.events("worker_orphaned");
        assertEquals(orphaned.map((r) => r.slot).sort(), [0, 1], out.stderr);
        assert(Date.now() - killedAt < 20_000, "the workers took too long to exit");
        for (const pid of pids) assert(!(await isAlive(pid)), `worker process ${pid} still runs`);
        const row = await job(sql, id);
        assertEquals([row.state, row.attempt], ["queued", 0], "drained: released");
        assertEquals(await workerRows(sql), []);
      });
    });
  });
});

Deno.test("restart cap: a worker process that always dies stops the supervisor with exit 1", async () => {
  const broken = `throw new Error("this app module fails at import");\n`;
  await withDir({ "app.ts": broken }, async (dir) => {
    await withProcesses(async () => {
      const started = Date.now();
      const sup = spawnCli(
        ["worker", `${dir}/app.ts`, "--processes", "2", "--log-format", "json"],
        { AKADZE_DATABASE_URL: "postgres://app:pw@127.0.0.1:1/app" },
        { permissions: supervisorPermissions(dir) },
      );
      const out = await within(sup.done(), 120_000, "the supervisor to stop");
      assertEquals(out.code, 1, out.stderr);
      const [cap] = sup.events("supervisor_restart_cap");
      assert(cap, out.stderr);
      assertEquals(cap.deaths, RESTART_CAP + 1);
      const restarts = sup.events("worker_process_restarted").filter((r) => r.slot === cap.slot);
      assertEquals(restarts.map((r) => r.delay), [1, 2, 4, 8, 16]);
      // 1 + 2 + 4 + 8 + 16 s of backoff before the sixth death.
      assert(Date.now() - started >= 31_000, "restarted faster than the backoff allows");
      assertEquals(sup.events("supervisor_stopped").map((r) => [r.reason, r.code]), [
        ["restart_cap", 1],
      ]);
      assertMatch(out.stderr, /could not load .*fails at import/);
    });
  });
});
