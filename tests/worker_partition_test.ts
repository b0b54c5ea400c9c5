// A database that stops answering (every server process frozen, as in a network
// partition) must not freeze the worker: its lease clock runs on, and it stops with
// code 1 once the heartbeat has failed for longer than the TTL.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { migrate } from "../src/migrate.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { Worker } from "../src/worker/worker.ts";
import { assert, assertEquals } from "./assert.ts";
import { waitFor } from "./_helpers.ts";

async function signalServer(pids: number[], signal: "SIGSTOP" | "SIGCONT"): Promise<void> {
  for (const pid of pids) {
    try {
      Deno.kill(pid, signal);
    } catch {
      // the process ended meanwhile
    }
  }
  await Promise.resolve();
}

Deno.test("a frozen database (queries hang) ends the run with heartbeat_lost, not a hang", async () => {
  const pg = await startThrowawayPostgres();
  const admin = postgres(pg.url, { max: 1, onnotice: () => {} });
  let pids: number[] = [];
  try {
    await admin`create database frozen_test`;
    const url = pg.url.replace(/\/postgres$/, "/frozen_test");
    await migrate(url);
    const [{ dir }] = await admin`select current_setting('data_directory') as dir`;
    const postmaster = Number((await Deno.readTextFile(`${dir}/postmaster.pid`)).split("\n")[0]);
    const app = new Akadze({ databaseUrl: url, max: 3 });
    let started = false;
    app.task("hold", (_args, ctx) =>
      new Promise((resolve) => {
        started = true;
        ctx.signal.addEventListener("abort", () => resolve(null));
      }));
    await app.tasks.get("hold")!.enqueue();
    const worker = new Worker(app, {
      heartbeatInterval: 200,
      heartbeatTtl: 1_500,
      pollInterval: 100,
    });
    const exit = worker.run();
    await waitFor(() => started, "the job to start");
    // Freeze the postmaster and every backend: connections stay open, nothing answers.
    const out = await new Deno.Command("pgrep", { args: ["-P", String(postmaster)] }).output();
    pids = [postmaster, ...new TextDecoder().decode(out.stdout).trim().split("\n").map(Number)];
    const frozenAt = performance.now();
    await signalServer(pids, "SIGSTOP");
    const result = await exit;
    const took = performance.now() - frozenAt;
    assertEquals([result.code, result.reason], [1, "heartbeat_lost"]);
    assert(took < 15_000, `stopped after ${Math.round(took)} ms`);
    await signalServer(pids, "SIGCONT");
    pids = [];
    await app.close();
  } finally {
    await signalServer(pids, "SIGCONT");
    await admin.end({ timeout: 1 });
    await pg.stop();
  }
});
