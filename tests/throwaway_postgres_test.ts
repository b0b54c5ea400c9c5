// startThrowawayPostgres with each engine: it serves queries, and stop() (or the death of
// the process that started it) leaves no server process or directory behind.
import postgres from "postgres";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import { assert, assertEquals, assertRejects } from "./assert.ts";

const hasSystemPostgres = await new Deno.Command("pg_config", { args: ["--bindir"] })
  .output()
  .then((out) => out.success, () => false);

for (const engine of ["system", "embedded"] as const) {
  Deno.test({
    name: `startThrowawayPostgres: ${engine} engine serves queries and stop() removes it`,
    ignore: engine === "system" && !hasSystemPostgres,
    async fn() {
      const pg = await startThrowawayPostgres({ engine });
      let dataDir = "";
      try {
        assertEquals(pg.engine, engine);
        assertEquals(new URL(pg.url).port, String(pg.port));
        const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
        try {
          const [row] = await sql`
            select 1 as one, current_setting('data_directory') as dir,
              current_setting('fsync') as fsync,
              current_setting('server_version_num')::int / 10000 as version`;
          assertEquals([row.one, row.fsync, row.version], [1, "off", pg.version]);
          dataDir = row.dir;
        } finally {
          await sql.end();
        }
      } finally {
        await pg.stop();
      }
      await pg.stop(); // idempotent
      await assertGone(dataDir);
    },
  });
}

Deno.test("startThrowawayPostgres: the server goes away when its process is killed", async () => {
  // A child Deno process starts the embedded server (the system one shares the mechanism),
  // prints its data directory and is SIGKILLed: no stop() runs.
  const code = `
    import postgres from "postgres";
    import { startThrowawayPostgres } from ${
    JSON.stringify(new URL("../src/throwaway_postgres.ts", import.meta.url).href)
  };
    const pg = await startThrowawayPostgres({ engine: "embedded" });
    const sql = postgres(pg.url, { max: 1 });
    const [{ dir }] = await sql\`select current_setting('data_directory') as dir\`;
    await sql.end();
    console.log(dir);
    setInterval(() => {}, 1000);
  `;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", "--config", new URL("../deno.json", import.meta.url).pathname, code],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  let output = "";
  try {
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    while (!output.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      output += value;
    }
    await reader.cancel();
  } finally {
    child.kill("SIGKILL");
    await child.status;
  }
  const dataDir = output.trim();
  assert(dataDir.endsWith("/data"), `child printed no data directory: ${output}`);
  await assertGone(dataDir, 20_000);
});

/** Wait until no process mentions the data directory and its parent directory is gone. */
async function assertGone(dataDir: string, timeoutMs = 5_000): Promise<void> {
  const dir = dataDir.slice(0, -"/data".length);
  const until = Date.now() + timeoutMs;
  let left: string[] = [];
  for (;;) {
    left = await processesMentioning(dataDir);
    const exists = await Deno.stat(dir).then(() => true, () => false);
    if (!left.length && !exists) return;
    if (Date.now() > until) {
      assert(false, `still there after ${timeoutMs} ms: ${exists ? dir : ""} ${left.join(", ")}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Command lines (Linux /proc) that contain `text`. */
async function processesMentioning(text: string): Promise<string[]> {
  const found: string[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`).catch(() => "");
    if (cmdline.includes(text)) found.push(`${entry.name}: ${cmdline.replaceAll("\0", " ")}`);
  }
  return found;
}

Deno.test("halt refuses connections, resume brings the same data back, restart does both", async () => {
  const pg = await startThrowawayPostgres();
  try {
    const sql = postgres(pg.url, { max: 1, onnotice: () => {}, connect_timeout: 2 });
    await sql`create table kept (x int)`;
    await sql`insert into kept values (7)`;
    await pg.halt();
    await assertRejects(() => sql`select 1`);
    await pg.resume();
    assertEquals((await sql`select x from kept`)[0].x, 7);
    const [{ t: before }] = await sql`select pg_postmaster_start_time() as t`;
    await pg.restart();
    await sql`select 1`.catch(() => {}); // the first query after a restart may fail (57P01)
    const [{ t: after }] = await sql`select pg_postmaster_start_time() as t`;
    assert(after > before, "a new postmaster");
    await sql.end();
  } finally {
    await pg.stop();
  }
});
