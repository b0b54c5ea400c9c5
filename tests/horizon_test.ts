// What holds back the cleanup of the jobs table, as the metrics report it: an open
// REPEATABLE READ transaction on another connection, seen with and without pg_monitor.
import postgres from "postgres";
import { renderMetrics } from "../src/metrics.ts";
import { migrate } from "../src/migrate.ts";
import { checkDatabase } from "../src/cli/health.ts";
import { startThrowawayPostgres } from "../src/throwaway_postgres.ts";
import type { Sql } from "../src/db.ts";
import { assert, assertEquals, assertMatch } from "./assert.ts";
import { waitFor, withDatabase } from "./_helpers.ts";
import { assertPromtoolAccepts } from "./_promtool.ts";

/** The value of a sample of `text` (`name` with its labels, as printed), or NaN. */
function sample(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? NaN : Number(line.slice(name.length + 1));
}

/** A transaction held open on a connection of its own until `release()`. */
interface HeldTransaction {
  pid: number;
  release(): Promise<void>;
}

async function holdRepeatableRead(url: string): Promise<HeldTransaction> {
  const conn = postgres(url, { max: 1, onnotice: () => {} });
  let release!: () => void;
  const released = new Promise<void>((resolve) => release = resolve);
  let opened!: (pid: number) => void;
  const pid = new Promise<number>((resolve) => opened = resolve);
  const done = conn.begin("isolation level repeatable read", async (tx) => {
    const [row] = await tx`select pg_backend_pid() as pid`;
    opened(row.pid);
    await released;
  });
  return {
    pid: await pid,
    release: async () => {
      release();
      await done;
      await conn.end({ timeout: 1 });
    },
  };
}

/** Jobs enqueued and deleted again: dead rows, and transactions after the held snapshot. */
async function churn(sql: Sql): Promise<void> {
  await sql`insert into akadze.jobs (task, args) select 't', '{}' from generate_series(1, 50)`;
  await sql`delete from akadze.jobs`;
}

const SESSION_SECONDS = 'akadze_oldest_transaction_seconds{source="session"}';
const SESSION_XIDS = 'akadze_horizon_age_transactions{source="session"}';
const HIDDEN = "akadze_horizon_hidden_sessions";
const DEAD = "akadze_jobs_dead_tuples";
const VACUUMED = "akadze_jobs_last_vacuum_timestamp_seconds";

Deno.test("the metrics show an open transaction holding back cleanup, and drop it after its COMMIT", async () => {
  await withDatabase("horizon", async (db, sql) => {
    const held = await holdRepeatableRead(db.url);
    let text = "";
    try {
      await churn(sql);
      await sql.unsafe("vacuum akadze.jobs");
      text = await waitFor(async () => {
        const t = await renderMetrics(sql);
        return sample(t, SESSION_SECONDS) > 0 && sample(t, SESSION_XIDS) >= 1 &&
            sample(t, DEAD) > 0 && sample(t, VACUUMED) > 0
          ? t
          : "";
      }, "the held transaction and the rows it keeps in the metrics");
      assertEquals(sample(text, HIDDEN), 0, "a superuser sees every session");
      assertEquals(sample(text, 'akadze_oldest_transaction_seconds{source="prepared"}'), 0);
      assertEquals(sample(text, 'akadze_horizon_age_transactions{source="replication_slot"}'), 0);
      assert(sample(text, VACUUMED) * 1000 <= Date.now() + 60_000, text);
      await assertPromtoolAccepts(text);
    } finally {
      await held.release();
    }
    text = await waitFor(async () => {
      const t = await renderMetrics(sql);
      return sample(t, SESSION_SECONDS) === 0 && sample(t, SESSION_XIDS) === 0 ? t : "";
    }, "the committed transaction to leave the metrics");
    // With nothing holding them, VACUUM removes the dead rows.
    await waitFor(async () => {
      await sql.unsafe("vacuum akadze.jobs");
      return sample(await renderMetrics(sql), DEAD) === 0;
    }, "VACUUM to remove the dead rows");
    assert(!text.includes(String(held.pid)), "no pid in the metrics");
  });
});

Deno.test("a role without pg_monitor gets valid metrics that count other roles' sessions as hidden", async () => {
  await withDatabase("horizon_roles", async (db, admin) => {
    const role = `akh${crypto.randomUUID().slice(0, 8)}`;
    await admin.unsafe(`create role ${role} login;
      grant usage on schema akadze to ${role};
      grant select on all tables in schema akadze to ${role}`);
    const u = new URL(db.url);
    u.username = role;
    u.password = "";
    const plain = postgres(u.href, { max: 1, onnotice: () => {} });
    const held = await holdRepeatableRead(db.url);
    try {
      await churn(admin);
      let text = await waitFor(async () => {
        const t = await renderMetrics(plain);
        return sample(t, HIDDEN) >= 1 && sample(t, SESSION_XIDS) >= 1 ? t : "";
      }, "the superuser's transaction as a hidden session");
      assertEquals(sample(text, SESSION_SECONDS), 0, "its start is not readable");
      assertMatch(text, /^akadze_jobs_dead_tuples \d+$/m);
      assertMatch(text, /^akadze_workers 0$/m);
      await assertPromtoolAccepts(text);

      await admin.unsafe(`grant pg_monitor to ${role}`);
      text = await waitFor(async () => {
        const t = await renderMetrics(plain);
        return sample(t, SESSION_SECONDS) > 0 ? t : "";
      }, "the transaction's age once the role has pg_monitor");
      assertEquals(sample(text, HIDDEN), 0);
    } finally {
      await held.release();
      await plain.end({ timeout: 1 });
      await admin.unsafe(`drop owned by ${role}; drop role ${role}`);
    }
  });
});

Deno.test("statistics views a role may not read leave their gauges out, the queue gauges stay", async () => {
  await withDatabase("horizon_denied", async (db, admin) => {
    const role = `akd${crypto.randomUUID().slice(0, 8)}`;
    // Privileges on the catalog's views are per database: this changes this database only.
    await admin.unsafe(`create role ${role} login;
      grant usage on schema akadze to ${role};
      grant select on all tables in schema akadze to ${role};
      revoke select on pg_catalog.pg_stat_activity, pg_catalog.pg_stat_user_tables from public`);
    await admin`insert into akadze.jobs (task, queue) values ('t', 'mail')`;
    const u = new URL(db.url);
    u.username = role;
    u.password = "";
    const plain = postgres(u.href, { max: 1, onnotice: () => {} });
    try {
      const text = await renderMetrics(plain);
      assertMatch(text, /^akadze_jobs\{queue="mail",state="queued"\} 1$/m);
      for (const name of [SESSION_SECONDS, SESSION_XIDS, HIDDEN, DEAD, VACUUMED]) {
        assert(!text.includes(name.replace(/\{.*/, "")), `${name} left out:\n${text}`);
      }
      await assertPromtoolAccepts(text);
    } finally {
      await plain.end({ timeout: 1 });
      await admin.unsafe(`drop owned by ${role}; drop role ${role}`);
    }
  });
});

Deno.test("a prepared transaction left unfinished shows as source prepared until ROLLBACK PREPARED", async () => {
  // The suite's server allows no prepared transactions; this one does.
  const pg = await startThrowawayPostgres({ settings: { max_prepared_transactions: 2 } });
  const sql = postgres(pg.url, { max: 2, onnotice: () => {} });
  try {
    await migrate(sql);
    await sql.begin(async (tx) => {
      await tx`insert into akadze.jobs (task, args) values ('t', '{}')`;
      await tx.prepare("akadze-horizon-test");
    });
    const prepared = 'akadze_oldest_transaction_seconds{source="prepared"}';
    const xids = 'akadze_horizon_age_transactions{source="prepared"}';
    const text = await waitFor(async () => {
      const t = await renderMetrics(sql);
      return sample(t, prepared) > 0 && sample(t, xids) >= 1 ? t : "";
    }, "the prepared transaction in the metrics");
    assert(!text.includes("akadze-horizon-test"), "no gid in the metrics");
    const health = await checkDatabase(sql, { maxTransactionAge: 0 });
    assertEquals(health.ok, false);
    assertMatch(
      health.line,
      /^a prepared transaction has been open for \d+\.\d s > 0 s .*PREPARED/,
    );
    await sql.unsafe("rollback prepared 'akadze-horizon-test'");
    await waitFor(async () => {
      const t = await renderMetrics(sql);
      return sample(t, prepared) === 0 && sample(t, xids) === 0;
    }, "the rolled back transaction to leave the metrics");
  } finally {
    await sql.end({ timeout: 1 });
    await pg.stop();
  }
});
