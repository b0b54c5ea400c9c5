// The worker's guard against errors the database driver (or the runtime's socket code under
// it) raises where no caller can catch them.
import {
  installDriverGuard,
  isDriverError,
  isStraySocketError,
} from "../src/worker/driver_guard.ts";
import { Akadze } from "../src/app.ts";
import { assert, assertEquals } from "./assert.ts";
import { withDatabase } from "./_helpers.ts";

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
