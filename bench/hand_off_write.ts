/**
 * What the hand-off costs an outcome write without dependents: batches of `--batch` (500) plain
 * successes written by `complete_jobs` with 8 arguments (0014, no hand-off), with 13 (0016) and
 * an offer of as many slots, and with 13 and nothing offered, in rotating order on one
 * connection of a throwaway server (fsync off), each on freshly inserted running jobs; prints
 * the median client-side time of each after 5 unmeasured rounds.
 *
 *   deno run --allow-all bench/hand_off_write.ts [ROUNDS, default 80] [--batch N]
 *
 * @module
 */
import postgres from "postgres";
import { parseArgs } from "node:util";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { migrate } from "../src/migrate.ts";

const { values, positionals } = parseArgs({
  args: Deno.args,
  allowPositionals: true,
  options: { batch: { type: "string", default: "500" } },
});
const n = Number(values.batch);
const rounds = Number(positionals[0] ?? 80);
const pg = await startThrowawayPostgres({ durable: false });
const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
try {
  await migrate(sql);
  const kinds = Array(n).fill("succeeded");
  const eight = `select id, state, attempt, run_at_ms
    from akadze.complete_jobs($1, $2, $3, $4, $5, $6, $7, $8)`;
  const thirteen = `select id, state, attempt, run_at_ms, has_dependents, claimed
    from akadze.complete_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`;
  const ways: Record<string, (base: unknown[]) => unknown[]> = {
    "8 arguments (0014)": (base) => base,
    "13 arguments, an offer": (base) => [...base, "w", ["default"], [n], n, ["t"]],
    "13 arguments, nothing offered": (base) => [...base, "", [], [], 0, []],
  };
  const names = Object.keys(ways);
  const times = new Map(names.map((name) => [name, [] as number[]]));
  for (let r = 0; r < rounds + 5; r++) {
    for (let k = 0; k < names.length; k++) {
      const name = names[(k + r) % names.length];
      const rows = await sql`
        insert into akadze.jobs (task, state, worker_id, started_at, run_count)
        select 't', 'running', 'w', now(), 1 from generate_series(1, ${n})
        returning id::text as id`;
      const base = [
        rows.map((row) => row.id),
        rows.map(() => 1),
        kinds,
        null,
        null,
        null,
        null,
        null,
      ];
      const text = name.startsWith("8") ? eight : thirteen;
      const t0 = performance.now();
      await sql.unsafe(text, ways[name](base) as never, { prepare: true }).values();
      if (r >= 5) times.get(name)!.push(performance.now() - t0);
      await sql`delete from akadze.jobs`;
    }
  }
  const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  for (const [name, t] of times) {
    console.log(`${name}: median ${median(t).toFixed(2)} ms over ${t.length} writes of ${n}`);
  }
} finally {
  await sql.end();
  await pg.stop();
}
