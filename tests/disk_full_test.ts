// A full disk (SQLSTATE 53100) is a passing condition for the worker: it keeps running,
// claims nothing while writes fail, and goes on once space returns. The disk is a tiny
// tmpfs holding a tablespace with the jobs table; it is filled with a file and emptied
// again. Mounting needs root: without it the test is reported as ignored.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import type { WorkerExit } from "../src/worker/worker.ts";
import { assert, assertEquals } from "./assert.ts";
import { countJobs, startWorker, waitFor, withDatabase, withLogs } from "./_helpers.ts";

const JOBS = 100;

/** Mount a 1 MiB tmpfs owned by the postgres OS user, or return undefined when we cannot. */
async function mountTinyDisk(): Promise<string | undefined> {
  if (Deno.uid() !== 0) return undefined;
  const ids = new TextDecoder().decode(
    (await new Deno.Command("id", { args: ["postgres"] })
      .output()).stdout,
  );
  const uid = /uid=(\d+)/.exec(ids)?.[1], gid = /gid=(\d+)/.exec(ids)?.[1];
  if (!uid || !gid) return undefined;
  const dir = await Deno.makeTempDir({ prefix: "akadze-full-" });
  const out = await new Deno.Command("mount", {
    args: ["-t", "tmpfs", "-o", `size=1m,uid=${uid},gid=${gid},mode=0700`, "tmpfs", dir],
    stderr: "null",
  }).output();
  if (out.success) return dir;
  await Deno.remove(dir);
  return undefined;
}

async function unmount(dir: string): Promise<void> {
  await new Deno.Command("umount", { args: [dir] }).output();
  await Deno.remove(dir).catch(() => {});
}

/** Fill the disk with a file until the file system refuses more. */
async function fill(dir: string): Promise<void> {
  const file = await Deno.open(`${dir}/filler`, { write: true, create: true });
  const chunk = new Uint8Array(4096);
  try {
    for (;;) await file.write(chunk);
  } catch (error) {
    if (!(error instanceof Error) || !/space/i.test(error.message)) throw error;
  } finally {
    file.close();
  }
}

// Whether this machine lets us mount one (a container may not).
const probe = await mountTinyDisk();
if (probe) await unmount(probe);

Deno.test({
  name:
    "on a full disk (53100) the worker keeps running and claims nothing, and runs every job once space returns",
  ignore: probe === undefined,
  async fn() {
    const dir = await mountTinyDisk();
    assert(dir, "the tmpfs mounted a moment ago cannot be mounted again");
    const space = `akadze_full_${crypto.randomUUID().slice(0, 8)}`;
    let admin: { url: string } | undefined;
    try {
      await withLogs(async (records) => {
        await withDatabase("disk_full", async (db, sql) => {
          admin = db;
          await sql.unsafe(`create tablespace ${space} location '${dir}'`);
          // Full pages: any new row version needs a new page, which the full disk refuses.
          await sql`alter table akadze.jobs set (fillfactor = 100)`;
          await sql.unsafe(`alter table akadze.jobs set tablespace ${space}`);
          // Random hex does not compress: about five jobs to a page.
          const pad = () =>
            [...crypto.getRandomValues(new Uint8Array(750))]
              .map((b) => b.toString(16).padStart(2, "0")).join("");
          for (let i = 0; i < JOBS; i++) {
            await sql`insert into akadze.jobs (task, args)
              values ('work', ${sql.json({ pad: pad() })})`;
          }
          await fill(dir);
          const app = new Akadze({ databaseUrl: db.url });
          app.task("work", () => 1);
          const running = startWorker(app, { slots: 4 });
          let exit: WorkerExit | null = null;
          running.exit.then((e) => exit = e);
          try {
            const full = () =>
              records.filter((r) => String(r.properties.message).includes("53100")).length;
            await waitFor(() => full() >= 3 || exit !== null, "the full disk to refuse writes");
            assertEquals(exit, null, "the worker exited on a full disk");
            assertEquals(await countJobs(sql, "succeeded"), 0);
            await Deno.remove(`${dir}/filler`);
            await waitFor(
              async () => await countJobs(sql, "succeeded") === JOBS || exit !== null,
              "every job to run once space returned",
            );
            assertEquals(exit, null, "the worker exited");
            const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
              where run_count <> 1`;
            assertEquals(n, 0, "a job ran more than once");
            assertEquals((await running.stop()).code, 0);
          } finally {
            running.worker.stop();
            await running.exit;
            await app.close();
            // Back where the database's drop does not care about the tablespace.
            await Deno.remove(`${dir}/filler`).catch(() => {});
          }
        });
      });
    } finally {
      if (admin) {
        const base = new URL(admin.url);
        base.pathname = "/postgres";
        const sql = postgres(base.toString(), { max: 1, onnotice: () => {} });
        await sql.unsafe(`drop tablespace if exists ${space}`).catch(() => {});
        await sql.end();
      }
      await unmount(dir);
    }
  },
});
