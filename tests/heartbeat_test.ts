// The heartbeat service driven directly: its beat statement and the lease it keeps.
import postgres from "postgres";
import { Heartbeat } from "../src/worker/heartbeat.ts";
import { AkadzeError } from "../src/errors.ts";
import { assert, assertEquals, assertMatch, assertThrows } from "./assert.ts";
import { waitFor, withApp, within } from "./_helpers.ts";

Deno.test("the heartbeat registers the worker and re-registers it when its row is removed", async () => {
  await withApp("w_heartbeat", async (app, sql, db) => {
    const hb = new Heartbeat(app.sql, {
      schema: app.schema,
      id: "hb-1",
      hostname: "h",
      pid: 1,
      queues: ["a", "b"],
      heartbeatTtl: 30_000,
    });
    const beat = await hb.runOnce();
    assertEquals({ ...beat, server: undefined }, {
      registered: true,
      cancelRequested: [],
      running: [],
      server: undefined,
      // The settings the worker's statements depend on (session_settings.ts).
      session: { isolation: "read committed", dateStyle: "ISO, MDY", floatDigits: 1 },
    });
    // The server that answered, so that a failover or restart shows in the log.
    assertEquals(beat.server.address, `127.0.0.1:${new URL(db.url).port}`);
    assert(beat.server.startedAt.length > 0);
    const [first] = await sql`select * from akadze.workers`;
    assertEquals([first.id, first.queues, first.heartbeat_ttl_ms], ["hb-1", ["a", "b"], 30_000]);
    assertEquals((await hb.runOnce()).registered, false);
    const [second] = await sql`select heartbeat_at from akadze.workers`;
    assert(second.heartbeat_at >= first.heartbeat_at);
    await sql`delete from akadze.workers`;
    assertEquals((await hb.runOnce()).registered, true);
    assert(await hb.remove());
    const identity = { schema: app.schema, id: "x", hostname: "h", pid: 1, queues: ["a"] };
    const error = assertThrows(
      () => new Heartbeat(app.sql, { ...identity, heartbeatTtl: 1_000, heartbeatInterval: 1_000 }),
      AkadzeError,
    );
    assertMatch(error.message, /heartbeatTtl \(1000 ms\) must be longer than heartbeatInterval/);
  });
});

Deno.test("a batch run's heartbeat that never reaches the database gives the lease up after heartbeatTtl", async () => {
  // Nothing listens on port 1: every beat fails at once, transiently (ECONNREFUSED).
  const sql = postgres("postgres://akadze@127.0.0.1:1/none", { max: 1, onnotice: () => {} });
  try {
    const hb = new Heartbeat(sql, {
      schema: "akadze",
      id: "hb-batch",
      hostname: "h",
      pid: 1,
      queues: ["default"],
      heartbeatTtl: 300,
      heartbeatInterval: 100,
      giveUpUnregistered: true,
    });
    hb.begin();
    assert(hb.due());
    assertEquals([(await hb.beat()).kind, hb.ok, hb.lastSuccess], ["failed", false, null]);
    const lost = await waitFor(async () => {
      const lease = await hb.beat();
      return lease.kind === "lost" ? lease : null;
    }, "the lease to be given up");
    assertMatch(lost?.message ?? "", /could not reach the database for \d+ s/);
  } finally {
    await sql.end({ timeout: 1 });
  }
});

Deno.test("the heartbeat watchdog fires once no beat succeeded for heartbeatTtl + heartbeatInterval", async () => {
  await withApp("hb_watch", async (app) => {
    const hb = new Heartbeat(app.sql, {
      schema: app.schema,
      id: "hb-watch",
      hostname: "h",
      pid: 1,
      queues: ["default"],
      heartbeatTtl: 100,
      heartbeatInterval: 50,
    });
    // One beat that succeeds (a generous bound for it: beat() would give up after
    // heartbeatTtl / 2, 50 ms, which a loaded machine can take for a first statement).
    await hb.runOnce({ running: [] }, 30_000);
    assert(hb.lastSuccess !== null);
    // No beat follows: the loop is "stuck".
    const watch = hb.watch();
    try {
      const fired = await within(watch.stalled.then(() => true), 30_000, "the watchdog");
      assert(fired);
    } finally {
      watch.stop();
    }
    assert(await hb.remove());
  });
});

Deno.test("a beat reports cancel requests of the jobs it is given, and lists every job running under the worker's id only when an orphan may exist or the last look is old", async () => {
  await withApp("hb_orphans", async (app, sql) => {
    const hb = new Heartbeat(app.sql, {
      schema: app.schema,
      id: "hb-o",
      hostname: "h",
      pid: 1,
      queues: ["default"],
      heartbeatTtl: 30_000,
      orphanScanEvery: 600_000,
    });
    const [known, orphan, cancelled] = await sql`
      insert into akadze.jobs (task, state, worker_id, run_count, started_at, cancel_requested_at)
      values ('t', 'running', 'hb-o', 1, now(), null), ('t', 'running', 'hb-o', 1, now(), now()),
             ('t', 'running', 'hb-o', 2, now(), now())
      returning id::text as id`;
    const first = await hb.runOnce({ running: [known.id, cancelled.id] });
    assertEquals(first.cancelRequested, [cancelled.id], "only the given jobs' requests");
    assertEquals(
      first.running?.map((r) => [r.id, r.runCount]).sort(),
      [[known.id, 1], [orphan.id, 1], [cancelled.id, 2]].sort(),
      "the first beat looks for orphans",
    );
    assertEquals(hb.orphanScanDue(), false);
    assertEquals((await hb.runOnce({ running: [known.id] })).running, null);
    hb.orphansMayExist();
    assertEquals((await hb.runOnce({ running: [] })).running?.length, 3, "after a lost write");
    assertEquals((await hb.runOnce({ running: [] })).running, null);
    const often = new Heartbeat(app.sql, {
      schema: app.schema,
      id: "hb-o",
      hostname: "h",
      pid: 1,
      queues: ["default"],
      heartbeatTtl: 30_000,
      orphanScanEvery: 0,
    });
    await often.runOnce();
    assertEquals((await often.runOnce()).running?.length, 3, "the backstop look");
  });
});
