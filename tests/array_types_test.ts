// A statement with an array parameter or column must not depend on postgres.js having
// learned the array types: it learns them lazily, per new connection, and under load the
// first statement of a connection could run before they were installed (`malformed array
// literal: "default"` from a worker's first heartbeat). A pool with `fetch_types: false`
// never learns them, so it is in that state for every statement, deterministically.
import postgres from "postgres";
import { Akadze } from "../src/app.ts";
import {
  arrayLiteral,
  installArrayTypes,
  parseArray,
  repeatedLiteral,
  serializeArray,
} from "../src/array_types.ts";
import { connect } from "../src/db.ts";
import { Heartbeat } from "../src/worker/heartbeat.ts";
import { assert, assertEquals } from "./assert.ts";
import { startWorker, waitForJob, withDatabase } from "./_helpers.ts";

Deno.test("array literals: every element quoted and escaped, nested arrays, NULL, and the text form read back", () => {
  assertEquals(
    serializeArray(["a", 'x"y', "b\\c", null, ""], undefined),
    '{"a","x\\"y","b\\\\c",null,""}',
  );
  assertEquals(serializeArray([], undefined), "{}");
  assertEquals(serializeArray([[1, 2], [3, 4]], undefined), '{{"1","2"},{"3","4"}}');
  assertEquals(serializeArray("{a}", undefined), "{a}", "a literal is sent as it is");
  assertEquals(parseArray('{a,"b c",NULL,"NULL","x\\"y","b\\\\c",""}'), [
    "a",
    "b c",
    null,
    "NULL",
    'x"y',
    "b\\c",
    "",
  ]);
  assertEquals(parseArray("{}"), []);
  assertEquals(parseArray("{{1,2},{3,4}}", Number), [[1, 2], [3, 4]]);
});

Deno.test("arrayLiteral writes the values serializeArray writes, one value repeated or not, as the server reads them", async () => {
  const cases: (string | number | null)[][] = [
    ["a", "b", "c"],
    ["a", 'x"y', "b\\c", "", "NULL", "null", ",", "{}", "a b", "ü"],
    ["same", "same", "same"],
    ['q"', 'q"'],
    [null, null],
    [1, 2, -3, 40000],
    [7, 7, 7],
    [1, null, 3],
    ["a", null, "c"],
    [1.5, 31536000000],
    ["one"],
  ];
  for (const values of cases) {
    if (values.every((v) => typeof v === "string")) {
      assertEquals(arrayLiteral(values), serializeArray(values, undefined), "the same text");
    }
  }
  assertEquals(arrayLiteral([]), "{}");
  assertEquals(repeatedLiteral("x", 3), '{"x","x","x"}');
  assertEquals(repeatedLiteral(null, 2), "{null,null}");
  await withDatabase("array_types_literal", async (_db, sql) => {
    for (const values of cases) {
      const [row] = await sql.unsafe("select array_to_json($1::text[]) as a", [
        arrayLiteral(values),
      ]);
      assertEquals(row.a, values.map((v) => v === null ? null : String(v)));
    }
  });
});

Deno.test("a pool that never fetches the array types sends and reads arrays once they are installed", async () => {
  await withDatabase("array_types_pool", async (db) => {
    const sql = postgres(db.url, { max: 1, fetch_types: false, onnotice: () => {} });
    try {
      installArrayTypes(sql);
      const texts = ["default", "b c", 'x"y', "b\\c", "", "NULL", "{}", ",", null];
      const [row] = await sql.unsafe(
        `select $1::text[] as t, $2::bigint[] as b, $3::int[] as i, $4::text[]::boolean[] as f,
                array['p', null, 'q'] as back, '{}'::text[] as empty,
                array[array[1, 2], array[3, 4]] as nested`,
        [texts, ["1", "9007199254740993"], [1, 2, 3], ["t", "f"]] as never[],
      );
      assertEquals(row.t, texts);
      assertEquals(row.b, ["1", "9007199254740993"]);
      assertEquals(row.i, [1, 2, 3]);
      assertEquals(row.f, [true, false]);
      assertEquals(row.back, ["p", null, "q"]);
      assertEquals(row.empty, []);
      assertEquals(row.nested, [[1, 2], [3, 4]]);
    } finally {
      await sql.end({ timeout: 1 });
    }
  });
});

Deno.test("akadze's own pool has the array types before its first statement", async () => {
  await withDatabase("array_types_connect", async (db, admin) => {
    const sql = connect(db.url, { max: 1 });
    // Derived as the worker's loop connection is (the pool's options), without the fetch:
    // the heartbeat, a connection's first statement, with its text[] queues.
    const loop = postgres({
      ...(sql as unknown as { options: object }).options,
      fetch_types: false,
    } as never);
    try {
      const hb = new Heartbeat(loop, {
        schema: "akadze",
        id: "w-arrays",
        hostname: "h",
        pid: 1,
        queues: ["default", "b c"],
        heartbeatTtl: 30_000,
      });
      const beat = await hb.runOnce({ running: [] }, 30_000);
      assert(beat.registered);
      assertEquals(beat.cancelRequested, []);
      const [w] = await admin`select queues from akadze.workers where id = 'w-arrays'`;
      assertEquals(w.queues, ["default", "b c"]);
    } finally {
      await loop.end({ timeout: 1 });
      await sql.end({ timeout: 1 });
    }
  });
});

Deno.test("a worker on an adopted pool that never fetches the array types beats, claims and finishes jobs", async () => {
  await withDatabase("array_types_worker", async (db, admin) => {
    const sql = postgres(db.url, { max: 4, fetch_types: false, onnotice: () => {} });
    const app = new Akadze({ sql });
    try {
      const t = app.task("t", (args) => Number(args.n) * 2);
      const id = await t.enqueue({ n: 21 });
      const w = startWorker(app);
      try {
        const row = await waitForJob(admin, id, (r) => r.state === "succeeded");
        assertEquals(row.result, 42);
      } finally {
        await w.stop();
      }
    } finally {
      await app.close();
      await sql.end({ timeout: 1 });
    }
  });
});
