// The claimer on one connection: the one-queue claim is a function whose plan that
// connection keeps, so what changes between claims (pauses, limits, priorities) must be
// read when the claim runs, not when it was planned.
import { pauseQueue, resumeQueue, setLimit } from "../mod.ts";
import { connect } from "../src/db.ts";
import { assertEquals } from "./assert.ts";
import { waitFor, withApp, workClaimer } from "./_helpers.ts";

Deno.test("a claim on a connection with a cached plan still honours pauses, limits and priorities added later", async () => {
  await withApp("claimer_cached", async (app, _sql, db) => {
    const work = app.task("work", () => {});
    const one = connect(db.url, { max: 1 });
    try {
      const claimer = workClaimer(one);
      const claimIds = async (slots: number) =>
        (await claimer.claim([{ queue: "default", slots }], slots)).claimed.map((j) => j.args);

      // More claims than PostgreSQL's five custom plans: the rest run the cached plan.
      await work.enqueueMany(Array.from({ length: 8 }, (_, i) => ({ i })));
      for (let i = 0; i < 8; i++) assertEquals(await claimIds(1), [{ i }]);
      assertEquals(await claimIds(1), []);

      await work.using({ priority: 5 }).enqueue({ i: "high" });
      await work.enqueue({ i: "low" });
      await pauseQueue(app.sql, "default");
      assertEquals(await claimIds(5), [], "a paused queue gives nothing");
      await resumeQueue(app.sql, "default");
      assertEquals(await claimIds(1), [{ i: "high" }]);
      assertEquals(await claimIds(1), [{ i: "low" }]);

      // A limits row created now: its jobs are left to the limited claim (which trusts "no
      // limits" for up to two seconds), and that one takes them one at a time.
      await setLimit(app.sql, "k", { maxRunning: 1 });
      await work.using({ limitKey: "k" }).enqueueMany([{ i: "k1" }, { i: "k2" }]);
      const first = await waitFor(async () => {
        const got = await claimIds(5);
        return got.length > 0 ? got : null;
      }, "the limited claim");
      assertEquals(first, [{ i: "k1" }]);
      assertEquals(await claimIds(5), []);
    } finally {
      await one.end();
    }
  });
});
