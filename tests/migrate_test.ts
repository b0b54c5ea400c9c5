import { assert, assertEquals, assertRejects, assertThrows } from "./assert.ts";
import { AkadzeError, MigrateError } from "../src/errors.ts";
import {
  appliedVersions,
  applyMigrations,
  knownVersions,
  migrate,
  type MigrateRetry,
  MIGRATIONS,
  migrationSql,
  migrationStatus,
} from "../src/migrate.ts";
import postgres from "postgres";
import type { Sql } from "../src/db.ts";
import { quoteSchema } from "../src/db.ts";
import { psql, withDatabase } from "./_helpers.ts";

async function catalog(sql: Sql, schema = "akadze") {
  const tables = await sql`
    select c.relname, c.reloptions from pg_class c join pg_namespace n on n.oid = c.relnamespace
    where n.nspname = ${schema} and c.relkind = 'r' order by 1`;
  const indexes = await sql`
    select indexname, indexdef from pg_indexes where schemaname = ${schema} order by 1`;
  const constraints = await sql`
    select conname from pg_constraint c join pg_namespace n on n.oid = c.connamespace
    where n.nspname = ${schema} order by 1`;
  return {
    tables: tables.map((r) => r.relname),
    reloptions: Object.fromEntries(tables.map((r) => [r.relname, r.reloptions])),
    indexes: Object.fromEntries(indexes.map((r) => [r.indexname, r.indexdef])),
    constraints: constraints.map((r) => r.conname),
  };
}

Deno.test("migrate creates every table, index and constraint of the schema", async () => {
  await withDatabase("migrate_all", async (_db, sql) => {
    const c = await catalog(sql);
    assertEquals(c.tables, [
      "job_dependencies",
      "jobs",
      "limit_starts",
      "limits",
      "periodic_runs",
      "queue_pauses",
      "schema_migrations",
      "unique_windows",
      "workers",
    ]);
    for (
      const name of [
        "jobs_claim_idx",
        "jobs_running_worker_idx",
        "jobs_running_limit_idx",
        "jobs_active_unique_key_idx",
        "jobs_flow_idx",
        "jobs_finished_idx",
        "limit_starts_key_idx",
        "periodic_runs_pkey",
        "unique_windows_pkey",
        "unique_windows_until_idx",
      ]
    ) assert(c.indexes[name], `missing index ${name}`);
    assert(c.indexes.jobs_claim_idx.includes("WHERE (state = 'queued'::text)"));
    assert(c.indexes.jobs_claim_idx.includes("(queue, priority DESC, run_at, id)"));
    assert(c.indexes.jobs_active_unique_key_idx.startsWith("CREATE UNIQUE INDEX"));
    assert(!c.indexes.jobs_unique_key_idx, "0009 replaced the unique index of 0001");
    // A B-tree: a BRIN index makes every prune read all block ranges not yet summarized.
    assert(c.indexes.jobs_finished_idx.includes("USING btree (finished_at)"));
    for (
      const name of [
        "jobs_state_check",
        "jobs_counters_check",
        "jobs_attempt_check",
        "jobs_finished_check",
        "jobs_running_check",
        "limits_rate_check",
      ]
    ) assert(c.constraints.includes(name), `missing constraint ${name}`);
    assert(
      (c.reloptions.jobs as string[]).includes("autovacuum_vacuum_scale_factor=0.01"),
      "jobs has tuned autovacuum",
    );
    assertEquals(await appliedVersions(sql), knownVersions());
  });
});

Deno.test("the jobs constraints reject impossible rows", async () => {
  await withDatabase("migrate_checks", async (_db, sql) => {
    const bad = [
      sql`insert into akadze.jobs (task, state) values ('t', 'lost')`,
      sql`insert into akadze.jobs (task, attempt, max_attempts) values ('t', 4, 3)`,
      sql`insert into akadze.jobs (task, max_attempts) values ('t', 0)`,
      sql`insert into akadze.jobs (task, state) values ('t', 'running')`,
      sql`insert into akadze.jobs (task, state) values ('t', 'succeeded')`,
      sql`insert into akadze.jobs (task, args) values ('t', '[]')`,
      sql`insert into akadze.jobs (task, queue) values ('t', 'has space')`,
    ];
    for (const query of bad) {
      await assertRejects(() => query, (e: { code?: string }) => e.code === "23514");
    }
    await sql`insert into akadze.jobs (task, unique_key) values ('t', 'k')`;
    await assertRejects(
      () => sql`insert into akadze.jobs (task, unique_key) values ('t', 'k')`,
      (e: { code?: string }) => e.code === "23505",
    );
  });
});

Deno.test("a second migrate changes nothing", async () => {
  await withDatabase("migrate_twice", async (_db, sql) => {
    const before = await catalog(sql);
    assertEquals(await migrate(sql), []);
    assertEquals(await catalog(sql), before);
    const [{ n }] = await sql`select count(*)::int as n from akadze.schema_migrations`;
    assertEquals(n, knownVersions().length);
  });
});

Deno.test("concurrent migrates apply each version exactly once", async () => {
  await withDatabase("migrate_race", async (db, sql) => {
    const results = await Promise.all(Array.from({ length: 6 }, () => migrate(db.url)));
    assertEquals(results.flat().sort(), knownVersions());
    const rows = await sql`select version from akadze.schema_migrations`;
    assertEquals(rows.map((r) => r.version), knownVersions());
  }, { migrated: false });
});

Deno.test("a custom schema name holds the tables; the default schema is untouched", async () => {
  await withDatabase("migrate_custom", async (_db, sql) => {
    assertEquals(await migrate(sql, { schema: "tenant_queue" }), knownVersions());
    const c = await catalog(sql, "tenant_queue");
    assert(c.tables.includes("jobs"));
    assertEquals(await appliedVersions(sql, { schema: "tenant_queue" }), knownVersions());
    assertEquals(await appliedVersions(sql), []);
    const [{ n }] = await sql`select count(*)::int as n from pg_namespace where nspname = 'akadze'`;
    assertEquals(n, 0);
  }, { migrated: false });
});

Deno.test("a hostile or invalid schema name is refused before anything runs", async () => {
  await withDatabase("migrate_hostile", async (_db, sql) => {
    const before = await sql`select count(*)::int as n from pg_namespace`;
    for (
      const name of [
        'x"; drop table t; --',
        "Akadze",
        "1abc",
        "",
        "pg_akadze",
        "a".repeat(64),
        "a b",
      ]
    ) {
      await assertRejects(() => migrate(sql, { schema: name }), AkadzeError);
      await assertRejects(() => appliedVersions(sql, { schema: name }), AkadzeError);
    }
    assertEquals(await sql`select count(*)::int as n from pg_namespace`, before);
    assertThrows(() => quoteSchema("ok; drop"), AkadzeError);
  }, { migrated: false });
});

Deno.test("appliedVersions on an empty database returns [] and creates nothing", async () => {
  await withDatabase("migrate_empty", async (db, sql) => {
    assertEquals(await appliedVersions(db.url), []);
    const [{ n }] = await sql`select count(*)::int as n from pg_namespace where nspname = 'akadze'`;
    assertEquals(n, 0);
  }, { migrated: false });
});

Deno.test("migrationStatus lists pending, then applied versions with their time, read-only", async () => {
  await withDatabase("migrate_status", async (db, sql) => {
    assertEquals(
      await migrationStatus(db.url),
      knownVersions().map((version) => ({ version, state: "pending", appliedAt: null })),
    );
    const [{ n }] = await sql`select count(*)::int as n from pg_namespace where nspname = 'akadze'`;
    assertEquals(n, 0, "nothing created");
    await migrate(sql);
    // A version a newer release applied is listed too.
    await sql`insert into akadze.schema_migrations (version) values ('9999_newer')`;
    const status = await migrationStatus(sql);
    assertEquals(
      status.map((m) => [m.version, m.state]),
      [...knownVersions(), "9999_newer"].map((v) => [v, "applied"]),
    );
    assert(status.every((m) => m.appliedAt instanceof Date));
  }, { migrated: false });
});

Deno.test("a migration with $$ function bodies and many statements applies", async () => {
  await withDatabase("migrate_dollar", async (_db, sql) => {
    const migrations = [{
      version: "0001_fn",
      sql: `create table {{schema}}.t (x int);
            create function {{schema}}.twice(x int) returns int language plpgsql as $$
            begin
              return x * 2; -- a semicolon inside the body
            end;
            $$;
            insert into {{schema}}.t values ({{schema}}.twice(21));`,
    }];
    assertEquals(await applyMigrations(sql, migrations, { schema: "fn_test" }), ["0001_fn"]);
    const [{ x }] = await sql`select x from fn_test.t`;
    assertEquals(x, 42);
    assertEquals(await applyMigrations(sql, migrations, { schema: "fn_test" }), []);
  }, { migrated: false });
});

Deno.test("a failing version rolls back whole; the versions before it stay applied", async () => {
  await withDatabase("migrate_fail", async (_db, sql) => {
    const migrations = [
      { version: "0001_ok", sql: "create table {{schema}}.a (x int);" },
      {
        version: "0002_bad",
        sql: "create table {{schema}}.b (x int); select nonsense from nowhere;",
      },
    ];
    const error = await assertRejects(
      () => applyMigrations(sql, migrations, { schema: "fail_test" }),
      MigrateError,
    );
    assert(String(error.message).includes("0002_bad"), error.message);
    // Each version commits on its own, so that none holds its locks until the last is done.
    assertEquals(await appliedVersions(sql, { schema: "fail_test" }), ["0001_ok"]);
    const [{ a, b }] = await sql`
      select to_regclass('fail_test.a')::text as a, to_regclass('fail_test.b')::text as b`;
    assertEquals({ a, b }, { a: "fail_test.a", b: null });
  }, { migrated: false });
});

Deno.test("a version that cannot get its lock in time is rolled back and tried again", async () => {
  await withDatabase("migrate_lock_retry", async (db, sql) => {
    await applyMigrations(sql, [{ version: "0001_t", sql: "create table {{schema}}.t (x int);" }], {
      schema: "retry_test",
    });
    const holder = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      let release!: () => void;
      const released = new Promise<void>((resolve) => release = resolve);
      let locked!: () => void;
      const isLocked = new Promise<void>((resolve) => locked = resolve);
      const held = holder.begin(async (tx) => {
        await tx`select count(*) from retry_test.t`;
        locked();
        await released;
      });
      await isLocked;
      const retries: MigrateRetry[] = [];
      const migrations = [
        { version: "0001_t", sql: "create table {{schema}}.t (x int);" },
        { version: "0002_alter", sql: "alter table {{schema}}.t add column y int;" },
      ];
      const migrating = applyMigrations(sql, migrations, {
        schema: "retry_test",
        lockTimeout: 50,
        onRetry: (retry) => {
          retries.push(retry);
          if (retries.length === 2) release();
        },
      });
      // Meanwhile the table stays writable: the version waits at most lockTimeout at a time.
      await sql`insert into retry_test.t values (1)`;
      assertEquals(await migrating, ["0002_alter"]);
      await held;
      assert(retries.length >= 2);
      assertEquals(retries[0].version, "0002_alter");
      assert(retries[0].reason.includes("lock timeout"), retries[0].reason);
      assertEquals(await appliedVersions(sql, { schema: "retry_test" }), ["0001_t", "0002_alter"]);
      // Past retryFor, migrate fails and says what to do.
      const again = holder.begin(async (tx) => {
        await tx`select count(*) from retry_test.t`;
        await new Promise((resolve) => setTimeout(resolve, 1_500));
      });
      await new Promise((resolve) => setTimeout(resolve, 100));
      const error = await assertRejects(
        () =>
          applyMigrations(sql, [
            ...migrations,
            { version: "0003_alter", sql: "alter table {{schema}}.t add column z int;" },
          ], { schema: "retry_test", lockTimeout: 50, retryFor: 300 }),
        MigrateError,
      );
      assert(error.message.includes("while applying 0003_alter"), error.message);
      assert(error.message.includes("--retry-for"), error.message);
      await again;
    } finally {
      await holder.end({ timeout: 1 });
    }
  }, { migrated: false });
});

Deno.test("every version runs in a transaction or holds concurrent index statements only", async () => {
  // migrationSql reads every version as migrate does: it throws for a version that mixes
  // concurrent index statements with others.
  const script = migrationSql();
  // The script runs in one transaction: there no index is built concurrently.
  assert(!/\bconcurrently\b/i.test(script.replace(/^\s*--.*$/gm, "")));
  const mixed = {
    version: "0009_mixed",
    sql: "CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON {{schema}}.jobs (id);\n" +
      "ALTER TABLE {{schema}}.jobs ADD COLUMN x int;",
  };
  // Refused before connecting (port 1 refuses connections).
  const error = await assertRejects(
    () => applyMigrations("postgres://u@127.0.0.1:1/db", [mixed]),
    MigrateError,
  );
  assert(error.message.includes("0009_mixed") && error.message.includes("ALTER TABLE"));
  const rerunnable = { version: "0009_index", sql: "CREATE INDEX CONCURRENTLY i ON t (id);" };
  const plain = await assertRejects(
    () => applyMigrations("postgres://u@127.0.0.1:1/db", [rerunnable]),
    MigrateError,
  );
  assert(plain.message.includes("IF NOT EXISTS"), plain.message);
});

Deno.test("a concurrent index version drops what a failed build left, and records itself", async () => {
  await withDatabase("migrate_concurrent", async (_db, sql) => {
    await applyMigrations(sql, [{ version: "0001_t", sql: "create table {{schema}}.t (x int);" }], {
      schema: "cic_test",
    });
    await sql`insert into cic_test.t select 1 from generate_series(1, 10)`;
    // A failed concurrent build leaves its index behind, invalid.
    await assertRejects(() => sql`create unique index concurrently t_x_idx on cic_test.t (x)`);
    await sql`delete from cic_test.t`;
    const migrations = [
      { version: "0001_t", sql: "create table {{schema}}.t (x int);" },
      {
        version: "0002_idx",
        sql: "-- a comment; with a semicolon\n" +
          "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_x_idx ON {{schema}}.t (x);\n",
      },
    ];
    assertEquals(await applyMigrations(sql, migrations, { schema: "cic_test" }), ["0002_idx"]);
    const [{ valid }] = await sql`
      select i.indisvalid as valid from pg_index i where i.indexrelid = 'cic_test.t_x_idx'::regclass`;
    assertEquals(valid, true);
    assertEquals(await applyMigrations(sql, migrations, { schema: "cic_test" }), []);
  }, { migrated: false });
});

Deno.test("migrate reports a refused connection without the password", async () => {
  const url = "postgres://app:hunter2secret@127.0.0.1:1/app";
  const error = await assertRejects(() => migrate(url), MigrateError);
  assert(!error.message.includes("hunter2secret"), error.message);
});

/** Everything a schema holds, with its name taken out so that two schemas compare. */
async function definitions(sql: Sql, schema: string) {
  const rows = await sql`
    select 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '') as d
      from pg_class c join pg_namespace n on n.oid = c.relnamespace
     where n.nspname = ${schema} and c.relkind = 'r'
    union all
    select 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
      from pg_attribute a join pg_class c on c.oid = a.attrelid
      join pg_namespace n on n.oid = c.relnamespace
      left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
     where n.nspname = ${schema} and c.relkind = 'r' and a.attnum > 0
    union all
    select 'index ' || indexdef from pg_indexes where schemaname = ${schema}
    union all
    select 'constraint ' || conname || ' ' || pg_get_constraintdef(c.oid)
      from pg_constraint c join pg_namespace n on n.oid = c.connamespace
     where n.nspname = ${schema}
    union all
    select 'function ' || pg_get_functiondef(p.oid)
      from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = ${schema}
    order by 1`;
  return rows.map((r) =>
    (r.d as string).replaceAll(`"${schema}".`, "S.").replaceAll(`${schema}.`, "S.").replaceAll(
      `"${schema}"`,
      "S",
    )
  );
}

Deno.test("migrationSql's script, run by psql, makes the schema migrate makes and records it", async () => {
  await withDatabase("migrate_print", async (db, sql) => {
    await migrate(sql, { schema: "native" });
    const script = migrationSql({ schema: "printed" });
    assert(
      script.startsWith(`-- akadze schema "printed": versions ${knownVersions().join(", ")}.`),
    );
    const out = await psql(db.url, script, { args: ["--single-transaction"] });
    assertEquals([out.code, out.stderr], [0, ""]);
    const native = await definitions(sql, "native");
    assert(native.length > 40, "the comparison sees the schema");
    assertEquals(await definitions(sql, "printed"), native);
    assertEquals(await appliedVersions(sql, { schema: "printed" }), knownVersions());
    // akadze's own migrate sees every version as applied; a second run of the script
    // applies nothing.
    assertEquals(await migrate(sql, { schema: "printed" }), []);
    const again = await psql(db.url, script, { args: ["--single-transaction"] });
    assertEquals([again.code, again.stderr], [0, ""]);
    assertEquals(await definitions(sql, "printed"), native);
    const [{ n }] = await sql`select count(*)::int as n from printed.schema_migrations`;
    assertEquals(n, knownVersions().length);
    assertThrows(() => migrationSql({ schema: 'x"; drop table t; --' }), AkadzeError);
  }, { migrated: false });
});

Deno.test("migrationSql's script applies only the versions the database lacks", async () => {
  await withDatabase("migrate_print_partial", async (db, sql) => {
    assertEquals(await applyMigrations(sql, MIGRATIONS.slice(0, 1)), [MIGRATIONS[0].version]);
    const [before] = await sql`select applied_at from akadze.schema_migrations`;
    // Statement by statement, without one transaction around them, works too.
    const out = await psql(db.url, migrationSql());
    assertEquals([out.code, out.stderr], [0, ""]);
    const rows = await sql`select version, applied_at from akadze.schema_migrations
                           order by version`;
    assertEquals(rows.map((r) => r.version), knownVersions());
    assertEquals(rows[0].applied_at, before.applied_at, "the applied version was not run again");
    assertEquals(await migrate(sql), []);
    const [{ ok }] = await sql`select akadze.enqueue('t') is not null as ok`;
    assert(ok);
  }, { migrated: false });
});

Deno.test("0015 replaces enqueue and enqueue_many with their grants: a role granted them by name keeps them", async () => {
  await withDatabase("migrate_0015_grants", async (db, sql) => {
    const at = MIGRATIONS.findIndex((m) => m.version === "0015_unique_key_modes");
    await applyMigrations(sql, MIGRATIONS.slice(0, at));
    const role = `akadze_grantee_${db.url.match(/\/([^/?]+)(\?|$)/)![1]}`.slice(0, 60);
    await sql.unsafe(`create role ${role}`);
    try {
      await sql.unsafe(`
        revoke execute on function akadze.enqueue, akadze.enqueue_many from public;
        grant execute on function akadze.enqueue, akadze.enqueue_many to ${role};`);
      await migrate(sql);
      const acls = await sql`
        select p.proname, pg_get_function_identity_arguments(p.oid) as args,
               has_function_privilege(${role}, p.oid, 'execute') as granted,
               has_function_privilege('public', p.oid, 'execute') as public
          from pg_proc p join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'akadze' and p.proname in ('enqueue', 'enqueue_many')
         order by 1`;
      assertEquals(acls.map((r) => [r.proname, r.granted, r.public]), [
        ["enqueue", true, false],
        ["enqueue_many", true, false],
      ]);
      // One of each: the old ones are gone, so a call is never ambiguous.
      assert(acls.every((r) => (r.args as string).includes("throttle interval")));
      await sql`select akadze.enqueue('t', unique_key => 'k', throttle => '1 minute')`;
    } finally {
      await sql.unsafe(`drop owned by ${role}; drop role ${role}`);
    }
  });
});
