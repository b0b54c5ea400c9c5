// Hostile search_path: akadze's functions resolve builtins in pg_catalog, whatever the caller's
// search_path, and every function of the schema (those of later migrations too) is pinned or is
// an inlined SQL function; the statements akadze sends from TypeScript (enqueue, the worker, the
// admin functions, the testing helpers, the CLI) name pg_catalog's operators, functions and
// types too.
import postgres from "postgres";
import { assert, assertEquals, assertRejects } from "./assert.ts";
import {
  cancelJobs,
  clearLimit,
  getJob,
  listJobs,
  listLimits,
  listQueues,
  listWorkers,
  migrationStatus,
  pauseQueue,
  pruneJobs,
  queueKnown,
  queueSnapshot,
  requestCancel,
  requeue,
  requeueJobs,
  resumeQueue,
  setLimit,
} from "../admin.ts";
import { Akadze, DuplicateJob, Fail } from "../mod.ts";
import { renderMetrics } from "../src/metrics.ts";
import { assertEnqueued, drain, makeReady } from "../src/testing.ts";
import type { Sql } from "../src/db.ts";
import { runCli, startWorker, waitFor, waitForJob, withDatabase } from "./_helpers.ts";

const SCHEDULES_APP = new URL("./fixtures/schedules_app.ts", import.meta.url).pathname;

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
      // The plain outcome write (0024): its success's dependent is settled by the trigger.
      const plainPair = await hostile`select step, id from akadze.enqueue_flow('[
        {"name": "p", "task": "v"}, {"name": "q", "task": "v", "depends_on": ["p"]}]')`;
      const [p] = await hostile`
        select id, run_count from akadze.claim_one('default', '{v}', 1, '{}', 'w1')`;
      const plain = await hostile`select * from akadze.complete_jobs_plain(${[p.id]}::bigint[],
        ${[p.run_count]}::int[], '{succeeded}', '{"{}"}', '{null}', '{0}')`;
      assertEquals([plain[0].state, plain[0].has_dependents], ["succeeded", true]);
      const [q] = await sql`select state from akadze.jobs
        where id = ${plainPair.find((s) => s.step === "q")!.id}`;
      assertEquals(q.state, "queued");
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

// A role whose search_path lists a schema of recording shadows before pg_catalog: shadows of
// every pg_catalog operator, of each pg_catalog function, aggregate and relation whose name the
// source of src/ uses, and of the type names a cast may name. Everything akadze sends from
// TypeScript runs under it (the app, a worker, the admin functions, the CLI), and no shadow
// may be called. The names come from the source, so a builtin a later statement uses is
// shadowed too.

/** Words of src/ that look like calls (`name(`) or relations (`pg_…`): the names to shadow. */
async function sourceNames(): Promise<{ calls: string[]; relations: string[] }> {
  const calls = new Set<string>();
  const relations = new Set<string>();
  const root = new URL("../src/", import.meta.url);
  const walk = async (dir: URL): Promise<void> => {
    for await (const entry of Deno.readDir(dir)) {
      if (entry.isDirectory) await walk(new URL(`${entry.name}/`, dir));
      else if (entry.name.endsWith(".ts")) {
        const text = (await Deno.readTextFile(new URL(entry.name, dir))).toLowerCase();
        for (const m of text.matchAll(/\b([a-z_][a-z0-9_]*)\s*\(/g)) calls.add(m[1]);
        for (const m of text.matchAll(/\b(pg_[a-z0-9_]+)\b/g)) relations.add(m[1]);
      }
    }
  };
  await walk(root);
  return { calls: [...calls].sort(), relations: [...relations].sort() };
}

/** Type names a cast may name that are not keywords (so resolved through search_path). */
const SHADOWED_TYPES = [
  "text",
  "jsonb",
  "json",
  "timestamptz",
  "float8",
  "float4",
  "int8",
  "int4",
  "int2",
  "bool",
  "name",
  "regclass",
  "oid",
  "bytea",
  "uuid",
  "xid8",
  "inet",
];

/** Concrete argument types shadowed for builtins that take "any" or a polymorphic argument. */
const COMMON_TYPES = ["text", "int8", "int4", "timestamptz", "jsonb", "bool", "float8", "interval"];

/**
 * Plant the shadows in schema evil; each records its name and the statement that called it in
 * evil.calls. Returns how many shadows there are.
 */
async function plantShadows(sql: Sql): Promise<number> {
  const { calls, relations } = await sourceNames();
  await sql.unsafe(`
    create schema evil;
    create table evil.calls (name text, query text);
    create table evil.planted (kind text, name text);
    create function evil.rec(p_name text) returns boolean language plpgsql
      set search_path = pg_catalog, pg_temp as $$
    begin
      insert into evil.calls values (p_name, current_query());
      return true;
    end $$;`);
  await sql.unsafe(
    `
    do $plant$
    declare
      r record;
      t text;
      u text;
      res text;
      n int := 0;
      calls text[] := $1::text[];
      common text[] := $2::text[];
    begin
      -- A window function's shadow is a plain function: a call with OVER then fails.
      perform set_config('check_function_bodies', 'off', true);
      -- Operators: every one of pg_catalog, with its exact operand types.
      for r in select o.oid, o.oprname, o.oprkind, format_type(o.oprleft, null) as l,
                      format_type(o.oprright, null) as rt, format_type(o.oprresult, null) as res
                 from pg_operator o join pg_namespace s on s.oid = o.oprnamespace
                where s.nspname = 'pg_catalog' and o.oprkind in ('b', 'l')
                  -- Not the two that postgres.js's own query of the array types runs some
                  -- 235,000 times on each new connection (the driver's, not akadze's).
                  and not (o.oprname = '=' and o.oprleft = o.oprright
                           and o.oprleft in ('oid'::regtype, '"char"'::regtype))
      loop
        begin
          if r.oprkind = 'b' then
            execute format('create function evil.op_%s(%s, %s) returns %s language sql
              set search_path = pg_catalog, pg_temp
              as %L', r.oid, r.l, r.rt, r.res,
              format('select evil.rec(%L); select $1 operator(pg_catalog.%s) $2',
                     r.oprname || '(' || r.l || ',' || r.rt || ')', r.oprname));
            execute format('create operator evil.%s (leftarg = %s, rightarg = %s,
              function = evil.op_%s)', r.oprname, r.l, r.rt, r.oid);
          else
            execute format('create function evil.op_%s(%s) returns %s language sql
              set search_path = pg_catalog, pg_temp
              as %L', r.oid, r.rt, r.res,
              format('select evil.rec(%L); select operator(pg_catalog.%s) $1',
                     r.oprname || '(' || r.rt || ')', r.oprname));
            execute format('create operator evil.%s (rightarg = %s, function = evil.op_%s)',
              r.oprname, r.rt, r.oid);
          end if;
          n := n + 1;
        exception when others then null; -- operand types a SQL function cannot take
        end;
      end loop;
      -- Functions (and window functions) of the names the source calls, every overload.
      for r in select p.oid, p.proname, p.pronargs, p.proretset, p.provariadic <> 0 as variadic,
                      p.prokind, pg_get_function_arguments(p.oid) as args,
                      pg_get_function_result(p.oid) as result,
                      p.proargtypes::oid[] as types
                 from pg_proc p join pg_namespace s on s.oid = p.pronamespace
                where s.nspname = 'pg_catalog' and p.proname = any(calls)
                  and p.prokind in ('f', 'w')
      loop
        begin
          if '"any"'::regtype = any(r.types) then
            -- "any" cannot be declared: the overloads a call with common types would pick.
            foreach t in array common loop
              begin
                if r.pronargs = 1 or (r.variadic and r.pronargs = 1) then
                  execute format('create function evil.%I(%s) returns %s language sql
                    set search_path = pg_catalog, pg_temp as %L', r.proname, t, r.result,
                    format('select evil.rec(%L); select pg_catalog.%I($1)',
                           r.proname || '(' || t || ')', r.proname));
                  n := n + 1;
                end if;
                if r.variadic then
                  execute format('create function evil.%I(text, %s) returns %s language sql
                    set search_path = pg_catalog, pg_temp as %L', r.proname, t, r.result,
                    format('select evil.rec(%L); select pg_catalog.%I($1, $2)',
                           r.proname || '(text,' || t || ')', r.proname));
                  n := n + 1;
                  foreach u in array common loop
                    execute format('create function evil.%I(text, %s, text, %s) returns %s
                      language sql set search_path = pg_catalog, pg_temp as %L',
                      r.proname, t, u, r.result,
                      format('select evil.rec(%L); select pg_catalog.%I($1, $2, $3, $4)',
                             r.proname || '(text,' || t || ',text,' || u || ')', r.proname));
                    n := n + 1;
                  end loop;
                end if;
              exception when others then null;
              end;
            end loop;
            continue;
          end if;
          execute format('create function evil.%I(%s) returns %s language sql
            set search_path = pg_catalog, pg_temp as %L', r.proname, r.args, r.result,
            format('select evil.rec(%L); select %s pg_catalog.%I(%s)',
                   r.proname || '(' || r.args || ')',
                   case when r.proretset or r.result like 'TABLE%' or r.args like '%OUT %'
                        then '* from' else '' end,
                   r.proname,
                   (select string_agg(case when r.variadic and i = r.pronargs
                                           then 'variadic $' || i else '$' || i end, ', ')
                      from generate_series(1, r.pronargs) i)));
          n := n + 1;
        exception when others then null; -- internal, cstring and the like
        end;
      end loop;
      -- Aggregates of the names the source calls: count(*), and one overload per argument
      -- type a call could pass (a value array folded by the builtin at the end).
      for r in select distinct p.proname from pg_proc p
                 join pg_namespace s on s.oid = p.pronamespace
                where s.nspname = 'pg_catalog' and p.proname = any(calls) and p.prokind = 'a'
      loop
        if r.proname = 'count' then
          create function evil.count_star(int8) returns int8 language sql immutable
            as 'select $1 operator(pg_catalog.+) 1';
          create function evil.count_star_final(int8) returns int8 language sql
            set search_path = pg_catalog, pg_temp as
            $f$ select evil.rec('count(*)'); select $1 $f$;
          create aggregate evil.count(*) (sfunc = evil.count_star, stype = int8,
            initcond = '0', finalfunc = evil.count_star_final);
          n := n + 1;
        end if;
        foreach t in array common || array(
          select distinct format_type(p.proargtypes[0], null) from pg_proc p
            join pg_namespace s on s.oid = p.pronamespace
           where s.nspname = 'pg_catalog' and p.proname = r.proname and p.prokind = 'a'
             and p.pronargs = 1
             and (select typtype from pg_type where oid = p.proargtypes[0]) <> 'p')
        loop
          begin
            execute format('select format_type(pg_typeof(pg_catalog.%I(x)), null)
              from (select null::%s as x) v', r.proname, t) into res;
            execute format('create function evil.%I(%s[]) returns %s language sql
              set search_path = pg_catalog, pg_temp as %L',
              'agg_' || r.proname || '_' || n, t, res,
              format('select evil.rec(%L); select pg_catalog.%I(x) from pg_catalog.unnest($1) x',
                     r.proname || '(' || t || ')', r.proname));
            execute format('create aggregate evil.%I(%s) (sfunc = pg_catalog.array_append,
              stype = %s[], initcond = ''{}'', finalfunc = evil.%I)',
              r.proname, t, t, 'agg_' || r.proname || '_' || n);
            n := n + 1;
          exception when others then null;
          end;
        end loop;
      end loop;
      -- Relations of pg_catalog the source names: a view that records as it is read.
      for r in select c.relname from pg_class c join pg_namespace s on s.oid = c.relnamespace
                where s.nspname = 'pg_catalog' and c.relname = any($3::text[])
                  and c.relkind in ('r', 'v')
      loop
        execute format('create view evil.%I as select * from pg_catalog.%I where evil.rec(%L)',
          r.relname, r.relname, r.relname);
        n := n + 1;
      end loop;
      -- Types a cast names: a domain over the builtin whose check records.
      foreach t in array $4::text[] loop
        execute format('create domain evil.%I as pg_catalog.%I check (evil.rec(%L))',
          t, t, '::' || t);
        n := n + 1;
      end loop;
      insert into evil.planted values ('count', n::text);
    end $plant$`.replace(/\$1::text\[\]/g, `'${pgArray(calls)}'::text[]`)
      .replace(/\$2::text\[\]/g, `'${pgArray(COMMON_TYPES)}'::text[]`)
      .replace(/\$3::text\[\]/g, `'${pgArray(relations)}'::text[]`)
      .replace(/\$4::text\[\]/g, `'${pgArray(SHADOWED_TYPES)}'::text[]`),
  );
  await sql.unsafe(`grant usage on schema evil to public;
    grant insert on evil.calls to public`);
  const [{ name }] = await sql`select name from evil.planted`;
  return Number(name);
}

/** A text[] literal of plain words. */
function pgArray(words: string[]): string {
  return `{${words.filter((w) => /^[a-z_][a-z0-9_]*$/.test(w)).join(",")}}`;
}

Deno.test("akadze's statements from TypeScript call no shadow of a role's search_path", () =>
  withDatabase("search_path_statements", async (db, sql) => {
    const planted = await plantShadows(sql);
    assert(planted > 500, `only ${planted} shadows planted`);
    // A login role whose own setting puts evil first: the app, the worker and the CLI
    // subprocesses all get it.
    const role = `hostile_${db.name.slice(-13, -5)}`;
    // track_functions counts the shadows' calls in rolled-back transactions too, whose rows in
    // evil.calls are gone.
    await sql.unsafe(`create role ${role} login superuser password 'hostile';
      alter role ${role} set search_path = evil, pg_catalog;
      alter role ${role} set track_functions = 'all'`);
    const url = new URL(db.url);
    url.username = role;
    url.password = "hostile";
    const hostileUrl = url.toString();
    const app = new Akadze({ databaseUrl: hostileUrl });
    // A statement a shadow breaks fails; the calls recorded until then are reported first.
    let failure: unknown;
    try {
      await runAll(app, sql, hostileUrl);
    } catch (error) {
      failure = error;
    } finally {
      await app.close();
    }
    // A session's function counts reach the statistics when it ends.
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from pg_stat_activity
        where usename = ${role}`;
      return n === 0;
    }, "the role's sessions to end");
    await sql.unsafe(`drop role ${role}`).catch(() => {});
    const calls = await sql`
      select name, query, count(*)::int as n from evil.calls group by name, query order by n desc`;
    const counted = await sql`
      select coalesce((select o.oprname || '(' || format_type(o.oprleft, null) || ',' ||
                              format_type(o.oprright, null) || ')'
                         from pg_operator o where 'op_' || o.oid = f.funcname), f.funcname) as name,
             f.calls::int as n
        from pg_stat_user_functions f
       where f.schemaname = 'evil' and f.funcname <> 'rec' order by f.calls desc`;
    assertEquals(
      [
        ...calls.map((c) => `${c.n}× ${c.name}: ${String(c.query).replace(/\s+/g, " ")}`),
        ...counted.map((c) => `${c.n}× ${c.name} (counted)`),
      ],
      [],
      failure ? `then: ${failure}` : undefined,
    );
    if (failure) throw failure;
  }));

/** Everything akadze sends, on `app` (whose role has the hostile search_path). */
async function runAll(app: Akadze, sql: Sql, hostileUrl: string): Promise<void> {
  const ok = app.task("ok", (args: { n?: number }, ctx) => {
    ctx.progress(args.n ?? 1);
    return { n: args.n ?? 0 };
  });
  let failures = 0;
  const flaky = app.task("flaky", { maxAttempts: 2, backoff: () => 0 }, () => {
    if (failures++ === 0) throw new Error("once");
    return "again";
  });
  const broken = app.task("broken", () => {
    throw new Fail("no");
  });
  let release!: () => void;
  const held = new Promise<void>((resolve) => release = resolve);
  const slow = app.task("slow", async (_args, ctx) => {
    await Promise.race([held, new Promise((r) => ctx.signal.addEventListener("abort", r))]);
  });
  const tx = app.task("tx", async (_args, ctx) => {
    await ctx.completeTx(async (t) => {
      await ok.using({ session: t }).enqueue({ n: 7 });
    });
  });
  const parent = app.task("parent", async (_args, ctx) => {
    const deps = await ctx.dependencies();
    if (Object.keys(deps).length === 0) {
      await ctx.waitForChildren({ child: { task: ok, args: { n: 2 } } });
      return;
    }
    return await ctx.resultOf(ok);
  });
  app.periodic("tick", { every: 1_000 }, () => {});

  // Enqueue: single, batch, with a uniqueKey (and its duplicate), delayed, a flow.
  const single = await ok.enqueue({ n: 1 });
  await ok.enqueueMany([{ n: 2 }, { n: 3 }]);
  await ok.using({ uniqueKey: "u1" }).enqueue({ n: 4 });
  await assertRejects(() => ok.using({ uniqueKey: "u1" }).enqueue({ n: 5 }), DuplicateJob);
  await ok.using({ uniqueKey: "u2" }).enqueueMany([{ n: 6 }]);
  const delayed = await ok.using({ delay: 3_600_000 }).enqueue({});
  await ok.using({ limitKey: "k", priority: 5, expiresAt: new Date(Date.now() + 60_000) })
    .enqueue({});
  const flow = await app.enqueueFlow({
    a: { task: ok, args: { n: 1 } },
    b: { task: ok, dependsOn: ["a"] },
    c: { task: broken, dependsOn: [{ step: "a", onFailure: "ignore" }] },
  });
  await setLimit(app.sql, "k", { maxRunning: 1, maxStarts: 10, window: 60_000 });
  const flakyId = await flaky.enqueue({});
  const brokenId = await broken.enqueue({});
  const txId = await tx.enqueue({});
  const parentId = await parent.enqueue({});
  await assertEnqueued(app, "ok", { n: 1 });
  await makeReady(app, { ids: [delayed] });

  // A worker that died with a job running: the rescuer puts it back.
  await sql`insert into akadze.workers (id, hostname, pid, queues, heartbeat_at)
    values ('dead', 'h', 1, '{default}', now() - interval '1 hour')`;
  const [{ id: lost }] = await sql`insert into akadze.jobs
      (task, state, worker_id, started_at, run_count, attempt)
    values ('ok', 'running', 'dead', now(), 1, 0) returning id::text as id`;
  // Old finished jobs for the pruner.
  await sql`insert into akadze.jobs (task, state, finished_at)
    values ('ok', 'succeeded', now() - interval '30 days')`;

  const w = startWorker(app, {
    id: "hostile",
    slots: 4,
    queues: ["default", "other"],
    heartbeatInterval: 200,
    // The default lease: a loop that a loaded machine stalls for seconds keeps its lease.
    heartbeatTtl: 30_000,
    pruneInterval: 300,
  });
  // A worker that stops early fails the test at once, with its reason.
  const early = w.exit.then((exit) => {
    throw new Error(`the worker stopped: ${exit.reason} ${exit.message ?? ""}`);
  });
  early.catch(() => {});
  try {
    const waitOptions = { timeout: 60_000 };
    const [done] = await Promise.race([app.waitForJobs([single], waitOptions), early]);
    assertEquals(done.state, "succeeded");
    assertEquals((await app.waitForJob(flakyId, waitOptions)).state, "succeeded");
    assertEquals((await app.waitForJob(brokenId, waitOptions)).state, "failed");
    assertEquals((await app.waitForJob(txId, waitOptions)).state, "succeeded");
    assertEquals((await app.waitForJob(parentId, waitOptions)).state, "succeeded");
    const steps = await app.waitForFlow(flow.id, waitOptions);
    assertEquals(steps.b.state, "succeeded");
    await waitForJob(sql, lost, (r) => r.state === "succeeded", "the rescued job");
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from akadze.jobs
        where finished_at < now() - interval '1 day'`;
      return n === 0;
    }, "the prune");
    await waitFor(async () => {
      const [{ n }] = await sql`select count(*)::int as n from akadze.periodic_runs`;
      return n > 0;
    }, "a schedule fire");
    // A cancel of a running job (the canceller and the heartbeat pass it on).
    const slowId = await slow.enqueue({});
    await waitForJob(sql, slowId, (r) => r.state === "running", "the slow job to run");
    assert(await requestCancel(app.sql, slowId));
    await waitForJob(sql, slowId, (r) => r.state === "cancelled", "the cancel");
    // And one of a queued job.
    const queuedId = await ok.using({ delay: 3_600_000 }).enqueue({});
    assert(await requestCancel(app.sql, queuedId));
    await waitForJob(sql, queuedId, (r) => r.state === "cancelled", "the queued cancel");
    release();
  } finally {
    const exit = await w.stop();
    assertEquals(exit.code, 0, `the worker stopped: ${exit.reason} ${exit.message ?? ""}`);
  }

  // The admin functions.
  assertEquals(
    (await getJob(app, single, { includeArgs: true, includeResult: true }))?.state,
    "succeeded",
  );
  assert((await listJobs(app, { state: "succeeded", task: "ok" })).length > 0);
  assert((await listJobs(app, { queue: "default", limit: 5 })).length > 0);
  await requeue(app.sql, brokenId);
  assertEquals((await requeueJobs(app.sql, { task: "broken" }, { dryRun: true })).requeued, 1);
  assertEquals((await requeueJobs(app.sql, { task: "broken", state: "failed" })).requeued, 1);
  assertEquals(await cancelJobs(app.sql, { task: "broken" }, { dryRun: true }), 2);
  assertEquals(await cancelJobs(app.sql, { task: "broken" }), 2);
  assert(await pauseQueue(app.sql, "other"));
  assert(await queueKnown(app.sql, "default"));
  assert((await listQueues(app)).length > 0);
  assert((await queueSnapshot(app)).length > 0);
  assert(await resumeQueue(app.sql, "other"));
  assertEquals((await listLimits(app)).map((l) => l.key), ["k"]);
  assert(await clearLimit(app.sql, "k"));
  await listWorkers(app);
  await pruneJobs(app.sql, { olderThan: 0 });
  assert((await renderMetrics(app.sql)).includes("akadze_"));
  await migrationStatus(app.sql);
  const [{ id: last }] = await sql`insert into akadze.jobs (task, state, run_at)
    values ('ok', 'queued', now()) returning id::text as id`;
  assertEquals(await drain(app), 1);
  const [{ id: failed }] = await sql`insert into akadze.jobs (task, state, attempt, finished_at)
    values ('broken', 'failed', 3, now()) returning id::text as id`;

  // The CLI, as the same role: each group at once, the groups in turn.
  const env = { AKADZE_DATABASE_URL: hostileUrl };
  const groups = [
    [
      ["jobs", "list"],
      ["jobs", "list", "--json", "--state", "failed", "--task", "broken", "--newest"],
      ["jobs", "show", last],
      ["jobs", "requeue", failed],
    ],
    [["jobs", "cancel", failed], ["queues", "list"], ["queues", "pause", "default"], [
      "workers",
      "list",
    ]],
    [
      ["queues", "resume", "default"],
      ["limits", "set", "smtp", "--max-running", "1"],
      ["metrics"],
      ["health"],
    ],
    [["limits", "list"], ["prune", "--dry-run"], ["schedules", "list", SCHEDULES_APP]],
    [["limits", "clear", "smtp"], ["prune"], ["migrate", "--status"]],
  ];
  for (const group of groups) {
    const outs = await Promise.all(group.map((args) => runCli(args, env)));
    outs.forEach((out, i) =>
      assertEquals(out.code, 0, `${group[i].join(" ")}: ${out.stderr}${out.stdout}`)
    );
  }
}
