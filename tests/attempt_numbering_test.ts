// One attempt numbering for users: the first run is attempt 1 in ctx.job, the hooks, the
// logs, listJobs/getJob, the CLI and each stored error entry.
import { getJob, listJobs } from "../admin.ts";
import { drain, makeReady } from "../src/testing.ts";
import { assertEquals } from "./assert.ts";
import { runCli, withApp, withLogs } from "./_helpers.ts";

Deno.test("the first run is attempt 1 in ctx.job, hooks, logs, listJobs, the CLI and stored errors", async () => {
  await withApp("attempt_numbering", async (app, _sql, db) => {
    const seen: number[] = [];
    const hooked: string[] = [];
    app.hooks.beforeRun.push((job) => {
      hooked.push(`before:${job.attempt}`);
    });
    app.hooks.onTransition.push((_tx, job, from, to) => {
      hooked.push(`${from}>${to}:${job.attempt}`);
    });
    const flaky = app.task("flaky", { maxAttempts: 3 }, async (_args, ctx) => {
      seen.push(ctx.job.attempt);
      const [running] = await listJobs(app, { task: "flaky" });
      seen.push(running.attempt);
      if (seen.length <= 2) throw new Error("first run fails");
    });
    const id = await flaky.enqueue({});
    const records = await withLogs(async () => {
      await drain(app);
      const [queued] = await listJobs(app, { task: "flaky" });
      assertEquals(queued.attempt, 1); // the last counted attempt
      await makeReady(app);
      await drain(app);
    });
    assertEquals(seen, [1, 1, 2, 2]);
    assertEquals(hooked, [
      "queued>running:1",
      "before:1",
      "running>queued:1",
      "queued>running:2",
      "before:2",
      "running>succeeded:2",
    ]);
    const logged = records
      .filter((r) =>
        ["job_claimed", "job_retrying", "job_succeeded"].includes(`${r.properties.event}`)
      )
      .map((r) => `${r.properties.event}:${r.properties.attempt}`);
    assertEquals(logged, ["job_claimed:1", "job_retrying:1", "job_claimed:2", "job_succeeded:2"]);
    const retrying = records.find((r) => r.properties.event === "job_retrying")!;
    assertEquals(
      retrying.message.join("").includes("attempt 1/3"),
      true,
      retrying.message.join(""),
    );

    const job = await getJob(app, id);
    assertEquals([job?.state, job?.attempt], ["succeeded", 2]);
    assertEquals(job?.errors.map((e) => (e as { attempt?: number }).attempt), [1]);
    const show = await runCli(["jobs", "show", id], { AKADZE_DATABASE_URL: db.url });
    assertEquals(show.code, 0, show.stderr);
    assertEquals(show.stdout.split("\n").filter((l) => l.startsWith("attempt:")), ["attempt: 2"]);
  });
});
