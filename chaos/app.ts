// The app module the chaos workers run: `akadze worker chaos/app.ts` (see chaos/run.ts).
import { Akadze } from "../mod.ts";
import { register } from "./tasks.ts";

/**
 * The chaos app on AKADZE_DATABASE_URL, with the tasks of chaos/tasks.ts; prepared
 * statements with AKADZE_CHAOS_PREPARE=1 (`deno task chaos --prepare`).
 */
export const app: Akadze = new Akadze({
  databaseUrl: Deno.env.get("AKADZE_DATABASE_URL"),
  prepare: Deno.env.get("AKADZE_CHAOS_PREPARE") === "1",
});
app.include({ register });
