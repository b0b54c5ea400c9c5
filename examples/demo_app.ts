/**
 * The demo's application module, shaped like a real one: the app reads its database URL
 * from `AKADZE_DATABASE_URL` when the module is imported, and registers four small tasks.
 * `examples/demo.ts` drives it; `deno run -A cli.ts dev examples/demo_app.ts` runs a worker
 * for it on a throwaway database.
 *
 * @module
 */
import * as v from "valibot";
import { Akadze } from "../mod.ts";

/** The application. */
export const app: Akadze = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

/** Always works. */
export const greet = app.task(
  "greet",
  { args: v.object({ name: v.string() }) },
  ({ name }) => `hello ${name}`,
);

/** Fails its first attempt (a transient error), then succeeds on the retry 200 ms later. */
export const flaky = app.task("flaky", { backoff: () => 200 }, (_args, ctx) => {
  if (ctx.job.attempt === 1) throw new Error("the upstream service timed out");
  return `worked on attempt ${ctx.job.attempt}`;
});

class PaymentDeclined extends Error {
  override name = "PaymentDeclined";
}

/** Always fails: after its two attempts the job ends `failed`. */
export const charge = app.task(
  "charge",
  { args: v.object({ cents: v.number() }), maxAttempts: 2, backoff: () => 200 },
  ({ cents }) => {
    throw new PaymentDeclined(`card declined for ${cents} cents`);
  },
);
