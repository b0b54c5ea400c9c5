import { assert, assertEquals, assertMatch } from "./assert.ts";
import { renderMetrics } from "../src/metrics.ts";
import { withDatabase } from "./_helpers.ts";

Deno.test("renderMetrics reports jobs, lag, pauses, workers and limits without job data", async () => {
  await withDatabase("metrics", async (_db, sql) => {
    await sql`insert into akadze.jobs (task, queue, args, run_at)
              values ('t', 'mail', '{"secret":"do-not-leak"}', now() - interval '5 seconds'),
                     ('t', 'mail', '{}', now() + interval '1 hour')`;
    await sql`insert into akadze.jobs (task, queue, state, worker_id, started_at, limit_key)
              values ('t', 'mail', 'running', 'w1', now(), 'api')`;
    // A step of a flow waiting for its dependencies: counted, neither ready nor lagging.
    await sql`insert into akadze.jobs (task, queue, state, run_at, pending_deps)
              values ('t', 'mail', 'waiting', now() - interval '1 hour', 1)`;
    await sql`insert into akadze.queue_pauses (queue) values ('idle'), ('we"ird')`;
    await sql`insert into akadze.workers (id, hostname, pid, queues) values ('w1', 'h', 1, '{mail}')`;
    await sql`insert into akadze.limits (key, max_running) values ('api', 2)`;
    const text = await renderMetrics(sql);
    assert(!text.includes("do-not-leak"));
    assertMatch(text, /^akadze_jobs\{queue="mail",state="queued"\} 2$/m);
    assertMatch(text, /^akadze_jobs\{queue="mail",state="running"\} 1$/m);
    assertMatch(text, /^akadze_jobs\{queue="mail",state="waiting"\} 1$/m);
    assertMatch(text, /^akadze_jobs\{queue="idle",state="waiting"\} 0$/m);
    assertMatch(text, /^akadze_jobs\{queue="idle",state="queued"\} 0$/m);
    assertMatch(text, /^akadze_queue_paused\{queue="we\\"ird"\} 1$/m);
    const lag = Number(/^akadze_queue_lag_seconds\{queue="mail"\} (\S+)$/m.exec(text)?.[1]);
    assert(lag >= 4.5 && lag < 60, `lag ${lag}`);
    assertMatch(text, /^akadze_queue_paused\{queue="idle"\} 1$/m);
    assertMatch(text, /^akadze_queue_paused\{queue="mail"\} 0$/m);
    assertMatch(text, /^akadze_worker_busy 1$/m);
    assertMatch(text, /^akadze_workers 1$/m);
    assertMatch(text, /^akadze_limit_running\{key="api"\} 1$/m);
    assertMatch(text, /^akadze_limit_max_running\{key="api"\} 2$/m);
    for (const line of text.trimEnd().split("\n")) {
      assert(/^(# (HELP|TYPE) \w+ .+|\w+(\{.*\})? -?[0-9.e+-]+)$/.test(line), line);
    }
    assertEquals(text.endsWith("\n"), true);
  });
});
