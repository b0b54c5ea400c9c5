// What keeping finished jobs costs the drain, by where they are kept. Not part of
// `deno task bench`; run
//
//   deno run --allow-all bench/storage.ts [--n 50000] [--rounds 3] [--out bench/results/DATE-storage]
//
// Interleaved drains of N no-op jobs by one Worker (slots 500, prepared statements, JIT off)
// on one durable throwaway PostgreSQL, with a succeeded job's outcome written
//   - "update": as src does (complete_jobs: the row stays in `jobs`, marked succeeded);
//   - "history": moved to a history table with the same columns, primary key and finished_at
//     index (DELETE ... RETURNING into INSERT, one statement per batch; NOT what akadze does:
//     akadze keeps finished jobs in `jobs`, this measures what changing that would buy);
//   - "delete": deleted (`retention: 0`, what graphile-worker does with a finished job).
// Reports the drain rate and the CPU per 1,000 jobs of the worker (this process) and of the
// whole server. Writes <out>.json and <out>.md.
import postgres from "postgres";
import { Akadze, Worker } from "../mod.ts";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { Completer, type CompleteResult, type Outcome } from "../src/worker/completer.ts";
import { flagValue } from "./lib/flags.ts";
import { HISTORY_DDL, MOVE_SUCCEEDED } from "./lib/history.ts";
import { cpuMs, postgresCpuMs, readPostmasterPid } from "./lib/proc.ts";
import { fmt, summarize } from "./lib/report.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
function flag(name: string, fallback: string): string {
  return flagValue(Deno.args, name, fallback);
}
const N = Number(flag("--n", "50000"));
const ROUNDS = Number(flag("--rounds", "3"));
const DATE = new Date().toISOString().slice(0, 10);
const OUT = flag("--out", `${ROOT}/bench/results/${DATE}-storage`);
const VARIANTS = ["update", "history", "delete"] as const;
type Variant = typeof VARIANTS[number];

// The "history" variant swaps the outcome write of all-succeeded batches (all of them
// here: the handler is a no-op) for the move; everything else goes through src.
let variant: Variant = "update";
let pool: postgres.Sql | null = null;
const write = Completer.prototype.write;
Completer.prototype.write = async function (
  this: Completer,
  outcomes: readonly Outcome[],
): Promise<CompleteResult> {
  if (variant !== "history" || outcomes.some((o) => o.kind !== "succeeded")) {
    return await write.call(this, outcomes);
  }
  const rows = await pool!.unsafe(
    MOVE_SUCCEEDED,
    [outcomes.map((o) => o.id), outcomes.map((o) => o.runCount)],
    { prepare: true },
  );
  const moved = new Set(rows.map((r) => r.id as string));
  return {
    written: rows.map((r) => ({ id: r.id, state: r.state })),
    stale: outcomes.filter((o) => !moved.has(o.id)),
    rolledBack: [],
  };
};

const server = await startThrowawayPostgres({ durable: true });
const results: Record<Variant, { rate: number[]; worker: number[]; server: number[] }> = {
  update: { rate: [], worker: [], server: [] },
  history: { rate: [], worker: [], server: [] },
  delete: { rate: [], worker: [], server: [] },
};
try {
  await migrate(server.url);
  const probe = postgres(server.url, { max: 1, onnotice: () => {} });
  for (const ddl of HISTORY_DDL) await probe.unsafe(ddl);
  const [{ dir }] = await probe`select current_setting('data_directory') as dir`;
  const postmaster = await readPostmasterPid(dir);
  for (let round = 0; round < ROUNDS; round++) {
    // Rotate the order each round, so no variant always follows the same one.
    const order = VARIANTS.map((_, i) => VARIANTS[(i + round) % VARIANTS.length]);
    for (const v of order) {
      variant = v;
      pool = postgres(server.url, {
        max: 10,
        prepare: true,
        onnotice: () => {},
        connection: { jit: "off" },
      });
      await pool`truncate akadze.jobs, akadze.history`;
      const app = new Akadze({ sql: pool, ...(v === "delete" ? { retention: 0 } : {}) });
      app.task("noop", () => {});
      await pool`insert into akadze.jobs (task) select 'noop' from generate_series(1, ${N})`;
      await pool`vacuum analyze akadze.jobs`;
      await pool`checkpoint`;
      const [w0, s0, t0] = [await cpuMs(), await postgresCpuMs(postmaster), performance.now()];
      const worker = new Worker(app, { slots: 500, schedules: false });
      const run = worker.run();
      for (;;) {
        const [{ busy }] = await probe`
          select exists (select 1 from akadze.jobs where state = 'queued')
              or exists (select 1 from akadze.jobs where state = 'running') as busy`;
        if (!busy) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      const [w1, s1, t1] = [await cpuMs(), await postgresCpuMs(postmaster), performance.now()];
      worker.stop();
      await run;
      await app.close();
      const [{ kept }] = await probe`
        select (select count(*) from akadze.jobs where state = 'succeeded')
             + (select count(*) from akadze.history) as kept`;
      const expected = v === "delete" ? 0 : N;
      if (Number(kept) !== expected) throw new Error(`${v}: ${kept} jobs kept, not ${expected}`);
      results[v].rate.push(N / (t1 - t0) * 1000);
      results[v].worker.push((w1 - w0) / N * 1000);
      results[v].server.push((s1 - s0) / N * 1000);
      console.log(
        `round ${round + 1}/${ROUNDS} ${v}: ${fmt(N / (t1 - t0) * 1000)} jobs/s, CPU per 1,000 ` +
          `jobs: worker ${fmt((w1 - w0) / N * 1000)} ms, PostgreSQL ${
            fmt((s1 - s0) / N * 1000)
          } ms`,
      );
    }
  }
  await probe.end();
} finally {
  await server.stop();
}

const med = (values: number[]) => summarize(values).median;
const range = (values: number[], digits = 0) => {
  const s = summarize(values);
  return `${fmt(s.median, digits)} (${fmt(s.min, digits)}–${fmt(s.max, digits)})`;
};
const md = [
  `# What keeping finished jobs costs the drain (${DATE})`,
  "",
  `Command: \`deno run --allow-all bench/storage.ts --n ${N} --rounds ${ROUNDS}\`. ` +
  `Interleaved drains of ${fmt(N)} no-op jobs, one Worker (slots 500, prepare: true, JIT off), ` +
  `durable throwaway PostgreSQL; medians (min–max) of ${ROUNDS} rounds. "history" is not ` +
  "what akadze does (akadze keeps finished jobs in `jobs`); it measures what moving them " +
  "to a table of their own would buy.",
  "",
  "| succeeded job's row | drain jobs/s | × update | worker CPU ms / 1,000 jobs | PostgreSQL CPU ms / 1,000 jobs |",
  "|---|---:|---:|---:|---:|",
  ...VARIANTS.map((v) =>
    `| ${
      {
        update: "updated in `jobs` (src)",
        history: "moved to a history table",
        delete: "deleted (`retention: 0`)",
      }[v]
    } | ${range(results[v].rate)} | ${
      fmt(med(results[v].rate)! / med(results.update.rate)!, 2)
    } | ` +
    `${range(results[v].worker)} | ${range(results[v].server)} |`
  ),
  "",
];
await Deno.writeTextFile(`${OUT}.md`, md.join("\n"));
await Deno.writeTextFile(
  `${OUT}.json`,
  JSON.stringify({ date: DATE, n: N, rounds: ROUNDS, results }, null, 2),
);
console.log(md.join("\n"));
console.log(`wrote ${OUT}.md and ${OUT}.json`);
