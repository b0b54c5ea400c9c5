/**
 * The entry point of a compiled worker binary that carries its app. A binary made by
 * `deno compile` can only import the modules compiled into it, so the prebuilt `akadze`
 * binaries cannot load `./app.ts` from disk; compile this instead (with your own app in
 * place of `demo_app.ts`), with the network scoped to your database:
 *
 * ```sh
 * deno compile --allow-net=db.internal:5432 --allow-env --allow-sys=hostname --allow-read \
 *   --no-prompt --output dist/demo-worker examples/worker_binary.ts
 * AKADZE_DATABASE_URL=postgres://app:secret@db.internal:5432/app dist/demo-worker --queue default
 * ```
 *
 * Every `akadze worker` flag works after the binary's name. CI compiles and runs it
 * (.github/workflows/ci.yml).
 *
 * @module
 */
import { main } from "@akadze/akadze/cli";
// The static import compiles the app module into the binary; the worker then loads that
// embedded module by its URL.
import "./demo_app.ts";

Deno.exit(await main(["worker", import.meta.resolve("./demo_app.ts"), ...Deno.args]));
