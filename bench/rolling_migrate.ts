// `deno run --allow-all bench/rolling_migrate.ts [--from COMMIT] [--rows N] [--reader S]`:
// a rolling deploy measured with real workers of an older release. The older release's
// code (`git archive COMMIT`, default the last commit before 0002) migrates a throwaway
// PostgreSQL and gets N finished rows; two of its workers run a task that ends in
// completeTx while a producer enqueues 20 jobs/s; a transaction stays open for S seconds
// while this checkout's `akadze migrate` runs. Prints how long migrate took, the longest
// enqueue, the longest gap between job starts while it ran, whether every job ran once,
// and the old workers' warnings and exit codes.
import { parseArgs } from "node:util";
import postgres from "postgres";
import { startThrowawayPostgres } from "../src/testing.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    from: { type: "string", default: "7103755^" },
    rows: { type: "string", default: "1000000" },
    reader: { type: "string", default: "15" },
  },
});
const ROWS = Number(values.rows);
const READER_MS = Number(values.reader) * 1000;
const NEW = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const decode = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

// The older release, beside this checkout's node_modules.
const OLD = await Deno.makeTempDir({ prefix: "akadze-old-" });
const archive = new Deno.Command("sh", {
  args: ["-c", `git -C "${NEW}" archive "${values.from}" | tar -x -C "${OLD}"`],
}).outputSync();
if (!archive.success) throw new Error(`git archive ${values.from}: ${decode(archive.stderr)}`);
await Deno.symlink(`${NEW}/node_modules`, `${OLD}/node_modules`);
await Deno.writeTextFile(
  `${OLD}/load_app.ts`,
  `import { Akadze } from "./mod.ts";
export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });
app.task("load", async (_args: Record<string, never>, ctx) => {
  await ctx.completeTx(async (tx) => {
    await tx\`insert into load_done (job_id) values (\${ctx.job.id})\`;
    await new Promise((resolve) => setTimeout(resolve, 50)); // the task's own work
  });
});
`,
);

const pg = await startThrowawayPostgres();
const env = { AKADZE_DATABASE_URL: pg.url, NO_COLOR: "1" };
const cli = (root: string, args: string[]) =>
  new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", `${root}/cli.ts`, ...args],
    env,
    cwd: root,
    stdout: "piped",
    stderr: "piped",
  });
const sql = postgres(pg.url, { max: 4, onnotice: () => {} });
try {
  const old = await cli(OLD, ["migrate"]).output();
  console.log(`${values.from}: ${decode(old.stdout).trim().replaceAll("\n", ", ")}`);
  await sql`create table load_done (job_id bigint primary key)`;
  await sql`insert into akadze.jobs (task, args, state, attempt, run_count, finished_at, result)
    select 'old', '{}', 'succeeded', 1, 1, now(), 'null' from generate_series(1, ${ROWS})`;
  await sql`vacuum analyze akadze.jobs`;
  const workers = [1, 2].map(() =>
    cli(OLD, ["worker", `${OLD}/load_app.ts`, "--log-format", "json"]).spawn()
  );
  let stop = false;
  let enqueued = 0;
  let longestEnqueue = 0;
  const producer = (async () => {
    while (!stop) {
      const start = performance.now();
      await sql`insert into akadze.jobs (task, args) values ('load', '{}')`;
      longestEnqueue = Math.max(longestEnqueue, performance.now() - start);
      enqueued++;
      await sleep(50);
    }
  })();
  await sleep(4_000);
  const reader = postgres(pg.url, { max: 1, onnotice: () => {} });
  const read = reader.begin(async (tx) => {
    await tx`select count(*) from akadze.jobs where state = 'queued'`;
    await sleep(READER_MS);
  });
  await sleep(200);
  const [{ from }] = await sql`select now() as from`;
  const started = performance.now();
  const migrated = await cli(NEW, ["migrate"]).output();
  const took = performance.now() - started;
  const [{ to }] = await sql`select now() as to`;
  console.log(
    `this checkout's migrate: exit ${migrated.code} after ${(took / 1000).toFixed(1)} s: ` +
      JSON.stringify(decode(migrated.stdout) + decode(migrated.stderr)),
  );
  await read;
  await reader.end();
  await sleep(5_000);
  stop = true;
  await producer;
  for (let i = 0; i < 600; i++) {
    const [{ n }] = await sql`
      select count(*)::int as n from akadze.jobs where task = 'load' and state <> 'succeeded'`;
    if (n === 0) break;
    await sleep(100);
  }
  const [counts] = await sql`
    select count(*) filter (where state = 'succeeded')::int as succeeded,
           (select count(*)::int from load_done) as completed_tx
      from akadze.jobs where task = 'load'`;
  const [{ gap }] = await sql`
    select max(g) as gap from (
      select extract(epoch from started_at - lag(started_at) over (order by started_at)) * 1000 as g
        from akadze.jobs where task = 'load' and started_at between ${from} and ${to}) s`;
  const [{ after }] = await sql`
    select count(*)::int as after from akadze.jobs where task = 'load' and started_at > ${to}`;
  console.log(
    `${enqueued} enqueued, ${counts.succeeded} succeeded, ${counts.completed_tx} completeTx rows; ` +
      `longest enqueue ${longestEnqueue.toFixed(0)} ms; longest gap between job starts while ` +
      `migrate ran ${
        Number(gap ?? 0).toFixed(0)
      } ms; ${after} jobs started by the old workers after it`,
  );
  for (const worker of workers) worker.kill("SIGTERM");
  for (const worker of workers) {
    const out = await worker.output();
    const lines = decode(out.stderr).trim().split("\n");
    const bad = lines.filter((l) =>
      !l.startsWith("{") || /"level":"(warning|error|fatal)"/.test(l)
    );
    console.log(`old worker: exit ${out.code}, ${lines.length} log lines, ${bad.length} warnings`);
    for (const line of bad.slice(0, 5)) console.log(`  ${line.slice(0, 300)}`);
  }
} finally {
  await sql.end({ timeout: 1 });
  await pg.stop();
  await Deno.remove(OLD, { recursive: true });
}
