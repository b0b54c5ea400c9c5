// A job keeps the worker that ran its last run, and each stored error the worker and attempt
// it came from; nothing that looks for a worker's jobs mistakes a finished job for a running one.
import { getJob, listWorkers } from "../admin.ts";
import { Rescuer } from "../src/worker/rescuer.ts";
import { drain, makeReady } from "../src/testing.ts";
import { assertEquals } from "./assert.ts";
import { startWorker, waitFor, withApp } from "./_helpers.ts";

Deno.test("finished, retried and rescued jobs keep the worker that ran each attempt", async () => {
  await withApp("job_worker_kept", async (app, sql) => {
    let runs = 0;
    const flaky = app.task("flaky", { maxAttempts: 3 }, () => {
      if (++runs === 1) throw new Error("first run fails");
    });
    const id = await flaky.enqueue({});
    // drain's worker ids start with "drain:"; each drain is a new worker.
    await drain(app);
    const [queued] = await sql`select worker_id from akadze.jobs where id = ${id}`;
    const first = queued.worker_id as string;
    assertEquals(first.startsWith("drain:"), true, first);
    await makeReady(app);
    await drain(app);
    const job = await getJob(app, id);
    assertEquals(job?.state, "succeeded");
    const second = job?.workerId as string;
    assertEquals(second.startsWith("drain:") && second !== first, true, second);
    assertEquals(job?.errors.map((e) => [e.attempt, e.worker]), [[1, first]]);

    // A lost worker: its running job is put back naming it, in the job and in the error.
    const lost = await flaky.enqueue({});
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
              values ('w-gone', 'h', 1, '{default}', now() - interval '1 hour', 1000)`;
    await sql`update akadze.jobs set state = 'running', worker_id = 'w-gone', run_count = 1,
                     started_at = now() where id = ${lost}`;
    // A job the lost worker finished earlier is not rescued, and does not keep its row alive.
    const done = await sql`insert into akadze.jobs (task, state, worker_id, finished_at)
                           values ('flaky', 'succeeded', 'w-gone', now()) returning id::text`;
    const rescuer = new Rescuer(app.sql, { schema: app.schema, hooks: [] });
    assertEquals(await rescuer.runOnce({ full: true }), {
      rescued: 1,
      failed: 0,
      removedWorkers: 1,
    });
    const rescued = await getJob(app, lost);
    assertEquals([rescued?.state, rescued?.workerId], ["queued", "w-gone"]);
    assertEquals(rescued?.errors.map((e) => [e.error, e.attempt, e.worker]), [
      ["WorkerLost", 1, "w-gone"],
    ]);
    const [kept] = await sql`select state, worker_id from akadze.jobs where id = ${done[0].id}`;
    assertEquals([kept.state, kept.worker_id], ["succeeded", "w-gone"]);
  });
});

Deno.test("listWorkers names the jobs a worker runs now, not those it finished", async () => {
  await withApp("job_worker_running", async (app) => {
    const gate = Promise.withResolvers<void>();
    const started: string[] = [];
    const slow = app.task("slow", async (_args, ctx) => {
      started.push(ctx.job.id);
      await gate.promise;
    });
    const quick = app.task("quick", () => {});
    const done = await quick.enqueue({});
    await drain(app);
    const running = startWorker(app, { queues: ["default"], slots: 2, id: "w-list" });
    try {
      const ids = [await slow.enqueue({}), await slow.enqueue({})];
      await waitFor(() => started.length === 2, "both jobs to start");
      const [worker] = (await listWorkers(app)).filter((w) => w.id === "w-list");
      assertEquals([worker.running, worker.runningJobs], [2, ids]);
      assertEquals((await getJob(app, done))?.state, "succeeded");
      gate.resolve();
      await waitFor(async () => {
        const [w] = (await listWorkers(app)).filter((w) => w.id === "w-list");
        return w.runningJobs.length === 0;
      }, "the jobs to finish");
      for (const id of ids) assertEquals((await getJob(app, id))?.workerId, "w-list");
    } finally {
      gate.resolve();
      await running.stop();
    }
  });
});
