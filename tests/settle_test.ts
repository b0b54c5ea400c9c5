// The bounded waits of the worker's way out.
import { settleWithin, withinTime } from "../src/worker/settle.ts";
import { assertEquals, assertRejects } from "./assert.ts";

const later = <T>(value: T, ms: number) =>
  new Promise<T>((resolve) => setTimeout(() => resolve(value), ms));

Deno.test("withinTime gives the value that comes in time, and fails the one that does not", async () => {
  assertEquals(await withinTime(later("beat", 10), 5_000), "beat");
  let resolve!: (value: string) => void;
  const never = new Promise<string>((r) => resolve = r);
  const error = await assertRejects<Error>(() => withinTime(never, 20), Error);
  assertEquals(error.message, "no answer within 20 ms");
  resolve("too late"); // absorbed, no unhandled rejection either way
});

Deno.test("withinTime without a bound (Infinity) waits as long as it takes", async () => {
  // A timer of Infinity ms fires at once in Deno: the bound must not become one.
  assertEquals(await withinTime(later("beat", 50), Infinity), "beat");
});

Deno.test("settleWithin returns when the promise settles or the time is up, and never rejects", async () => {
  const started = performance.now();
  await settleWithin(Promise.reject(new Error("gone")), 5_000);
  await settleWithin(new Promise(() => {}), 20);
  await settleWithin(null, 5_000);
  assertEquals(performance.now() - started < 4_000, true);
});
