// The hand-off of a limit key's room (migrations/0020_limit_hand_off.sql) against real
// PostgreSQL: the outcome write of a keyed job (complete_jobs with p_hand_keys) claims the next
// ready job of the same key for the writing worker in the same transaction, at most as many as
// the key has room for, counted under the key's limits row. Observable: the handed job's
// started_at is the finished job's finished_at (both the transaction's now()). Not handed when
// the key is full, its limits row is held by another transaction (waited for 50 ms only), its
// maxStarts are spent, the queue is paused or not offered, the task not run, the job has a cancel
// request, or a ready job without a limits row comes first; the 13-argument write of earlier
// workers hands nothing keyed. A worker keeps the slot of a keyed success for it.
import postgres from "postgres";
import { setLimit } from "../admin.ts";
import type { Sql } from "../src/db.ts";
import { Claimer } from "../src/worker/claimer.ts";
import { assert, assertEquals } from "./assert.ts";
import { startWorker, waitFor, withApp, withDatabase } from "./_helpers.ts";

/** Insert `n` queued jobs of task `t` with limit key `key` (and `extra` columns); their ids. */
async function enqueue(
  sql: Sql,
  n: number,
  key: string | null,
  extra: { queue?: string; priority?: number; task?: string } = {},
): Promise<string[]> {
  const rows = await sql`insert into akadze.jobs (task, queue, priority, limit_key)
    select ${extra.task ?? "t"}, ${extra.queue ?? "default"}, ${extra.priority ?? 0}, ${key}
      from generate_series(1, ${n}::int) returning id::text as id`;
  return rows.map((r) => r.id as string).sort((a, b) => Number(a) - Number(b));
}

/** Put job `id` running under worker `worker` (as a claim would); its run_count. */
async function run(sql: Sql, id: string, worker = "w1"): Promise<number> {
  const [row] = await sql`update akadze.jobs set state = 'running', worker_id = ${worker},
      run_count = run_count + 1, started_at = now()
    where id = ${id} returning run_count`;
  return row.run_count;
}

interface Write {
  queues?: string[];
  slots?: number[];
  total?: number;
  tasks?: string[];
  keys?: boolean;
}

/** Write job `id`'s success with the 14-argument complete_jobs; the ids it handed to w1. */
async function succeed(sql: Sql, id: string, runCount: number, w: Write = {}): Promise<string[]> {
  const queues = w.queues ?? ["default"];
  const rows = await sql`select id, state, claimed from akadze.complete_jobs(
      ${[id]}::bigint[], ${[runCount]}::int[], '{succeeded}', null, null, null, null, null, 'w1',
      ${queues}::text[], ${w.slots ?? queues.map(() => 1)}::int[], ${w.total ?? 1},
      ${w.tasks ?? ["t"]}::text[], ${w.keys ?? true})`;
  assertEquals(rows.filter((r) => r.claimed === null).map((r) => [r.id, r.state]), [[
    id,
    "succeeded",
  ]]);
  return rows.filter((r) => r.claimed !== null).map((r) => r.claimed.id as string);
}

/** Job `id`'s state, worker and run count. */
async function state(sql: Sql, id: string): Promise<[string, string | null, number]> {
  const [row] = await sql`select state, worker_id, run_count from akadze.jobs where id = ${id}`;
  return [row.state, row.worker_id, row.run_count];
}

Deno.test("a keyed success hands the next job of its key to the writing worker, in its transaction", async () => {
  await withDatabase("limit_hand_off_basic", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 5)`;
    const [a, b, c] = await enqueue(sql, 3, "k");
    // One handed per run ended, though the key has room for more and two slots are offered.
    const conn = await sql.reserve();
    try {
      await conn`set lock_timeout = '7s'`;
      const handed = await succeed(conn, a, await run(sql, a), { slots: [2], total: 2 });
      assertEquals(handed, [b]);
      assertEquals((await conn`show lock_timeout`)[0].lock_timeout, "7s", "the session's stays");
    } finally {
      conn.release();
    }
    assertEquals(await state(sql, b), ["running", "w1", 1]);
    assertEquals(await state(sql, c), ["queued", null, 0]);
    const [row] = await sql`select j.started_at = d.finished_at as same
      from akadze.jobs j, akadze.jobs d where j.id = ${b} and d.id = ${a}`;
    assert(row.same, "started in the transaction that finished a");
    // The claim's columns, as decodeClaimed reads them.
    const [{ claimed }] = await sql`select claimed from akadze.complete_jobs(
        ${[b]}::bigint[], '{1}', '{succeeded}', null, null, null, null, null, 'w1',
        '{default}', '{1}', 1, '{t}', true) where claimed is not null`;
    assertEquals([claimed.id, claimed.limit_key, claimed.run_count], [c, "k", 1]);
  });
});

Deno.test("the hand-off counts the key's room under its row: a full key is handed nothing", async () => {
  await withDatabase("limit_hand_off_full", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 2)`;
    const [a, b, c, d] = await enqueue(sql, 4, "k");
    const ra = await run(sql, a);
    await run(sql, b, "other");
    // The limit was lowered to 1 while two ran: a's end leaves b alone at the limit.
    await sql`update akadze.limits set max_running = 1`;
    assertEquals(await succeed(sql, a, ra, { slots: [2], total: 2 }), []);
    assertEquals((await state(sql, c))[0], "queued");
    // Two runs end together under maxRunning 2: two handed, no more.
    await sql`update akadze.limits set max_running = 2`;
    const rb = (await sql`select run_count from akadze.jobs where id = ${b}`)[0].run_count;
    await sql`update akadze.jobs set worker_id = 'w1' where id = ${b}`;
    const rc = await run(sql, c);
    const rows = await sql`select id, claimed from akadze.complete_jobs(
        ${[b, c]}::bigint[], ${[rb, rc]}::int[], '{succeeded,succeeded}', null, null, null, null,
        null, 'w1', '{default}', '{5}', 5, '{t}', true)`;
    assertEquals(rows.filter((r) => r.claimed).map((r) => r.claimed.id), [d]);
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
      where limit_key = 'k' and state = 'running'`;
    assertEquals(n, 1);
  });
});

Deno.test("a key whose limits row another transaction holds is skipped after a short wait", async () => {
  await withDatabase("limit_hand_off_locked", async (db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    const [a, b] = await enqueue(sql, 2, "k");
    const ra = await run(sql, a);
    const other = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      let release!: () => void;
      const held = new Promise<void>((r) => release = r);
      let locked!: () => void;
      const isLocked = new Promise<void>((r) => locked = r);
      const tx = other.begin(async (tx) => {
        await tx`select 1 from akadze.limits where key = 'k' for update`;
        locked();
        await held;
      });
      await isLocked;
      const conn = await sql.reserve();
      try {
        await conn`set lock_timeout = '5s'`;
        const t0 = performance.now();
        assertEquals(await succeed(conn, a, ra), []);
        // The hand-off's own lock_timeout (50 ms), not the session's; and the session's stays.
        assert(performance.now() - t0 < 4_000, "waited for the session's lock_timeout");
        assertEquals((await conn`show lock_timeout`)[0].lock_timeout, "5s");
      } finally {
        conn.release();
        release();
        await tx;
      }
      assertEquals(await state(sql, b), ["queued", null, 0]);
    } finally {
      await other.end();
    }
  });
});

Deno.test("maxStarts: a handed start is marked in limit_starts, and none is handed past the limit", async () => {
  await withDatabase("limit_hand_off_starts", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_starts, "window") values ('k', 2, '1 hour')`;
    const [a, b, c] = await enqueue(sql, 3, "k");
    const ra = await run(sql, a);
    await sql`insert into akadze.limit_starts (key, job_id) values ('k', ${a})`;
    assertEquals(await succeed(sql, a, ra), [b]);
    const marks = await sql`select job_id::text as id from akadze.limit_starts order by job_id`;
    assertEquals(marks.map((m) => m.id), [a, b]);
    assertEquals(await succeed(sql, b, 1), []);
    assertEquals(await state(sql, c), ["queued", null, 0]);
  });
});

Deno.test("not handed: paused or not offered queue, task not run, cancel requested, p_hand_keys false, the 13-argument write", async () => {
  await withDatabase("limit_hand_off_refused", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    const succeedOnce = async (w: Write) => {
      const [a] = await enqueue(sql, 1, "k");
      const [b] = await enqueue(sql, 1, "k");
      const handed = await succeed(sql, a, await run(sql, a), w);
      await sql`update akadze.jobs set state = 'cancelled', finished_at = now()
        where id = ${b} and state = 'queued'`;
      return handed;
    };
    await sql`insert into akadze.queue_pauses (queue) values ('default')`;
    assertEquals(await succeedOnce({}), [], "paused queue");
    await sql`delete from akadze.queue_pauses`;
    assertEquals(await succeedOnce({ queues: ["elsewhere"] }), [], "queue not offered");
    assertEquals(await succeedOnce({ tasks: ["other"] }), [], "task not run");
    assertEquals(await succeedOnce({ keys: false }), [], "p_hand_keys false");
    assertEquals(await succeedOnce({ total: 0 }), [], "no slot offered");
    // A cancel request: that job is not ready, the next one is handed.
    const [a, b, c] = await enqueue(sql, 3, "k");
    await sql`update akadze.jobs set cancel_requested_at = now() where id = ${b}`;
    assertEquals(await succeed(sql, a, await run(sql, a)), [c]);
    assertEquals((await state(sql, b))[0], "queued");
    // The 13-argument write of earlier workers hands no keyed job.
    const [d, e] = await enqueue(sql, 2, "k");
    await sql`update akadze.jobs set state = 'succeeded', finished_at = now() where id = ${c}`;
    const rd = await run(sql, d);
    const rows = await sql`select claimed from akadze.complete_jobs(${[d]}::bigint[],
        ${[rd]}::int[], '{succeeded}', null, null, null, null, null, 'w1', '{default}', '{1}', 1,
        '{t}')`;
    assertEquals(rows.map((r) => r.claimed), [null]);
    assertEquals((await state(sql, e))[0], "queued");
  });
});

Deno.test("a keyed job is not handed ahead of a ready job without a limits row that comes first", async () => {
  await withDatabase("limit_hand_off_order", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 1)`;
    const [a, b] = await enqueue(sql, 2, "k");
    // A higher priority, no key.
    const [high] = await enqueue(sql, 1, null, { priority: 5 });
    assertEquals(await succeed(sql, a, await run(sql, a)), []);
    assertEquals((await state(sql, b))[0], "queued");
    // The same priority, an earlier run_at, a key without a limits row.
    await sql`update akadze.jobs set priority = 0, limit_key = 'free',
        run_at = now() - interval '1 minute' where id = ${high}`;
    await run(sql, b);
    const [c] = await enqueue(sql, 1, "k");
    assertEquals(await succeed(sql, b, 1), []);
    // Ready but behind the keyed job in claim order (a later run_at), and of a task not run
    // here: neither keeps it from being handed.
    const [d] = await enqueue(sql, 1, "k");
    await sql`update akadze.jobs set run_at = now() where id = ${high}`;
    await enqueue(sql, 1, null, { priority: 9, task: "other" });
    const rc = await run(sql, c);
    assertEquals(await succeed(sql, c, rc), [d]);
  });
});

Deno.test("a worker runs a key at its maxRunning with each next job handed off by the write of the last", async () => {
  await withApp("limit_hand_off_worker", async (app, sql) => {
    const work = app.task("work", () => new Promise((r) => setTimeout(r, 5)));
    await setLimit(app.sql, "k", { maxRunning: 1 });
    await work.using({ limitKey: "k" }).enqueueMany(Array.from({ length: 6 }, () => ({})));
    // Neither a poll nor a heartbeat claims during the run: only the first claim and the
    // hand-offs start the jobs.
    const w = startWorker(app, {
      slots: 4,
      pollInterval: 120_000,
      heartbeatInterval: 60_000,
      heartbeatTtl: 180_000,
    });
    let peak = 0;
    try {
      await waitFor(async () => {
        const [s] = await sql`select
            count(*) filter (where state = 'running')::int as running,
            count(*) filter (where state = 'succeeded')::int as done from akadze.jobs`;
        peak = Math.max(peak, s.running);
        return s.done === 6;
      }, "the six jobs of the key");
    } finally {
      await w.stop();
    }
    assert(peak <= 1, `maxRunning 1 exceeded: ${peak}`);
    const rows = await sql`select j.started_at = p.finished_at as handed
      from akadze.jobs j join akadze.jobs p on p.id = j.id - 1 order by j.id`;
    assertEquals(rows.map((r) => r.handed), [true, true, true, true, true]);
  });
});

Deno.test("the claim marks the jobs of keys with a limits row: only their successes keep a slot for the hand-off", async () => {
  await withDatabase("limit_hand_off_marked", async (_db, sql) => {
    await sql`insert into akadze.limits (key, max_running) values ('k', 5)`;
    const [limited] = await enqueue(sql, 1, "k");
    const [free] = await enqueue(sql, 1, "no-row");
    const [plain] = await enqueue(sql, 1, null);
    const claimer = new Claimer(sql, { schema: "akadze", workerId: "w1", tasks: ["t"], hooks: [] });
    const { claimed } = await claimer.claim([{ queue: "default", slots: 3 }], 3);
    const marks = Object.fromEntries(claimed.map((j) => [j.id, j.limited === true]));
    assertEquals(marks, { [limited]: true, [free]: false, [plain]: false });
  });
});
