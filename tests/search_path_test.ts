// Hostile search_path: akadze's functions resolve builtins in pg_catalog, whatever the caller's
// search_path, and every function of the schema (those of later migrations too) is pinned or is
// an inlined SQL function.
import postgres from "postgres";
import { assertEquals } from "./assert.ts";
import { withDatabase } from "./_helpers.ts";

// Shadows of builtins akadze's functions call, each recording its call in evil.calls.
const EVIL = `
create schema evil;
create table evil.calls (name text);
grant usage on schema evil to public;
create function evil.now() returns timestamptz language sql as
  $$ insert into evil.calls values ('now'); select pg_catalog.now() $$;
create function evil.pg_notify(text, text) returns void language sql as
  $$ insert into evil.calls values ('pg_notify'); select pg_catalog.pg_notify($1, $2) $$;
create function evil.jsonb_build_object(text, timestamptz) returns jsonb language sql as
  $$ insert into evil.calls values ('jsonb_build_object'); select '{}'::jsonb $$;
create function evil.coalesce_like(jsonb, jsonb) returns jsonb language sql as
  $$ select $1 $$;
create function evil.text_eq(text, text) returns boolean language sql as
  $$ insert into evil.calls values ('=(text,text)'); select $1 operator(pg_catalog.=) $2 $$;
create operator evil.= (leftarg = text, rightarg = text, function = evil.text_eq);
create function evil.int8_eq(bigint, bigint) returns boolean language sql as
  $$ insert into evil.calls values ('=(bigint,bigint)'); select $1 operator(pg_catalog.=) $2 $$;
create operator evil.= (leftarg = bigint, rightarg = bigint, function = evil.int8_eq);
create function evil.int4_plus(int, int) returns int language sql as
  $$ insert into evil.calls values ('+(int,int)'); select $1 operator(pg_catalog.+) $2 $$;
create operator evil.+ (leftarg = int, rightarg = int, function = evil.int4_plus);
create function evil.int4_lt(int, int) returns boolean language sql as
  $$ insert into evil.calls values ('<(int,int)'); select $1 operator(pg_catalog.<) $2 $$;
create operator evil.< (leftarg = int, rightarg = int, function = evil.int4_lt);
create function evil.jsonb_concat(jsonb, jsonb) returns jsonb language sql as
  $$ insert into evil.calls values ('||(jsonb,jsonb)'); select $1 operator(pg_catalog.||) $2 $$;
create operator evil.|| (leftarg = jsonb, rightarg = jsonb, function = evil.jsonb_concat);
`;

Deno.test("akadze's functions call no shadowing function or operator of the caller's search_path", () =>
  withDatabase("search_path_functions", async (db, sql) => {
    await sql.unsafe(EVIL);
    const hostile = postgres(db.url, {
      max: 1,
      onnotice: () => {},
      connection: { search_path: "evil, pg_catalog" },
    });
    try {
      // SQL enqueue (0003), claim (0001, 0004), a retry with an error, then a success.
      await hostile`select akadze.enqueue('t', '{"a": 1}', max_attempts => 2)`;
      await hostile`select * from akadze.enqueue_many('t', '[{}, {}]')`;
      const claimed = await hostile`
        select id, run_count from akadze.claim_one('default', '{t}', 2, '{}', 'w1')`;
      assertEquals(claimed.length, 2);
      await hostile`insert into akadze.workers (id, hostname, pid, queues)
        values ('w1', 'h', 1, '{default}')`;
      const floor = await hostile`
        select id from akadze.claim_one_floor('default', '{t}', 1, '{}', 'w1', '{0}', '{0}')`;
      assertEquals(floor.length, 1);
      const all = [...claimed, ...floor];
      const written = await hostile`select * from akadze.complete_jobs(
        ${all.map((r) => r.id)}::bigint[], ${all.map((r) => r.run_count ?? 1)}::int[],
        '{retry,succeeded,fail}', '{null,"{}",null}',
        array['{"error":"E","message":"m"}', null, '{"error":"F","message":"m"}'], '{0,0,0}')`;
      assertEquals(written.map((r) => r.state).sort(), ["failed", "queued", "succeeded"]);
      const [{ errors }] = await sql`select errors from akadze.jobs where state = 'queued'`;
      assertEquals(typeof errors[0].at, "string");
      // A flow (0008): enqueued, its first step failed, its dependents settled by the trigger.
      const steps = await hostile`select step, id from akadze.enqueue_flow('[
        {"name": "b", "task": "t", "depends_on": ["a"]},
        {"name": "c", "task": "t", "depends_on": [{"step": "a", "on_failure": "ignore"}]},
        {"name": "a", "task": "t"}]')`;
      const a = steps.find((s) => s.step === "a")!.id;
      await hostile`update akadze.jobs set state = 'failed', finished_at = pg_catalog.now()
        where id operator(pg_catalog.=) ${a}::bigint`;
      const settled = await sql`select step, state from akadze.jobs
        where step is not null order by step`;
      assertEquals(settled.map((r) => r.state), ["failed", "cancelled", "queued"]);
      // A success in an outcome batch (0014): the batch counts its dependent down itself.
      const pair = await hostile`select step, id from akadze.enqueue_flow('[
        {"name": "x", "task": "u"}, {"name": "y", "task": "u", "depends_on": ["x"]}]')`;
      const [x] = await hostile`
        select id, run_count from akadze.claim_one('default', '{u}', 1, '{}', 'w1')`;
      await hostile`select * from akadze.complete_jobs(${[x.id]}::bigint[],
        ${[x.run_count]}::int[], '{succeeded}', '{"{}"}', '{null}', '{0}')`;
      const [y] = await sql`select state from akadze.jobs
        where id = ${pair.find((s) => s.step === "y")!.id}`;
      assertEquals(y.state, "queued");
      // The unique-key modes (0015): a throttle window, a replace, a running holder's key given
      // up, and an enqueue inside the window.
      const keyed = (mode: string) =>
        hostile.unsafe(
          `select akadze.enqueue('k', '{}', queue => 'keyed', unique_key => 'k', ${mode})`,
        );
      await keyed("throttle => '1 minute', on_duplicate => 'replace'");
      await keyed("on_duplicate => 'replace'");
      await sql`update akadze.jobs set state = 'running', worker_id = 'w1' where unique_key = 'k'`;
      await keyed("on_duplicate => 'debounce', while_running => 'queue_one'");
      await keyed("throttle => '1 minute'");
      assertEquals(
        (await sql`select state from akadze.jobs where task = 'k' order by id`).map((r) => r.state),
        [
          "running",
          "queued",
        ],
      );
    } finally {
      await hostile.end({ timeout: 1 });
    }
    assertEquals([...await sql`select name from evil.calls`], []);
  }));

Deno.test("every function of the akadze schema pins search_path or is an inlined SQL function", () =>
  withDatabase("search_path_pinned", async (_db, sql) => {
    const functions = await sql`
      select p.proname, l.lanname, p.proconfig from pg_proc p
        join pg_namespace n on n.oid = p.pronamespace join pg_language l on l.oid = p.prolang
       where n.nspname = 'akadze' order by p.proname`;
    const unpinned = functions.filter((f) =>
      !(f.proconfig ?? []).includes("search_path=pg_catalog, pg_temp")
    );
    // Only an inlined SQL function may go without: inlined, its body is part of the calling
    // statement, which shows no call of it in its plan.
    assertEquals(unpinned.map((f) => [f.proname, f.lanname]), [["outcome_state", "sql"]]);
    for (const f of unpinned) {
      const plan = await sql.unsafe(`explain (verbose, costs off)
        select akadze.${f.proname}(j.cancel_requested_at is not null, 'retry', j.attempt,
                                   j.max_attempts) from akadze.jobs j`);
      const text = plan.map((r) => r["QUERY PLAN"]).join("\n");
      assertEquals(text.includes(f.proname), false, text);
    }
  }));
