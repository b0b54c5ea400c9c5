// `deno task test`: runs the test suite against AKADZE_DATABASE_URL's server when set,
// otherwise against a throwaway PostgreSQL that is stopped and removed afterwards, also
// when tests fail or the run is interrupted.
import postgres from "postgres";
import {
  assertTestDatabaseUrl,
  DATABASE_URL_ENV,
  startThrowawayPostgres,
  type ThrowawayPostgres,
} from "../src/testing.ts";

let server: ThrowawayPostgres | undefined;
let url = Deno.env.get(DATABASE_URL_ENV);
try {
  if (url) {
    assertTestDatabaseUrl(url);
  } else {
    server = await startThrowawayPostgres();
    const admin = postgres(server.url, { max: 1, onnotice: () => {} });
    await admin`create database akadze_test`;
    await admin.end();
    url = server.url.replace(/\/postgres$/, "/akadze_test");
    console.error(`throwaway PostgreSQL ${server.version} on port ${server.port}`);
  }
} catch (error) {
  await server?.stop();
  console.error(`error: ${error instanceof Error ? error.message : error}`);
  Deno.exit(2);
}

const child = new Deno.Command(Deno.execPath(), {
  args: [
    "test",
    "--allow-all",
    "--unstable-worker-options",
    "--parallel",
    ...(Deno.args.length ? Deno.args : ["tests/"]),
  ],
  env: { [DATABASE_URL_ENV]: url },
  stdin: "null",
}).spawn();

let signals = 0;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  Deno.addSignalListener(signal, () => {
    // Let the test run end first, so the server is stopped after its last connection;
    // a second signal forces.
    child.kill(++signals > 1 ? "SIGKILL" : signal);
  });
}
const status = await child.status;
await server?.stop();
Deno.exit(signals ? 130 : status.code);
