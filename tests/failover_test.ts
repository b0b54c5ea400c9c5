// Failover to a promoted standby: a primary with a synchronous streaming standby, workers
// on a multi-host URL, the primary stopped hard while jobs flow, the standby promoted. The
// workers must keep running (a read-only server is a passing condition, not a fatal one)
// and every job must finish on the new primary. This file starts its own two servers.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { connect } from "../src/db.ts";
import { migrate } from "../src/migrate.ts";
import type { ThrowawayPostgres, ThrowawayStandby } from "../src/throwaway_postgres.ts";
import type { WorkerExit } from "../src/worker/worker.ts";
import { assert, assertEquals } from "./assert.ts";
import { crash, startSyncPair } from "./_failover.ts";
import {
  countJobs,
  startWorker,
  waitFor,
  watchClosedConnectionWrites,
  within,
  withLogs,
} from "./_helpers.ts";

const JOBS = 300;
const LATER = 50;
/** A promotion takes a few seconds on a busy machine: well within the lease. */
const TIMINGS = { slots: 4, heartbeatInterval: 500, heartbeatTtl: 20_000 };

/** A primary whose commits wait for a streaming standby, with a database `akadze` on it. */
async function withPair(
  fn: (primary: ThrowawayPostgres, standby: ThrowawayStandby) => Promise<void>,
): Promise<void> {
  const pair = await startSyncPair({ databases: ["akadze"] });
  try {
    await fn(pair.primary, pair.standby);
  } finally {
    await pair.stop();
  }
}

function dbUrl(server: ThrowawayPostgres): string {
  return server.url.replace(/\/postgres$/, "/akadze");
}

async function failover(attrs: "read-write" | "primary"): Promise<void> {
  await withLogs(async (records) => {
    await withPair(async (primary, standby) => {
      const url = `postgres://postgres@127.0.0.1:${primary.port},127.0.0.1:${standby.port}` +
        `/akadze?target_session_attrs=${attrs}`;
      const direct = postgres(dbUrl(primary), { max: 1, onnotice: () => {} });
      await migrate(direct);
      await direct.end();
      const app = new Akadze({ databaseUrl: url });
      const work = app.task("work", async () => await new Promise((r) => setTimeout(r, 5)));
      const workers = [startWorker(app, TIMINGS), startWorker(app, TIMINGS)];
      const exited: (WorkerExit | null)[] = [null, null];
      workers.forEach((w, i) => w.exit.then((exit) => exited[i] = exit));
      const onStandby = postgres(dbUrl(standby), { max: 1, onnotice: () => {} });
      try {
        for (let i = 0; i < JOBS; i += 50) {
          await app.sql`insert into akadze.jobs (task, args)
            select 'work', '{}'::jsonb from generate_series(1, 50)`;
        }
        await waitFor(
          async () => await countJobs(onStandby, "succeeded") >= 20,
          "jobs to flow before the crash",
        );
        // Each worker beat on the first primary (on a loaded machine one may start late, and
        // a first beat on the new primary has no server to compare with).
        await waitFor(
          () =>
            workers.every((w) =>
              records.some((r) =>
                r.properties.event === "worker_registered" &&
                r.properties.workerId === w.worker.id
              )
            ),
          "each worker's first beat",
        );
        await crash(primary);
        const crashedAt = records.length;
        if (attrs === "read-write") {
          // Failover is not instant, and postgres.js's read-write check accepts a hot
          // standby: the workers land on it and meet its refusal to write before it is
          // promoted.
          await waitFor(
            () =>
              workers.every((w, i) =>
                exited[i] !== null ||
                records.slice(crashedAt).some((r) =>
                  r.properties.event === "heartbeat_failed" &&
                  r.properties.workerId === w.worker.id &&
                  String(r.properties.message).includes("25006")
                )
              ),
            "each worker's heartbeat to meet the read-only standby",
          );
        }
        // With primary, the driver waits for a primary to appear (the promotion must come
        // within the heartbeat TTL).
        assertEquals(
          exited,
          [null, null],
          `the workers exited before the promotion: ${JSON.stringify(exited)}`,
        );
        await standby.promote();
        for (let i = 0; i < LATER; i++) await work.enqueue({});
        await waitFor(
          async () =>
            await countJobs(onStandby, "succeeded") === JOBS + LATER ||
            exited.some((e) => e !== null),
          "every job to finish on the new primary",
          60_000,
        );
        assertEquals(exited, [null, null], `a worker exited: ${JSON.stringify(exited)}`);
        assertEquals(await countJobs(onStandby, "succeeded"), JOBS + LATER);
        // One line per worker says what happened, even where the driver hid the failover: at
        // its first beat on the new primary, which a loaded machine may hold back until after
        // the jobs finished.
        const changed = (w: (typeof workers)[number]) =>
          records.filter((r) =>
            r.properties.event === "database_server_changed" &&
            r.properties.workerId === w.worker.id
          ).map((r) => [r.properties.was, r.properties.address]);
        await waitFor(
          () => workers.every((w) => changed(w).length > 0),
          "each worker's line about the new server",
        );
        for (const w of workers) {
          assertEquals(changed(w), [[`127.0.0.1:${primary.port}`, `127.0.0.1:${standby.port}`]]);
        }
        const stops = await Promise.all(workers.map((w) => w.stop()));
        assertEquals(stops.map((e) => e.code), [0, 0]);
      } finally {
        for (const w of workers) w.worker.stop();
        await Promise.all(workers.map((w) => w.exit));
        await app.close();
        await onStandby.end();
      }
    });
  });
}

Deno.test("workers on target_session_attrs=read-write survive a promoted standby: they wait out the read-only server and finish every job on the new primary", async () => {
  await failover("read-write");
});

Deno.test("workers on target_session_attrs=primary survive a promoted standby and finish every job on the new primary", async () => {
  await failover("primary");
});

/** A TCP proxy to `port` on 127.0.0.1 that counts the connections it is asked for. */
function countingProxy(port: number): { port: number; count: () => number; close(): void } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const open = new Set<Deno.Conn>();
  let count = 0;
  (async () => {
    for await (const conn of listener) {
      count++;
      open.add(conn);
      Deno.connect({ hostname: "127.0.0.1", port }).then((upstream) => {
        open.add(upstream);
        const done = () => {
          for (const c of [conn, upstream]) {
            open.delete(c);
            try {
              c.close();
            } catch { /* closed already */ }
          }
        };
        conn.readable.pipeTo(upstream.writable).catch(() => {}).finally(done);
        upstream.readable.pipeTo(conn.writable).catch(() => {}).finally(done);
      }, () => conn.close());
    }
  })().catch(() => {});
  return {
    port: (listener.addr as Deno.NetAddr).port,
    count: () => count,
    close: () => {
      listener.close();
      for (const c of open) {
        try {
          c.close();
        } catch { /* closed already */ }
      }
    },
  };
}

Deno.test("with target_session_attrs=primary and no primary among the hosts, a statement waits with growing pauses between attempts and one warning, and runs once a standby is promoted", async () => {
  await withLogs(async (records) => {
    await withPair(async (_primary, standby) => {
      // Both hosts are the standby: no host is a primary until it is promoted.
      const a = countingProxy(standby.port);
      const b = countingProxy(standby.port);
      const sql = connect(
        `postgres://postgres@127.0.0.1:${a.port},127.0.0.1:${b.port}/akadze` +
          "?target_session_attrs=primary",
        { max: 1 },
      );
      try {
        const started = performance.now();
        const waiting = sql`select pg_catalog.pg_is_in_recovery() as recovery`.execute();
        let settled = false;
        waiting.then(() => settled = true, () => settled = true);
        await waitFor(() => a.count() + b.count() >= 10, "ten connection attempts");
        // Before: the driver tried the hosts again at once, round after round (hundreds of
        // connections a second). Now each round after the first waits longer: at least
        // 2 x (50 + 100 + 200 + 400) ms before the tenth attempt, however fast the machine.
        const elapsed = performance.now() - started;
        assert(elapsed >= 1_000, `ten attempts within ${Math.round(elapsed)} ms`);
        assert(a.count() > 0 && b.count() > 0, "both hosts are tried");
        assertEquals(settled, false, "the statement waits for a primary");
        const warnings = records.filter((r) => r.properties.event === "db_no_server");
        assertEquals(warnings.length, 1, "one warning however many rounds");
        const message = String(warnings[0].message.join(""));
        assert(message.includes("not a primary server (target_session_attrs=primary)"), message);
        assert(message.includes(`127.0.0.1:${a.port}`), message);
        assert(message.includes(`127.0.0.1:${b.port}`), message);
        await standby.promote();
        const [row] = await within(waiting, 30_000, "the statement after the promotion");
        assertEquals(row.recovery, false);
        assertEquals(
          records.filter((r) => r.properties.event === "db_server_found").length,
          1,
          "one line says a server is accepted again",
        );
      } finally {
        await sql.end({ timeout: 1 });
        a.close();
        b.close();
      }
    });
  });
});

/**
 * Terminate the backend of `sql`'s only connection while it runs a statement (`pg_sleep(60)`,
 * started here unless `running` is given), and wait for the statement to fail.
 */
async function terminateBusy(
  sql: postgres.Sql,
  admin: postgres.Sql,
  name: string,
  running?: Promise<unknown>,
): Promise<void> {
  const busy = running ?? sql`select pg_catalog.pg_sleep(60)`.execute();
  const failed = busy.then((result) => result instanceof Error, () => true);
  await waitFor(
    async () =>
      (await admin`select pg_terminate_backend(pid) as done from pg_stat_activity
      where application_name = ${name} and query like '%pg_sleep(60)%'`).some((r) => r.done),
    "the busy connection to be terminated",
  );
  assert(await within(failed, 30_000, "the terminated statement to fail"));
}

Deno.test("with target_session_attrs=primary, a pooled connection whose backend was terminated mid-statement or mid-transaction reconnects at once, and not to the standby", async () => {
  await withPair(async (primary, standby) => {
    const name = "terminated_on_pair";
    // The primary first: the pool's next attempt after the termination goes to the standby.
    const sql = connect(
      `postgres://postgres@127.0.0.1:${primary.port},127.0.0.1:${standby.port}/akadze` +
        "?target_session_attrs=primary",
      { max: 1, applicationName: name, connectTimeout: 5 },
    );
    const admin = postgres(dbUrl(primary), { max: 1, onnotice: () => {} });
    try {
      await admin`create table written (n int)`;
      for (let round = 0; round < 3; round++) {
        const [before] = await sql`select pg_catalog.pg_is_in_recovery() as recovery`;
        assertEquals(before.recovery, false);
        await terminateBusy(sql, admin, name);
        // postgres.js kept the terminated statement's error and took it for the answer to
        // the next session's startup, skipping its target_session_attrs check: that session
        // was on the standby, and every statement after it stayed there. The first statement
        // may still fail with that stale error; the connection must be on the primary.
        await sql`select 1`.catch(() => {});
        for (let i = 0; i < 5; i++) {
          const [row] = await sql`select pg_catalog.pg_is_in_recovery() as recovery`;
          assertEquals(
            row.recovery,
            false,
            `round ${round}: a pooled connection is on the standby`,
          );
        }
        await sql`insert into written values (${round})`;
      }
      // A transaction's connection terminated: postgres.js then sends its rollback on the
      // closed connection, which left the object unable to send (each reconnect waited for
      // the connect timeout). With several hosts the driver also ignores errors while it
      // connects, so what waits on the object must be failed in another way.
      const writes = watchClosedConnectionWrites();
      try {
        for (let round = 0; round < 3; round++) {
          const before = writes.count();
          const tx = sql.begin(async (tx) => {
            await tx`select pg_catalog.pg_sleep(60)`;
          }).then(() => null, (e: unknown) => e);
          await terminateBusy(sql, admin, name, tx);
          await waitFor(
            () => writes.count() > before,
            "the driver's write on the closed connection",
          );
          const started = performance.now();
          const errors: string[] = [];
          for (let i = 0; i < 5; i++) {
            const ok = await sql`select pg_catalog.pg_is_in_recovery() as recovery`.then(
              ([row]) => row.recovery === false,
              (e: Error & { code?: string }) => (errors.push(String(e.code ?? e.message)), false),
            );
            if (ok) break;
          }
          assertEquals(
            errors.filter((code) => code === "CONNECT_TIMEOUT"),
            [],
            `tx round ${round}`,
          );
          assert(errors.length <= 2, `tx round ${round}: ${errors.join(", ")}`);
          const [row] = await sql`select pg_catalog.pg_is_in_recovery() as recovery`;
          assertEquals(row.recovery, false, `tx round ${round}: the connection is on the standby`);
          const took = performance.now() - started;
          assert(took < 4_000, `tx round ${round}: reconnecting took ${Math.round(took)} ms`);
          await sql`insert into written values (${10 + round})`;
        }
      } finally {
        writes.stop();
      }
    } finally {
      await sql.end({ timeout: 1 });
      await admin.end();
    }
  });
});
