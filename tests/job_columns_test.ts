// The SQL copies of a job's shape, read back from a migrated database and compared with the
// TypeScript they repeat: the claim functions (claim rule and result columns, claim_rule.ts and
// job_columns.ts), and the state lists of the constraints, partial indexes and SQL enqueue
// (job.ts).
import { quoteSchema } from "../src/db.ts";
import { ACTIVE_STATES, JOB_STATES, stateList, TERMINAL_STATES } from "../src/job.ts";
import { claimResultColumns, claimValues, columnsOf, selectList } from "../src/job_columns.ts";
import { claimOrder, claimSet, noLimitPredicate } from "../src/worker/claim_rule.ts";
import { readyPredicates } from "../src/ready_rule.ts";
import { assert, assertEquals } from "./assert.ts";
import { withDatabase } from "./_helpers.ts";

/**
 * SQL text compared loosely: case, whitespace, spacing around parentheses and commas, and
 * names qualified with pg_catalog (`operator(pg_catalog.=)` is `=`).
 */
function normalize(sql: string): string {
  return sql.toLowerCase().replace(/\s*operator\(pg_catalog\.([^)]+)\)\s*/g, " $1 ")
    .replaceAll("pg_catalog.", "").replace(/\s+/g, " ")
    .replace(/\s*([(),])\s*/g, "$1").trim();
}

/** How many times `part` stands in `text`, both normalized. */
function occurrences(text: string, part: string): number {
  return normalize(text).split(normalize(part)).length - 1;
}

Deno.test("claim_one and claim_one_floor repeat the claim rule and return the claim columns, in order", async () => {
  await withDatabase("job_columns_claim", async (_db, sql) => {
    const s = quoteSchema("akadze");
    const functions = await sql`
      select p.proname as name, p.prosrc as body,
             array(select a.name || ' ' || format_type(a.type, null)
                     from unnest(p.proargnames, p.proallargtypes, p.proargmodes::text[])
                          with ordinality as a(name, type, mode, i)
                    where a.mode = 't' order by a.i) as result
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze' and p.proname in ('claim_one', 'claim_one_floor')
       order by p.proname`;
    assertEquals(functions.map((f) => f.name), ["claim_one", "claim_one_floor"]);
    for (const f of functions) {
      const body = f.body as string;
      assertEquals(f.result, claimResultColumns(), `${f.name}: its result columns`);
      const returning = /returning (.*?);/.exec(normalize(body))?.[1];
      assertEquals(returning, normalize(claimValues().join(", ")), `${f.name}: its RETURNING`);
      // Every scan of the jobs for candidates has every condition of the rule.
      const scans = occurrences(body, `from ${s}.jobs c`);
      assert(scans >= 1, `${f.name} scans ${s}.jobs c`);
      for (const predicate of [...readyPredicates("p_queue"), noLimitPredicate(s)]) {
        assertEquals(occurrences(body, predicate), scans, `${f.name}: ${predicate}`);
      }
      assertEquals(occurrences(body, `set ${claimSet("p_worker")}`), 1, `${f.name}: its SET`);
      assert(occurrences(body, `order by ${claimOrder("c")}`) >= 1, `${f.name}: its order`);
    }
    // claim_one_floor merges its scans in claim order.
    assertEquals(occurrences(functions[1].body, `order by ${claimOrder("u")}`), 1);
  });
});

Deno.test("claim_one_checked (0020) returns the claim columns, then its answer on limit keys", async () => {
  await withDatabase("job_columns_checked", async (_db, sql) => {
    const [f] = await sql`
      select array(select a.name || ' ' || format_type(a.type, null)
                     from unnest(p.proargnames, p.proallargtypes, p.proargmodes::text[])
                          with ordinality as a(name, type, mode, i)
                    where a.mode = 't' order by a.i) as result
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze' and p.proname = 'claim_one_checked'`;
    assertEquals(f.result, [...claimResultColumns(), "keyed text"]);
  });
});

Deno.test("the hand-off of complete_jobs (0019) claims by the claim rule and returns the claim columns, by name", async () => {
  await withDatabase("job_columns_hand_off", async (_db, sql) => {
    const s = quoteSchema("akadze");
    const [f] = await sql`
      select p.prosrc as body from pg_proc p join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze' and p.proname = 'complete_jobs' and p.pronargs = 13`;
    const body = f.body as string;
    // The handed jobs: each part of the claim's SET, given to a handed dependent only (its
    // update from waiting to running is the one that counts it down), and its values named as
    // decodeClaimed reads them.
    const set = normalize(claimSet("p_worker")).split(/,(?![^(]*\))/);
    assertEquals(set.length, 4, "the claim's SET has four parts");
    assert(normalize(body).includes(normalize("then v_running")), "its state");
    assert(normalize(body).includes(normalize("run_count = j.run_count +")), "its run_count");
    assert(
      normalize(body).includes(normalize("then p_worker else j.worker_id end")),
      "its worker_id",
    );
    assert(
      normalize(body).includes(normalize("then now() else j.started_at end")),
      "its started_at",
    );
    const returning = /returning j\.state as new_state,(j\.id::text as id.*?\bas args)\)/
      .exec(normalize(body))?.[1];
    assertEquals(returning, normalize(selectList("claim")), "its RETURNING");
    // The jobs that would come first (alias a) are ready by the ready rule and free of a limits
    // row, as the claim's; so are the dependents handed (alias c), as they will be once queued:
    // they still wait in the statement's snapshot.
    for (const [alias, queue] of [["c", "q.name"], ["a", "q.name"]]) {
      const of = (sql: string) => sql.replaceAll("c.", `${alias}.`);
      const predicates = [...readyPredicates(queue), noLimitPredicate(s)].filter((p) =>
        alias === "a" || !p.startsWith("c.state") && !p.startsWith("c.queue")
      );
      for (const predicate of predicates) {
        assertEquals(occurrences(body, of(predicate)), 1, `${alias}: ${of(predicate)}`);
      }
    }
    assertEquals(occurrences(body, "c.state = 'waiting' and c.pending_deps <= k.n"), 1);
    assertEquals(occurrences(body, "join firsts q on q.name = c.queue"), 1);
    assertEquals(occurrences(body, `order by ${claimOrder("x")}`), 2, "claim order");
  });
});

Deno.test("complete_jobs_plain (0024) writes an outcome as complete_jobs (0019) does, and returns its columns", async () => {
  await withDatabase("job_columns_plain", async (_db, sql) => {
    const bodies = await sql`
      select p.proname as name, p.prosrc as body from pg_proc p
        join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze' and (p.proname = 'complete_jobs_plain'
              or (p.proname = 'complete_jobs' and p.pronargs = 13))`;
    const of = (name: string) => normalize(bodies.find((b) => b.name === name)!.body as string);
    // The UPDATE's SET and WHERE: from SET to the unnest's aliases (which the plain one
    // lists without the dead-letter columns), then from its WHERE to RETURNING.
    const set = (body: string) => /update "akadze"\.jobs j set(.*?)from unnest\(/.exec(body)?.[1];
    const where = (body: string) => /(where j\.id = o\.id.*?)returning/.exec(body)?.[1];
    const full = of("complete_jobs");
    const plain = of("complete_jobs_plain");
    assert(set(full) !== undefined && where(full) !== undefined, "0019's UPDATE found");
    assertEquals(set(plain), set(full), "the SET");
    assertEquals(where(plain), where(full), "the WHERE");
    assert(
      plain.includes(normalize(
        "returning j.id::text, j.state::text, j.attempt, date_part('epoch', j.run_at) * 1000, " +
          "j.has_dependents, null::jsonb",
      )),
      "the columns of complete_jobs, in its order",
    );
  });
});

Deno.test("the state constraints, the partial indexes and SQL enqueue list the states of job.ts", async () => {
  await withDatabase("job_columns_states", async (_db, sql) => {
    const literals = (text: string) => [...text.matchAll(/'([a-z_]+)'::text/g)].map((m) => m[1]);
    const sorted = (states: readonly string[]) => [...states].sort();
    const constraints = new Map(
      (await sql`
        select conname, pg_get_constraintdef(oid) as def from pg_constraint
         where conrelid = 'akadze.jobs'::regclass and contype = 'c'`)
        .map((r) => [r.conname as string, r.def as string]),
    );
    assertEquals(sorted(literals(constraints.get("jobs_state_check")!)), sorted(JOB_STATES));
    assertEquals(
      sorted(literals(constraints.get("jobs_finished_check")!)),
      sorted(TERMINAL_STATES),
    );
    const predicates = new Map(
      (await sql`
        select c.relname, pg_get_expr(i.indpred, i.indrelid) as pred
          from pg_index i join pg_class c on c.oid = i.indexrelid
         where i.indrelid = 'akadze.jobs'::regclass and i.indpred is not null`)
        .map((r) => [r.relname as string, r.pred as string]),
    );
    assertEquals(
      sorted(literals(predicates.get("jobs_active_unique_key_idx")!)),
      sorted(ACTIVE_STATES),
    );
    assertEquals(sorted(literals(predicates.get("jobs_finished_idx")!)), sorted(TERMINAL_STATES));
    // SQL enqueue's ON CONFLICT names the unique index's states (TypeScript enqueue derives
    // its own from ACTIVE_STATES).
    // So do enqueue_keyed's (the unique-key modes, 0015), and its look-up of the holder.
    const bodies = await sql`
      select p.proname, p.prosrc as body from pg_proc p
        join pg_namespace n on n.oid = p.pronamespace
       where n.nspname = 'akadze' and p.proname in ('enqueue_many', 'enqueue_keyed')
       order by 1`;
    assertEquals(bodies.map((r) => r.proname), ["enqueue_keyed", "enqueue_many"]);
    for (const { proname, body } of bodies) {
      assertEquals(occurrences(body, `where state in (${stateList(ACTIVE_STATES)})`), 1, proname);
    }
    assertEquals(
      occurrences(bodies[0].body, `j.state in (${stateList(ACTIVE_STATES)})`),
      1,
      "enqueue_keyed's holder",
    );
  });
});

Deno.test("every read of job_columns.ts selects columns the jobs table has", async () => {
  await withDatabase("job_columns_table", async (_db, sql) => {
    const columns = new Set(
      (await sql`
        select attname from pg_attribute
         where attrelid = 'akadze.jobs'::regclass and attnum > 0 and not attisdropped`)
        .map((r) => r.attname as string),
    );
    for (const read of ["claim", "row", "info", "summary", "detail", "step"] as const) {
      for (const c of columnsOf(read)) {
        if (c.sql) continue;
        assert(columns.has(c.name), `${read} reads ${c.name}, which akadze.jobs does not have`);
      }
    }
  });
});

Deno.test("the ready rule names a queue only when given one", () => {
  const any = readyPredicates();
  assert(!any.some((p) => p.includes("c.queue")), `no queue predicate: ${any.join(" and ")}`);
  const one = readyPredicates("$1");
  assertEquals(one.filter((p) => !any.includes(p)), ["c.queue operator(pg_catalog.=) $1"]);
  assertEquals(one.filter((p) => any.includes(p)), any);
});
