// The database roles of docs/production.md, applied exactly as documented (read from the doc
// at test time): the owner migrates, then the queue is used as the enqueue-only, worker and
// operator roles through every part of a job's life, each with no more than its grants.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { Worker } from "../src/worker/worker.ts";
import { AKADZE_OBJECTS, type Sql } from "../src/db.ts";
import { DuplicateJob, Fail } from "../src/errors.ts";
import { migrate, pendingVersions } from "../src/migrate.ts";
import { renderMetrics } from "../src/metrics.ts";
import {
  clearLimit,
  listJobs,
  listLimits,
  listWorkers,
  pauseQueue,
  pruneJobs,
  queueSnapshot,
  requestCancel,
  requeue,
  resumeQueue,
  setLimit,
} from "../admin.ts";
import { assert, assertEquals, assertRejects } from "./assert.ts";
import { startWorker, waitFor, waitForJob, withDatabase } from "./_helpers.ts";
import { extractBlocks } from "./_markdown.ts";

const DOC = "docs/production.md";
const ROLES = ["owner", "enqueue", "worker", "operator"] as const;
type Role = typeof ROLES[number];

/**
 * The SQL blocks of the doc's "Database roles" section, in order, with the example role and
 * database names replaced by this run's (roles are shared by the whole server).
 */
async function documentedSql(prefix: string, database: string): Promise<string[]> {
  const text = await Deno.readTextFile(new URL(`../${DOC}`, import.meta.url));
  const lines = text.split("\n");
  const start = lines.indexOf("## Database roles") + 1;
  assert(start > 0, `${DOC} has no "## Database roles" section`);
  const end = lines.findIndex((line, i) => i >= start && line.startsWith("## "));
  const blocks = extractBlocks(DOC, text)
    .filter((b) => b.lang === "sql" && b.line > start && (end < 0 || b.line < end + 1));
  return blocks.map((b) =>
    b.code
      .replace(/\bakadze_(owner|enqueue|worker|operator)\b/g, `${prefix}_$1`)
      .replace(/\bDATABASE app\b/g, `DATABASE "${database}"`)
  );
}

/** A connection to `url` as `role` (the throwaway server trusts local connections). */
function connectAs(url: string, role: string): Sql {
  const u = new URL(url);
  u.username = role;
  u.password = "";
  return postgres(u.href, { max: 4, onnotice: () => {} });
}

/** Whether a statement fails with "permission denied" (42501). */
async function denied(run: () => Promise<unknown>): Promise<boolean> {
  try {
    await run();
    return false;
  } catch (error) {
    return (error as { code?: string }).code === "42501";
  }
}

Deno.test("the documented roles: enqueue, work and operate the queue as non-owner roles", async () => {
  await withDatabase("roles", async (db, admin) => {
    const prefix = `akr${crypto.randomUUID().slice(0, 8)}`;
    const role = (r: Role) => `${prefix}_${r}`;
    const [setup, grants, ...rest] = await documentedSql(prefix, db.name);
    assertEquals(rest.length, 0, "two SQL blocks: the roles, then the grants");
    const conns: Sql[] = [];
    const apps: Akadze[] = [];
    try {
      await admin.unsafe(setup);
      const owner = connectAs(db.url, role("owner"));
      conns.push(owner);
      assertEquals((await migrate(owner)).length > 0, true);
      // A hardened database: functions are not executable by PUBLIC, so the grants must say so.
      await owner`revoke execute on all functions in schema akadze from public`;
      await owner.unsafe(grants);
      const [{ schemaOwner }] = await admin`
        select pg_get_userbyid(nspowner) as "schemaOwner" from pg_namespace
         where nspname = 'akadze'`;
      assertEquals(schemaOwner, role("owner"));

      const url = (r: Role) => {
        const u = new URL(db.url);
        u.username = role(r);
        u.password = "";
        return u.href;
      };
      const operator = connectAs(db.url, role("operator"));
      conns.push(operator);

      // ---- enqueue only ----
      const web = new Akadze({ databaseUrl: url("enqueue") });
      apps.push(web);
      const hooked = new Akadze({ databaseUrl: url("enqueue") });
      apps.push(hooked);
      let hookSaw = 0;
      hooked.hooks.onEnqueue.push(() => void hookSaw++);
      const define = (app: Akadze) => ({
        ok: app.task("ok", (args: { n?: number }) => args.n ?? 0),
        fails: app.task("fails", () => {
          throw new Fail("no");
        }),
        flaky: app.task("flaky", { maxAttempts: 2 }, (_args, ctx) => {
          if (ctx.job.attempt === 1) throw new Error("first attempt fails");
          return "second";
        }),
        sleepy: app.task(
          "sleepy",
          (_args, ctx) => new Promise((resolve) => ctx.signal.addEventListener("abort", resolve)),
        ),
      });
      const w = define(web);
      const one = await w.ok.enqueue({ n: 1 });
      const many = await w.ok.enqueueMany([{ n: 2 }, { n: 3 }]);
      assertEquals(many.length, 2);
      await define(hooked).ok.enqueue({ n: 4 });
      assertEquals(hookSaw, 1);
      const unique = await w.ok.using({ uniqueKey: "u1" }).enqueue({ n: 5 });
      await assertRejects(() => w.ok.using({ uniqueKey: "u1" }).enqueue({ n: 6 }), DuplicateJob);
      // The unique-key modes change the holder with the owner's rights (enqueue_keyed).
      const replace = { uniqueKey: "u1", onDuplicate: "replace", throttle: 60_000 } as const;
      assertEquals(await w.ok.using(replace).enqueue({ n: 6 }), unique);
      // In the application's own transaction: a rollback takes the job with it.
      const webSql = connectAs(db.url, role("enqueue"));
      conns.push(webSql);
      let rolledBack = "";
      await webSql.begin(async (tx) => {
        rolledBack = await w.ok.using({ session: tx }).enqueue({ n: 7 });
        await tx`select 1`;
        throw new Error("roll back");
      }).catch(() => {});
      const committed = await webSql.begin((tx) => w.ok.using({ session: tx }).enqueue({ n: 8 }));
      // From SQL, as the same role (the function runs with its rights): one job, then none.
      const [{ id: fromSql }] = await webSql`select akadze.enqueue('ok', '{"n": 9}') as id`;
      assert(fromSql !== null, "akadze.enqueue inserted a job");
      await webSql`select akadze.enqueue_many('ok', '[]')`;
      const [{ id: kept }] = await webSql`select akadze.enqueue('ok', '{"n": 6}',
        unique_key => 'u1', on_duplicate => 'replace', while_running => 'queue_one')::text as id`;
      assertEquals(kept, unique);
      // A flow, from TypeScript (with and without hooks) and from SQL, as the enqueue role.
      const flow = await web.enqueueFlow({
        first: { task: "ok", args: { n: 20 } },
        second: { task: "fails", dependsOn: ["first"] },
        third: { task: "ok", dependsOn: [{ step: "second", onFailure: "ignore" }] },
      });
      const hookedFlow = await hooked.enqueueFlow({ a: { task: "ok" } });
      assertEquals(hookSaw, 2);
      const [{ id: sqlStep }] = await webSql`select id::text as id from akadze.enqueue_flow(
        '[{"name": "x", "task": "ok"}]')`;
      const [{ n: rolledBackCount }] = await admin`select count(*)::int as n from akadze.jobs
                                                   where id = ${rolledBack}`;
      assertEquals(rolledBackCount, 0);
      // It cannot change, remove or read the rest of a job, nor insert one already running.
      assert(await denied(() => webSql`update akadze.jobs set priority = 9`), "enqueue may UPDATE");
      assert(await denied(() => webSql`delete from akadze.jobs`), "enqueue may DELETE");
      assert(await denied(() => webSql`select result from akadze.jobs`), "enqueue reads results");
      assert(
        await denied(() =>
          webSql`insert into akadze.jobs (task, state, worker_id) values ('ok', 'running', 'w')`
        ),
        "enqueue may insert a running job",
      );
      assert(await denied(() => webSql`select * from akadze.workers`), "enqueue reads workers");

      // ---- operator: limits and a pause before the worker starts ----
      await setLimit(operator, "one", { maxRunning: 1 });
      await setLimit(operator, "rate", { maxStarts: 2, window: 3_600_000 });
      assert(await pauseQueue(operator, "held"));
      const held = await w.ok.using({ queue: "held" }).enqueue({ n: 9 });
      const keyed = await w.ok.using({ limitKey: "one" }).enqueueMany([{ n: 10 }, { n: 11 }]);
      const rated = await w.ok.using({ limitKey: "rate" }).enqueueMany([{}, {}, {}]);
      const failing = await w.fails.enqueue();
      const flaky = await w.flaky.enqueue();
      const sleeping = await w.sleepy.enqueue();

      // A worker that died with a job running: rescued by the worker role.
      await admin`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at)
                  values ('dead', 'h', 1, '{default}', now() - interval '1 hour')`;
      const [{ id: orphan }] = await admin`
        insert into akadze.jobs (task, state, worker_id, started_at, run_count, args)
        values ('ok', 'running', 'dead', now(), 1, '{"n":12}') returning id::text as id`;

      // ---- worker ----
      const workerApp = new Akadze({ databaseUrl: url("worker") });
      apps.push(workerApp);
      define(workerApp);
      // What `akadze worker` checks before it starts.
      assertEquals(await pendingVersions(workerApp.sql), []);
      workerApp.periodic("tick", { every: 1_000, overlap: false }, () => "tick");
      const running = startWorker(workerApp, {
        queues: ["default", "held"],
        slots: 4,
        heartbeatInterval: 200,
        heartbeatTtl: 2_000,
      });
      try {
        const done = (id: string, state = "succeeded") =>
          waitForJob(admin, id, (r) => r.state === state, `job ${id} ${state}`, 30_000);
        for (const id of [one, ...many, unique, committed, ...keyed]) await done(id);
        // The flow's steps settle one another as the worker role finishes them.
        await done(flow.jobs.second, "failed");
        for (const id of [flow.jobs.first, flow.jobs.third, hookedFlow.id, sqlStep]) {
          await done(id);
        }
        await done(failing, "failed");
        const flakyRow = await done(flaky);
        assertEquals(flakyRow.attempt, 1);
        const rescued = await done(orphan);
        assertEquals(rescued.attempt, 1);
        await waitFor(async () => {
          const [{ n }] = await admin`select count(*)::int as n from akadze.workers
                                      where id = 'dead'`;
          return n === 0;
        }, "the dead worker removed");
        await waitFor(async () => {
          const [{ n }] = await admin`select count(*)::int as n from akadze.periodic_runs r
              join akadze.jobs j on j.id = r.job_id where r.name = 'tick'
               and j.state = 'succeeded'`;
          return n >= 1;
        }, "a schedule fire run");
        // maxStarts 2 per hour: two of the three start, the third waits.
        await waitFor(async () => {
          const rows = await admin`select state from akadze.jobs where id = any(${rated})`;
          return rows.filter((r) => r.state === "succeeded").length === 2;
        }, "two rate-limited jobs");
        const [{ n: waiting }] = await admin`select count(*)::int as n from akadze.jobs
                                             where id = any(${rated}) and state = 'queued'`;
        assertEquals(waiting, 1);
        assertEquals((await waitForJob(admin, held, () => true)).state, "queued");

        // ---- operator while the worker runs ----
        await waitForJob(admin, sleeping, (r) => r.state === "running", "sleepy running");
        assert(await requestCancel(operator, sleeping));
        await done(sleeping, "cancelled");
        assert(await resumeQueue(operator, "held"));
        await done(held);
        assert(await clearLimit(operator, "rate"));
        for (const id of rated) await done(id);
        await requeue(operator, failing);
        await done(failing, "failed");
        assertEquals((await listLimits(operator)).map((l) => l.key), ["one"]);
        assert((await listWorkers(operator)).length >= 1);
        assert((await listJobs(operator, { state: "failed" })).length >= 1);
        assert((await queueSnapshot(operator)).length >= 1);
        assert((await renderMetrics(operator)).includes("akadze_jobs{"));
        const pruned = await pruneJobs(operator, { olderThan: 0, dryRun: true });
        assert(pruned > 0, `prune would delete ${pruned} jobs`);
      } finally {
        const exit = await running.stop();
        assertEquals(exit.code, 0, exit.message);
      }

      const workerSql = connectAs(db.url, role("worker"));
      conns.push(workerSql);
      assert(
        await denied(() => workerSql`update akadze.limits set max_running = 99`),
        "a worker may change a limit",
      );
      assert(
        await denied(() => workerSql`insert into akadze.queue_pauses (queue) values ('x')`),
        "a worker may pause a queue",
      );
      assert(
        (await pruneJobs(operator, { olderThan: 0, includeFailed: true })) > 0,
        "the operator's prune deleted nothing",
      );

      // The worker's pruning, and deleting succeeded jobs at once (retention 0).
      const pruning = new Akadze({ databaseUrl: url("worker"), retention: 0, grace: 1 });
      apps.push(pruning);
      const p = define(pruning);
      const quick = await p.ok.using({ session: webSql }).enqueue({ n: 13 });
      // Bookkeeping rows past their keep: a fire two days old, a mark of a key without limits.
      await admin`update akadze.periodic_runs set fire_at = fire_at - interval '2 days',
                                                  created_at = created_at - interval '2 days'`;
      await admin`insert into akadze.limit_starts (key, job_id) values ('gone', 1)`;
      const pruner = startWorker(pruning, { pruneInterval: 50, schedules: false });
      try {
        await waitFor(async () => {
          const [{ jobs, runs, marks }] = await admin`
            select (select count(*)::int from akadze.jobs where state <> 'queued') as jobs,
                   -- Each schedule's last fire stays (a backfill starts after it).
                   (select count(*)::int - count(distinct name)::int from akadze.periodic_runs)
                     as runs,
                   (select count(*)::int from akadze.limit_starts) as marks`;
          return jobs === 0 && runs === 0 && marks === 0;
        }, "every finished job, schedule fire and start mark pruned");
        assertEquals(
          (await admin`select 1 from akadze.jobs where id = ${quick}`).length,
          0,
          "the succeeded job is gone",
        );
      } finally {
        assertEquals((await pruner.stop()).code, 0);
      }
    } finally {
      for (const app of apps) await app.close();
      for (const sql of conns) await sql.end({ timeout: 1 });
      // Roles belong to the whole server: remove them with what they own and were granted.
      const names = ROLES.map((r) => `"${role(r)}"`).join(", ");
      await admin.unsafe(`drop owned by ${names} cascade; drop role ${names}`).catch(() => {});
    }
  }, { migrated: false });
});

Deno.test("a role without akadze's grants gets an error that says where the grants are", async () => {
  await withDatabase("roles_missing_grant", async (db) => {
    const role = `nogrant_${crypto.randomUUID().slice(0, 8)}`;
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await admin.unsafe(`create role ${role} login`);
      const sql = connectAs(db.url, role);
      const app = new Akadze({ sql });
      const task = app.task("hello", () => "hi");
      try {
        for (
          const run of [
            () => listJobs(sql),
            () => task.enqueue(),
            () => pauseQueue(sql, "default"),
          ]
        ) {
          const error = await assertRejects(run);
          assertEquals((error as { code?: string }).code, "42501");
          assert(
            String((error as Error).message).includes('"Database roles"'),
            String((error as Error).message),
          );
        }
        // A worker stops with the same advice.
        const exit = await new Worker(app, {
          batch: true,
          heartbeatTtl: 2_000,
          heartbeatInterval: 200,
        }).run();
        assertEquals(exit.code, 1);
        assert(exit.message?.includes('"Database roles"'), exit.message);
      } finally {
        await sql.end({ timeout: 1 });
      }
    } finally {
      await admin.unsafe(`drop owned by ${role}; drop role ${role}`).catch(() => {});
      await admin.end({ timeout: 1 });
    }
  });
});

Deno.test("every table, sequence and function of akadze's schema is one a missing grant is explained for", async () => {
  await withDatabase("roles_objects", async (_db, sql) => {
    const objects = await sql`
      select c.relname as name from pg_class c join pg_namespace n on n.oid = c.relnamespace
       where n.nspname = 'akadze' and c.relkind in ('r', 'S', 'v', 'p')
      union
      select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze'`;
    const names = objects.map((r) => r.name as string).sort();
    assertEquals(names.filter((name) => !AKADZE_OBJECTS.has(name)), []);
    // The list names nothing the schema does not have (a renamed object is renamed there too).
    assertEquals([...AKADZE_OBJECTS].filter((name) => !names.includes(name)), []);
  });
});
