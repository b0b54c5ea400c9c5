// The current `migrate` run on a database at each earlier schema version while that
// version's workers, a producer and a long reader use it, as during a rolling deploy: no
// deadlock, no enqueue or claim held back for long, no job lost, and the workers of the
// older version keep working on the newer schema.
import postgres from "postgres";
import { assert, assertEquals } from "./assert.ts";
import { applyMigrations, knownVersions, migrate, MIGRATIONS } from "../src/migrate.ts";
import type { Sql } from "../src/db.ts";
import { createTestDatabase } from "../src/testing.ts";

/** Finished rows in the table: enough that an index build on it takes a measurable time. */
const FINISHED_ROWS = 300_000;
/** How long the reader's transaction stays open while migrate runs. */
const READER_MS = 6_000;
/** The longest an enqueue, a claim or a completeTx may wait (the reader holds 6 s). */
const STALL_BOUND_MS = 3_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every statement's duration and every failure of one kind of load. */
class Record {
  longestMs = 0;
  errors: string[] = [];
  async time<T>(fn: () => Promise<T>): Promise<T | undefined> {
    const start = performance.now();
    try {
      return await fn();
    } catch (error) {
      const e = error as { code?: string; message?: string };
      this.errors.push(`${e.code ?? ""} ${e.message ?? String(error)}`);
      return undefined;
    } finally {
      this.longestMs = Math.max(this.longestMs, performance.now() - start);
    }
  }
}

/**
 * The load of a deployment at an older version, with only the statements that version's
 * workers run (claim_one and complete_jobs exist since 0001): the producer inserts a job
 * every 50 ms; each worker claims one job and ends it in a completeTx-like transaction (lock
 * the job row, write the task's own row, write the outcome).
 */
async function underLoad(
  sql: Sql,
  during: () => Promise<void>,
): Promise<{ enqueue: Record; claim: Record; complete: Record; enqueued: number }> {
  const enqueue = new Record();
  const claim = new Record();
  const complete = new Record();
  let stop = false;
  let enqueued = 0;
  const producer = (async () => {
    while (!stop) {
      const rows = await enqueue.time(() =>
        sql`insert into akadze.jobs (task, args) values ('load', '{}') returning id`
      );
      if (rows) enqueued++;
      await sleep(50);
    }
  })();
  let draining = false;
  const worker = async (name: string) => {
    while (true) {
      const rows = await claim.time(() =>
        sql`select id, run_count from akadze.claim_one('default', array['load'], 1, '{}', ${name})`
      );
      if (!rows || rows.length === 0) {
        if (draining && rows) return;
        await sleep(20);
        continue;
      }
      const [{ id, run_count }] = rows;
      await complete.time(() =>
        sql.begin(async (tx) => {
          await tx`select state from akadze.jobs where id = ${id} for update`;
          await tx`insert into load_done (job_id) values (${id})`;
          await sleep(50); // the task's own work, inside its transaction
          await tx`select * from akadze.complete_jobs(
            array[${id}]::bigint[], array[${run_count}]::int[], array['succeeded'],
            array[null]::text[], array[null]::text[], array[null]::float8[])`;
        })
      );
    }
  };
  const workers = [worker("w1"), worker("w2")];
  await sleep(500);
  try {
    await during();
    await sleep(500);
  } finally {
    stop = true;
    await producer;
    draining = true;
    await Promise.all(workers);
  }
  return { enqueue, claim, complete, enqueued };
}

for (let applied = 1; applied < MIGRATIONS.length; applied++) {
  const from = MIGRATIONS[applied - 1].version;
  Deno.test(`migrate from ${from} under load: no deadlock, no long stall, nothing lost`, async () => {
    const db = await createTestDatabase({ name: `migrate_load_${applied}` });
    const sql = postgres(db.url, { max: 8, onnotice: () => {} });
    const reader = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      await applyMigrations(sql, MIGRATIONS.slice(0, applied));
      await sql`create table load_done (job_id bigint primary key)`;
      await sql`insert into akadze.jobs (task, args, state, attempt, run_count, finished_at, result)
        select 'old', '{}', 'succeeded', 1, 1, now(), 'null'
          from generate_series(1, ${FINISHED_ROWS})`;
      await sql`analyze akadze.jobs`;
      let migrated: string[] = [];
      const load = await underLoad(sql, async () => {
        const read = reader.begin(async (tx) => {
          await tx`select count(*) from akadze.jobs where state = 'queued'`;
          await sleep(READER_MS);
        });
        await sleep(200);
        migrated = await migrate(db.url);
        await read;
      });
      assertEquals(migrated, knownVersions().slice(applied));
      const { enqueue, claim, complete } = load;
      const summary = Object.entries({ enqueue, claim, complete }).map(([name, r]) =>
        `${name}: longest ${Math.round(r.longestMs)} ms, errors ${JSON.stringify(r.errors)}`
      ).join("; ");
      for (const record of [enqueue, claim, complete]) {
        assertEquals(record.errors, [], summary);
        assert(record.longestMs < STALL_BOUND_MS, summary);
      }
      const [counts] = await sql`
        select count(*) filter (where state = 'succeeded')::int as succeeded,
               count(*)::int as all,
               (select count(*)::int from load_done) as done
          from akadze.jobs where task = 'load'`;
      assertEquals(counts, { succeeded: load.enqueued, all: load.enqueued, done: load.enqueued });
      const invalid = await sql`
        select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid
         where c.relnamespace = 'akadze'::regnamespace and not (i.indisvalid and i.indisready)`;
      assertEquals(invalid.map((r) => r.relname), []);
    } finally {
      await reader.end({ timeout: 1 });
      await sql.end({ timeout: 1 });
      await db.close();
    }
  });
}
