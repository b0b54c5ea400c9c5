// The claimer on one connection: the one-queue claim is a function whose plan that
// connection keeps, so what changes between claims (pauses, limits, priorities) must be
// read when the claim runs, not when it was planned.
import { pauseQueue, resumeQueue, setLimit } from "../admin.ts";
import { connect, type Sql } from "../src/db.ts";
import { Claimer } from "../src/worker/claimer.ts";
import { assert, assertEquals } from "./assert.ts";
import { waitFor, withApp, withDatabase, workClaimer } from "./_helpers.ts";

Deno.test("a claim on a connection with a cached plan still honours pauses, limits and priorities added later", async () => {
  await withApp("claimer_cached", async (app, _sql, db) => {
    const work = app.task("work", () => {});
    const one = connect(db.url, { max: 1 });
    try {
      const claimer = workClaimer(one);
      const claimIds = async (slots: number) =>
        (await claimer.claim([{ queue: "default", slots }], slots)).claimed.map((j) => j.args);

      // More claims than PostgreSQL's five custom plans: the rest run the cached plan.
      await work.enqueueMany(Array.from({ length: 8 }, (_, i) => ({ i })));
      for (let i = 0; i < 8; i++) assertEquals(await claimIds(1), [{ i }]);
      assertEquals(await claimIds(1), []);

      await work.using({ priority: 5 }).enqueue({ i: "high" });
      await work.enqueue({ i: "low" });
      await pauseQueue(app.sql, "default");
      assertEquals(await claimIds(5), [], "a paused queue gives nothing");
      await resumeQueue(app.sql, "default");
      assertEquals(await claimIds(1), [{ i: "high" }]);
      assertEquals(await claimIds(1), [{ i: "low" }]);

      // A limits row created now: its jobs are left to the limited claim (which trusts "no
      // limits" for up to two seconds), and that one takes them one at a time.
      await setLimit(app.sql, "k", { maxRunning: 1 });
      await work.using({ limitKey: "k" }).enqueueMany([{ i: "k1" }, { i: "k2" }]);
      const first = await waitFor(async () => {
        const got = await claimIds(5);
        return got.length > 0 ? got : null;
      }, "the limited claim");
      assertEquals(first, [{ i: "k1" }]);
      assertEquals(await claimIds(5), []);
    } finally {
      await one.end();
    }
  });
});

/** Index entries the claim index gave to scans so far, `sql`'s own pending counts reported first. */
async function claimIndexReads(sql: Sql): Promise<number> {
  await sql`select pg_stat_force_next_flush()`;
  const [{ n }] = await sql`
    select idx_tup_read::int as n from pg_stat_user_indexes
     where schemaname = 'akadze' and indexrelname = 'jobs_claim_idx'`;
  return n;
}

/**
 * `n` jobs enqueued, claimed and finished, as a worker would leave them, while `pin`'s snapshot
 * keeps their queued row versions (and those versions' claim index entries) from removal.
 */
async function deadClaimEntries(sql: Sql, n: number): Promise<void> {
  await sql`insert into akadze.jobs (task, run_at)
            select 'work', now() - interval '1 hour' from generate_series(1, ${n})`;
  await sql`update akadze.jobs set state = 'running', worker_id = 'w0', started_at = now(),
                   run_count = 1 where state = 'queued'`;
  await sql`update akadze.jobs set state = 'succeeded', worker_id = null, finished_at = now()
             where state = 'running'`;
}

Deno.test("while an old snapshot pins the horizon, a one-queue claim does not scan every claimed job's dead index entry", async () => {
  await withApp("claimer_pinned", async (app, sql, db) => {
    const work = app.task("work", () => {});
    const one = connect(db.url, { max: 1 });
    const pin = await sql.reserve();
    try {
      await pin`begin isolation level repeatable read`;
      await pin`select 1`;
      const dead = 20_000;
      await deadClaimEntries(sql, dead);
      const claimer = workClaimer(one);
      const before = await claimIndexReads(one);
      const claims = 40;
      for (let i = 0; i < claims; i++) {
        await work.enqueue({ i });
        const { claimed } = await claimer.claim([{ queue: "default", slots: 5 }], 5);
        assertEquals(claimed.map((j) => j.args), [{ i }]);
        await sql`update akadze.jobs set state = 'succeeded', worker_id = null,
                         finished_at = now() where id = ${claimed[0].id}`;
      }
      const read = await claimIndexReads(one) - before;
      // From the start of the index every claim reads all of them (800,000 here); from floors,
      // only the full claims (at least one, one more every two seconds) do.
      assert(read < 8 * dead, `the claims read ${read} claim index entries`);
    } finally {
      await pin`rollback`.catch(() => {});
      pin.release();
      await one.end();
    }
  });
});

Deno.test("a one-queue claim from floors still claims jobs behind them, and in priority order", async () => {
  await withApp("claimer_floors", async (app, sql, db) => {
    const work = app.task("work", () => {});
    const one = connect(db.url, { max: 1 });
    try {
      const claimer = workClaimer(one);
      const claim = async (slots: number) =>
        (await claimer.claim([{ queue: "default", slots }], slots)).claimed.map((j) => j.args);
      // Levels 0 and 3 become known, with floors near now.
      await work.enqueue({ i: "p0" });
      await work.using({ priority: 3 }).enqueue({ i: "p3" });
      assertEquals((await claim(5)).length, 2);

      // Known levels keep their order, and a higher level is claimed first as soon as it appears.
      await work.enqueue({ i: "low" });
      await work.using({ priority: 3 }).enqueue({ i: "mid" });
      await work.using({ priority: 9 }).enqueue({ i: "high" });
      assertEquals(await claim(1), [{ i: "high" }]);
      assertEquals(await claim(1), [{ i: "mid" }]);
      assertEquals(await claim(1), [{ i: "low" }]);

      // A job enqueued in a transaction that began before the last claim and commits after it.
      const late = await sql.reserve();
      try {
        await late`begin`;
        await late`select now()`;
        await new Promise((resolve) => setTimeout(resolve, 20));
        await work.enqueue({ i: "first" });
        assertEquals(await claim(1), [{ i: "first" }]);
        await work.using({ session: late }).enqueue({ i: "late" });
        await late`commit`;
      } finally {
        late.release();
      }
      assertEquals(await claim(5), [{ i: "late" }]);

      // A level between the known ones is claimed in priority order too.
      await work.enqueue({ i: "p0 again" });
      await work.using({ priority: 1 }).enqueue({ i: "between" });
      assertEquals(await claim(1), [{ i: "between" }]);
      assertEquals(await claim(1), [{ i: "p0 again" }]);

      // Behind its level's floor: a run_at an hour ago waits for the next full claim (at most
      // two seconds).
      await work.using({ runAt: new Date(Date.now() - 3_600_000) }).enqueue({ i: "past" });
      const past = await waitFor(async () => {
        const got = await claim(5);
        return got.length > 0 ? got : null;
      }, "the job behind the floor");
      assertEquals(past, [{ i: "past" }]);
    } finally {
      await one.end();
    }
  });
});

Deno.test("a costly whole-queue claim spaces the next one: 2 s while cheap, 250 times its duration when longer, at most 30 s", async () => {
  await withApp("claimer_full_cost", async (app, _sql, db) => {
    const work = app.task("work", () => {});
    const one = connect(db.url, { max: 1 });
    try {
      // A fake clock: the claimer reads it before a claim and, after a whole-queue claim,
      // again to measure it; each claim below is given the readings it takes.
      const times: number[] = [];
      const now = () => {
        const t = times.shift();
        if (t === undefined) throw new Error("the claimer read the clock more often than expected");
        return t;
      };
      const claimer = new Claimer(one, {
        schema: "akadze",
        workerId: "w1",
        tasks: ["work"],
        hooks: [],
        now,
      });
      const claim = async (...readings: number[]) => {
        times.push(...readings);
        const got = (await claimer.claim([{ queue: "default", slots: 5 }], 5)).claimed;
        assertEquals(times, [], "each reading used");
        return got.map((j) => j.args);
      };
      // A job behind its level's floor is claimed only by a whole-queue claim.
      const behind = (i: number) =>
        work.using({ runAt: new Date(Date.now() - 3_600_000) }).enqueue({ i });
      await work.enqueue({ i: 0 });
      assertEquals(await claim(0, 1), [{ i: 0 }], "the first claim is whole (took 1 ms)");
      await behind(1);
      assertEquals(await claim(1_999), [], "from floors until 2 s after a cheap one");
      assertEquals(await claim(2_000, 2_100), [{ i: 1 }], "whole again (took 100 ms)");
      await behind(2);
      assertEquals(await claim(26_999), [], "from floors for 250 times 100 ms");
      assertEquals(await claim(27_000, 27_500), [{ i: 2 }], "whole again (took 500 ms)");
      await behind(3);
      assertEquals(await claim(56_999), [], "from floors for at most 30 s");
      assertEquals(await claim(57_000, 57_001), [{ i: 3 }], "whole again (took 1 ms)");
      await behind(4);
      assertEquals(await claim(58_999), []);
      assertEquals(await claim(59_000, 59_000), [{ i: 4 }], "2 s after a cheap one again");
    } finally {
      await one.end();
    }
  });
});

Deno.test("every claim path claims one set of jobs in the same order, and none it must not", async () => {
  await withDatabase("claimer_paths", async (db, sql) => {
    // track_functions counts each call of the claim functions: the paths below are those.
    const one = connect(db.url, { max: 1 });
    await one`set track_functions = 'pl'`;
    const base = { schema: "akadze", workerId: "w1", tasks: ["work"], hooks: [] };
    // label, priority, run_at (s after a base an hour ago), limit key, and what keeps a job
    // from any claim.
    const jobs: [string, number, number, string | null, string?][] = [
      ["a", 0, 10, null],
      ["b", 0, 10, null], // same priority and run_at as a: by id
      ["c", 5, 30, null],
      ["d", 5, 20, null],
      ["e", -3, 0, null],
      ["f", 0, 5, "k"], // a limits row in the limited paths
      ["g", 5, 25, "k"],
      ["h", 0, 15, "free"], // a key without a limits row
      ["i", 10, 50, null, "expires_at = now() + interval '1 hour'"], // not expired yet
      ["j", -3, 0, null],
      ["x1", 9, 0, null, "cancel_requested_at = now()"],
      ["x2", 9, 0, null, "expires_at = now() - interval '1 second'"],
      ["x3", 9, 0, null, "run_at = now() + interval '1 hour'"],
      ["x4", 9, 0, null, "task = 'other'"],
    ];
    const expected = ["i", "d", "g", "c", "f", "a", "b", "h", "e", "j"];
    const reset = async (limits: boolean) => {
      await sql`delete from akadze.jobs`;
      await sql`delete from akadze.limits`;
      for (const [label, priority, at, key, extra] of jobs) {
        const [{ id }] = await sql`
          insert into akadze.jobs (task, queue, priority, run_at, limit_key, args)
          values ('work', 'q', ${priority},
                  date_trunc('second', now()) - interval '1 hour' + ${at} * interval '1 second',
                  ${key}, ${sql.json({ label })})
          returning id`;
        if (extra) await sql.unsafe(`update akadze.jobs set ${extra} where id = $1`, [id]);
      }
      if (limits) await setLimit(sql, "k", { maxRunning: 100 });
    };
    const calls = async () => {
      await one`select pg_stat_force_next_flush()`;
      const rows = await one`
        select funcname, calls::int as n from pg_stat_user_functions
         where schemaname = 'akadze' and funcname in ('claim_one', 'claim_one_floor')`;
      return Object.fromEntries(rows.map((r) => [r.funcname, r.n]));
    };
    const run = async (
      claimer: () => Claimer,
      requests: { queue: string; slots: number }[],
    ): Promise<string[]> => {
      const order: string[] = [];
      for (let n = 0; n < jobs.length + 1; n++) {
        const { claimed } = await claimer().claim(requests, 1);
        if (claimed.length === 0) break;
        order.push(...claimed.map((j) => (j.args as { label: string }).label));
        for (const j of claimed) {
          assertEquals([j.state, j.worker_id, j.queue, j.run_count], ["running", "w1", "q", 1]);
          assert(j.run_at instanceof Date && j.created_at instanceof Date && j.started_at);
        }
      }
      return order;
    };
    const oneQueue = [{ queue: "q", slots: 1 }];
    const twoQueues = [{ queue: "empty", slots: 1 }, { queue: "q", slots: 1 }];
    const paths: [string, boolean, () => () => Claimer, { queue: string; slots: number }[]][] = [
      [
        "claim_one: a new claimer for each claim",
        false,
        () => () => new Claimer(one, base),
        oneQueue,
      ],
      ["claim_one_floor: one claimer, its clock stopped", false, () => {
        const claimer = new Claimer(one, { ...base, now: () => 0 });
        return () => claimer;
      }, oneQueue],
      ["several queues", false, () => {
        const claimer = new Claimer(one, base);
        return () => claimer;
      }, twoQueues],
      ["limits, one queue", true, () => {
        const claimer = new Claimer(one, base);
        return () => claimer;
      }, oneQueue],
      ["limits, several queues", true, () => {
        const claimer = new Claimer(one, base);
        return () => claimer;
      }, twoQueues],
      ["an onTransition hook: one job per transaction", false, () => {
        const claimer = new Claimer(one, { ...base, hooks: [() => {}] });
        return () => claimer;
      }, twoQueues],
    ];
    try {
      for (const [name, limits, make, requests] of paths) {
        await reset(limits);
        const before = await calls();
        assertEquals(await run(make(), requests), expected, name);
        const after = await calls();
        const used = (f: string) => (after[f] ?? 0) - (before[f] ?? 0);
        if (name.startsWith("claim_one:")) assertEquals(used("claim_one_floor"), 0, name);
        if (name.startsWith("claim_one_floor:")) {
          // The first claim scans the whole queue; every later one starts from floors.
          assertEquals([used("claim_one"), used("claim_one_floor")], [1, expected.length], name);
        }
        if (name.startsWith("several") || name === "limits, several queues") {
          assertEquals(used("claim_one") + used("claim_one_floor"), 0, name);
        }
        const [{ n }] =
          await sql`select count(*)::int as n from akadze.jobs where state = 'queued'`;
        assertEquals(n, 4, `${name}: the four jobs no claim may take are left`);
      }
      const [{ marks }] = await sql`select count(*)::int as marks from akadze.limit_starts`;
      assertEquals(marks, 0, "maxRunning only: no start marks");
    } finally {
      await one.end();
    }
  });
});
