import { Worker } from "../src/worker/worker.ts";
import { drain } from "../src/testing.ts";
import { assertEquals } from "./assert.ts";
import { waitFor, withApp } from "./_helpers.ts";

Deno.test("smoke: a worker runs jobs", async () => {
  await withApp("smoke", async (app, sql) => {
    const seen: number[] = [];
    const t = app.task("t", ({ n }) => {
      seen.push(n as number);
      return { doubled: (n as number) * 2 };
    });
    await t.enqueueMany([{ n: 1 }, { n: 2 }, { n: 3 }]);
    const ran = await drain(app);
    assertEquals(ran, 3);
    const rows = await sql`select state, result from akadze.jobs order by id`;
    assertEquals(rows.map((r) => r.state), ["succeeded", "succeeded", "succeeded"]);
    assertEquals(rows[2].result, { doubled: 6 });
    const w = new Worker(app, { slots: 2, pollInterval: 100 });
    const run = w.run();
    await t.enqueue({ n: 4 });
    await waitFor(() => seen.length === 4, "the fourth job to run");
    w.stop();
    assertEquals((await run).code, 0);
    assertEquals(seen, [1, 2, 3, 4]);
  });
});
