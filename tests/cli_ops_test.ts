// The operations CLI end to end: jobs, queues, workers, limits, metrics, prune and
// schedules, each run as `deno run cli.ts …` against a real database.
import { assert, assertEquals, assertMatch, assertRejects } from "./assert.ts";
import { assertPromtoolAccepts, HAVE_PROMTOOL } from "./_promtool.ts";
import { pruneJobs } from "../admin.ts";
import { AkadzeError } from "../src/errors.ts";
import { migrate } from "../src/migrate.ts";
import type { Sql } from "../src/db.ts";
import { runCli, setDatabaseDefault, withApp, withDatabase } from "./_helpers.ts";

type Output = { code: number; stdout: string; stderr: string };

const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const REFUSED_URL = "postgres://app:Sup3rSecretPw@127.0.0.1:1/app";
const SCHEDULES_APP = new URL("./fixtures/schedules_app.ts", import.meta.url).pathname;

/** Commands that need the database, with valid arguments. */
const DATABASE_COMMANDS: string[][] = [
  ["jobs", "list"],
  ["jobs", "list", "--json"],
  ["jobs", "show", "1"],
  ["jobs", "requeue", "1"],
  ["jobs", "cancel", "1"],
  ["queues", "list"],
  ["queues", "pause", "mail"],
  ["queues", "resume", "mail"],
  ["workers", "list"],
  ["limits", "list"],
  ["limits", "set", "smtp", "--max-running", "1"],
  ["limits", "clear", "smtp"],
  ["metrics"],
  ["prune"],
  ["prune", "--dry-run"],
];

/** Run the CLI for each argument list, a few at a time; outputs in the same order. */
async function runAll(argLists: string[][], env: Record<string, string>): Promise<Output[]> {
  const outs: Output[] = [];
  for (let i = 0; i < argLists.length; i += 4) {
    outs.push(...await Promise.all(argLists.slice(i, i + 4).map((args) => runCli(args, env))));
  }
  return outs;
}

/** The tab-separated lines of a listing. */
function table(stdout: string): string[][] {
  return stdout.trimEnd().split("\n").map((line) => line.split("\t"));
}

function assertOneLineError(out: Output, code: number, pattern?: RegExp): void {
  assertEquals(out.code, code, `exit code; stderr: ${out.stderr}`);
  assertMatch(out.stderr, /^error: [^\n]+\n$/);
  assert(!/\bat \S+:\d+/.test(out.stderr), `no stack trace: ${out.stderr}`);
  if (pattern) assertMatch(out.stderr, pattern);
}

async function insertJob(sql: Sql, fields: Record<string, unknown>): Promise<string> {
  const [{ id }] = await sql`insert into akadze.jobs ${sql(fields)} returning id::text as id`;
  return id;
}

async function finishedJob(
  sql: Sql,
  state: "succeeded" | "failed" | "cancelled",
  finishedAgo: string,
  fields: Record<string, unknown> = {},
): Promise<string> {
  const [{ id }] = await sql`
    insert into akadze.jobs (task, queue, state, attempt, finished_at, unique_key)
    values (${String(fields.task ?? "t")}, ${String(fields.queue ?? "default")}, ${state},
            ${state === "failed" ? 3 : 0}, now() - ${finishedAgo}::interval,
            ${(fields.unique_key as string | undefined) ?? null})
    returning id::text as id`;
  return id;
}

Deno.test("every operations command and subcommand has --help; the top help lists them", async () => {
  const top = await runCli(["--help"], {});
  for (const command of ["jobs", "queues", "workers", "limits", "metrics", "prune", "schedules"]) {
    assertMatch(top.stdout, new RegExp(`^  ${command}\\b`, "m"));
  }
  const helps = [
    ["jobs"],
    ["jobs", "list"],
    ["jobs", "show"],
    ["jobs", "requeue"],
    ["jobs", "cancel"],
    ["queues"],
    ["queues", "list"],
    ["queues", "pause"],
    ["queues", "resume"],
    ["workers"],
    ["workers", "list"],
    ["limits"],
    ["limits", "list"],
    ["limits", "set"],
    ["limits", "clear"],
    ["metrics"],
    ["prune"],
    ["schedules"],
    ["schedules", "list"],
  ];
  const outs = await runAll(helps.map((args) => [...args, "--help"]), {});
  outs.forEach((out, i) => {
    const usage = `Usage: akadze ${helps[i].join(" ")}`;
    assertEquals([out.code, out.stderr], [0, ""], usage);
    assert(out.stdout.startsWith(usage), `${usage}: ${out.stdout.slice(0, 80)}`);
  });
  const bare = await runCli(["jobs"], {});
  assertEquals(bare.code, 2);
  assertMatch(bare.stdout, /^Usage: akadze jobs/);
});

Deno.test("usage errors exit 2 with one line, before touching the database", async () => {
  const env = { AKADZE_DATABASE_URL: REFUSED_URL };
  const cases: [string[], RegExp][] = [
    [["jobs", "frob"], /unknown jobs command "frob"/],
    [["queues", "drop", "x"], /unknown queues command "drop"/],
    [["jobs", "show"], /missing ID/],
    [["jobs", "show", "abc"], /job id must be a positive decimal integer, got "abc"/],
    [["jobs", "show", "0"], /positive decimal integer/],
    [["jobs", "requeue", "99999999999999999999"], /positive decimal integer/],
    [["jobs", "cancel", "1", "2"], /unexpected argument "2"/],
    [["jobs", "list", "--state", "done"], /--state must be one of waiting, queued, running/],
    [["jobs", "list", "--limit", "0"], /--limit must be an integer from 1 to 1000/],
    [["jobs", "list", "--limit", "1001"], /--limit/],
    [["jobs", "list", "--limit", "ten"], /--limit/],
    [["jobs", "list", "--queue", "bad queue"], /--queue must be 1-64 characters/],
    [["jobs", "list", "--bogus"], /bogus/],
    [["jobs", "list", "--schema", "Bad-Name"], /--schema: schema must be a lower-case/],
    [["queues", "pause"], /missing NAME/],
    [["queues", "pause", "no spaces"], /queue name must be/],
    [["limits", "set", "smtp"], /at least one of --max-running, --max-starts, --window/],
    [["limits", "set", "smtp", "--max-running", "0"], /--max-running must be an integer/],
    [["limits", "set", "smtp", "--max-starts", "1.5"], /--max-starts must be an integer/],
    [["limits", "set", "smtp", "--window", "0"], /--window must be a number of seconds/],
    [["limits", "set", "smtp", "--window", "1e3"], /--window/],
    [["limits", "clear"], /missing KEY/],
    [["prune", "--older-than", "a week"], /--older-than must be a number of seconds/],
    [["prune", "extra"], /unexpected argument "extra"/],
    [["metrics", "--json"], /json/],
    [["schedules", "list"], /missing APP/],
    [["schedules", "list", "./nope/app.ts"], /app module not found/],
    [["schedules", "list", SCHEDULES_APP, "--after", "tomorrow"], /--after must be an ISO 8601/],
    [["schedules", "list", `${SCHEDULES_APP}:missing`], /has no export "missing"/],
  ];
  const outs = await runAll(cases.map(([args]) => args), env);
  outs.forEach((out, i) => {
    const [args, pattern] = cases[i];
    assertOneLineError(out, 2, pattern);
    assertEquals(out.stdout, "", args.join(" "));
  });
});

Deno.test("a missing AKADZE_DATABASE_URL exits 2 with one line on every database command", async () => {
  const outs = await runAll(DATABASE_COMMANDS, {});
  outs.forEach((out, i) => {
    assertOneLineError(out, 2, /^error: AKADZE_DATABASE_URL is not set/);
    assertEquals(out.stdout, "", DATABASE_COMMANDS[i].join(" "));
  });
});

Deno.test("a refused connection exits 1 with one line and no password on every database command", async () => {
  const env = { AKADZE_DATABASE_URL: REFUSED_URL };
  const outs = await runAll(DATABASE_COMMANDS, env);
  outs.forEach((out, i) => {
    const what = DATABASE_COMMANDS[i].join(" ");
    assertOneLineError(out, 1);
    assert(!out.stderr.includes("Sup3rSecretPw"), `${what}: ${out.stderr}`);
    assertEquals(out.stdout, "", what);
  });
});

Deno.test("jobs list: tab-separated rows in queue order or newest first, filters, limit and --json", async () => {
  await withApp("cli_ops_jobs_list", async (app, sql, db) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const send = app.task("send", { queue: "mail", priority: 5 }, () => {});
    const first = await send.using({ uniqueKey: "welcome-1" }).enqueue({ to: "secret@example" });
    const second = await insertJob(sql, { task: "build", queue: "default" });
    const failed = await finishedJob(sql, "failed", "1 minute", { task: "send", queue: "mail" });

    // By default in the order the queue runs them: priority first, then run_at, then id.
    const queued = table((await runCli(["jobs", "list", "--state", "queued"], env)).stdout);
    assertEquals(queued.slice(1).map((r) => r[0]), [first, second]);

    const out = await runCli(["jobs", "list", "--newest"], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    const rows = table(out.stdout);
    assertEquals(rows[0], [
      "ID",
      "QUEUE",
      "TASK",
      "STATE",
      "PRIORITY",
      "ATTEMPT",
      "MAX_ATTEMPTS",
      "RUN_AT",
      "STARTED_AT",
      "FINISHED_AT",
      "WORKER_ID",
    ]);
    assertEquals(rows.slice(1).map((r) => r[0]), [failed, second, first]);
    assertEquals(rows[3].slice(0, 7), [first, "mail", "send", "queued", "5", "0", "3"]);
    assertMatch(rows[3][7], ISO);
    assertEquals(rows[3].slice(8), ["-", "-", "-"]);
    assertEquals(rows[1][3], "failed");
    assertMatch(rows[1][9], ISO);
    assert(!out.stdout.includes("secret@example"), "no arguments in listings");

    const failedOnly = table((await runCli(["jobs", "list", "--state", "failed"], env)).stdout);
    assertEquals(failedOnly.slice(1).map((r) => r[0]), [failed]);
    const mail = table((await runCli(["jobs", "list", "--queue", "mail", "--newest"], env)).stdout);
    assertEquals(mail.slice(1).map((r) => r[0]), [failed, first]);
    const one = table((await runCli(["jobs", "list", "--limit", "1"], env)).stdout);
    assertEquals(one.length, 2);
    const none = await runCli(["jobs", "list", "--queue", "nothing"], env);
    assertEquals(none.stdout.split("\n").length, 2, "the header line only");

    const json = await runCli(["jobs", "list", "--json", "--state", "queued", "--newest"], env);
    assertEquals(json.code, 0);
    const jobs = JSON.parse(json.stdout);
    assertEquals(jobs.length, 2);
    assertEquals(Object.keys(jobs[0]), [
      "id",
      "task",
      "queue",
      "state",
      "priority",
      "attempt",
      "maxAttempts",
      "runCount",
      "runAt",
      "createdAt",
      "startedAt",
      "finishedAt",
      "workerId",
      "uniqueKey",
      "limitKey",
      "expiresAt",
      "cancelRequested",
      "flowId",
      "step",
    ]);
    assertEquals(
      [jobs[1].id, jobs[1].task, jobs[1].priority, jobs[1].uniqueKey, jobs[1].cancelRequested],
      [first, "send", 5, "welcome-1", false],
    );
    assertMatch(jobs[1].runAt, ISO);
    assertMatch(jobs[1].createdAt, ISO);
    assertEquals(jobs[1].finishedAt, null);

    const sendOnly = table(
      (await runCli(["jobs", "list", "--task", "send", "--newest"], env)).stdout,
    );
    assertEquals(sendOnly.slice(1).map((r) => r[0]), [failed, first]);
    const both = table(
      (await runCli(["jobs", "list", "--task", "send", "--state", "queued"], env)).stdout,
    );
    assertEquals(both.slice(1).map((r) => r[0]), [first]);
  });
});

Deno.test("jobs list --since takes a duration back from now or an ISO 8601 time", async () => {
  await withDatabase("cli_ops_jobs_since", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const old = await insertJob(sql, { task: "t", created_at: new Date("2030-01-01T08:00:00Z") });
    const older = await insertJob(sql, { task: "t", created_at: new Date("2020-01-01T00:00:00Z") });
    const recent = await insertJob(sql, { task: "t" });
    const ids = async (...args: string[]) => {
      const out = await runCli(["jobs", "list", "--newest", ...args], env);
      assertEquals([out.code, out.stderr], [0, ""], args.join(" "));
      return table(out.stdout).slice(1).map((r) => r[0]);
    };
    assertEquals(await ids(), [recent, older, old], "newest first by id, not by created_at");
    assertEquals(await ids("--since", "15m"), [recent, old], "the 2030 job is in the future");
    assertEquals(await ids("--since", "365d"), [recent, old]);
    assertEquals(await ids("--since", "2030-01-01T08:00"), [old], "no offset: UTC");
    assertEquals(await ids("--since", "2030-01-01T10:00:00+02:00"), [old]);
    assertEquals(await ids("--since", "2030-01-01T08:00:01Z"), []);
    assertEquals(await ids("--since", "2019-12-31"), [recent, older, old]);
    // 999999999d is before the first date JavaScript can hold: a usage error too.
    for (const bad of ["15", "15 m", "1w", "-3d", "2030-13-01", "yesterday", "999999999d"]) {
      assertOneLineError(
        await runCli(["jobs", "list", `--since=${bad}`], env),
        2,
        /--since must be a duration such as 30s, 15m, 2h or 3d, or an ISO 8601 time/,
      );
    }
  });
});

Deno.test("jobs requeue and cancel by filters: --dry-run counts, then the change", async () => {
  await withDatabase("cli_ops_bulk", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const x1 = await finishedJob(sql, "failed", "1 minute", { task: "x" });
    const x2 = await finishedJob(sql, "failed", "1 minute", { task: "x", unique_key: "k" });
    await insertJob(sql, { task: "x", unique_key: "k" }); // holds x2's key
    const y = await finishedJob(sql, "failed", "1 minute", { task: "y" });
    const xDone = await finishedJob(sql, "succeeded", "1 minute", { task: "x" });
    const states = async () =>
      Object.fromEntries(
        (await sql`select id::text as id, state from akadze.jobs`).map((r) => [r.id, r.state]),
      );

    const dry = await runCli(
      ["jobs", "requeue", "--state", "failed", "--task", "x", "--dry-run"],
      env,
    );
    assertEquals([dry.code, dry.stderr], [0, ""]);
    assertEquals(
      dry.stdout,
      [
        "would requeue 1 job",
        `would skip job ${x2}: another job with its uniqueKey is queued or running`,
        "",
      ].join("\n"),
    );
    assertEquals((await states())[x1], "failed", "a dry run changes nothing");

    const real = await runCli(["jobs", "requeue", "--state", "failed", "--task", "x"], env);
    assertEquals([real.code, real.stderr], [0, ""]);
    assertEquals(
      real.stdout,
      [
        "requeued 1 job",
        `skipped job ${x2}: another job with its uniqueKey is queued or running`,
        "",
      ].join("\n"),
    );
    const after = await states();
    assertEquals([after[x1], after[x2], after[y], after[xDone]], [
      "queued",
      "failed",
      "failed",
      "succeeded",
    ]);
    const again = await runCli(["jobs", "requeue", "--task", "x"], env);
    assertEquals(again.stdout.split("\n")[0], "requeued 0 jobs");

    const q1 = await insertJob(sql, { task: "t", queue: "q" });
    const q2 = await insertJob(sql, {
      task: "t",
      queue: "q",
      state: "running",
      worker_id: "w1",
      started_at: new Date(),
    });
    const other = await insertJob(sql, { task: "t", queue: "other" });
    const dryCancel = await runCli(["jobs", "cancel", "--queue", "q", "--dry-run"], env);
    assertEquals([dryCancel.code, dryCancel.stdout], [
      0,
      "would request the cancellation of 2 jobs\n",
    ]);
    const cancel = await runCli(["jobs", "cancel", "--queue", "q"], env);
    assertEquals([cancel.code, cancel.stdout, cancel.stderr], [
      0,
      "cancel requested for 2 jobs\n",
      "",
    ]);
    const marked = await sql`select id::text as id from akadze.jobs
                              where cancel_requested_at is not null order by id`;
    assertEquals(marked.map((r) => r.id), [q1, q2]);
    assert(!marked.some((r) => r.id === other));
    const twice = await runCli(["jobs", "cancel", "--queue", "q"], env);
    assertEquals(twice.stdout, "cancel requested for 0 jobs\n", "already requested");

    for (
      const [args, pattern] of [
        [["jobs", "requeue"], /missing ID or a filter/],
        [["jobs", "cancel", "--dry-run"], /missing ID or a filter/],
        [["jobs", "requeue", x1, "--task", "x"], /a job ID or filters, not both/],
        [["jobs", "requeue", "--state", "queued"], /--state must be failed, got "queued"/],
        [
          ["jobs", "cancel", "--state", "failed"],
          /--state must be one of waiting, queued, running/,
        ],
        [["jobs", "cancel", x1, "--dry-run"], /--dry-run goes with filters/],
      ] as [string[], RegExp][]
    ) {
      assertOneLineError(await runCli(args, env), 2, pattern);
    }
  });
});

Deno.test("an unknown option is a one-line akadze usage error pointing at --help", async () => {
  const cases: [string[], string][] = [
    [["jobs", "list", "--bogus"], "error: unknown option --bogus (see akadze jobs list --help)"],
    [["jobs", "show", "1", "-x"], "error: unknown option -x (see akadze jobs show --help)"],
    [["jobs", "list", "--limit"], "error: --limit needs a value (see akadze jobs list --help)"],
    [["jobs", "list", "--json=yes"], "error: --json takes no value (see akadze jobs list --help)"],
    [
      ["queues", "pause", "q", "--now"],
      "error: unknown option --now (see akadze queues pause --help)",
    ],
    [["migrate", "--bogus"], "error: unknown option --bogus (see akadze migrate --help)"],
    [["health", "--bogus"], "error: unknown option --bogus (see akadze health --help)"],
    [["worker", "app.ts", "--bogus"], "error: unknown option --bogus (see akadze worker --help)"],
    // A short flag's value starting with "-": the advice names the long form (`-o=-x` would
    // be the value "=-x").
    [
      ["compile", "app.ts", "-o", "-x"],
      'error: -o needs a value; for one that starts with "-", write --output=VALUE ' +
      "(see akadze compile --help)",
    ],
  ];
  const outs = await runAll(cases.map(([args]) => args), {});
  for (const [i, [args, line]] of cases.entries()) {
    assertEquals([outs[i].code, outs[i].stderr], [2, `${line}\n`], args.join(" "));
  }
});

Deno.test("jobs show: errors always, args and result only when asked; unknown id exits 1", async () => {
  await withDatabase("cli_ops_jobs_show", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const [{ id }] = await sql`
      insert into akadze.jobs (task, queue, state, attempt, max_attempts, args, errors, result,
                               finished_at, run_count, started_at)
      values ('send', 'mail', 'failed', 2, 2, '{"to":"secret@example"}',
              '[{"error":"Error","message":"boom\\nsecond line","at":"2030-01-01T00:00:00.000Z"},
                {"error":"TimeoutError","message":"too slow","at":"2030-01-01T00:01:00.000Z"}]',
              '{"partial":true}', now(), 2, now())
      returning id::text as id`;

    const out = await runCli(["jobs", "show", id], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    const lines = out.stdout.trimEnd().split("\n");
    assertEquals(lines.slice(0, 8), [
      `id: ${id}`,
      "task: send",
      "queue: mail",
      "state: failed",
      "priority: 0",
      "attempt: 2",
      "maxAttempts: 2",
      "runCount: 2",
    ]);
    assert(lines.includes("workerId: -"), out.stdout);
    assert(lines.includes("snoozes: 0"), out.stdout);
    assertEquals(lines.slice(-3), [
      "errors: 2",
      "error: 2030-01-01T00:00:00.000Z Error: boom second line",
      "error: 2030-01-01T00:01:00.000Z TimeoutError: too slow",
    ]);
    assert(!out.stdout.includes("secret@example") && !out.stdout.includes("partial"));

    const full = await runCli(["jobs", "show", id, "--args", "--result"], env);
    assertEquals(full.stdout.trimEnd().split("\n").slice(-2), [
      'args: {"to":"secret@example"}',
      'result: {"partial":true}',
    ]);

    const json = JSON.parse((await runCli(["jobs", "show", id, "--json"], env)).stdout);
    assert(!("args" in json) && !("result" in json), "no args/result unless asked");
    assertEquals(json.errors, [
      { error: "Error", message: "boom\nsecond line", at: "2030-01-01T00:00:00.000Z" },
      { error: "TimeoutError", message: "too slow", at: "2030-01-01T00:01:00.000Z" },
    ]);
    assertEquals([json.id, json.state, json.snoozes], [id, "failed", 0]);
    assertMatch(json.finishedAt, ISO);
    const withArgs = JSON.parse(
      (await runCli(["jobs", "show", "--json", "--args", "--result", id], env)).stdout,
    );
    assertEquals([withArgs.args, withArgs.result], [{ to: "secret@example" }, { partial: true }]);
    assertEquals(Object.keys(withArgs).slice(-5), [
      "snoozes",
      "progress",
      "errors",
      "args",
      "result",
    ]);

    const missing = await runCli(["jobs", "show", "999999"], env);
    assertOneLineError(missing, 1, /^error: job 999999 not found\n$/);
    assertEquals(missing.stdout, "");
  });
});

Deno.test("jobs requeue: a failed job goes back to queued; other states and DuplicateJob exit 1", async () => {
  await withDatabase("cli_ops_requeue", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const failed = await finishedJob(sql, "failed", "1 minute");
    const out = await runCli(["jobs", "requeue", failed], env);
    assertEquals([out.code, out.stdout, out.stderr], [0, `requeued job ${failed}\n`, ""]);
    const [row] = await sql`select state, attempt, max_attempts, finished_at
                              from akadze.jobs where id = ${failed}`;
    assertEquals([row.state, row.attempt, row.max_attempts, row.finished_at], [
      "queued",
      3,
      4,
      null,
    ]);

    assertOneLineError(
      await runCli(["jobs", "requeue", failed], env),
      1,
      /job \d+ is not failed \(it is queued\)/,
    );
    assertOneLineError(await runCli(["jobs", "requeue", "999999"], env), 1, /does not exist/);

    const dup = await finishedJob(sql, "failed", "1 minute", { unique_key: "nightly" });
    await insertJob(sql, { task: "t", unique_key: "nightly" });
    assertOneLineError(await runCli(["jobs", "requeue", dup], env), 1, /uniqueKey/);
    const [still] = await sql`select state from akadze.jobs where id = ${dup}`;
    assertEquals(still.state, "failed");
  });
});

Deno.test("jobs cancel: marks queued and running jobs; finished or unknown ones are a no-op (exit 0)", async () => {
  await withDatabase("cli_ops_cancel", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const queued = await insertJob(sql, { task: "t" });
    const running = await insertJob(sql, {
      task: "t",
      state: "running",
      worker_id: "w1",
      started_at: new Date(),
    });
    const done = await finishedJob(sql, "succeeded", "1 minute");
    for (const id of [queued, running]) {
      const out = await runCli(["jobs", "cancel", id], env);
      assertEquals([out.code, out.stdout, out.stderr], [0, `cancel requested for job ${id}\n`, ""]);
    }
    const marked = await sql`select id::text as id from akadze.jobs
                              where cancel_requested_at is not null order by id`;
    assertEquals(marked.map((r) => r.id), [queued, running]);

    const finished = await runCli(["jobs", "cancel", done], env);
    assertEquals(
      [finished.code, finished.stdout],
      [0, `nothing cancelled: job ${done} is succeeded\n`],
    );
    const unknown = await runCli(["jobs", "cancel", "999999"], env);
    assertEquals([unknown.code, unknown.stdout], [0, "nothing cancelled: job 999999 not found\n"]);
    const [row] = await sql`select state, cancel_requested_at from akadze.jobs where id = ${done}`;
    assertEquals([row.state, row.cancel_requested_at], ["succeeded", null]);
  });
});

Deno.test("queues list|pause|resume: counts and lag, pauses written to queue_pauses", async () => {
  await withDatabase("cli_ops_queues", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    await insertJob(sql, { task: "t", queue: "mail", run_at: new Date(Date.now() - 10_000) });
    await insertJob(sql, { task: "t", queue: "mail", run_at: new Date(Date.now() + 3_600_000) });
    await finishedJob(sql, "failed", "1 minute", { queue: "mail" });
    await insertJob(sql, { task: "t", queue: "default" });
    // A step waiting for its dependencies: counted as waiting, not ready, no lag.
    await insertJob(sql, {
      task: "t",
      queue: "default",
      state: "waiting",
      pending_deps: 1,
      run_at: new Date(Date.now() - 3_600_000),
    });

    const pause = await runCli(["queues", "pause", "mail"], env);
    assertEquals([pause.code, pause.stdout, pause.stderr], [0, "paused queue mail\n", ""]);
    const again = await runCli(["queues", "pause", "mail"], env);
    assertEquals([again.code, again.stdout], [0, "queue mail was already paused\n"]);
    // A queue no job is in and no worker serves is most likely a typo: refused, unless forced.
    const typo = await runCli(["queues", "pause", "idle"], env);
    assertEquals([typo.code, typo.stdout], [1, ""]);
    assertMatch(typo.stderr, /no job is in queue idle and no worker serves it.*--force/);
    assertEquals((await sql`select 1 from akadze.queue_pauses where queue = 'idle'`).length, 0);
    assertEquals((await runCli(["queues", "pause", "idle", "--force"], env)).code, 0);
    const pauses = await sql`select queue from akadze.queue_pauses order by queue`;
    assertEquals(pauses.map((r) => r.queue), ["idle", "mail"]);

    const out = await runCli(["queues", "list"], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    const rows = table(out.stdout);
    assertEquals(rows[0], [
      "QUEUE",
      "PAUSED",
      "WAITING",
      "QUEUED",
      "READY",
      "RUNNING",
      "SUCCEEDED",
      "FAILED",
      "CANCELLED",
      "LAG_SECONDS",
    ]);
    assertEquals(rows.slice(1).map((r) => r.slice(0, 9)), [
      ["default", "false", "1", "1", "1", "0", "0", "0", "0"],
      ["idle", "true", "0", "0", "0", "0", "0", "0", "0"],
      ["mail", "true", "0", "2", "1", "0", "0", "1", "0"],
    ]);
    assert(Number(rows[3][9]) >= 9.5 && Number(rows[3][9]) < 120, rows[3][9]);
    assertEquals(rows[2][9], "0");
    assert(Number(rows[1][9]) < 60, `the waiting job adds no lag: ${rows[1][9]}`);

    const json = JSON.parse((await runCli(["queues", "list", "--json"], env)).stdout);
    assertEquals(Object.keys(json[2]), [
      "queue",
      "paused",
      "waiting",
      "queued",
      "ready",
      "running",
      "succeeded",
      "failed",
      "cancelled",
      "lagSeconds",
    ]);
    assertEquals([json[2].queue, json[2].paused, json[2].queued, json[2].ready], [
      "mail",
      true,
      2,
      1,
    ]);
    assertEquals(typeof json[2].lagSeconds, "number");

    const resume = await runCli(["queues", "resume", "mail"], env);
    assertEquals([resume.code, resume.stdout], [0, "resumed queue mail\n"]);
    const resumeAgain = await runCli(["queues", "resume", "mail"], env);
    assertEquals([resumeAgain.code, resumeAgain.stdout], [0, "queue mail was not paused\n"]);
    const left = await sql`select queue from akadze.queue_pauses`;
    assertEquals(left.map((r) => r.queue), ["idle"]);
  });
});

Deno.test("workers list: most recent heartbeat first, alive flag and the running jobs' ids", async () => {
  await withDatabase("cli_ops_workers", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const empty = await runCli(["workers", "list"], env);
    assertEquals(empty.stdout.split("\n").length, 2, "the header line only");
    await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at, heartbeat_ttl_ms)
              values ('w-live', 'host-a', 11, '{default,mail}', now(), 30000),
                     ('w-lost', 'host-b', 12, '{default}', now() - interval '1 hour', 5000)`;
    const running = await insertJob(sql, {
      task: "t",
      state: "running",
      worker_id: "w-live",
      started_at: new Date(),
    });
    const second = await insertJob(sql, {
      task: "t",
      state: "running",
      worker_id: "w-live",
      started_at: new Date(),
    });
    // A job the worker finished keeps its worker_id but is not running there.
    await insertJob(sql, {
      task: "t",
      state: "succeeded",
      worker_id: "w-live",
      finished_at: new Date(),
    });
    const out = await runCli(["workers", "list"], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    const rows = table(out.stdout);
    assertEquals(rows[0], [
      "ID",
      "HOSTNAME",
      "PID",
      "QUEUES",
      "STARTED_AT",
      "HEARTBEAT_AT",
      "HEARTBEAT_TTL_SECONDS",
      "ALIVE",
      "RUNNING",
      "JOBS",
    ]);
    assertEquals(rows[1].slice(0, 4), ["w-live", "host-a", "11", "default,mail"]);
    assertEquals(rows[1].slice(6), ["30", "true", "2", `${running},${second}`]);
    assertEquals(rows[2].slice(6), ["5", "false", "0", "-"]);
    assertMatch(rows[1][5], ISO);

    const json = JSON.parse((await runCli(["workers", "list", "--json"], env)).stdout);
    assertEquals(Object.keys(json[0]), [
      "id",
      "hostname",
      "pid",
      "queues",
      "startedAt",
      "heartbeatAt",
      "heartbeatTtlSeconds",
      "alive",
      "running",
      "runningJobs",
    ]);
    assertEquals(json[0].runningJobs, [running, second]);
    assertEquals(
      [json[0].id, json[0].queues, json[0].heartbeatTtlSeconds, json[0].alive, json[0].running],
      ["w-live", ["default", "mail"], 30, true, 2],
    );
    assertMatch(json[1].heartbeatAt, ISO);
  });
});

Deno.test("limits set|list|clear: seconds windows, none removes, rows written to limits", async () => {
  await withDatabase("cli_ops_limits", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const header = "KEY\tMAX_RUNNING\tMAX_STARTS\tWINDOW_SECONDS\tRUNNING\tSTARTS";
    const set = await runCli(
      ["limits", "set", "smtp", "--max-running", "5", "--max-starts", "100", "--window", "1.5"],
      env,
    );
    assertEquals([set.code, set.stdout, set.stderr], [
      0,
      `${header}\nsmtp\t5\t100\t1.5\t0\t0\n`,
      "",
    ]);
    const limitRow = async (key: string) =>
      (await sql`select max_running, max_starts,
                        extract(epoch from "window")::float8 as window_s
                   from akadze.limits where key = ${key}`)[0];
    assertEquals({ ...await limitRow("smtp") }, { max_running: 5, max_starts: 100, window_s: 1.5 });

    const keep = await runCli(["limits", "set", "smtp", "--max-running", "none"], env);
    assertEquals(keep.stdout, `${header}\nsmtp\t-\t100\t1.5\t0\t0\n`);
    assertEquals({ ...await limitRow("smtp") }, {
      max_running: null,
      max_starts: 100,
      window_s: 1.5,
    });

    const rateOnly = await runCli(["limits", "set", "api", "--max-starts", "3"], env);
    assertOneLineError(rateOnly, 2, /maxStarts and window must be set together/);
    assertEquals(await limitRow("api"), undefined);

    const api = await runCli(["limits", "set", "api", "--max-running", "2", "--json"], env);
    assertEquals(JSON.parse(api.stdout), {
      key: "api",
      maxRunning: 2,
      maxStarts: null,
      windowSeconds: null,
      running: 0,
      starts: 0,
    });
    await insertJob(sql, {
      task: "t",
      state: "running",
      worker_id: "w1",
      started_at: new Date(),
      limit_key: "api",
    });
    const list = await runCli(["limits", "list"], env);
    assertEquals(list.stdout, `${header}\napi\t2\t-\t-\t1\t0\nsmtp\t-\t100\t1.5\t0\t0\n`);
    const json = JSON.parse((await runCli(["limits", "list", "--json"], env)).stdout);
    assertEquals(json.map((l: { key: string }) => l.key), ["api", "smtp"]);
    assertEquals(Object.keys(json[1]), [
      "key",
      "maxRunning",
      "maxStarts",
      "windowSeconds",
      "running",
      "starts",
    ]);
    assertEquals([json[0].running, json[1].windowSeconds], [1, 1.5]);

    const clearRate = await runCli(
      ["limits", "set", "smtp", "--max-starts", "none", "--window", "none", "--max-running", "1"],
      env,
    );
    assertEquals(clearRate.code, 0);
    assertEquals({ ...await limitRow("smtp") }, {
      max_running: 1,
      max_starts: null,
      window_s: null,
    });

    const clear = await runCli(["limits", "clear", "smtp"], env);
    assertEquals([clear.code, clear.stdout], [0, "cleared limit smtp\n"]);
    assertEquals(await limitRow("smtp"), undefined);
    const again = await runCli(["limits", "clear", "smtp"], env);
    assertEquals([again.code, again.stdout], [0, "no limit smtp (nothing cleared)\n"]);
  });
});

Deno.test("metrics prints the Prometheus text of renderMetrics", async () => {
  await withDatabase("cli_ops_metrics", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    await sql`insert into akadze.jobs (task, queue, args) values ('t', 'mail', '{"k":"do-not-leak"}')`;
    await sql`insert into akadze.queue_pauses (queue) values ('mail')`;
    const out = await runCli(["metrics"], env);
    assertEquals([out.code, out.stderr], [0, ""]);
    assertMatch(out.stdout, /^# TYPE akadze_jobs gauge$/m);
    assertMatch(out.stdout, /^akadze_jobs\{queue="mail",state="queued"\} 1$/m);
    assertMatch(out.stdout, /^akadze_queue_paused\{queue="mail"\} 1$/m);
    assertMatch(out.stdout, /^akadze_workers 0$/m);
    assert(out.stdout.endsWith("\n") && !out.stdout.endsWith("\n\n"), "one final newline");
    assert(!out.stdout.includes("do-not-leak"));
  });
});

Deno.test({
  name: "akadze metrics passes promtool check metrics",
  ignore: !HAVE_PROMTOOL, // needs promtool (Debian: apt-get install prometheus)
  fn: async () => {
    await withDatabase("cli_ops_promtool", async (db, sql) => {
      await sql`insert into akadze.jobs (task, queue, run_at)
                values ('t', 'mail', now() - interval '3 seconds'), ('t', 'default', now())`;
      await sql`insert into akadze.jobs (task, queue, state, worker_id, started_at, limit_key)
                values ('t', 'mail', 'running', 'w1', now(), 'api')`;
      await sql`insert into akadze.workers (id, hostname, pid, queues) values ('w1', 'h', 1, '{mail}')`;
      await sql`insert into akadze.queue_pauses (queue) values ('idle'), ('we"ird\\q')`;
      await sql`insert into akadze.limits (key, max_running, max_starts, "window")
                values ('api', 2, 10, interval '1 minute')`;
      const out = await runCli(["metrics"], { AKADZE_DATABASE_URL: db.url });
      assertEquals(out.code, 0, out.stderr);
      await assertPromtoolAccepts(out.stdout);
    });
  },
});

Deno.test("prune deletes old succeeded and cancelled jobs; failed only with --include-failed", async () => {
  await withDatabase("cli_ops_prune", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    await finishedJob(sql, "succeeded", "8 days");
    await finishedJob(sql, "cancelled", "8 days");
    const oldFailed = await finishedJob(sql, "failed", "8 days");
    const recent = await finishedJob(sql, "succeeded", "1 hour");
    const queued = await insertJob(sql, {
      task: "t",
      run_at: new Date(Date.now() - 30 * 86_400_000),
    });
    const ids = async () =>
      (await sql`select id::text as id from akadze.jobs order by id`).map((r) => r.id);
    const week = "finished more than 604800 s ago";

    const dry = await runCli(["prune", "--dry-run"], env);
    assertEquals([dry.code, dry.stdout, dry.stderr], [
      0,
      `would delete 2 jobs (succeeded, cancelled; ${week})\n`,
      "",
    ]);
    const dryFailed = await runCli(["prune", "--dry-run", "--include-failed"], env);
    assertEquals(dryFailed.stdout, `would delete 3 jobs (succeeded, failed, cancelled; ${week})\n`);
    assertEquals((await ids()).length, 5, "a dry run deletes nothing");

    const prune = await runCli(["prune"], env);
    assertEquals([prune.code, prune.stdout], [
      0,
      `deleted 2 jobs (succeeded, cancelled; ${week})\n`,
    ]);
    assertEquals(await ids(), [oldFailed, recent, queued]);

    const failed = await runCli(["prune", "--include-failed"], env);
    assertEquals(failed.stdout, `deleted 1 job (succeeded, failed, cancelled; ${week})\n`);
    assertEquals(await ids(), [recent, queued]);

    const minute = await runCli(["prune", "--older-than", "60"], env);
    assertEquals(
      minute.stdout,
      "deleted 1 job (succeeded, cancelled; finished more than 60 s ago)\n",
    );
    assertEquals(await ids(), [queued], "queued jobs are never pruned");

    const zero = await runCli(["prune", "--older-than", "0.5", "--dry-run"], env);
    assertEquals(
      zero.stdout,
      "would delete 0 jobs (succeeded, cancelled; finished more than 0.5 s ago)\n",
    );
  });
});

Deno.test("pruneJobs deletes in bounded batches, in the caller's transaction, and validates", async () => {
  await withDatabase("cli_ops_prune_api", async (_db, sql) => {
    await sql`insert into akadze.jobs (task, state, finished_at)
              select 't', 'succeeded', now() - interval '2 days' from generate_series(1, 7)`;
    await sql`insert into akadze.jobs (task, state, attempt, finished_at)
              values ('t', 'failed', 3, now() - interval '2 days')`;
    const day = 86_400_000;
    assertEquals(await pruneJobs(sql, { olderThan: day, dryRun: true }), 7);
    assertEquals(await pruneJobs(sql, { olderThan: day, dryRun: true, includeFailed: true }), 8);
    await assertRejects(
      () =>
        sql.begin(async (tx) => {
          assertEquals(await pruneJobs(tx, { olderThan: day, batchSize: 2 }), 7);
          throw new Error("roll back");
        }),
      (e: Error) => e.message === "roll back",
    );
    assertEquals(await pruneJobs(sql, { olderThan: day, dryRun: true }), 7, "rolled back");
    assertEquals(await pruneJobs(sql, { olderThan: 3 * day }), 0);
    assertEquals(await pruneJobs(sql, { olderThan: day, batchSize: 3 }), 7);
    assertEquals(await pruneJobs(sql, { olderThan: day, includeFailed: true }), 1);
    assertMatch(
      (await assertRejects(() => pruneJobs(sql, { olderThan: -1 }), AkadzeError)).message,
      /olderThan/,
    );
    assertMatch(
      (await assertRejects(() => pruneJobs(sql, { batchSize: 0 }), AkadzeError)).message,
      /batchSize/,
    );
    assertMatch(
      (await assertRejects(() => pruneJobs(sql, { schema: "Nope" }), AkadzeError)).message,
      /schema/,
    );
  });
});

Deno.test("--schema selects the tables; a schema that is not migrated says to migrate (exit 1)", async () => {
  await withDatabase("cli_ops_schema", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    await migrate(sql, { schema: "ops_alt" });
    await sql`insert into ops_alt.jobs (task, queue) values ('other', 'alt')`;
    const alt = JSON.parse(
      (await runCli(["jobs", "list", "--json", "--schema", "ops_alt"], env)).stdout,
    );
    assertEquals(alt.map((j: { task: string }) => j.task), ["other"]);
    assertEquals(JSON.parse((await runCli(["jobs", "list", "--json"], env)).stdout), []);
    const paused = await runCli(["queues", "pause", "alt", "--schema", "ops_alt"], env);
    assertEquals(paused.code, 0);
    assertEquals((await sql`select queue from ops_alt.queue_pauses`).map((r) => r.queue), ["alt"]);
    assertEquals((await sql`select count(*)::int as n from akadze.queue_pauses`)[0].n, 0);
    const metrics = await runCli(["metrics", "--schema", "ops_alt"], env);
    assertMatch(metrics.stdout, /^akadze_jobs\{queue="alt",state="queued"\} 1$/m);

    const missing = await runCli(["jobs", "list", "--schema", "not_there"], env);
    assertOneLineError(missing, 1, /run akadze migrate/);
  });
});

Deno.test("schedules list prints each schedule's next fire from the app module, no database needed", async () => {
  // The app's URL points nowhere: the command must not connect.
  const env = { AKADZE_DATABASE_URL: REFUSED_URL };
  const after = ["--after", "2030-03-30T12:00:00Z"];
  const out = await runCli(["schedules", "list", SCHEDULES_APP, ...after], env);
  assertEquals([out.code, out.stderr], [0, ""]);
  assertEquals(
    out.stdout,
    [
      "NAME\tTASK\tSCHEDULE\tOVERLAP\tNEXT_FIRE",
      "ops.prune\tops.prune\tevery 30000 ms\tfalse\t2030-03-30T12:00:30.000Z",
      'ops.prune.hourly\tops.prune\tcron "@hourly" (UTC)\ttrue\t2030-03-30T13:00:00.000Z',
      // 03:00 in Berlin on the morning clocks go forward (CEST, UTC+2).
      'reports.nightly\treports.nightly\tcron "0 3 * * *" (Europe/Berlin)\ttrue\t2030-03-31T01:00:00.000Z',
      "",
    ].join("\n"),
  );

  const json = JSON.parse(
    (await runCli(["schedules", "list", `${SCHEDULES_APP}:app`, "--json", ...after], env)).stdout,
  );
  assertEquals(json, [
    {
      name: "ops.prune",
      task: "ops.prune",
      schedule: "every 30000 ms",
      cron: null,
      everySeconds: 30,
      timezone: null,
      overlap: false,
      nextFire: "2030-03-30T12:00:30.000Z",
    },
    {
      name: "ops.prune.hourly",
      task: "ops.prune",
      schedule: 'cron "@hourly" (UTC)',
      cron: "@hourly",
      everySeconds: null,
      timezone: "UTC",
      overlap: true,
      nextFire: "2030-03-30T13:00:00.000Z",
    },
    {
      name: "reports.nightly",
      task: "reports.nightly",
      schedule: 'cron "0 3 * * *" (Europe/Berlin)',
      cron: "0 3 * * *",
      everySeconds: null,
      timezone: "Europe/Berlin",
      overlap: true,
      nextFire: "2030-03-31T01:00:00.000Z",
    },
  ]);

  const before = Date.now();
  const now = JSON.parse(
    (await runCli(["schedules", "list", SCHEDULES_APP, "--json"], env)).stdout,
  );
  const next = Date.parse(now[0].nextFire);
  assert(next > before && next <= Date.now() + 30_000 && next % 30_000 === 0, now[0].nextFire);

  const bare = await runCli(["schedules", "list", `${SCHEDULES_APP}:bare`], env);
  assertEquals([bare.code, bare.stdout], [0, "NAME\tTASK\tSCHEDULE\tOVERLAP\tNEXT_FIRE\n"]);
  const bareJson = await runCli(["schedules", "list", `${SCHEDULES_APP}:bare`, "--json"], env);
  assertEquals(JSON.parse(bareJson.stdout), []);

  // The module reads AKADZE_DATABASE_URL: without it, it cannot load (a usage error).
  const unset = await runCli(["schedules", "list", SCHEDULES_APP], {});
  assertOneLineError(unset, 2, /AKADZE_DATABASE_URL is not set/);
});

/** The control characters in a text other than the tab and newline of the output's layout. */
function controlChars(text: string): string[] {
  return [...text].filter((c) => {
    const code = c.charCodeAt(0);
    return (code < 0x20 && c !== "\t" && c !== "\n") || (code >= 0x7f && code <= 0x9f);
  });
}

Deno.test("text output shows terminal escapes held in the database as \\x escapes; --json keeps them", async () => {
  await withDatabase("cli_ops_escapes", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const evil = "a\x1b[31mred\x07bell\rback\x7f\u009b2J";
    const id = await insertJob(sql, {
      task: `task-${evil}`,
      state: "failed",
      attempt: 1,
      finished_at: new Date(),
      unique_key: `u-${evil}`,
      limit_key: `l-${evil}`,
      worker_id: `w-${evil}`,
      errors: sql.json([{ error: `E${evil}`, message: `m-${evil}`, at: "2030-01-01T00:00:00Z" }]),
    });
    await sql`insert into akadze.limits (key, max_running) values (${`k-${evil}`}, 1)`;
    await sql`insert into akadze.workers (id, hostname, pid, queues)
              values (${`w-${evil}`}, ${`h-${evil}`}, 1, '{default}')`;
    // In a listing or a one-line message a line break is a space, as before.
    const shown = "a\\x1b[31mred\\x07bell back\\x7f\\x9b2J";
    const outs = await runAll([
      ["limits", "list"],
      ["jobs", "list"],
      ["jobs", "show", id],
      ["workers", "list"],
      ["limits", "clear", `k-${evil}`],
      ["queues", "pause", `q-${evil}`],
    ], env);
    for (const [i, out] of outs.entries()) {
      assertEquals(controlChars(out.stdout + out.stderr), [], `command ${i}: ${out.stdout}`);
    }
    const [limits, jobs, show, workers, cleared, badQueue] = outs;
    assert(limits.stdout.includes(`k-${shown}\t1\t`), limits.stdout);
    assert(jobs.stdout.includes(`task-${shown}`), jobs.stdout);
    for (const part of [`task: task-${shown}`, `uniqueKey: u-${shown}`, `limitKey: l-${shown}`]) {
      assert(show.stdout.includes(part), show.stdout);
    }
    assert(show.stdout.includes(`E${shown}: m-${shown}`), show.stdout);
    assert(workers.stdout.includes(`h-${shown}`), workers.stdout);
    assertEquals(cleared.stdout, `cleared limit k-${shown.replace(" ", "\\x0d")}\n`);
    assertOneLineError(badQueue, 2, /q-a\\x1b\[31m/);

    // JSON escapes them too (DEL and C1 as \u00NN), and keeps the exact text.
    const jsonOut = await runCli(["jobs", "show", id, "--json"], env);
    assertEquals(controlChars(jsonOut.stdout), []);
    const json = JSON.parse(jsonOut.stdout);
    assertEquals([json.task, json.uniqueKey, json.errors[0].message], [
      `task-${evil}`,
      `u-${evil}`,
      `m-${evil}`,
    ]);
  });
});

Deno.test("jobs list and jobs show read times right on a database whose DateStyle is not ISO", async () => {
  await withApp("cli_ops_datestyle", async (_app, sql, db) => {
    await setDatabaseDefault(sql, "DateStyle", "SQL, DMY");
    const env = { AKADZE_DATABASE_URL: db.url };
    const id = await insertJob(sql, { task: "send", run_at: new Date("2026-12-07T10:11:12Z") });
    const listed = JSON.parse((await runCli(["jobs", "list", "--json"], env)).stdout);
    // Read in that style, the 7th of December was the 12th of July.
    assertEquals(listed.map((j: { runAt: string }) => j.runAt), ["2026-12-07T10:11:12.000Z"]);
    const shown = JSON.parse((await runCli(["jobs", "show", id, "--json"], env)).stdout);
    assertEquals(shown.runAt, "2026-12-07T10:11:12.000Z");
  });
});
