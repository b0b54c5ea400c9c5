/**
 * What a pinned MVCC horizon costs the worker's statements: a long REPEATABLE READ transaction
 * on another connection keeps every claimed job's old (queued) row version, and its entry in
 * the claim index, from being removed. This builds that state fast (bulk SQL instead of a
 * 15-minute run), then measures each statement of the worker's loop at 0 / 100k / 450k such
 * entries: buffers touched (EXPLAIN ANALYZE BUFFERS) and mean time over repeated calls, each
 * call claiming one freshly enqueued job, as a steady trickle would.
 *
 *   deno run --allow-all bench/claim_horizon.ts [--steps 0,100000,450000] [--calls 200]
 *     [--steady SECONDS] [--rate JOBS_PER_S] [--recover SECONDS] [--skip-statements] [--heartbeat MS]
 *
 * With `--steady`, after the last step a worker (id of the dead running entries, one queue,
 * in this process) runs jobs enqueued at `--rate` (500) per second for that long, still pinned,
 * and the enqueue-to-start latency (p50, p99, max) and the backlog left are printed; with
 * `--recover`, the pin then ends and the same load runs that much longer, printed per 10 s.
 *
 * @module
 */
import postgres from "postgres";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { migrate } from "../src/migrate.ts";
import { parseArgs } from "node:util";
import { Akadze } from "../src/app.ts";
import { Worker } from "../src/worker/worker.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    steps: { type: "string", default: "0,100000,450000" },
    calls: { type: "string", default: "200" },
    steady: { type: "string", default: "0" },
    rate: { type: "string", default: "500" },
    recover: { type: "string", default: "0" },
    // Skip the per-statement measurements (with a schema before migration 0004, say).
    "skip-statements": { type: "boolean", default: false },
    // The steady worker's heartbeatInterval (ms; its heartbeatTtl is 6 times that).
    heartbeat: { type: "string", default: "5000" },
  },
});
const steps = values.steps.split(",").map(Number);
const calls = Number(values.calls);

const pg = await startThrowawayPostgres({ settings: { shared_buffers: "256MB" } });
const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
await admin.unsafe("create database horizon");
await admin.end();
const url = pg.url.replace(/\/postgres(\?|$)/, "/horizon$1");
const sql = postgres(url, { max: 1, onnotice: () => {} });
const pin = postgres(url, { max: 1, onnotice: () => {} });

const s = `"akadze"`;
const tasks = ["t"];
const worker = "w1";

/** The worker's statements, with the parameters a one-queue worker passes. */
const statements: Record<string, { text: string; params: unknown[] }> = {
  claim_one: {
    text: `select * from ${s}.claim_one($1, $2, $3, $4, $5)`,
    params: ["default", tasks, 10, [], worker],
  },
  // The same claim with a lower bound on run_at (a floor a minute back): as an index filter
  // (no priority given, so it cannot position the scan) and as a start key (one priority).
  claim_floor_filter: {
    text: claimWith(`and c.run_at >= now() - interval '1 minute'`),
    params: ["default", tasks, 10, [], worker],
  },
  claim_floor_level: {
    text: claimWith(`and c.priority = 0 and c.run_at >= now() - interval '1 minute'`),
    params: ["default", tasks, 10, [], worker],
  },
  // The claim from floors (migrations/0004_claim_floor.sql), floor 5 s back at priority 0.
  claim_one_floor: {
    text: `select * from ${s}.claim_one_floor($1, $2, $3, $4, $5, $6, $7)`,
    params: ["default", tasks, 10, [], worker, [0], [0]],
  },
  heartbeat: {
    text: `select array(select id::text from ${s}.jobs where worker_id = $1 and state = 'running'
             and cancel_requested_at is not null) as cancel,
           array(select id::text || ':' || run_count from ${s}.jobs
                  where worker_id = $1 and state = 'running') as running`,
    params: [worker],
  },
  // The heartbeat as it is now: cancel requests of the jobs the worker runs, by id (10 slots);
  // the list above only on a beat that looks for orphans (src/worker/heartbeat.ts).
  heartbeat_known: {
    text: `select array(select k.id::text
             from (select id, worker_id, state, cancel_requested_at from ${s}.jobs
                    where id = any($2::bigint[]) offset 0) k
            where k.worker_id = $1 and k.state = 'running'
              and k.cancel_requested_at is not null) as cancel`,
    params: [worker, Array.from({ length: 10 }, (_, i) => String(i + 1))],
  },
  // The rescue as it is now: from the stale worker rows; the scan below only every minute
  // (src/worker/rescuer.ts).
  rescue_stale: {
    text: `select c.id::text as id from ${s}.jobs c
            where c.state = 'running' and c.worker_id = any(array(
              select w.id from ${s}.workers w
               where w.heartbeat_at < now() - w.heartbeat_ttl_ms * interval '1 millisecond'))
            limit 1000`,
    params: [],
  },
  rescue_find: {
    text: `select c.id::text as id from ${s}.jobs c where c.state = 'running' and not exists (
        select 1 from ${s}.workers w where w.id = c.worker_id
           and w.heartbeat_at >= now() - w.heartbeat_ttl_ms * interval '1 millisecond')
        limit 1000`,
    params: [],
  },
  cancel: {
    text: `select c.id from ${s}.jobs c where c.state = 'queued' and c.queue = any($1::text[])
             and (c.cancel_requested_at is not null or c.expires_at <= now()) limit 500`,
    params: [["default"]],
  },
  prune_find: {
    text: `select id from ${s}.jobs where state in ('succeeded', 'failed', 'cancelled')
             and finished_at < now() - interval '1 hour' limit 1000`,
    params: [],
  },
};

/** claim_one's statement, with `extra` conditions. */
function claimWith(extra: string): string {
  return `with candidates as (
    select c.ctid from ${s}.jobs c
     where c.state = 'queued' and c.queue = $1 and c.run_at <= now() ${extra}
       and c.cancel_requested_at is null and (c.expires_at is null or c.expires_at > now())
       and c.task = any($2::text[]) and c.id <> all($4::bigint[])
       and (c.limit_key is null
            or not exists (select 1 from ${s}.limits l where l.key = c.limit_key))
     order by c.priority desc, c.run_at, c.id limit $3
     for update of c skip locked)
  update ${s}.jobs j set state = 'running', run_count = j.run_count + 1, worker_id = $5,
         started_at = now()
   where j.ctid = any(array(select ctid from candidates)) returning j.id`;
}

/** Latency percentile (ms) of `xs`. */
function pct(xs: number[], p: number): number {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN;
}

/** A worker at a steady enqueue rate, pinned, then (with --recover) unpinned. */
async function steady(held: { unsafe(text: string): Promise<unknown> }): Promise<void> {
  const app = new Akadze({ databaseUrl: url, max: 10 });
  let window: number[] = [];
  app.task("t", ({ t0 }) => {
    if (typeof t0 === "number") window.push(Date.now() - t0);
  });
  const producer = new Akadze({ databaseUrl: url, max: 2 });
  const t = producer.task("t", () => {});
  const heartbeatInterval = Number(values.heartbeat);
  const running = new Worker(app, {
    id: worker,
    schedules: false,
    slots: 10,
    heartbeatInterval,
    heartbeatTtl: 6 * heartbeatInterval,
  });
  const run = running.run();
  const rate = Number(values.rate);
  const per = Math.max(1, Math.round(rate / 100)); // a batch every 10 ms
  const phase = async (seconds: number, label: string) => {
    const end = performance.now() + seconds * 1000;
    let next = performance.now();
    let report = performance.now() + 10_000;
    while (performance.now() < end) {
      await t.enqueueMany(Array.from({ length: per }, () => ({ t0: Date.now() })));
      next += (per / rate) * 1000;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      if (performance.now() >= report || performance.now() >= end) {
        const [{ n }] = await sql.unsafe(
          `select count(*)::int as n from ${s}.jobs where state = 'queued'`,
        );
        console.log(
          `${label}: ${window.length} started, p50 ${pct(window, 0.5)} ms, p99 ${
            pct(window, 0.99)
          } ms, max ${Math.max(...window)} ms, queued ${n}`,
        );
        window = [];
        report = performance.now() + 10_000;
      }
    }
  };
  try {
    await phase(Number(values.steady), "pinned");
    await held.unsafe("rollback");
    if (Number(values.recover) > 0) await phase(Number(values.recover), "unpinned");
  } finally {
    running.stop();
    await run;
    await app.close();
    await producer.close();
  }
}

try {
  await migrate(sql);
  await sql.unsafe(
    `insert into ${s}.workers (id, hostname, pid, queues) values ($1, 'h', 1, '{}')`,
    [
      worker,
    ],
  );
  // The pin: a snapshot held open in the same database.
  const pinned = pin.reserve();
  const held = await pinned;
  await held.unsafe("begin isolation level repeatable read");
  await held.unsafe("select 1");

  let made = 0;
  for (const target of steps) {
    while (made < target) {
      const n = Math.min(50_000, target - made);
      // Enqueue, claim, complete: three row versions per job, as the worker writes them.
      await sql.unsafe(
        `insert into ${s}.jobs (task, run_at) select 't', now() - interval '1 hour'
           from generate_series(1, $1)`,
        [n],
      );
      await sql.unsafe(
        `update ${s}.jobs set state = 'running', worker_id = $1, started_at = now(),
                run_count = run_count + 1 where state = 'queued'`,
        [worker],
      );
      await sql.unsafe(
        `update ${s}.jobs set state = 'succeeded', worker_id = null, finished_at = now()
          where state = 'running'`,
      );
      made += n;
    }
    await sql.unsafe(`analyze ${s}.jobs`);
    console.log(`\n== ${made} dead claim-index entries (horizon pinned) ==`);
    statements.claim_one_floor.params[6] = [Date.now() - 5_000];
    // The dead entries' worker is alive (as in the steady run): rescue_stale finds no stale
    // worker. (A stale one's pass reads its own entries, until its jobs are rescued.)
    await sql.unsafe(`update ${s}.workers set heartbeat_at = now() where id = $1`, [worker]);
    for (
      const [name, { text, params }] of Object.entries(values["skip-statements"] ? {} : statements)
    ) {
      await sql.unsafe(`insert into ${s}.jobs (task) values ('t')`);
      const plan = await sql.unsafe(
        `explain (analyze, buffers, format json) ${text}`,
        params as [],
      );
      const top = (plan[0]["QUERY PLAN"] as { Plan: Record<string, number> }[])[0].Plan;
      const buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"];
      let total = 0;
      for (let i = 0; i < calls; i++) {
        await sql.unsafe(`insert into ${s}.jobs (task) values ('t')`);
        const t0 = performance.now();
        await sql.unsafe(text, params as []);
        total += performance.now() - t0;
        await sql.unsafe(
          `update ${s}.jobs set state = 'succeeded', worker_id = null, finished_at = now()
            where state = 'running' and worker_id = $1`,
          [worker],
        );
      }
      // Whatever was claimed or left queued by a non-claim statement goes away for the next.
      await sql.unsafe(
        `update ${s}.jobs set state = 'succeeded', worker_id = null, finished_at = now()
          where state in ('queued', 'running')`,
      );
      console.log(
        `${name.padEnd(12)} buffers ${String(buffers).padStart(7)}  mean ${
          (total / calls).toFixed(2)
        } ms over ${calls} calls`,
      );
    }
  }
  if (Number(values.steady) > 0) await steady(held);
  else await held.unsafe("rollback");
  held.release();
} finally {
  await sql.end();
  await pin.end();
  await pg.stop();
}
