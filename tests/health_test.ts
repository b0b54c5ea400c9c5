// `akadze health`: the heartbeat-file probe (fresh, stale, missing; one process and a
// supervisor with its worker processes), and the database probe (lag and ready thresholds).
import postgres from "postgres";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { checkHeartbeatFiles } from "../src/cli/health.ts";
import { waitFor, withDatabase } from "./_helpers.ts";
import { knownVersions } from "../src/migrate.ts";
import {
  APP_MODULE,
  SLOW,
  spawnCli,
  supervisorPermissions,
  withDir,
  withProcesses,
} from "./_processes.ts";

const ONE_LINE = /^[^\n]+\n$/;
const MINUTE_AGO = () => new Date(Date.now() - 60_000);

/**
 * That `text` matches `pattern` and the age its group matched is at least `min` seconds: a
 * loaded machine may take longer to run the command, so only the lower bound is certain.
 */
function assertAge(text: string, pattern: RegExp, min: number): void {
  const match = text.match(pattern);
  assert(match, `${JSON.stringify(text)} does not match ${pattern}`);
  assert(Number(match[1]) >= min, `${match[1]} s is younger than ${min} s: ${text}`);
}

/** Run `akadze health ARGS`; a probe needs to read metadata only (and the network for the database). */
function health(args: string[], env: Record<string, string> = {}) {
  return spawnCli(["health", ...args], env, {
    permissions: ["--allow-read", "--allow-env", "--allow-net"],
  }).done();
}

Deno.test("checkHeartbeatFiles: fresh, stale and missing files, one line naming each problem", async () => {
  await withDir({ a: "1", b: "2" }, async (dir) => {
    const now = Date.now();
    const fresh = await checkHeartbeatFiles([`${dir}/a`, `${dir}/b`], 5_000, now);
    assertEquals(fresh.ok, true);
    assertMatch(fresh.line, /^2 heartbeat files fresh \(oldest \d+(\.\d)? s old, max 5 s\)$/);
    // A minute before `now`, the instant the check measures from (not the clock, which ran on).
    await Deno.utime(`${dir}/b`, new Date(now - 60_000), new Date(now - 60_000));
    const stale = await checkHeartbeatFiles([`${dir}/a`, `${dir}/b`, `${dir}/c`], 5_000, now);
    assertEquals(stale.ok, false);
    assertMatch(
      stale.line,
      new RegExp(`^${dir}/b is stale \\(60(\\.\\d)? s old, max 5 s\\); ${dir}/c is missing$`),
    );
    // A modification time ahead of the clock (skew) is fresh.
    const future = new Date(now + 60_000);
    await Deno.utime(`${dir}/b`, future, future);
    assertEquals((await checkHeartbeatFiles([`${dir}/b`], 5_000, now)).ok, true);
  });
});

Deno.test("akadze health --heartbeat-file: exit 0 fresh, 1 stale or missing, without a database", async () => {
  await withDir({ hb: "1", "n.supervisor": "1", "n.0": "1" }, async (dir) => {
    // No AKADZE_DATABASE_URL and no network permission needed.
    const probe = (args: string[]) =>
      spawnCli(["health", ...args], {}, { permissions: [`--allow-read=${dir}`] }).done();
    const ok = await probe(["--heartbeat-file", `${dir}/hb`]);
    assertEquals([ok.code, ok.stderr], [0, ""]);
    assertMatch(ok.stdout, new RegExp(`^ok: ${dir}/hb fresh \\(oldest .* max 60 s\\)\\n$`));
    await Deno.utime(`${dir}/hb`, MINUTE_AGO(), MINUTE_AGO());
    const stale = await probe(["--heartbeat-file", `${dir}/hb`, "--max-age", "30"]);
    assertEquals(stale.code, 1);
    assertMatch(stale.stderr, ONE_LINE);
    assertAge(
      stale.stderr,
      new RegExp(`^unhealthy: ${dir}/hb is stale \\((\\d+(?:\\.\\d)?) s old, max 30 s\\)`),
      60,
    );
    assertEquals((await probe(["--heartbeat-file", `${dir}/hb`, "--max-age", "90"])).code, 0);
    // With --processes 2: PATH.supervisor, PATH.0 and PATH.1.
    const missing = await probe(["--heartbeat-file", `${dir}/n`, "--processes", "2"]);
    assertEquals(missing.code, 1);
    assertMatch(missing.stderr, ONE_LINE);
    assertMatch(missing.stderr, new RegExp(`^unhealthy: ${dir}/n\\.1 is missing\\n$`));
    const none = await probe(["--heartbeat-file", `${dir}/none`]);
    assertEquals(none.code, 1);
    assertMatch(none.stderr, /is missing/);
  });
});

Deno.test("akadze health usage errors: mixing file and database checks, bad numbers (exit 2)", async () => {
  const cases: [string[], RegExp][] = [
    [["--heartbeat-file", "/x", "--max-lag", "5"], /--max-lag checks the database/],
    [["--processes", "2"], /--processes goes with --heartbeat-file/],
    [["--heartbeat-file", "/x", "--max-age", "0"], /--max-age must be a positive number/],
    [["--heartbeat-file", "/x", "--processes", "0"], /--processes must be an integer/],
    [["--max-ready", "-1"], /max-ready/],
    [["--max-lag", "soon"], /--max-lag must be a number of seconds/],
    [["--max-transaction-age", "soon"], /--max-transaction-age must be a number of seconds/],
    [["--heartbeat-file", "/x", "--max-transaction-age", "5"], /checks the database/],
    [["--queue", "no spaces"], /queue name/],
    [[], /AKADZE_DATABASE_URL is not set/],
  ];
  for (const [args, message] of cases) {
    const out = await health(args);
    assertEquals(out.code, 2, `${args.join(" ")}: ${out.stderr}`);
    assertMatch(out.stderr, /^error: [^\n]+\n$/);
    assertMatch(out.stderr, message);
  }
  const help = await health(["--help"]);
  assertEquals(help.code, 0);
  for (
    const flag of [
      "--heartbeat-file",
      "--processes",
      "--max-age",
      "--max-lag",
      "--max-ready",
      "--max-transaction-age",
    ]
  ) {
    assert(help.stdout.includes(flag), `health --help lacks ${flag}`);
  }
});

Deno.test("heartbeat files of a supervisor and its workers: fresh while running, stale after", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("health_supervisor_files", async (db) => {
      await withProcesses(async () => {
        const hb = `${dir}/hb`;
        const probe = (...args: string[]) =>
          spawnCli(["health", "--heartbeat-file", hb, ...args], {}, {
            permissions: [`--allow-read=${dir}`],
          }).done();
        const sup = spawnCli(
          [
            "worker",
            `${dir}/app.ts`,
            "--processes",
            "2",
            "--heartbeat-file",
            hb,
            "--poll-interval",
            "0.1",
            "--log-format",
            "json",
          ],
          { AKADZE_DATABASE_URL: db.url },
          { permissions: supervisorPermissions(dir) },
        );
        const ok = await waitFor(
          async () => {
            const out = await probe("--processes", "2", "--max-age", "5");
            return out.code === 0 ? out : null;
          },
          "the supervisor's and both workers' heartbeat files",
          SLOW,
        );
        assertMatch(ok!.stdout, /^ok: 3 heartbeat files fresh/);
        // The base path alone is not written with --processes 2, nor is a third slot.
        const single = await probe();
        assertEquals(single.code, 1);
        assertMatch(single.stderr, new RegExp(`^unhealthy: ${hb} is missing\\n$`));
        const three = await probe("--processes", "3");
        assertEquals(three.code, 1);
        assertMatch(three.stderr, new RegExp(`^unhealthy: ${hb}\\.2 is missing\\n$`));
        sup.child.kill("SIGTERM");
        assertEquals((await sup.done()).code, 0);
        // The workers stop before the supervisor, so their files go stale first: wait for
        // the supervisor's too.
        const stale = await waitFor(
          async () => {
            const out = await probe("--processes", "2", "--max-age", "0.3");
            return out.code === 1 && out.stderr.includes(`${hb}.supervisor is stale`) ? out : null;
          },
          "the files to go stale",
          SLOW,
        );
        assertMatch(stale!.stderr, ONE_LINE);
        assertMatch(stale!.stderr, new RegExp(`${hb}\\.supervisor is stale`));
      });
    });
  });
});

Deno.test("one worker process with --heartbeat-file touches PATH", async () => {
  await withDir({ "app.ts": APP_MODULE }, async (dir) => {
    await withDatabase("health_worker_file", async (db) => {
      await withProcesses(async () => {
        const hb = `${dir}/hb`;
        const worker = spawnCli(
          ["worker", `${dir}/app.ts`, "--heartbeat-file", hb, "--poll-interval", "0.1"],
          { AKADZE_DATABASE_URL: db.url },
          {
            permissions: [
              "--allow-net",
              "--allow-env",
              "--allow-sys=hostname",
              "--allow-read",
              `--allow-write=${dir}`,
            ],
          },
        );
        const first = await waitFor(
          () => Deno.stat(hb).then((i) => i.mtime, () => null),
          "PATH",
          SLOW,
        );
        await waitFor(
          async () => (await Deno.stat(hb)).mtime! > first!,
          "PATH to be touched again",
          SLOW,
        );
        const out = await health(["--heartbeat-file", hb, "--max-age", "5"]);
        assertEquals(out.code, 0, out.stderr);
        worker.child.kill("SIGTERM");
        assertEquals((await worker.done()).code, 0);
      });
    });
  });
});

Deno.test("akadze health on the database: lag and ready thresholds per queue", async () => {
  await withDatabase("health_database", async (db, sql) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const empty = await health([], env);
    assertEquals(empty.code, 0, empty.stderr);
    assertEquals(
      empty.stdout,
      `ok: database reachable, schema "akadze" up to date, 0 ready jobs\n`,
    );
    await sql`
      insert into akadze.jobs (task, queue, run_at) values
        ('t', 'default', now() - interval '120 seconds'),
        ('t', 'default', now() - interval '5 seconds'),
        ('t', 'mail', now() - interval '10 seconds'),
        ('t', 'mail', now() + interval '1 hour')`;
    // Running and finished jobs are not ready, nor are steps waiting for their dependencies.
    await sql`insert into akadze.jobs (task, queue, state, worker_id, run_at)
              values ('t', 'mail', 'running', 'w', now() - interval '1 hour')`;
    await sql`insert into akadze.jobs (task, queue, state, run_at, pending_deps)
              values ('t', 'default', 'waiting', now() - interval '1 hour', 1)`;
    const ok = await health(["--max-lag", "300", "--max-ready", "2"], env);
    assertEquals(ok.code, 0, ok.stderr);
    assertAge(ok.stdout, /^ok: .* 3 ready jobs, oldest waited (\d+\.\d) s\n$/, 120);
    const lag = await health(["--max-lag", "60"], env);
    assertEquals(lag.code, 1);
    assertMatch(lag.stderr, ONE_LINE);
    assertAge(
      lag.stderr,
      /^unhealthy: queue default: oldest ready job waited (\d+\.\d) s > 60 s\n$/,
      120,
    );
    // The future job does not count: mail has one ready job, 10 s old.
    const mail = await health(["--max-lag", "60", "--max-ready", "1", "--queue", "mail"], env);
    assertEquals(mail.code, 0, mail.stderr);
    assertAge(mail.stdout, /1 ready jobs in mail, oldest waited (\d+\.\d) s/, 10);
    const ready = await health(["--max-ready", "1"], env);
    assertEquals(ready.code, 1);
    assertMatch(ready.stderr, /^unhealthy: queue default: 2 ready jobs > 1\n$/);
    await sql`insert into akadze.queue_pauses (queue) values ('default')`;
    const both = await health(["--max-ready", "1", "--max-lag", "60", "-q", "default,other"], env);
    assertEquals(both.code, 1);
    assertMatch(both.stderr, ONE_LINE);
    assertMatch(
      both.stderr,
      /queue default \(paused\): 2 ready jobs > 1; queue default \(paused\): oldest/,
    );
  });
});

Deno.test("akadze health --max-transaction-age: unhealthy while a transaction holds back cleanup", async () => {
  await withDatabase("health_transaction_age", async (db) => {
    const env = { AKADZE_DATABASE_URL: db.url };
    const holder = postgres(db.url, { max: 1, onnotice: () => {} });
    let release!: () => void;
    const released = new Promise<void>((resolve) => release = resolve);
    let opened!: (pid: number) => void;
    const pid = new Promise<number>((resolve) => opened = resolve);
    const done = holder.begin("isolation level repeatable read", async (tx) => {
      const [row] = await tx`select pg_backend_pid() as pid`;
      opened(row.pid);
      await released;
    });
    try {
      const held = await health(["--max-transaction-age", "0"], env);
      assertEquals(held.code, 1, held.stdout);
      assertMatch(held.stderr, ONE_LINE);
      assertMatch(
        held.stderr,
        new RegExp(
          `^unhealthy: a transaction \\(server process ${await pid}\\) has been open for ` +
            `\\d+\\.\\d s > 0 s and holds back the cleanup of old job rows, which slows ` +
            `claims down: if it is not needed, end it with SELECT pg_terminate_backend\\(${await pid}\\)`,
        ),
      );
    } finally {
      release();
      await done;
      await holder.end({ timeout: 1 });
    }
    const ok = await health(["--max-transaction-age", "0"], env);
    assertEquals(ok.code, 0, ok.stderr);
    assertMatch(ok.stdout, /^ok: .* 0 ready jobs, oldest open transaction 0\.0 s\n$/);
  });
});

Deno.test("akadze health on the database: unmigrated schema or unreachable server exit 1", async () => {
  await withDatabase("health_unmigrated", async (db) => {
    const out = await health([], { AKADZE_DATABASE_URL: db.url });
    assertEquals(out.code, 1);
    assertMatch(
      out.stderr,
      new RegExp(
        `^unhealthy: schema "akadze" is not migrated \\(pending: ${
          knownVersions().join(", ")
        }\\)\n$`,
      ),
    );
  }, { migrated: false });
  const refused = await health(["--timeout", "5"], {
    AKADZE_DATABASE_URL: "postgres://app:Sup3rSecretPw@127.0.0.1:1/app",
  });
  assertEquals(refused.code, 1);
  assertMatch(refused.stderr, /^unhealthy: database: [^\n]*\n$/);
  assert(!refused.stderr.includes("Sup3rSecretPw"), refused.stderr);
});
