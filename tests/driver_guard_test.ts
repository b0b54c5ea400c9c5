// The worker's guard against errors the database driver (or the runtime's socket code under
// it) raises where no caller can catch them.
import {
  installDriverGuard,
  isClosedConnectionWrite,
  isDriverError,
  isStraySocketError,
  isTypeFetchError,
} from "../src/driver_guard.ts";
import { Akadze } from "../src/app.ts";
import { checkSessionAttrs, startsAttempt } from "../src/startup_guard.ts";
import { connect } from "../src/db.ts";
import { assert, assertEquals } from "./assert.ts";
import { waitFor, watchClosedConnectionWrites, withDatabase, within } from "./_helpers.ts";

/** An error shaped like one the runtime raised: a code and the given stack frames. */
function socketError(code: string, message: string, frames: string[]): Error {
  const error = new Error(message) as Error & { code: string };
  error.code = code;
  error.stack = [`Error: ${message}`, ...frames.map((f) => `    at ${f}`)].join("\n");
  return error;
}

// As seen from a worker whose connections were terminated (bench scratch stray.ts).
const RUNTIME_FRAMES = [
  "__node_internal_errnoException (ext:deno_node/internal/errors.ts:1:3113)",
  "__node_internal_errnoException (ext:deno_node/internal/hide_stack_frames.ts:1:238)",
  "TCPWrap.onStreamRead [as onread] (ext:deno_node/internal/stream_base_commons.ts:1:3690)",
];

Deno.test("a socket reset raised by the runtime alone counts as a driver error; one from application code does not", () => {
  assert(isDriverError(socketError("ECONNRESET", "read ECONNRESET", RUNTIME_FRAMES)));
  assert(isDriverError(socketError("EPIPE", "This socket has been ended", RUNTIME_FRAMES)));
  assert(isDriverError(socketError("ECONNRESET", "x", ["ext:core/01_core.js:12:3"])));
  // A frame of application code: someone may be waiting for it; not the guard's to hide.
  assert(
    !isDriverError(
      socketError("ECONNRESET", "read ECONNRESET", [
        ...RUNTIME_FRAMES,
        "callApi (file:///app/handlers.ts:10:5)",
      ]),
    ),
  );
  // Other codes, no frames, or no code at all.
  assert(!isDriverError(socketError("ENOENT", "no such file", RUNTIME_FRAMES)));
  assert(!isDriverError(socketError("ECONNRESET", "read ECONNRESET", [])));
  assert(!isDriverError(new Error("read ECONNRESET")));
  assert(!isDriverError({ code: "ECONNRESET", stack: RUNTIME_FRAMES.join("\n") }));
  // The driver's own code, as before.
  const driver = new TypeError("Cannot read properties of null (reading 'write')");
  driver.stack = "TypeError: x\n    at write (file:///n/postgres/src/connection.js:248:12)";
  assert(isDriverError(driver));
  assert(!isStraySocketError(driver));
  assert(isStraySocketError(socketError("ECONNRESET", "read ECONNRESET", RUNTIME_FRAMES)));
});

Deno.test("the guard absorbs a stray socket rejection while installed and reports it", async () => {
  const seen: unknown[] = [];
  const remove = installDriverGuard((error) => seen.push(error));
  try {
    const stray = socketError("ECONNRESET", "read ECONNRESET", RUNTIME_FRAMES);
    // Nobody handles this promise: without the guard the test (and a worker) would die.
    Promise.reject(stray);
    await new Promise((resolve) => setTimeout(resolve, 10));
    assertEquals(seen, [stray]);
  } finally {
    remove();
  }
});

Deno.test("closing the app absorbs a driver error raised while its pool ends, and then stops guarding", async () => {
  await withDatabase("guard_close", async (db) => {
    const app = new Akadze({ databaseUrl: db.url, max: 2 });
    await app.sql`select 1`;
    const closing = app.close();
    // As a connection killed earlier can raise while the pool ends: nobody handles it, and
    // without the guard this test (and an application closing its app) would die.
    Promise.reject(
      socketError("EPIPE", "This socket has been ended by the other party", RUNTIME_FRAMES),
    );
    await closing;
    // Closed: the guard is gone, so an unhandled rejection reaches the next listener untouched.
    let preventedBefore: boolean | undefined;
    const listener = (event: PromiseRejectionEvent) => {
      preventedBefore = event.defaultPrevented;
      event.preventDefault();
    };
    globalThis.addEventListener("unhandledrejection", listener);
    try {
      Promise.reject(socketError("ECONNRESET", "read ECONNRESET", RUNTIME_FRAMES));
      await new Promise((resolve) => setTimeout(resolve, 10));
    } finally {
      globalThis.removeEventListener("unhandledrejection", listener);
    }
    assertEquals(preventedBefore, false);
  });
});

/**
 * A one-connection proxy to `port`: it passes the startup through, drops the connection when
 * the driver sends its array-type query, and listens no more, so the reconnect is refused.
 */
function dropAtTypeFetch(port: number): { port: number; done: Promise<void> } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const pump = async (from: Deno.Conn, to: Deno.Conn, stopAt?: string) => {
    const buffer = new Uint8Array(64 * 1024);
    try {
      for (;;) {
        const n = await from.read(buffer);
        if (n === null) return;
        const chunk = buffer.subarray(0, n);
        if (stopAt && new TextDecoder().decode(chunk).includes(stopAt)) return;
        for (let sent = 0; sent < n;) sent += await to.write(chunk.subarray(sent));
      }
    } catch {
      // the other side is closed
    }
  };
  const done = (async () => {
    const client = await listener.accept();
    listener.close();
    const server = await Deno.connect({ hostname: "127.0.0.1", port });
    const up = pump(client, server, "pg_catalog.pg_type");
    const down = pump(server, client);
    await Promise.race([up, down]);
    client.close();
    server.close();
    await Promise.all([up, down]);
  })();
  return { port: (listener.addr as Deno.NetAddr).port, done };
}

Deno.test("a connection lost while the driver fetches its types does not leave an unhandled rejection", async () => {
  await withDatabase("guard_type_fetch", async (db) => {
    const target = new URL(db.url);
    const proxy = dropAtTypeFetch(Number(target.port));
    const url = new URL(db.url);
    url.hostname = "127.0.0.1";
    url.port = String(proxy.port);
    const sql = connect(url.href, { max: 1 });
    const seen: { prevented: boolean; reason: unknown }[] = [];
    const listener = (event: PromiseRejectionEvent) => {
      seen.push({ prevented: event.defaultPrevented, reason: event.reason });
      event.preventDefault();
    };
    globalThis.addEventListener("unhandledrejection", listener);
    try {
      // The query that opened the connection hears of the failure itself...
      const error = await sql`select 1`.then(() => null, (e: unknown) => e);
      assert(error instanceof Error, "the query fails: its connection was lost");
      // ...and the driver's type fetch on that connection rejects with nobody waiting for it.
      await waitFor(() => seen.length > 0, "the driver's unhandled type-fetch rejection");
      assert(isTypeFetchError(seen[0].reason), String(seen[0].reason));
      assertEquals(seen.map((s) => s.prevented), [true]);
    } finally {
      globalThis.removeEventListener("unhandledrejection", listener);
      await sql.end({ timeout: 1 });
      await proxy.done;
    }
  });
});

Deno.test("a pooled connection whose transaction was terminated connects again at once, not after connect timeouts", async () => {
  await withDatabase("guard_dead_tx", async (db, admin) => {
    const name = "guard_dead_tx";
    const sql = connect(db.url, { max: 1, connectTimeout: 1, applicationName: name });
    // The pool's own guard absorbs the driver's write on the closed connection; seen here.
    const writes = watchClosedConnectionWrites();
    try {
      for (let round = 0; round < 3; round++) {
        const before = writes.count();
        // A transaction whose backend is terminated while it runs a statement: postgres.js
        // rejects the transaction when the connection closes, and then sends its rollback
        // on the connection it has let go. That write throws inside the driver (the guard's
        // "Cannot read properties of null (reading 'write')") and left the connection object
        // with writes it never sent: each next session's startup waited in its buffer until
        // the connect timeout, about a dozen times.
        const tx = sql.begin(async (tx) => {
          await tx`select pg_catalog.pg_sleep(60)`;
        }).then(() => null, (e: unknown) => e);
        await waitFor(
          async () =>
            (await admin`select pg_terminate_backend(pid) as done from pg_stat_activity
            where application_name = ${name} and query like '%pg_sleep(60)%'`).some((r) => r.done),
          "the transaction's backend to be terminated",
        );
        assert(await within(tx, 30_000, "the terminated transaction") instanceof Error);
        await waitFor(() => writes.count() > before, "the driver's write on the closed connection");
        const started = performance.now();
        const errors: string[] = [];
        for (let i = 0; i < 3; i++) {
          await sql`select 1`.catch((e: Error) =>
            errors.push(String((e as { code?: string }).code ?? e.message))
          );
        }
        assertEquals(errors.filter((code) => code === "CONNECT_TIMEOUT"), [], `round ${round}`);
        const [row] = await sql`select 1 as one`;
        assertEquals(row.one, 1);
        assert(
          performance.now() - started < 5_000,
          `round ${round}: reconnecting took ${Math.round(performance.now() - started)} ms`,
        );
      }
    } finally {
      writes.stop();
      await sql.end({ timeout: 1 });
    }
  });
});

Deno.test("a connection attempt starts with an opening message; bytes of a dead session before it are not one", () => {
  const ssl = [0, 0, 0, 8, 4, 210, 22, 47];
  const startup = [0, 0, 0, 13, 0, 3, 0, 0, 0x75, 0x73, 0x65, 0x72, 0];
  const sync = [0x53, 0, 0, 0, 4];
  assert(startsAttempt(new Uint8Array(ssl)));
  assert(startsAttempt(new Uint8Array(startup)));
  // A statement queued behind the startup is the driver's own doing, and fine.
  assert(startsAttempt(new Uint8Array([...startup, ...sync])));
  assert(!startsAttempt(new Uint8Array([...sync, ...startup])));
  assert(!startsAttempt(new Uint8Array(sync)));
  assert(!startsAttempt(new Uint8Array([0, 0, 0, 8, 0, 0, 0, 1])));
});

Deno.test("the server's startup report is checked against target_session_attrs as postgres.js checks it", () => {
  const primary = { in_hot_standby: "off", default_transaction_read_only: "off" };
  const standby = { in_hot_standby: "on", default_transaction_read_only: "off" };
  const readOnly = { in_hot_standby: "off", default_transaction_read_only: "on" };
  assertEquals(checkSessionAttrs("primary", primary), true);
  assertEquals(checkSessionAttrs("primary", standby), false);
  assertEquals(checkSessionAttrs("standby", standby), true);
  assertEquals(checkSessionAttrs("standby", primary), false);
  assertEquals(checkSessionAttrs("read-write", readOnly), false);
  assertEquals(checkSessionAttrs("read-write", standby), true);
  assertEquals(checkSessionAttrs("read-only", readOnly), true);
  assertEquals(checkSessionAttrs("any", standby), true);
  assertEquals(checkSessionAttrs("prefer-standby", primary), true);
  // A server before PostgreSQL 14 does not report them: the driver asks it.
  assertEquals(checkSessionAttrs("primary", {}), undefined);
});

Deno.test("only the driver's own write on a let-go connection is absorbed for the whole process", () => {
  const error = (frame: string, message = "Cannot read properties of null (reading 'write')") => {
    const e = new TypeError(message);
    e.stack = `TypeError: ${message}\n    at ${frame}\n    at Immediate.callback (ext:x:1:1)`;
    return e;
  };
  const driver = "Immediate.nextWrite (file:///x/node_modules/postgres/src/connection.js:255:22)";
  assert(isClosedConnectionWrite(error(driver)));
  // Application code reading a null, or another error of the driver: left alone.
  assert(!isClosedConnectionWrite(error("handler (file:///app/routes.ts:10:5)")));
  assert(!isClosedConnectionWrite(error(driver, "Cannot read properties of null (reading 'x')")));
  assert(!isClosedConnectionWrite(new Error("Cannot read properties of null (reading 'write')")));
});

Deno.test("an app whose transaction's backend is terminated keeps running: the driver's write on the closed connection is absorbed", async () => {
  await withDatabase("guard_app_tx", async (db, admin) => {
    // An application process, not a worker: it enqueues in its own transaction, as the docs
    // show, and nothing else of akadze guards it.
    const dir = await Deno.makeTempDir({ prefix: "akadze-guard-app-" });
    try {
      await Deno.writeTextFile(
        `${dir}/app.ts`,
        `import { Akadze } from ${JSON.stringify(new URL("../mod.ts", import.meta.url).href)};
const app = new Akadze({ databaseUrl: Deno.args[0] });
const hello = app.task("hello", () => "hi");
const failed = await app.sql.begin(async (tx) => {
  await hello.using({ session: tx }).enqueue({});
  await tx\`select pg_catalog.pg_sleep(60)\`;
}).then(() => null, (error) => error);
console.log("transaction failed:", failed !== null);
// The driver's rollback on the let-go connection throws on a later turn.
await new Promise((resolve) => setTimeout(resolve, 500));
const [row] = await app.sql\`select 1 as one\`;
console.log("still running:", row.one === 1);
await app.close();
`,
      );
      const child = new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--allow-all",
          "--config",
          new URL("../deno.json", import.meta.url).pathname,
          `${dir}/app.ts`,
          db.url,
        ],
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const output = child.output();
      await waitFor(
        async () =>
          (await admin`select pg_terminate_backend(pid) as done from pg_stat_activity
          where query like '%pg_sleep(60)%' and pid <> pg_backend_pid()`).some((r) => r.done),
        "the app's transaction to be terminated",
      ).catch(async (error) => {
        try {
          child.kill();
        } catch { /* it ended already */ }
        const out = await output;
        throw new Error(`${error.message}: ${new TextDecoder().decode(out.stderr)}`);
      });
      const out = await within(output, 60_000, "the app to end");
      const stdout = new TextDecoder().decode(out.stdout);
      const stderr = new TextDecoder().decode(out.stderr);
      assertEquals(out.code, 0, stderr);
      assertEquals(stdout, "transaction failed: true\nstill running: true\n", stderr);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});
