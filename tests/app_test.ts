import * as v from "valibot";
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import { AkadzeError } from "../src/errors.ts";
import { assert, assertEquals, assertRejects, assertThrows } from "./assert.ts";
import { withApp, withDatabase } from "./_helpers.ts";

const URL = "postgres://u:p@127.0.0.1:1/x_test";

Deno.test("Akadze needs exactly one of databaseUrl and sql", async () => {
  const sql = postgres(URL, { max: 1 });
  try {
    const both = assertThrows(() => new Akadze({ databaseUrl: URL, sql }), AkadzeError);
    assert(both.message.includes("not both"));
    assertThrows(() => new Akadze({}), AkadzeError);
    assertThrows(() => new Akadze({ sql: {} as never }), AkadzeError);
  } finally {
    await sql.end();
  }
});

Deno.test("Akadze options are validated with precise messages", () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ schema: "Bad-Name" }, /schema must be/],
    [{ retention: -1 }, /retention must be a non-negative number/],
    [{ grace: -1 }, /grace must be a positive number/],
    [{ notify: "yes" }, /notify must be a boolean/],
    [{ max: 0 }, /max must be a positive integer/],
    [{ databse: "x" }, /unknown Akadze option "databse"/],
  ];
  for (const [extra, message] of cases) {
    const error = assertThrows(() => new Akadze({ databaseUrl: URL, ...extra }), AkadzeError);
    assert(message.test(error.message), error.message);
  }
  assertThrows(() => new Akadze({ databaseUrl: "mysql://x" }), AkadzeError);
});

Deno.test("the app exposes its settings and defaults", async () => {
  const app = new Akadze({ databaseUrl: URL });
  assertEquals(
    [app.schema, app.retention, app.grace, app.notify],
    ["akadze", 7 * 24 * 3600 * 1000, 60_000, true],
  );
  assertEquals(app.sql.options.prepare, false);
  assertEquals(Object.keys(app.hooks).sort(), [
    "afterRun",
    "beforeRun",
    "onEnqueue",
    "onTransition",
  ]);
  await app.close();
});

Deno.test("close() ends an owned pool and leaves an adopted one open", async () => {
  await withDatabase("app_close", async (db) => {
    const adopted = postgres(db.url, { max: 1 });
    const app = new Akadze({ sql: adopted });
    assertEquals(app.sql, adopted);
    await app.close();
    const [{ one }] = await adopted`select 1 as one`;
    assertEquals(one, 1);
    await adopted.end();
    const owned = new Akadze({ databaseUrl: db.url });
    await owned.sql`select 1`;
    await owned.close();
    await assertRejects(() => owned.sql`select 1`);
  }, { migrated: false });
});

Deno.test("task registration validates every option with AkadzeError", () => {
  const app = new Akadze({ databaseUrl: URL });
  const handler = () => {};
  app.task("taken", handler);
  const cases: [() => unknown, RegExp][] = [
    [() => app.task("taken", handler), /task "taken" is already registered/],
    [() => app.task("", handler), /task name must be/],
    [() => app.task("a", { maxAttempts: 0 }, handler), /maxAttempts must be an integer from 1/],
    [() => app.task("a", { maxAttempts: 2 ** 31 }, handler), /maxAttempts must be/],
    [() => app.task("a", { maxAttempts: 1.5 }, handler), /maxAttempts must be/],
    [() => app.task("a", { timeout: 0 }, handler), /timeout must be a positive number/],
    [() => app.task("a", { timeout: -5 }, handler), /timeout must be/],
    [() => app.task("a", { timeout: NaN }, handler), /timeout must be/],
    [() => app.task("a", { priority: 40000 }, handler), /priority must be an integer from -32768/],
    [() => app.task("a", { priority: 0.5 }, handler), /priority must be/],
    [() => app.task("a", { queue: "has space" }, handler), /queue must be/],
    [() => app.task("a", { args: { parse() {} } as never }, handler), /Standard Schema/],
    [() => app.task("a", { backoff: 5 as never }, handler), /backoff must be a function/],
    [() => app.task("a", { retries: 3 } as never, handler), /unknown option "retries"/],
    [() => app.task("a", {}, "nope" as never), /handler must be a function/],
  ];
  for (const [register, message] of cases) {
    const error = assertThrows(register, AkadzeError);
    assert(message.test(error.message), error.message);
  }
  assertEquals([...app.tasks.keys()], ["taken"]);
});

Deno.test("register binds a plain function; include calls register(app)", () => {
  const app = new Akadze({ databaseUrl: URL });
  const deps = { greeting: "hi" };
  const task = app.register(({ name }: { name?: unknown }) => `${deps.greeting} ${name}`, {
    name: "greet",
    queue: "mail",
    maxAttempts: 5,
  });
  assertEquals([task.name, task.queue, task.maxAttempts], ["greet", "mail", 5]);
  assertEquals(app.tasks.get("greet"), task);
  const module = {
    register(app: Akadze) {
      app.task("mod.one", () => 1);
      app.task("mod.two", { queue: "ops" }, () => 2);
    },
  };
  assertEquals(app.include(module), app);
  assert(app.tasks.has("mod.one") && app.tasks.get("mod.two")?.queue === "ops");
  assertThrows(() => app.include({} as never), AkadzeError);
  assertThrows(() => app.register(() => {}, { name: "greet" }), AkadzeError);
});

Deno.test("the handler's argument type is inferred from the schema", async () => {
  await withApp("app_types", async (app) => {
    const task = app.task(
      "typed",
      { args: v.object({ name: v.string(), n: v.optional(v.number(), 1) }) },
      ({ name, n }) => name.toUpperCase().repeat(n),
    );
    // @ts-expect-error: name is required
    await assertRejects(() => task.enqueue({}));
    // @ts-expect-error: name must be a string
    await assertRejects(() => task.enqueue({ name: 1 }));
    const id = await task.enqueue({ name: "ada" });
    assert(/^\d+$/.test(id));
    const untyped = app.task("untyped", (args) => Object.keys(args).length);
    await untyped.enqueue();
  });
});
