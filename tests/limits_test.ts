// Limits enforced by the claim, raced by several worker processes.
import { setLimit } from "../admin.ts";
import { assert, assertEquals } from "./assert.ts";
import { connect, type Sql } from "../src/db.ts";
import { Claimer } from "../src/worker/claimer.ts";
import { countJobs, startWorker, waitFor, withApp, workClaimer } from "./_helpers.ts";
import { WORKER_PERMISSIONS } from "./_processes.ts";

const FIXTURE = new URL("./fixtures/limits_worker.ts", import.meta.url).pathname;

function spawnWorker(url: string, options: Record<string, unknown>): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...WORKER_PERMISSIONS,
      FIXTURE,
      JSON.stringify({ pollInterval: 20, heartbeatInterval: 500, heartbeatTtl: 5000, ...options }),
    ],
    env: { AKADZE_DATABASE_URL: url },
    stdout: "null",
    stderr: "null",
    stdin: "null",
  }).spawn();
}

Deno.test("maxRunning is never exceeded by worker processes racing on one key; others flow", async () => {
  await withApp("lim_running", async (app, sql, db) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "api", { maxRunning: 2 });
    await work.using({ limitKey: "api" }).enqueueMany(
      Array.from({ length: 60 }, () => ({ ms: 15 })),
    );
    await work.using({ limitKey: "no-row" }).enqueueMany(
      Array.from({ length: 20 }, () => ({ ms: 15 })),
    );
    await work.enqueueMany(Array.from({ length: 20 }, () => ({ ms: 15 })));
    const workers = [0, 1, 2].map(() => spawnWorker(db.url, { slots: 4 }));
    let peak = 0;
    let peakFree = 0;
    try {
      await waitFor(
        async () => {
          const [s] = await sql`
          select count(*) filter (where state = 'running' and limit_key = 'api')::int as api,
                 count(*) filter (where state = 'running' and limit_key is distinct from 'api')::int
                   as free,
                 count(*) filter (where state = 'succeeded')::int as done
            from akadze.jobs`;
          peak = Math.max(peak, s.api);
          peakFree = Math.max(peakFree, s.free);
          return s.done === 100;
        },
        "all 100 jobs",
        90_000,
      );
    } finally {
      for (const w of workers) w.kill("SIGTERM");
      for (const w of workers) await w.status;
    }
    assert(peak <= 2, `maxRunning 2 exceeded: ${peak} running`);
    assertEquals(peak, 2, "the key did run at its limit");
    assert(peakFree > 2, `jobs without a limit ran alongside (peak ${peakFree})`);
    const [row] = await sql`select max(run_count)::int as runs, max(attempt)::int as attempts
                            from akadze.jobs`;
    assertEquals(row, { runs: 1, attempts: 0 }, "held jobs kept their attempt and run_count");
  });
});

Deno.test("maxStarts per window caps claims and counts them in limit_starts", async () => {
  await withApp("lim_rate", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "rate", { maxStarts: 3, window: 3_000 });
    await work.using({ limitKey: "rate" }).enqueueMany(Array.from({ length: 7 }, () => ({})));
    const free = await work.enqueue();
    const w = startWorker(app, { slots: 5 });
    try {
      await waitFor(async () => {
        const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                  where state = 'succeeded' and limit_key = 'rate'`;
        return n === 3;
      }, "the first window's three starts");
      const [{ first }] = await sql`select min(started_at) as first from akadze.limit_starts`;
      await new Promise((r) => setTimeout(r, 800));
      const [s] = await sql`select count(*) filter (where state = 'succeeded')::int as done,
                                   count(*) filter (where state = 'queued' and run_count = 0)::int
                                     as held,
                                   now() - ${first}::timestamptz < interval '3 seconds' as in_window
                              from akadze.jobs where limit_key = 'rate'`;
      if (s.in_window) assertEquals([s.done, s.held], [3, 4]);
      const [{ marks }] = await sql`select count(*)::int as marks from akadze.limit_starts`;
      assert(marks >= 3);
      await waitFor(
        async () => {
          const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
                                  where state = 'succeeded' and limit_key = 'rate'`;
          return n === 7;
        },
        "all rate-limited jobs over three windows",
        30_000,
      );
      const [row] = await sql`select state from akadze.jobs where id = ${free}`;
      assertEquals(row.state, "succeeded");
    } finally {
      await w.stop();
    }
    assertEquals(await countJobs(sql), 8);
  });
});

Deno.test("a limit key without a limits row is unlimited", async () => {
  await withApp("lim_none", async (app, sql) => {
    let running = 0;
    let peak = 0;
    const t = app.task("t", async () => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 100));
      running--;
    });
    await t.using({ limitKey: "unlimited" }).enqueueMany(Array.from({ length: 5 }, () => ({})));
    const w = startWorker(app, { slots: 5 });
    await waitFor(async () => {
      const [{ n }] =
        await sql`select count(*)::int as n from akadze.jobs where state = 'succeeded'`;
      return n === 5;
    }, "all jobs");
    await w.stop();
    assertEquals(peak, 5);
  });
});

/** `n` limit keys `tenant:00000`…, each with `limit` and `jobs(i)` queued "work" jobs. */
async function tenants(
  sql: Sql,
  n: number,
  limit: { maxRunning?: number; maxStarts?: number; windowMs?: number },
  jobs: (i: number) => number,
): Promise<void> {
  await sql`insert into akadze.limits (key, max_running, max_starts, "window")
            select format('tenant:%s', lpad(i::text, 5, '0')), ${limit.maxRunning ?? null}::int,
                   ${limit.maxStarts ?? null}::int,
                   ${limit.windowMs ?? null}::int * interval '1 millisecond'
              from generate_series(0, ${n - 1}::int) as i`;
  const counts = Array.from({ length: n }, (_, i) => jobs(i));
  await sql`insert into akadze.jobs (task, limit_key)
            select 'work', format('tenant:%s', lpad(i::text, 5, '0'))
              from unnest(${counts}::int[]) with ordinality as c(jobs, o)
             cross join lateral generate_series(1, c.jobs)
             cross join lateral (select (c.o - 1)::int as i) k`;
}

/** Running jobs per limit key: [keys with a running job, most running for one key]. */
async function runningByKey(sql: Sql): Promise<[number, number]> {
  const [row] = await sql`select count(*)::int as keys, coalesce(max(n), 0)::int as most
                            from (select limit_key, count(*) as n from akadze.jobs
                                   where state = 'running' group by limit_key) r`;
  return [row.keys, row.most];
}

Deno.test("every limited key with room starts, also past the first hundred keys by name", async () => {
  await withApp("lim_many_keys", async (app, sql) => {
    let release!: () => void;
    const held = new Promise<void>((r) => release = r);
    app.task("work", () => held);
    await tenants(sql, 105, { maxRunning: 1 }, () => 2);
    const w = startWorker(app, { slots: 300, pollInterval: 50 });
    try {
      await waitFor(
        async () => (await runningByKey(sql))[0] === 105,
        "a job of all 105 keys",
        30_000,
      );
      assertEquals(await runningByKey(sql), [105, 1], "one running job per key, never two");
    } finally {
      release();
      await w.stop();
    }
  });
});

Deno.test("maxStarts keys past the first hundred by name get their starts too", async () => {
  await withApp("lim_many_rate", async (_app, sql) => {
    await tenants(sql, 105, { maxStarts: 1, windowMs: 3_600_000 }, () => 2);
    const claimer = workClaimer(sql);
    const { claimed } = await claimer.claim([{ queue: "default", slots: 300 }], 300);
    assertEquals(claimed.length, 105, "one start for each of the 105 keys");
    assertEquals(new Set(claimed.map((j) => j.limit_key)).size, 105);
    const [{ marks }] =
      await sql`select count(distinct key)::int as marks from akadze.limit_starts`;
    assertEquals(marks, 105);
    assertEquals((await claimer.claim([{ queue: "default", slots: 300 }], 300)).claimed, []);
    const [held] = await sql`select count(*)::int as n, max(run_count)::int as runs,
                                    max(attempt)::int as attempts
                               from akadze.jobs where state = 'queued'`;
    assertEquals(held, { n: 105, runs: 0, attempts: 0 });
  });
});

Deno.test("with 10,000 limit keys every key gets its turn, one running job per key", async () => {
  await withApp("lim_10k_keys", async (_app, sql) => {
    const keys = 10_000;
    await tenants(sql, keys, { maxRunning: 1 }, (i) => 1 + (i % 2));
    await sql`analyze akadze.jobs`;
    const claimer = workClaimer(sql);
    const claim = () => claimer.claim([{ queue: "default", slots: 500 }], 500);
    const first = await claim();
    assertEquals(first.claimed.length, 500);
    // First every key gets one running job, while none finishes.
    await waitFor(
      async () => {
        await claim();
        const [running, most] = await runningByKey(sql);
        assertEquals(most, 1, "maxRunning 1 held");
        return running === keys;
      },
      "a running job for each of the 10,000 keys",
      120_000,
    );
    // Then, as jobs finish, the second jobs start.
    await waitFor(
      async () => {
        await sql`update akadze.jobs set state = 'succeeded', finished_at = now(), worker_id = null
                 where state = 'running'`;
        await claim();
        const [{ queued }] = await sql`select count(*)::int as queued from akadze.jobs
                                      where state = 'queued'`;
        return queued === 0;
      },
      "every job started",
      120_000,
    );
    const [{ runs }] = await sql`select max(run_count)::int as runs from akadze.jobs`;
    assertEquals(runs, 1);
  });
});

Deno.test("a keyed job is claimed in priority order among jobs without a key", async () => {
  await withApp("lim_priority", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "k", { maxRunning: 10 });
    const low = await work.using({ priority: 0 }).enqueue();
    const mid = await work.using({ priority: 5 }).enqueue();
    const keyed = await work.using({ priority: 10, limitKey: "k" }).enqueue();
    const claimer = workClaimer(sql);
    const order: string[] = [];
    for (let i = 0; i < 3; i++) {
      order.push(
        ...(await claimer.claim([{ queue: "default", slots: 1 }], 1)).claimed.map((j) => j.id),
      );
    }
    assertEquals(order, [keyed, mid, low]);
    assertEquals((await claimer.claim([{ queue: "default", slots: 1 }], 1)).claimed, []);

    // After a claim that found no keyed job, a new one still comes first.
    await work.using({ priority: 5 }).enqueue();
    const later = await work.using({ priority: 10, limitKey: "k" }).enqueue();
    assertEquals((await claimer.claim([{ queue: "default", slots: 1 }], 1)).claimed[0].id, later);
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now(), worker_id = null
               where queue = 'default' and state <> 'succeeded'`;

    // Two queues (the other claim statement): the same order within each queue.
    const a = await work.using({ queue: "a", priority: 5 }).enqueue();
    const b = await work.using({ queue: "b", priority: 5 }).enqueue();
    const keyedA = await work.using({ queue: "a", priority: 10, limitKey: "k" }).enqueue();
    const got = await claimer.claim([{ queue: "a", slots: 1 }, { queue: "b", slots: 1 }], 2);
    assertEquals(got.claimed.map((j) => j.id).sort(), [keyedA, b].sort());
    assertEquals((await claimer.claim([{ queue: "a", slots: 1 }], 1)).claimed[0].id, a);
  });
});

Deno.test("a keyed job starts under a steady stream of jobs without a key", async () => {
  await withApp("lim_stream", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "k", { maxRunning: 1 });
    const keyed = await work.using({ limitKey: "k" }).enqueue();
    const claimer = workClaimer(sql);
    const claimed: string[] = [];
    // Each round a new job without a key arrives before the claim of one slot.
    for (let i = 0; i < 5 && !claimed.includes(keyed); i++) {
      await work.enqueue();
      claimed.push(
        ...(await claimer.claim([{ queue: "default", slots: 1 }], 1)).claimed.map((j) => j.id),
      );
    }
    assertEquals(claimed[0], keyed, "the oldest job, keyed, starts first");
  });
});

Deno.test("with onTransition hooks, a rolled-back keyed claim is skipped and the rest follow in order", async () => {
  await withApp("lim_hooks", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "k", { maxRunning: 5 });
    const bad = await work.using({ priority: 10, limitKey: "k" }).enqueue();
    const keyed = await work.using({ priority: 5, limitKey: "k" }).enqueue();
    const free = await work.using({ priority: 1 }).enqueue();
    const claimer = new Claimer(sql, {
      schema: "akadze",
      workerId: "w1",
      tasks: ["work"],
      hooks: [(_tx, job) => {
        if (job.id === bad) throw new Error("refused");
      }],
    });
    const got = await claimer.claim([{ queue: "default", slots: 3 }], 3);
    assertEquals([got.claimed.map((j) => j.id), got.rolledBack], [[keyed, free], 1]);
    const [row] = await sql`select state, run_count from akadze.jobs where id = ${bad}`;
    assertEquals(row, { state: "queued", run_count: 0 });
  });
});

Deno.test("claimers racing over many limit keys never start two jobs of a key with maxRunning 1", async () => {
  await withApp("lim_race_keys", async (_app, sql, db) => {
    await tenants(sql, 300, { maxRunning: 1 }, () => 3);
    const pools = [0, 1, 2, 3].map(() => connect(db.url, { max: 2 }));
    try {
      const claimers = pools.map((pool) => workClaimer(pool));
      await waitFor(
        async () => {
          await Promise.all(claimers.map((c) => c.claim([{ queue: "default", slots: 40 }], 40)));
          return (await runningByKey(sql))[0] === 300;
        },
        "a running job for each of the 300 keys",
        60_000,
      );
      assertEquals(await runningByKey(sql), [300, 1]);
    } finally {
      await Promise.all(pools.map((pool) => pool.end()));
    }
  });
});

Deno.test("a finished keyed job lets the next job of its key start without waiting for the poll", async () => {
  await withApp("lim_freed_wakes", async (app, sql) => {
    const work = app.task("work", () => {});
    await setLimit(app.sql, "k", { maxRunning: 1 });
    await work.using({ limitKey: "k" }).enqueueMany([{}, {}, {}]);
    // Neither a poll nor a heartbeat wakes the loop during the wait below.
    const w = startWorker(app, {
      slots: 4,
      pollInterval: 120_000,
      heartbeatInterval: 60_000,
      heartbeatTtl: 180_000,
    });
    try {
      await waitFor(
        async () => (await countJobs(sql, "succeeded")) === 3,
        "the three jobs of the key, one after another",
        20_000,
      );
    } finally {
      await w.stop();
    }
  });
});

Deno.test("the check for a key with room looks past the first hundred keys at their limit", async () => {
  await withApp("lim_key_walk", async (_app, sql) => {
    // 150 keys at their maxRunning 1, each with one more job queued.
    await tenants(sql, 150, { maxRunning: 1 }, () => 2);
    await sql`update akadze.jobs set state = 'running', worker_id = 'elsewhere', started_at = now()
               where id in (select min(id) from akadze.jobs group by limit_key)`;
    await sql`analyze akadze.jobs`;
    const claimer = workClaimer(sql);
    const claim = () => claimer.claim([{ queue: "default", slots: 5 }], 5);
    assertEquals((await claim()).claimed, [], "every key is at its limit");
    // The last key by name gets room: found although the walk of queued keys stops earlier.
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now(), worker_id = null
               where state = 'running' and limit_key = 'tenant:00149'`;
    const got = await claim();
    assertEquals(got.claimed.map((j) => j.limit_key), ["tenant:00149"]);
    assertEquals((await claim()).claimed, [], "and then no key has room again");
    // With few keys queued the walk sees them all: a key with room, then none.
    await sql`delete from akadze.jobs where limit_key > 'tenant:00002'`;
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now(), worker_id = null
               where state = 'running' and limit_key = 'tenant:00001'`;
    assertEquals((await claim()).claimed.map((j) => j.limit_key), ["tenant:00001"]);
    assertEquals((await claim()).claimed, []);
    // Jobs without a key are claimed meanwhile.
    await sql`insert into akadze.jobs (task) values ('work'), ('work')`;
    assertEquals((await claim()).claimed.map((j) => j.limit_key), [null, null]);
  });
});

Deno.test("claim_one_checked claims as claim_one unless a limit key has room and a ready job", async () => {
  await withApp("lim_checked", async (_app, sql) => {
    const checked = (levels: string) =>
      sql.unsafe(
        `select id::text as id, limit_key, keyed
           from akadze.claim_one_checked('default', '{work}', 5, '{}', 'w1', ${levels})`,
      );
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    const [{ id: keyed }] = await sql`insert into akadze.jobs (task, limit_key)
      values ('work', 'k') returning id::text as id`;
    const [{ id: free }] = await sql`insert into akadze.jobs (task) values ('work')
      returning id::text as id`;
    // The key has room and a ready job: only the answer, nothing claimed.
    assertEquals([...await checked("null, null")], [{ id: null, limit_key: null, keyed: "key" }]);
    assertEquals(await countJobs(sql, "running"), 0);
    // At its limit: the jobs without a limits row are claimed, from floors too.
    await sql`update akadze.jobs set state = 'running', worker_id = 'elsewhere',
      started_at = now() where limit_key = 'k'`;
    await sql`insert into akadze.jobs (task, limit_key) values ('work', 'k')`;
    assertEquals([...await checked("'{0}', '{0}'")], [{ id: free, limit_key: null, keyed: null }]);
    // A paused queue: nothing, and no answer.
    await sql`update akadze.jobs set state = 'queued', worker_id = null where id = ${keyed}`;
    await sql`insert into akadze.queue_pauses (queue) values ('default')`;
    assertEquals([...await checked("null, null")], []);
    // More keys queued than the check looks at, none with room: it cannot tell.
    await sql`delete from akadze.queue_pauses`;
    await sql`update akadze.jobs set state = 'running', worker_id = 'elsewhere',
      started_at = now() where id = ${keyed}`;
    await tenants(sql, 120, { maxRunning: 1 }, () => 1);
    await sql`update akadze.jobs set state = 'running', worker_id = 'elsewhere',
      started_at = now() where limit_key like 'tenant:%'`;
    await sql`insert into akadze.jobs (task, limit_key)
      select 'work', key from akadze.limits where key like 'tenant:%'`;
    assertEquals([...await checked("null, null")], [{
      id: null,
      limit_key: null,
      keyed: "unknown",
    }]);
  });
});
