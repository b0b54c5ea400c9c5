// ctx.progress against real PostgreSQL: the value rule, throttled writes with the last value
// written before the outcome, the fence on the run, completeTx, getJob, `akadze jobs show`
// and waitForJob's onProgress.
import { getJob } from "../src/admin/jobs.ts";
import type { Sql } from "../src/db.ts";
import { AkadzeError } from "../src/errors.ts";
import { MAX_PROGRESS_BYTES, progressText } from "../src/rules.ts";
import { ProgressReporter, progressStatement } from "../src/worker/progress.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals, assertThrows } from "./assert.ts";
import { runCli, startWorker, waitFor, waitForJob, withApp, within } from "./_helpers.ts";

/** Record every write of jobs.progress (a trigger of the test's own) in progress_writes. */
async function recordProgressWrites(sql: Sql): Promise<void> {
  await sql.unsafe(`
    create table progress_writes (id bigint, value jsonb, at timestamptz default clock_timestamp());
    create function record_progress() returns trigger language plpgsql as $$
    begin
      insert into progress_writes (id, value) values (new.id, new.progress);
      return null;
    end $$;
    create trigger record_progress after update of progress on akadze.jobs
      for each row when (new.progress is distinct from old.progress)
      execute function record_progress();`);
}

async function writes(sql: Sql, id: string): Promise<unknown[]> {
  const rows = await sql`select value from progress_writes where id = ${id} order by at`;
  return rows.map((r) => r.value);
}

Deno.test("progress must be a finite number or small JSON", () => {
  assertEquals(progressText(42.5), "42.5");
  assertEquals(progressText({ done: 3, of: 10 }), '{"done":3,"of":10}');
  assertEquals(progressText("step 2"), '"step 2"');
  const message = (value: unknown) => assertThrows(() => progressText(value), AkadzeError).message;
  assertEquals(message(NaN), "progress must be a finite number or small JSON, got NaN");
  assertEquals(message(Infinity), "progress must be a finite number or small JSON, got Infinity");
  assertEquals(message(undefined), "progress must be a finite number or small JSON, got undefined");
  assertEquals(message(null), "progress must be a finite number or small JSON, got null");
  assert(message({ n: 1n }).startsWith("progress cannot be stored: progress.n is a BigInt"));
  assertEquals(
    message("x".repeat(MAX_PROGRESS_BYTES)),
    `progress must be at most ${MAX_PROGRESS_BYTES} bytes of JSON, got ${
      MAX_PROGRESS_BYTES + 2
    }: report a summary (a percentage, counts), not the data`,
  );
});

Deno.test("reports are throttled and the last one is written before the outcome", async () => {
  await withApp("progress_throttle", async (app, sql) => {
    await recordProgressWrites(sql);
    const work = app.task("work", (_args, ctx) => {
      for (let i = 1; i <= 100; i++) ctx.progress(i);
      return "done";
    });
    const id = await work.enqueue({});
    await new Worker(app, { batch: true }).run();
    // The first report at once, the 98 between coalesced, the last before the outcome.
    assertEquals(await writes(sql, id), [1, 100]);
    const job = await getJob(app, id);
    assertEquals([job?.state, job?.progress], ["succeeded", 100]);
  });
});

Deno.test("a handler that reports over time is written at most once per interval", async () => {
  await withApp("progress_interval", async (app, sql) => {
    await recordProgressWrites(sql);
    const work = app.task("work", async (_args, ctx) => {
      // 30 reports over ~1.5 s: at most a write per second plus the last.
      for (let i = 1; i <= 30; i++) {
        ctx.progress({ step: i });
        await new Promise((r) => setTimeout(r, 50));
      }
    });
    const id = await work.enqueue({});
    await new Worker(app, { batch: true }).run();
    const seen = await writes(sql, id);
    assert(seen.length >= 2 && seen.length <= 4, `writes: ${JSON.stringify(seen)}`);
    assertEquals(seen[0], { step: 1 });
    assertEquals(seen.at(-1), { step: 30 });
  });
});

Deno.test("progress is fenced on the run: a stale run cannot overwrite it", async () => {
  await withApp("progress_fence", async (app, sql) => {
    const work = app.task("work", () => {});
    const id = await work.enqueue({});
    await sql`update akadze.jobs set state = 'running', worker_id = 'w', run_count = 2
      where id = ${id}`;
    const statement = progressStatement("akadze");
    const stale = new ProgressReporter(app.sql, statement, { id, runCount: 1 });
    stale.report("1");
    await stale.finish();
    assertEquals((await getJob(app, id))?.progress, null);
    const current = new ProgressReporter(app.sql, statement, { id, runCount: 2 });
    current.report("2");
    await current.finish();
    assertEquals((await getJob(app, id))?.progress, 2);
    // Once the job is no longer running, no run writes it.
    await sql`update akadze.jobs set state = 'succeeded', worker_id = null, finished_at = now()
      where id = ${id}`;
    const late = new ProgressReporter(app.sql, statement, { id, runCount: 2 });
    late.report("3");
    await late.finish();
    assertEquals((await getJob(app, id))?.progress, 2);
  });
});

Deno.test("completeTx writes the last progress in its transaction", async () => {
  await withApp("progress_complete_tx", async (app, sql) => {
    const work = app.task("work", async (_args, ctx) => {
      ctx.progress(1);
      ctx.progress(2); // coalesced: the interval has not passed
      await ctx.completeTx(async (tx) => {
        await tx`select 1`;
      });
    });
    const id = await work.enqueue({});
    await new Worker(app, { batch: true }).run();
    const [row] = await sql`select state, progress from akadze.jobs where id = ${id}`;
    assertEquals([row.state, row.progress], ["succeeded", 2]);
  });
});

Deno.test("a bad progress value fails the handler with the rule", async () => {
  await withApp("progress_bad", async (app) => {
    const work = app.task("work", (_args, ctx) => ctx.progress(NaN));
    const id = await work.using({ maxAttempts: 1 }).enqueue({});
    await new Worker(app, { batch: true }).run();
    const job = await getJob(app, id);
    assertEquals(job?.state, "failed");
    assertEquals(
      job?.errors.at(-1)?.message,
      "progress must be a finite number or small JSON, got NaN",
    );
  });
});

Deno.test("waitForJob's onProgress sees each new value; jobs show prints it", async () => {
  await withApp("progress_await", async (app, sql, db) => {
    let open!: () => void;
    const proceed = new Promise<void>((resolve) => open = resolve);
    const work = app.task("work", async (_args, ctx) => {
      ctx.progress({ done: 1, of: 2 });
      await proceed;
      ctx.progress({ done: 2, of: 2 });
      return "ok";
    });
    const running = startWorker(app);
    try {
      const id = await work.enqueue({});
      const seen: unknown[] = [];
      const wait = app.waitForJob(id, {
        timeout: 60_000,
        pollInterval: 60_000,
        onProgress: (progress, jobId) => {
          assertEquals(jobId, id);
          seen.push(progress);
        },
      });
      wait.catch(() => {});
      await waitFor(() => seen.length === 1, "the first progress");
      assertEquals(seen, [{ done: 1, of: 2 }]);
      await waitForJob(sql, id, (r) => r.awaited === true, "the job to be marked awaited");
      const shown = await runCli(["jobs", "show", id], { AKADZE_DATABASE_URL: db.url });
      assertEquals(shown.code, 0, shown.stderr);
      assert(shown.stdout.includes('progress: {"of":2,"done":1}'), shown.stdout);
      open();
      const job = await within(wait, 20_000, "the job");
      assertEquals([job.state, job.progress], ["succeeded", { done: 2, of: 2 }]);
      assertEquals(seen, [{ done: 1, of: 2 }, { done: 2, of: 2 }]);
    } finally {
      await running.stop();
    }
  });
});
