// Hostile tasks at the process level: a task's stray promise rejection or uncaught timer
// error must not end the worker process nor print the task's arguments or the database
// password, and jobs holding every pool connection must not cost the worker its lease.
import { Akadze } from "../src/app.ts";
import type { Sql } from "../src/db.ts";
import { describeStray } from "../src/worker/process_guard.ts";
import { assert, assertEquals } from "./assert.ts";
import { startWorker, waitFor, withDatabase, withLogs } from "./_helpers.ts";
import { MOD, SLOW, spawnCli } from "./_processes.ts";

/** Short timings, so a lost lease shows within seconds; conditions are awaited generously. */
const FAST = {
  heartbeatInterval: 200,
  heartbeatTtl: 1_500,
  pollInterval: 100,
  shutdownTimeout: 2_000,
  schedules: false,
} as const;

const CARD = "4111111111111111";

type Row = { id: string; state: string; attempt: number; run_count: number; result: unknown };

async function insertJob(sql: Sql, task: string, args: Record<string, unknown>): Promise<string> {
  const [{ id }] = await sql`
    insert into akadze.jobs (task, args) values (${task}, ${sql.json(args as never)})
    returning id::text as id`;
  return id;
}

async function jobs(sql: Sql, ids: string[]): Promise<Row[]> {
  return await sql`
    select id::text as id, state, attempt, run_count, result from akadze.jobs
     where id = any(${ids}::bigint[]) order by id` as unknown as Row[];
}

/** `url` with a password (trust authentication ignores it), so that a leak would show. */
function withPassword(url: string): { url: string; password: string } {
  const parsed = new URL(url);
  const password = parsed.password || `SurvivePw${crypto.randomUUID().slice(0, 8)}`;
  parsed.password = password;
  return { url: parsed.toString(), password };
}

Deno.test("a stray error is described by its class and code only, never by text that could be a value", () => {
  const named = Object.assign(new Error(CARD), { name: CARD, code: CARD });
  assertEquals(describeStray("unhandled_rejection", named), {
    kind: "unhandled_rejection",
    error: "Error",
  });
  const reset = Object.assign(new TypeError(`read ${CARD}`), { code: "ECONNRESET" });
  assertEquals(describeStray("uncaught_error", reset), {
    kind: "uncaught_error",
    error: "TypeError",
    code: "ECONNRESET",
  });
  // A server error's message can quote the value; its SQLSTATE cannot.
  const server = Object.assign(new Error(`invalid input syntax for type integer: "${CARD}"`), {
    name: "PostgresError",
    code: "22P02",
  });
  assertEquals(describeStray("unhandled_rejection", server).code, "22P02");
  assertEquals(describeStray("unhandled_rejection", CARD).error, "string");
  assertEquals(describeStray("unhandled_rejection", null).error, "null");
});

Deno.test("a task's unhandled rejection and its timer's uncaught error do not end the run: logged by class only, the job keeps its handler's outcome, other jobs run", async () => {
  await withLogs(async (records) => {
    await withDatabase("survive_in_process", async (db, sql) => {
      const app = new Akadze({ databaseUrl: db.url });
      app.task("reject", (args) => {
        Promise.reject(new Error(String(args.card)));
        return 1;
      });
      app.task("timer", (args) => {
        setTimeout(() => {
          throw new TypeError(String(args.card));
        }, 1);
        return 2;
      });
      app.task("ok", () => 3);
      const w = startWorker(app, FAST);
      try {
        const first = [
          await insertJob(sql, "reject", { card: CARD }),
          await insertJob(sql, "timer", { card: CARD }),
        ];
        await waitFor(
          () => records.some((r) => r.properties.event === "uncaught_error"),
          "the timer's error to be logged",
        );
        const later = await insertJob(sql, "ok", {});
        const rows = await waitFor(async () => {
          const rows = await jobs(sql, [...first, later]);
          return rows.every((r) => r.state === "succeeded") ? rows : null;
        }, "every job to succeed");
        assertEquals(rows!.map((r) => [r.result, r.attempt, r.run_count]), [
          [1, 0, 1],
          [2, 0, 1],
          [3, 0, 1],
        ]);
        const rejection = records.find((r) => r.properties.event === "unhandled_rejection");
        assert(rejection, "the rejection is logged");
        assertEquals(rejection.properties.error, "Error");
        assertEquals(rejection.properties.jobId, first[0]);
        assertEquals(rejection.properties.task, "reject");
        const uncaught = records.find((r) => r.properties.event === "uncaught_error");
        assertEquals(uncaught?.properties.error, "TypeError");
        const text = JSON.stringify(records.map((r) => [r.message, r.properties]));
        assert(!text.includes(CARD), `the argument is logged: ${text}`);
      } finally {
        const exit = await w.stop();
        assertEquals([exit.code, exit.reason], [0, "stopped"]);
        await app.close();
      }
    });
  });
});

const HOSTILE_APP = `
import { Akadze } from ${JSON.stringify(MOD)};

export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

app.task("reject", (a) => {
  Promise.reject(new Error(String(a.card) + " " + Deno.env.get("AKADZE_DATABASE_URL")));
  return 1;
});
app.task("timer", (a) => {
  setTimeout(() => {
    throw new Error(String(a.card) + " " + Deno.env.get("AKADZE_DATABASE_URL"));
  }, 1);
  return 2;
});
app.task("ok", () => 3);
`;

Deno.test("akadze worker survives a task's stray rejection and timer error: it runs on, prints neither the argument nor the password", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze-survive-" });
  try {
    await Deno.writeTextFile(`${dir}/app.ts`, HOSTILE_APP);
    await withDatabase("survive_cli", async (db, sql) => {
      const { url, password } = withPassword(db.url);
      const first = [
        await insertJob(sql, "reject", { card: CARD }),
        await insertJob(sql, "timer", { card: CARD }),
      ];
      const cli = spawnCli(
        ["worker", `${dir}/app.ts`, "--poll-interval", "0.1", "--log-format", "json"],
        { AKADZE_DATABASE_URL: url },
      );
      let exited = false;
      cli.child.status.finally(() => exited = true);
      try {
        await waitFor(
          () => {
            if (exited) throw new Error(`the worker exited:\n${cli.stderr()}`);
            return ["unhandled_rejection", "uncaught_error"].every((e) => cli.events(e).length > 0);
          },
          "both strays to be logged",
          SLOW,
        );
        // Still running: it takes a job enqueued after the strays and runs it.
        const later = await insertJob(sql, "ok", {});
        const rows = await waitFor(
          async () => {
            const rows = await jobs(sql, [...first, later]);
            if (rows.every((r) => r.state === "succeeded")) return rows;
            if (exited) throw new Error(`the worker exited:\n${cli.stderr()}`);
            return null;
          },
          "every job to succeed",
          SLOW,
        );
        assertEquals(rows!.map((r) => [r.result, r.attempt]), [[1, 0], [2, 0], [3, 0]]);
        cli.child.kill("SIGTERM");
        const out = await cli.done();
        assertEquals(out.code, 0, out.stderr);
        assert(!out.stderr.includes(CARD), `the argument is printed:\n${out.stderr}`);
        assert(!out.stderr.includes(password), `the password is printed:\n${out.stderr}`);
        // Only log records: no crash report, no stack.
        const other = out.stderr.split("\n").filter((line) => line && !line.startsWith("{"));
        assertEquals(other, []);
      } finally {
        await cli.cleanup();
      }
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("jobs holding every pool connection longer than the heartbeat TTL: the worker keeps its lease and every job succeeds on its first run", async () => {
  await withDatabase("survive_pool_held", async (db, sql) => {
    const slots = 3;
    const app = new Akadze({ databaseUrl: db.url, max: slots });
    app.task("hold", async () => {
      await app.sql`select pg_sleep(4)`;
      return "held";
    });
    const w = startWorker(app, { ...FAST, slots });
    let exited = false;
    w.exit.finally(() => exited = true);
    try {
      const ids: string[] = [];
      for (let i = 0; i < slots; i++) ids.push(await insertJob(sql, "hold", {}));
      const rows = await waitFor(
        async () => {
          if (exited) throw new Error(`the worker stopped: ${JSON.stringify(await w.exit)}`);
          const rows = await jobs(sql, ids);
          return rows.every((r) => r.state === "succeeded" || r.run_count > 1) ? rows : null;
        },
        "every job to end",
        30_000,
      );
      assertEquals(rows!.map((r) => [r.state, r.attempt, r.run_count]), [
        ["succeeded", 0, 1],
        ["succeeded", 0, 1],
        ["succeeded", 0, 1],
      ]);
    } finally {
      const exit = await w.stop();
      await app.close();
      assertEquals([exit.code, exit.reason], [0, "stopped"]);
    }
  });
});

Deno.test("a stop while jobs hold every pool connection past the shutdown timeout puts them back at once, no attempt spent", async () => {
  await withDatabase("survive_pool_held_stop", async (db, sql) => {
    const slots = 2;
    const app = new Akadze({ databaseUrl: db.url, max: slots });
    let started = 0;
    // Ignores its signal, as a task stuck in a long query does.
    app.task("hold", async () => {
      started++;
      await app.sql`select pg_sleep(20)`.catch(() => {});
      return "held";
    });
    const w = startWorker(app, { ...FAST, slots, shutdownTimeout: 200 });
    try {
      const ids: string[] = [];
      for (let i = 0; i < slots; i++) ids.push(await insertJob(sql, "hold", {}));
      await waitFor(() => started === slots, "every job to start");
      const exit = await w.stop();
      assertEquals([exit.code, exit.reason], [0, "stopped"]);
      // Written before run() returned: not left running for the lease to rescue.
      const rows = await jobs(sql, ids);
      assertEquals(rows.map((r) => [r.state, r.attempt, r.run_count]), [
        ["queued", 0, 1],
        ["queued", 0, 1],
      ]);
    } finally {
      await w.stop();
      await app.close();
    }
  });
});
