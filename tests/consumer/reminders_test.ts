// The consumer project's test of its tasks, written as a user of @akadze/akadze writes one:
// a throwaway PostgreSQL for the test, the jobs run in this process with drain(), and
// assertEnqueued() for what is left queued. Run it with `deno test -A` in this directory.
import assert from "node:assert/strict";
import { Akadze } from "@akadze/akadze";
import { getJob, migrate } from "@akadze/akadze/admin";
import {
  assertEnqueued,
  drain,
  startThrowawayPostgres,
} from "@akadze/akadze/testing";
import ms from "ms";
import { register, sent } from "./reminders.ts";

Deno.test("a welcome sends a reminder now and keeps one for the next day", async () => {
  const server = await startThrowawayPostgres();
  const app = new Akadze({ databaseUrl: server.url });
  try {
    await migrate(app.sql);
    const welcome = register(app);

    await welcome.enqueue({ email: "ada@example.com" });
    await assertEnqueued(app, "signups.welcome", { email: "ada@example.com" });
    // The welcome, then the reminder it enqueued for now; the delayed one is not ready.
    assert.equal(await drain(app), 2);
    assert.deepEqual(sent, ["ada@example.com"]);

    const later = await assertEnqueued(app, "reminders.send", {
      email: "ada@example.com",
    });
    const job = await getJob(app, later);
    assert.ok(
      job && job.runAt.getTime() > Date.now() + ms("23 hours"),
      `runAt ${job?.runAt}`,
    );
  } finally {
    await app.close();
    await server.stop();
  }
});
