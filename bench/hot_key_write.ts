/**
 * Where a hot key's time goes: one worker of `--slots` slots in this process runs jobs of one
 * limit key (`maxRunning` `--max-running`) that wait `--task-ms` each, on a durable throwaway
 * server with pg_stat_statements and track_functions. Over `--seconds` after a second of
 * warm-up it prints jobs/s, the tasks' own time, the gap from a task's end to the next start,
 * the outcome writes' time (`Completer.write`, timed in process), and per statement and
 * function the mean time in PostgreSQL; then one autocommit UPDATE and `select 1` for the
 * commit and the round trip.
 *
 *   deno run --allow-all bench/hot_key_write.ts [--slots 8] [--max-running 5] [--task-ms 5]
 *     [--seconds 5] [--jobs 20000]
 *
 * @module
 */
import postgres from "postgres";
import { Akadze, Worker } from "../mod.ts";
import { migrate, setLimit } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { Completer } from "../src/worker/completer.ts";
import { flagValue } from "./lib/flags.ts";

const flag = (name: string, fallback: string) => Number(flagValue(Deno.args, name, fallback));
const SLOTS = flag("--slots", "8");
const MAX_RUNNING = flag("--max-running", "5");
const TASK_MS = flag("--task-ms", "5");
const SECONDS = flag("--seconds", "5");
const JOBS = flag("--jobs", "20000");

const server = await startThrowawayPostgres({
  durable: true,
  settings: {
    shared_preload_libraries: "pg_stat_statements",
    "pg_stat_statements.track": "all",
    track_functions: "all",
  },
});
const sql = postgres(server.url, { max: 1, onnotice: () => {} });
const median = (xs: number[]) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ms = (x: number) => x.toFixed(2);
try {
  await migrate(sql);
  await sql`create extension pg_stat_statements`;
  const app = new Akadze({ databaseUrl: server.url, max: 4 });
  const starts: number[] = [];
  const ends: number[] = [];
  app.task("hot", async () => {
    starts.push(performance.now());
    await new Promise((r) => setTimeout(r, TASK_MS));
    ends.push(performance.now());
  });
  // Each outcome write, timed around the method the worker calls.
  const writes: { start: number; end: number }[] = [];
  const write = Completer.prototype.write;
  Completer.prototype.write = async function (this: Completer, ...args) {
    const start = performance.now();
    try {
      return await write.apply(this, args);
    } finally {
      writes.push({ start, end: performance.now() });
    }
  };
  await setLimit(sql, "hot", { maxRunning: MAX_RUNNING });
  await sql`insert into akadze.jobs (task, limit_key)
    select 'hot', 'hot' from generate_series(1, ${JOBS}::int)`;
  const worker = new Worker(app, { slots: SLOTS, schedules: false });
  const exit = worker.run();
  await new Promise((r) => setTimeout(r, 1_000));
  await sql`select pg_stat_statements_reset()`;
  await sql`select pg_stat_reset()`;
  const from = starts.length;
  const t0 = performance.now();
  const w0 = writes.length;
  await new Promise((r) => setTimeout(r, SECONDS * 1_000));
  const t1 = performance.now();
  const to = starts.length;
  worker.stop();
  await exit;
  await app.close();

  const tasks = starts.slice(from, Math.min(to, ends.length)).map((s, i) => ends[from + i] - s);
  const sortedEnds = ends.slice().sort((a, b) => a - b);
  const gaps: number[] = [];
  for (let i = from, j = 0; i < to; i++) {
    while (j + 1 < sortedEnds.length && sortedEnds[j + 1] <= starts[i]) j++;
    if (sortedEnds[j] <= starts[i]) gaps.push(starts[i] - sortedEnds[j]);
  }
  const written = writes.slice(w0).map((w) => w.end - w.start);
  console.log(
    `${Math.round((to - from) / ((t1 - t0) / 1000))} jobs/s; task ${ms(median(tasks))} ms, ` +
      `end to next start ${ms(median(gaps))} ms, outcome write ${ms(median(written))} ms ` +
      `(${written.length} writes; medians)`,
  );
  console.log("in PostgreSQL, per call (ms):");
  for (
    const r of await sql`select calls, total_exec_time / calls as ms,
        left(regexp_replace(query, '\\s+', ' ', 'g'), 70) as query
      from pg_stat_statements where calls >= ${written.length / 2}
      order by total_exec_time desc limit 6`
  ) console.log(`  ${ms(r.ms)}  ${r.calls} × ${r.query}`);
  for (
    const r of await sql`select funcid::regprocedure::text as f, calls,
        total_time / calls as total, self_time / calls as self
      from pg_stat_user_functions where calls >= ${written.length / 2}
      order by total_time desc`
  ) console.log(`  ${ms(r.total)} (self ${ms(r.self)})  ${r.calls} × ${r.f.slice(0, 60)}`);
  const time = async (n: number, q: () => Promise<unknown>) => {
    const t = performance.now();
    for (let i = 0; i < n; i++) await q();
    return (performance.now() - t) / n;
  };
  const update = await time(200, () => sql`update akadze.limits set max_running = max_running`);
  const select = await time(200, () => sql`select 1`);
  console.log(`an autocommit UPDATE ${ms(update)} ms, select 1 ${ms(select)} ms (from Deno)`);
} finally {
  await sql.end();
  await server.stop();
}
