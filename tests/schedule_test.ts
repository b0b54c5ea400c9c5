// Periodic schedules: registration, fire computation, dispatch once per fire.
import * as v from "valibot";
import { Akadze } from "../src/app.ts";
import { AkadzeError } from "../src/errors.ts";
import { Schedule } from "../src/schedule.ts";
import { Scheduler } from "../src/worker/scheduler.ts";
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import { startWorker, waitFor, withApp } from "./_helpers.ts";

const URL = "postgres://u@127.0.0.1:1/x_test";

function offlineApp(): Akadze {
  return new Akadze({ databaseUrl: URL });
}

Deno.test("schedules are validated at registration with precise errors; nothing half-registered", async () => {
  const app = offlineApp();
  try {
    app.task("typed", { args: v.object({ n: v.number() }) }, () => {});
    app.task("plain", () => {});
    app.task("parse", { args: v.object({ n: v.pipe(v.string(), v.transform(Number)) }) }, () => {});
    const cases: [() => unknown, RegExp][] = [
      [() => app.addSchedule("missing", { every: 60_000 }), /unknown task "missing"/],
      [() => app.addSchedule("plain", {}), /exactly one of cron and every/],
      [() => app.addSchedule("plain", { cron: "* * * * *", every: 1000 }), /exactly one/],
      [() => app.addSchedule("plain", { cron: "61 * * * *" }), /invalid cron "61 \* \* \* \*"/],
      [() => app.addSchedule("plain", { cron: "* * * *" }), /5 fields/],
      [() => app.addSchedule("plain", { cron: "0 * * * * *" }), /5 fields/],
      [() => app.addSchedule("plain", { every: 10 }), /every must be a whole number/],
      [() => app.addSchedule("plain", { every: 1500.5 }), /every must be/],
      [() => app.addSchedule("plain", { cron: "@hourly", timezone: "Mars/Base" }), /time zone/],
      [() => app.addSchedule("plain", { every: 60_000, timezone: "UTC" }), /cron only/],
      [() => app.addSchedule("typed", { every: 60_000, args: { n: "x" } }), /invalid args: n/],
      [
        () => app.addSchedule("parse", { every: 60_000, args: { n: "5" } }),
        /the args schema of task "parse" does not accept its own output \(n: /,
      ],
      [() => app.addSchedule("plain", { every: 60_000, args: { d: new Date() } }), /Date/],
      [() => app.addSchedule("plain", { every: 60_000, overlap: "no" as never }), /overlap/],
      [() => app.addSchedule("plain", { every: 60_000, bogus: 1 } as never), /unknown option/],
      [() => app.periodic("p", { cron: "x * * * *" }, () => {}), /invalid cron/],
    ];
    for (const [register, message] of cases) {
      const error = assertThrows(register, AkadzeError);
      assert(message.test(error.message), `${message}: ${error.message}`);
    }
    assertEquals(app.schedules.size, 0);
    assert(!app.tasks.has("p"), "a refused periodic registers no task");
    app.addSchedule("typed", { every: 60_000, args: { n: 1 } });
    assertThrows(() => app.addSchedule("typed", { every: 30_000 }), AkadzeError);
    app.addSchedule("typed", { every: 30_000, args: { n: 2 }, name: "typed.fast" });
    const error = assertThrows(
      () =>
        app.addSchedules([
          { task: "plain", every: 60_000 },
          { task: "plain", cron: "bad * * * *" },
        ]),
      AkadzeError,
    );
    assertMatch(error.message, /invalid cron/);
    assertEquals([...app.schedules.keys()], ["typed", "typed.fast"], "all or nothing");
    app.addSchedules([{ task: "plain", cron: "@daily" }, {
      task: "plain",
      every: 5000,
      name: "p5",
    }]);
    const periodic = app.periodic(
      "nightly",
      { cron: "0 3 * * *", timezone: "Europe/Berlin" },
      () => {},
    );
    assertEquals(periodic.name, "nightly");
    assertEquals(app.schedules.get("nightly")?.describe(), 'cron "0 3 * * *" (Europe/Berlin)');
  } finally {
    await app.close();
  }
});

Deno.test("every fires at multiples of the interval since the epoch", async () => {
  const app = offlineApp();
  try {
    const s = new Schedule(app.task("t", () => {}), { every: 15 * 60_000 });
    const now = new Date("2026-05-05T10:37:12Z");
    assertEquals(s.lastFire(now)?.toISOString(), "2026-05-05T10:30:00.000Z");
    assertEquals(s.nextFire(now)?.toISOString(), "2026-05-05T10:45:00.000Z");
    const exact = new Date("2026-05-05T10:45:00Z");
    assertEquals(s.lastFire(exact)?.toISOString(), "2026-05-05T10:45:00.000Z");
    const odd = new Schedule(app.tasks.get("t")!, { every: 7_000, name: "odd" });
    assertEquals(odd.lastFire(new Date(20_000))?.getTime(), 14_000);
  } finally {
    await app.close();
  }
});

Deno.test("cron runs in UTC by default and follows a time zone across DST changes", async () => {
  const app = offlineApp();
  try {
    const t = app.task("t", () => {});
    const utc = new Schedule(t, { cron: "30 2 * * *", name: "utc" });
    assertEquals(
      utc.lastFire(new Date("2026-03-29T12:00:00Z"))?.toISOString(),
      "2026-03-29T02:30:00.000Z",
    );
    const berlin = new Schedule(t, { cron: "0 9 * * *", timezone: "Europe/Berlin", name: "b" });
    // 09:00 local is 08:00Z in winter (CET) and 07:00Z in summer (CEST).
    const spring = berlin.firesBetween(
      new Date("2026-03-27T00:00:00Z"),
      new Date("2026-03-31T00:00:00Z"),
    );
    assertEquals(spring.map((d) => d.toISOString()), [
      "2026-03-27T08:00:00.000Z",
      "2026-03-28T08:00:00.000Z",
      "2026-03-29T07:00:00.000Z",
      "2026-03-30T07:00:00.000Z",
    ]);
    const autumn = berlin.firesBetween(
      new Date("2026-10-24T00:00:00Z"),
      new Date("2026-10-27T00:00:00Z"),
    );
    assertEquals(autumn.map((d) => d.toISOString()), [
      "2026-10-24T07:00:00.000Z",
      "2026-10-25T08:00:00.000Z",
      "2026-10-26T08:00:00.000Z",
    ]);
    // 02:30 does not exist on the spring-forward night and happens twice in autumn: once each.
    const night = new Schedule(t, { cron: "30 2 * * *", timezone: "Europe/Berlin", name: "n" });
    assertEquals(
      night.firesBetween(new Date("2026-03-28T12:00:00Z"), new Date("2026-03-29T12:00:00Z")).length,
      1,
    );
    assertEquals(
      night.firesBetween(new Date("2026-10-24T12:00:00Z"), new Date("2026-10-25T12:00:00Z")).length,
      1,
    );
    const hourly = new Schedule(t, { cron: "@hourly", name: "h" });
    assertEquals(
      hourly.nextFire(new Date("2026-01-01T10:10:00Z"))?.toISOString(),
      "2026-01-01T11:00:00.000Z",
    );
  } finally {
    await app.close();
  }
});

Deno.test("three workers dispatching the same fire create exactly one job", async () => {
  await withApp("sched_once", async (app, sql) => {
    app.periodic("tick", { every: 60_000, args: { from: "schedule" } }, () => {});
    // Both passes must see the same fire: a minute starting between them is a new fire.
    const toNextMinute = 60_000 - Date.now() % 60_000;
    if (toNextMinute < 5_000) await new Promise((r) => setTimeout(r, toNextMinute + 100));
    const schedulers = [
      new Scheduler(app.sql, { app }),
      new Scheduler(app.sql, { app }),
      new Scheduler(app.sql, { app }),
    ];
    const results = await Promise.all(schedulers.map((s) => s.runOnce()));
    assertEquals(results.flatMap((r) => r.fired), ["tick"]);
    assertEquals(results.flatMap((r) => r.taken), ["tick", "tick"]);
    const jobs = await sql`select task, args from akadze.jobs`;
    assertEquals(jobs.map((r) => [r.task, r.args]), [["tick", { from: "schedule" }]]);
    // The same fire is never dispatched again.
    const again = await Promise.all(schedulers.map((s) => s.runOnce()));
    assertEquals(again.flatMap((r) => [...r.fired, ...r.taken]), []);
    const [run] = await sql`select name, job_id::text as job_id, fire_at from akadze.periodic_runs`;
    assertEquals(run.name, "tick");
    assertEquals(run.fire_at.getTime() % 60_000, 0);
  });
});

Deno.test("three real workers running an every-second schedule enqueue one job per fire", async () => {
  await withApp("sched_workers", async (app, sql) => {
    app.periodic("second", { every: 1_000 }, () => {});
    const workers = [0, 1, 2].map(() => startWorker(app, { pollInterval: 50 }));
    await waitFor(
      async () => {
        const [{ n }] = await sql`select count(*)::int as n from akadze.periodic_runs`;
        return n >= 3;
      },
      "three fires",
      20_000,
    );
    await Promise.all(workers.map((w) => w.stop()));
    const rows = await sql`select r.fire_at, count(j.id)::int as jobs
                           from akadze.periodic_runs r left join akadze.jobs j on j.id = r.job_id
                           group by r.fire_at`;
    assert(rows.length >= 3);
    for (const row of rows) assertEquals(row.jobs, 1);
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs`;
    assertEquals(n, rows.length);
  });
});

Deno.test("missed fires are not backfilled: only the latest fire within the grace", async () => {
  await withApp("sched_grace", async (app, sql) => {
    app.periodic("often", { every: 1_000 }, () => {});
    // Its last fire was 10 h ago at 02:00 UTC or so; far beyond a 60 s grace: nothing.
    app.periodic("stale", { cron: `0 ${(new Date().getUTCHours() + 14) % 24} * * *` }, () => {});
    const result = await new Scheduler(app.sql, { app }).runOnce();
    assertEquals(result.fired, ["often"]);
    const jobs = await sql`select task from akadze.jobs`;
    assertEquals(jobs.map((r) => r.task), ["often"]);
  }, { grace: 60_000 });
});

Deno.test("overlap: false skips a fire while the previous run is active, and records it", async () => {
  await withApp("sched_overlap", async (app, sql) => {
    app.periodic("single", { every: 1_000, overlap: false }, () => {});
    const scheduler = new Scheduler(app.sql, { app });
    assertEquals((await scheduler.runOnce()).fired, ["single"]);
    await waitFor(
      async () => (await scheduler.runOnce()).skipped.length > 0,
      "a skipped fire",
      20_000,
    );
    const runs = await sql`select job_id from akadze.periodic_runs order by fire_at`;
    assert(runs.length >= 2);
    assert(runs[0].job_id !== null && runs.at(-1)!.job_id === null);
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs`;
    assertEquals(n, 1);
    // Once the run finished, the next fire enqueues again.
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now()`;
    await waitFor(async () => (await scheduler.runOnce()).fired.length > 0, "a new fire", 20_000);
  });
});

Deno.test("a schedule whose enqueue fails is logged and does not stop the others", async () => {
  await withApp("sched_failing", async (app, sql) => {
    app.hooks.onEnqueue.push((_tx, job) => {
      if (job.task === "broken") throw new Error("hook refuses");
    });
    app.periodic("broken", { every: 60_000 }, () => {});
    app.periodic("fine", { every: 60_000 }, () => {});
    const result = await new Scheduler(app.sql, { app }).runOnce();
    assertEquals(result.failed, ["broken"]);
    assertEquals(result.fired, ["fine"]);
    const jobs = await sql`select task from akadze.jobs`;
    assertEquals(jobs.map((r) => r.task), ["fine"]);
    const runs = await sql`select name from akadze.periodic_runs`;
    assertEquals(runs.map((r) => r.name), ["fine"], "the failed fire was rolled back");
    // And a worker with that schedule keeps running.
    const w = startWorker(app);
    await new Promise((r) => setTimeout(r, 300));
    assertEquals(await w.stop(), { code: 0, reason: "stopped" });
  });
});
