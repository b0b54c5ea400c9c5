// Why a job failed, as an operator sees it: the stored error with its stack, the
// job_retrying / job_failed log records, and `jobs show`.
import type { LogRecord } from "@logtape/logtape";
import { drain } from "../src/testing.ts";
import { errorEntry, STACK_FRAMES_MAX, STACK_MAX } from "../src/worker/error_entry.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { runCli, withApp, withDatabase, withLogs } from "./_helpers.ts";

const CARD = "4111-CARD-0000-1234";

type StoredError = { error: string; message: string; at: string; stack?: string };

/** Throws from a named function, quoting its argument (which must not be stored). */
function chargeCard(card: string): never {
  throw new TypeError(`card ${card} was declined`);
}

/** A record's message as the text formatter renders it (strings bare). */
function rendered(record: LogRecord): string {
  return record.message.map((part) => typeof part === "string" ? part : String(part)).join("");
}

Deno.test("a failed run stores its stack: the throwing function's name, no argument value", async () => {
  await withApp("errors_stack", async (app, sql) => {
    const pay = app.task("pay", { maxAttempts: 1 }, (args) => {
      chargeCard(String(args.card));
    });
    const id = await pay.enqueue({ card: CARD });
    await drain(app);
    const [row] = await sql`select state, errors from akadze.jobs where id = ${id}`;
    assertEquals(row.state, "failed");
    const [entry] = row.errors as StoredError[];
    assertEquals([entry.error, entry.message], ["TypeError", "card *** was declined"]);
    assert(typeof entry.stack === "string", `a stack: ${JSON.stringify(entry)}`);
    const frames = entry.stack.split("\n");
    assertMatch(frames[0], /^at chargeCard \(.*job_errors_test\.ts:\d+:\d+\)$/);
    assert(frames.every((f) => f.startsWith("at ")), entry.stack);
    assert(!entry.stack.includes("declined"), "the first line (name and message) is dropped");
    assert(!JSON.stringify(row.errors).includes(CARD), "no argument value");
  });
});

Deno.test("a stored stack keeps at most 20 frames and 4096 characters, redacted", () => {
  const error = new Error("first line\n    at not a frame (message.ts:1:1)");
  const frames = Array.from(
    { length: 50 },
    (_, i) => `    at f${i} (file:///app/s3cret.ts:${i}:1)`,
  );
  error.stack = `Error: ${error.message}\n${frames.join("\n")}`;
  const entry = errorEntry(error, ["s3cret"]);
  const lines = entry.stack!.split("\n");
  assertEquals(lines.length, STACK_FRAMES_MAX + 1);
  assertEquals(lines[0], "at f0 (file:///app/***.ts:0:1)");
  assertEquals(lines.at(-1), "… 30 more frames");
  assert(!entry.stack!.includes("not a frame"), "a message line is not a frame");

  const long = new Error("x");
  long.stack = `Error: x\n    at ${"y".repeat(10_000)} (a.ts:1:1)`;
  assertEquals(errorEntry(long, []).stack!.length, STACK_MAX);
  const none = Object.assign(new Error("no frames"), { stack: "Error: no frames" });
  assertEquals(errorEntry(none, []), { error: "Error", message: "no frames" });
  assertEquals(errorEntry("a string", []).stack, undefined);
});

Deno.test("job_retrying and job_failed records carry the error, its message and the duration", async () => {
  await withLogs(async (records) => {
    await withApp("errors_log", async (app) => {
      const flaky = app.task(
        "flaky.thing",
        { maxAttempts: 2, backoff: () => 0 },
        (args) => chargeCard(String(args.card)),
      );
      const id = await flaky.enqueue({ card: CARD });
      await drain(app);
      const retrying = records.find((r) => r.properties.event === "job_retrying");
      const failed = records.find((r) => r.properties.event === "job_failed");
      assert(retrying && failed, `records: ${records.map((r) => r.properties.event)}`);
      for (const [record, attempt] of [[retrying, 1], [failed, 2]] as const) {
        const p = record.properties;
        assertEquals(
          [p.jobId, p.task, p.error, p.message, p.attempt, p.maxAttempts],
          [id, "flaky.thing", "TypeError", "card *** was declined", attempt, 2],
        );
        assert(typeof p.durationMs === "number" && p.durationMs >= 0, `durationMs ${p.durationMs}`);
        assert(!("stack" in p), "the stack stays in the database");
      }
      assertEquals(failed.level, "warning");
      assertMatch(
        rendered(failed),
        new RegExp(
          `^job ${id} \\(flaky\\.thing\\) failed on attempt 2/2 after \\d+ ms: ` +
            "TypeError: card \\*\\*\\* was declined$",
        ),
      );
      assertMatch(
        rendered(retrying),
        new RegExp(
          `^job ${id} \\(flaky\\.thing\\) failed on attempt 1/2 after \\d+ ms: ` +
            "TypeError: card \\*\\*\\* was declined; retrying at \\d{4}-",
        ),
      );
      for (const record of records) {
        assert(!JSON.stringify(record.properties).includes(CARD), "no argument value logged");
        assert(!rendered(record).includes(CARD), "no argument value logged");
      }
    });
  });
});

Deno.test("jobs show prints each error's stack frames; --json has them as stack", async () => {
  await withDatabase("errors_show", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const errors = [
      { error: "WorkerLost", message: "the worker stopped", at: "2030-01-01T00:00:00.000Z" },
      {
        error: "TypeError",
        message: `card ${CARD} was declined`,
        at: "2030-01-01T00:01:00.000Z",
        stack: `at chargeCard (file:///app/pay.ts:3:9)\nat handler (file:///app/${CARD}.ts:9:3)`,
      },
    ];
    const [{ id }] = await sql`
      insert into akadze.jobs (task, state, attempt, args, errors, finished_at)
      values ('pay', 'failed', 2, ${sql.json({ card: CARD })}, ${sql.json(errors)}, now())
      returning id::text as id`;
    const out = await runCli(["jobs", "show", id], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    assertEquals(out.stdout.trimEnd().split("\n").slice(-5), [
      "errors: 2",
      "error: 2030-01-01T00:00:00.000Z WorkerLost: the worker stopped",
      "error: 2030-01-01T00:01:00.000Z TypeError: card *** was declined",
      "  at chargeCard (file:///app/pay.ts:3:9)",
      "  at handler (file:///app/***.ts:9:3)",
    ]);
    const json = JSON.parse((await runCli(["jobs", "show", id, "--json"], env)).stdout);
    assertEquals(json.errors[0].stack, undefined);
    assertEquals(
      json.errors[1].stack,
      "at chargeCard (file:///app/pay.ts:3:9)\nat handler (file:///app/***.ts:9:3)",
    );
  });
});
