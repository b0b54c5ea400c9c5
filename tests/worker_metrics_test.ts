// The worker's own metrics: jobs finished per task, queue and outcome, run durations, busy
// slots, served at GET /metrics with --metrics-port (one port per worker process).
import { Cancel, Fail, Retry, Snooze } from "../src/errors.ts";
import { parseWorkerCommandLine } from "../src/cli/worker_flags.ts";
import { UsageError } from "../src/cli/common.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import { countJobs, startWorker, waitFor, waitForJob, withApp, withDatabase } from "./_helpers.ts";
import {
  APP_MODULE,
  SLOW,
  spawnCli,
  supervisorPermissions,
  withDir,
  withProcesses,
} from "./_processes.ts";
import { assertPromtoolAccepts } from "./_promtool.ts";

/** The samples of a scrape: `name{labels}` → value. */
function samples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** A port nothing listens on now, and the `extra` ports after it too. */
function freePort(extra = 0): number {
  for (;;) {
    const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (probe.addr as Deno.NetAddr).port;
    probe.close();
    if (port + extra > 65_535) continue;
    try {
      for (let i = 1; i <= extra; i++) {
        Deno.listen({ hostname: "127.0.0.1", port: port + i }).close();
      }
      return port;
    } catch {
      // taken: try another
    }
  }
}

async function scrape(port: number, path = "/metrics"): Promise<Response> {
  return await fetch(`http://127.0.0.1:${port}${path}`);
}

Deno.test("worker metrics count every outcome per task and queue, time runs, and pass promtool", async () => {
  await withApp("wmetrics_outcomes", async (app, sql) => {
    const ok = app.task("ok", () => "done");
    const slow = app.task("slow", () => new Promise((r) => setTimeout(r, 30)));
    const flaky = app.task("flaky", { maxAttempts: 2 }, () => {
      throw new Retry({ delay: 1 });
    });
    const doomed = app.task("doomed", () => {
      throw new Fail("no");
    });
    const quits = app.task("quits", () => {
      throw new Cancel();
    });
    const naps = app.task("naps", { queue: "mail" }, (_args, ctx) => {
      if (ctx.job.runCount === 1) throw new Snooze(1);
    });
    const viaTx = app.task("viaTx", async (_args, ctx) => {
      await ctx.completeTx(async () => {});
    });
    app.task("never", () => {}); // registered, never run: its series start at zero
    app.task("elsewhere", { queue: "other" }, () => {}); // a queue the worker does not serve
    const sleepy = app.task(
      "sleepy",
      (_args, ctx) => new Promise((resolve) => ctx.signal.addEventListener("abort", resolve)),
    );
    const ids = [
      await ok.enqueue(),
      await ok.enqueue(),
      await slow.enqueue(),
      await flaky.enqueue(),
      await doomed.enqueue(),
      await quits.enqueue(),
      await naps.enqueue(),
      await ok.using({ queue: "mail" }).enqueue(),
      await viaTx.enqueue(),
      await viaTx.enqueue(),
      await viaTx.enqueue(),
    ];
    const port = freePort();
    const running = startWorker(app, {
      queues: ["default", "mail"],
      slots: 4,
      metricsPort: port,
      shutdownTimeout: 100,
    });
    try {
      for (const id of ids) {
        await waitForJob(sql, id, (r) => r.finished_at !== null, `job ${id} to finish`);
      }
      // An outcome is counted once written: wait for the last ones to show.
      const text = (await waitFor(async () => {
        const response = await scrape(port);
        const body = await response.text();
        const s = samples(body);
        return s.get(
                'akadze_worker_jobs_finished_total{task="naps",queue="mail",outcome="succeeded"}',
              ) === 1 &&
            s.get(
                'akadze_worker_jobs_finished_total{task="flaky",queue="default",outcome="failed"}',
              ) === 1 &&
            response.headers.get("content-type")?.startsWith("text/plain; version=0.0.4")
          ? body
          : null;
      }, "every outcome in the scrape"))!;
      const s = samples(text);
      const finished = (task: string, queue: string, outcome: string) =>
        s.get(
          `akadze_worker_jobs_finished_total{task="${task}",queue="${queue}",outcome="${outcome}"}`,
        );
      assertEquals(finished("ok", "default", "succeeded"), 2);
      assertEquals(finished("ok", "mail", "succeeded"), 1);
      assertEquals(finished("slow", "default", "succeeded"), 1);
      assertEquals(finished("flaky", "default", "retried"), 1);
      assertEquals(finished("flaky", "default", "failed"), 1);
      assertEquals(finished("doomed", "default", "failed"), 1);
      assertEquals(finished("doomed", "default", "retried"), 0);
      assertEquals(finished("quits", "default", "cancelled"), 1);
      assertEquals(finished("naps", "mail", "snoozed"), 1);
      assertEquals(finished("naps", "mail", "succeeded"), 1);
      assertEquals(finished("never", "default", "succeeded"), 0);
      // A success written by ctx.completeTx counts like any other.
      assertEquals(finished("viaTx", "default", "succeeded"), 3);
      assertEquals(finished("elsewhere", "other", "succeeded"), undefined);
      const duration = (part: string, task: string, queue = "default", le?: string) =>
        s.get(
          `akadze_worker_job_duration_seconds_${part}{task="${task}",queue="${queue}"${
            le ? `,le="${le}"` : ""
          }}`,
        );
      // One observation per run: flaky ran twice, naps twice.
      assertEquals(duration("count", "flaky"), 2);
      assertEquals(duration("count", "naps", "mail"), 2);
      assertEquals(duration("bucket", "naps", "mail", "+Inf"), 2);
      assertEquals(duration("count", "slow"), 1);
      assert(duration("sum", "slow")! >= 0.025, `slow's duration ${duration("sum", "slow")}`);
      assertEquals(duration("bucket", "slow", "default", "0.025"), 0);
      assertEquals(duration("bucket", "slow", "default", "300"), 1);
      assertEquals(duration("count", "never"), 0);
      assertEquals(duration("count", "viaTx"), 3);
      assertEquals(s.get('akadze_worker_slots_busy{queue="default"}'), 0);
      await assertPromtoolAccepts(text);
      assertEquals((await scrape(port, "/")).status, 404);
      // A run in progress is a busy slot; put back on shutdown, it counts as released.
      const asleep = await sleepy.enqueue();
      await waitForJob(sql, asleep, (r) => r.state === "running", "sleepy to run");
      await waitFor(async () => {
        const busy = samples(await (await scrape(port)).text());
        return busy.get('akadze_worker_slots_busy{queue="default"}') === 1;
      }, "a busy slot in the scrape");
    } finally {
      await running.stop();
    }
    assertEquals(
      samples(running.worker.metrics.render())
        .get('akadze_worker_jobs_finished_total{task="sleepy",queue="default",outcome="released"}'),
      1,
    );
    // The endpoint ends with the run.
    await fetch(`http://127.0.0.1:${port}/metrics`).then(
      () => assert(false, "the endpoint still answers after the run"),
      () => {},
    );
  });
});

Deno.test("a metrics port already taken ends the run with code 1 and a message naming it", async () => {
  await withApp("wmetrics_taken", async (app) => {
    const taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (taken.addr as Deno.NetAddr).port;
    try {
      const exit = await new Worker(app, { metricsPort: port }).run();
      assertEquals([exit.code, exit.reason], [1, "fatal"]);
      assertMatch(exit.message!, new RegExp(`^cannot serve metrics on 127\\.0\\.0\\.1:${port}: `));
    } finally {
      taken.close();
    }
  });
});

Deno.test("--metrics-port: an integer port; --metrics-host and --metrics-queue-state go with it", () => {
  const line = parseWorkerCommandLine(
    ["./app.ts", "--metrics-port", "9465", "--metrics-host", "0.0.0.0", "--metrics-queue-state"],
    "worker",
  );
  assertEquals(line.worker, { metricsPort: 9465, metricsHost: "0.0.0.0", metricsQueueState: true });
  for (
    const [args, message] of [
      [["--metrics-port", "x"], /--metrics-port must be an integer from 0 to 65535/],
      [["--metrics-port", "65535", "--processes", "2"], /choose a port at most 65534/],
      [["--metrics-host", "0.0.0.0"], /--metrics-host goes with --metrics-port/],
      [["--metrics-queue-state"], /--metrics-queue-state goes with --metrics-port/],
    ] as const
  ) {
    const error = assertThrows(
      () => parseWorkerCommandLine(["./app.ts", ...args], "worker"),
      UsageError,
    );
    assertMatch(error.message, message);
  }
});

Deno.test("--processes 2 --metrics-port P: worker process K serves its own metrics on P+K", async () => {
  await withDatabase("wmetrics_processes", async (db, sql) => {
    await withDir({ "app.ts": APP_MODULE }, async (dir) => {
      await withProcesses(async () => {
        const port = freePort(1);
        const sup = spawnCli(
          [
            "worker",
            `${dir}/app.ts`,
            "--processes",
            "2",
            "--metrics-port",
            String(port),
            "--metrics-queue-state",
            "--log-format",
            "json",
            "--poll-interval",
            "0.1",
          ],
          { AKADZE_DATABASE_URL: db.url },
          { permissions: supervisorPermissions(dir) },
        );
        const listening = await sup.waitForEvent("metrics_listening", undefined, 2, SLOW);
        assertEquals(listening.map((r) => r.port).sort(), [port, port + 1]);
        await sql`insert into akadze.jobs (task, args) values ('hello', '{"name":"x"}')`;
        await waitFor(async () => await countJobs(sql, "succeeded") === 1, "the job to succeed");
        const key =
          'akadze_worker_jobs_finished_total{task="hello",queue="default",outcome="succeeded"}';
        // The job ran in one of the two: the counts of both add up to one.
        const texts = (await waitFor(async () => {
          const texts = [await (await scrape(port)).text(), await (await scrape(port + 1)).text()];
          const counts = texts.map((t) => samples(t).get(key));
          return counts.every((n) => n !== undefined) && counts[0]! + counts[1]! === 1
            ? texts
            : null;
        }, "the job counted in one worker process"))!;
        for (const text of texts) {
          // The queue gauges too, with --metrics-queue-state.
          assertEquals(
            samples(text).get('akadze_jobs{queue="default",state="succeeded"}'),
            1,
            text,
          );
          await assertPromtoolAccepts(text);
        }
        Deno.kill(sup.child.pid, "SIGTERM");
        assertEquals((await sup.done()).code, 0);
      });
    });
  });
});
