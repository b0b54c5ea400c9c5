// Dead letters: a task's jobs that fail for good enqueue a job of its deadLetter task, with
// the failed job's id, task, queue, arguments and errors, in the same transaction.
import { Akadze, type DeadLetter, Fail } from "../mod.ts";
import { getJob, requeue } from "../admin.ts";
import { AkadzeError } from "../src/errors.ts";
import { Rescuer } from "../src/worker/rescuer.ts";
import { deadLetterTargets } from "../src/dead_letter.ts";
import { drain, makeReady } from "../src/testing.ts";
import { assert, assertEquals, assertThrows } from "./assert.ts";
import { startWorker, waitForJob, withApp } from "./_helpers.ts";

Deno.test("a job that fails for good is dead-lettered once, with its id, task, arguments and errors; requeue still works", async () => {
  await withApp("dead_letter", async (app, sql) => {
    const letters: DeadLetter[] = [];
    const queues: string[] = [];
    app.task("charge.failed", { queue: "dead" }, (args, ctx) => {
      letters.push(args as unknown as DeadLetter);
      queues.push(ctx.job.queue);
    });
    let fix = false;
    const charge = app.task(
      "charge",
      { maxAttempts: 2, deadLetter: "charge.failed" },
      ({ cents }) => {
        if (!fix) throw new Error(`card declined for ${cents}`);
        return "charged";
      },
    );
    const retried = app.task("retried", { maxAttempts: 2, deadLetter: "charge.failed" }, () => {
      throw new Fail("no");
    });
    const cancelled = app.task("cancelled", { deadLetter: "charge.failed" }, (_a, ctx) => {
      if (ctx.job.attempt === 1) throw new Error("first fails");
    });

    const id = await charge.enqueue({ cents: 1234 });
    await drain(app); // attempt 1 fails: retried later, no dead letter yet
    assertEquals(letters.length, 0);
    await makeReady(app);
    await drain(app); // attempt 2 fails: the job fails and its dead letter runs
    assertEquals((await getJob(app, id))?.state, "failed");
    assertEquals(letters.length, 1);
    const [letter] = letters;
    assertEquals([letter.id, letter.task, letter.queue, letter.args], [
      id,
      "charge",
      "default",
      { cents: 1234 },
    ]);
    assertEquals(letter.errors.map((e) => [e.message, e.attempt]), [
      ["card declined for 1234", 1],
      ["card declined for 1234", 2],
    ]);
    assertEquals(queues, ["dead"]); // the dead-letter task's own queue

    // Fail ends it at once (a dead letter); a success after a retry has none.
    await retried.enqueue({});
    await cancelled.enqueue({});
    await drain(app);
    await makeReady(app);
    await drain(app);
    assertEquals(letters.map((l) => l.task), ["charge", "retried"]);

    // The original can still be put back; it succeeds now, and nothing more is dead-lettered.
    fix = true;
    await requeue(app.sql, id);
    assertEquals(await drain(app), 1);
    assertEquals((await getJob(app, id))?.state, "succeeded");
    assertEquals(letters.length, 2);
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                              where task = 'charge.failed'`;
    assertEquals(n, 2);
  });
});

Deno.test("the dead letter commits with the failure: a rolled-back failure leaves none", async () => {
  await withApp("dead_letter_tx", async (app, sql) => {
    // Inside the failing transition's transaction the dead letter exists; outside it does not
    // until that transaction commits. The first try is rolled back by the hook, with it.
    const seen: string[] = [];
    app.hooks.onTransition.push(async (tx, _job, _from, to) => {
      if (to !== "failed") return;
      const count = (rows: { n: number }[]) => rows[0].n;
      const q = "select count(*)::int as n from akadze.jobs where task = 'gone'";
      seen.push(`${count(await tx.unsafe(q))} in, ${count(await sql.unsafe(q))} out`);
      if (seen.length === 1) throw new Error("refused once");
    });
    app.task("gone", { queue: "dead" }, () => {});
    const doomed = app.task("doomed", { maxAttempts: 1, deadLetter: "gone" }, () => {
      throw new Error("boom");
    });
    const id = await doomed.enqueue({});
    const running = startWorker(app, { queues: ["default"] });
    try {
      await waitForJob(sql, id, (r) => r.state === "failed", "the job to fail");
    } finally {
      await running.stop();
    }
    assertEquals(seen, ["1 in, 0 out", "1 in, 0 out"]);
    const letters = await sql`select args->>'id' as id from akadze.jobs where task = 'gone'`;
    assertEquals(letters.map((r) => r.id), [id]);
  });
});

Deno.test("a rescue that fails a job on its last attempt dead-letters it", async () => {
  await withApp("dead_letter_rescue", async (app, sql) => {
    app.task("lost.dead", { queue: "dead" }, () => {});
    app.task("lost", { maxAttempts: 1, deadLetter: "lost.dead" }, () => {});
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
              values ('w-gone', 'h', 1, '{default}', now() - interval '1 hour', 1000)`;
    const [{ id }] = await sql`
      insert into akadze.jobs (task, state, worker_id, run_count, started_at, max_attempts, args)
      values ('lost', 'running', 'w-gone', 1, now(), 1, '{"n":1}') returning id::text`;
    const rescuer = new Rescuer(app.sql, {
      schema: app.schema,
      hooks: [],
      deadLetters: deadLetterTargets(app.tasks),
    });
    assertEquals((await rescuer.runOnce({ full: true })).failed, 1);
    const [letter] = await sql`select queue, args from akadze.jobs where task = 'lost.dead'`;
    assertEquals([letter.queue, letter.args.id, letter.args.args], ["dead", id, { n: 1 }]);
    assertEquals(letter.args.errors.map((e: { error: string }) => e.error), ["WorkerLost"]);
  });
});

Deno.test("deadLetter is checked at registration", async () => {
  const app = new Akadze({ databaseUrl: "postgres://localhost/unused" }); // connects lazily
  try {
    const bad = ["self", "", { task: "x", queue: "no spaces" }, { task: "x", other: 1 }, 42];
    for (const deadLetter of bad) {
      assertThrows(
        () => app.task("self", { deadLetter: deadLetter as never }, () => {}),
        AkadzeError,
      );
    }
    app.task("named", { deadLetter: { task: "elsewhere", queue: "graveyard" } }, () => {});
    app.task("plain", { deadLetter: "unknown.task" }, () => {});
    const targets = deadLetterTargets(app.tasks);
    assertEquals(targets.get("named"), { task: "elsewhere", queue: "graveyard" });
    assertEquals(targets.get("plain"), { task: "unknown.task", queue: "default" });
    assert(!targets.has("self"));
  } finally {
    await app.close();
  }
});
