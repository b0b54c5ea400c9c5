// The app module the chaos workers run: `akadze worker chaos/app.ts` (see chaos/run.ts).
import { Akadze, connect } from "../mod.ts";
import { register } from "./tasks.ts";

/**
 * The chaos app on AKADZE_DATABASE_URL, with the tasks of chaos/tasks.ts; prepared
 * statements with AKADZE_CHAOS_PREPARE=1 (`deno task chaos --prepare`). The pool's connect
 * timeout comes from AKADZE_CHAOS_CONNECT_TIMEOUT (seconds): the harness shrinks it with the
 * heartbeat TTL, as docs/worker.md advises.
 */
export const app: Akadze = new Akadze({
  sql: connect(Deno.env.get("AKADZE_DATABASE_URL") ?? "", {
    prepare: Deno.env.get("AKADZE_CHAOS_PREPARE") === "1",
    connectTimeout: Number(Deno.env.get("AKADZE_CHAOS_CONNECT_TIMEOUT") ?? 10),
  }),
});
app.include({ register });
