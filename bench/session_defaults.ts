/**
 * What a database's session defaults cost a drain: N no-op jobs drained by `--workers` apps
 * in this process (one `Worker` of `--slots` slots each) on a database whose
 * `default_transaction_isolation` is each of `--levels`, on one throwaway server. Prints per
 * level the drain's seconds, the transactions rolled back (`pg_stat_database.xact_rollback`)
 * and whether every job ran once. The worker runs its own statements at read committed
 * whatever the default (src/worker/session_settings.ts); run it on an older checkout to see
 * what the default cost before.
 *
 *   deno run --allow-all bench/session_defaults.ts [--n 20000] [--workers 6] [--slots 20]
 *     [--levels "read committed,repeatable read,serializable"]
 *
 * @module
 */
import postgres from "postgres";
import { Akadze, Worker } from "../mod.ts";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { flagValue } from "./lib/flags.ts";

const flag = (name: string, fallback: string) => flagValue(Deno.args, name, fallback);
const N = Number(flag("--n", "20000"));
const WORKERS = Number(flag("--workers", "6"));
const SLOTS = Number(flag("--slots", "20"));
const LEVELS = flag("--levels", "read committed,repeatable read,serializable").split(",");

const server = await startThrowawayPostgres({});
const admin = postgres(server.url, { max: 1, onnotice: () => {} });
try {
  for (const [i, level] of LEVELS.entries()) {
    if (!/^(read committed|repeatable read|serializable)$/.test(level)) {
      throw new Error(`--levels: unknown isolation level ${JSON.stringify(level)}`);
    }
    const name = `session_defaults_${i}`;
    await admin.unsafe(`create database ${name}`);
    await admin.unsafe(`alter database ${name} set default_transaction_isolation = '${level}'`);
    const url = server.url.replace(/\/[^/]*$/, `/${name}`);
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    await migrate(sql);
    await sql`insert into akadze.jobs (task) select 'work' from generate_series(1, ${N}::int)`;
    const rollbacks = async () => {
      const [{ n }] = await sql`select xact_rollback::int as n from pg_stat_database
        where datname = current_database()`;
      return n as number;
    };
    const before = await rollbacks();
    const runs = new Map<string, number>();
    const apps = Array.from({ length: WORKERS }, () => new Akadze({ databaseUrl: url, max: 4 }));
    for (const app of apps) {
      app.task("work", (_args: unknown, ctx) => {
        runs.set(ctx.job.id, (runs.get(ctx.job.id) ?? 0) + 1);
      });
    }
    const start = performance.now();
    const workers = apps.map((app) => new Worker(app, { slots: SLOTS, schedules: false }));
    const exits = workers.map((w) => w.run());
    while (runs.size < N) await new Promise((r) => setTimeout(r, 10));
    const seconds = (performance.now() - start) / 1000;
    for (const w of workers) w.stop();
    await Promise.all(exits);
    await Promise.all(apps.map((app) => app.close()));
    // The workers' sessions report their counts as they end.
    for (;;) {
      const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
        where datname = current_database() and pid <> pg_backend_pid()`;
      if (n === 0) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    await sql`select pg_stat_force_next_flush()`;
    const twice = [...runs.values()].filter((n) => n > 1).length;
    console.log(
      `${level}: ${N} jobs in ${seconds.toFixed(2)} s, ${
        (await rollbacks()) - before
      } transactions rolled back, ${twice} jobs run twice`,
    );
    await sql.end();
  }
} finally {
  await admin.end();
  await server.stop();
}
