/**
 * The sockets akadze's connections open: the same as postgres.js's own, plus checks of what
 * goes through them while a connection starts.
 *
 * - postgres.js reads whatever a server answers to its startup message as PostgreSQL
 *   messages; a server of another kind (an HTTP server on the port, say) that answers and
 *   closes makes it reconnect and wait again, forever, with the query still pending. A first
 *   reply that no PostgreSQL server sends ends the attempt with {@linkcode NOT_POSTGRES},
 *   which the query then fails with.
 * - postgres.js reuses a connection object after its session ended, and some of its state
 *   survives the end. A statement the dead session's server never answered, with that
 *   server's error (a terminated backend's), is taken for the answer to the next session's
 *   startup: the driver's `target_session_attrs` check is skipped, and a connection could
 *   stay on a hot standby. The server's own startup report (`in_hot_standby`,
 *   `default_transaction_read_only`) is checked here instead ({@linkcode checkSessionAttrs}).
 *   And statements sent after the socket was let go (the `rollback` of a transaction whose
 *   connection died) leave the object unable to send: each next startup waited behind them
 *   until the connect timeout. Such an attempt is ended at once, and the dead session's
 *   statements are never sent ({@linkcode guardWrites}).
 * - On a multi-host URL, rounds of failed or refused attempts are paced (see
 *   {@linkcode openSocket}).
 *
 * @module
 */
import { Socket } from "node:net";
import { AkadzeError } from "./errors.ts";
import { logger } from "./log.ts";

const log = logger("db");

/** The error code of a connection attempt whose server is not PostgreSQL. */
export const NOT_POSTGRES = "AKADZE_NOT_POSTGRES";

/**
 * The first byte a PostgreSQL server answers with: to the startup message, an
 * authentication request (R), an error (E) or a protocol version negotiation (v); to an
 * SSL request, S or N.
 */
const FIRST_REPLIES = new Set([0x52, 0x45, 0x76, 0x53, 0x4e]);

/** The parts of postgres.js's parsed options a socket needs. */
interface SocketOptions {
  host: string[];
  port: number[];
  path?: string | false;
  target_session_attrs?: string | null;
  ssl?: unknown;
  sslnegotiation?: string | null;
  shared?: object;
}

/** The next host each pool tries, as postgres.js goes round its hosts per attempt. */
const nextHost = new WeakMap<object, number>();

/**
 * A multi-host pool's attempts since one was last accepted. postgres.js tries the next host
 * at once after an attempt that failed or that `target_session_attrs` refused, round and
 * round without a pause and without failing the statement that waits: with no primary (a
 * failover under way) or every host down, that is hundreds of connections a second. After
 * a whole round has failed, each attempt waits first, longer each round.
 */
interface Streak {
  failed: number;
  refused: Set<string>;
  unreachable: Set<string>;
  ended: Set<string>;
  warned: boolean;
}
const streaks = new WeakMap<object, Streak>();

/** The longest wait before an attempt, once every host failed (ms). */
export const HOST_ROUND_BACKOFF_MAX = 1_000;

/** The wait before the next attempt after `rounds` failed rounds (ms), jittered. */
function roundBackoff(rounds: number): number {
  return Math.round((0.5 + Math.random() / 2) * Math.min(50 * 2 ** rounds, HOST_ROUND_BACKOFF_MAX));
}

/**
 * Open a socket for one connection attempt (postgres.js's `socket` option): to the pool's
 * Unix socket, or to its next host in turn. Writes made before it connects are buffered.
 * With several hosts, once every host has failed or been refused in a row, the attempt
 * waits first (at most {@linkcode HOST_ROUND_BACKOFF_MAX}), and one warning says why
 * (`db_no_server`).
 *
 * @example
 * ```ts ignore
 * const sql = postgres(url, { socket: openSocket });
 * ```
 */
export function openSocket(options: SocketOptions): Socket | Promise<Socket> {
  const hosts = options.path ? 1 : options.port.length;
  if (hosts < 2) return attempt(options, undefined);
  // Keyed by the state postgres.js shares between a pool and the instances derived from it
  // (a worker's loop connection), so that they pace and warn as one.
  const key = options.shared ?? options;
  let streak = streaks.get(key);
  if (!streak) {
    streaks.set(
      key,
      streak = {
        failed: 0,
        refused: new Set(),
        unreachable: new Set(),
        ended: new Set(),
        warned: false,
      },
    );
  }
  // Only once every host has failed: a pool's connections reconnect together after their
  // sessions were terminated, and those that try the standby first are turned down while
  // the others are still starting on the primary.
  const rounds = everyHostFailed(streak, hosts) ? Math.floor(streak.failed / hosts) : 0;
  if (rounds === 0) return attempt(options, streak);
  const current = streak;
  return new Promise((resolve) =>
    setTimeout(() => resolve(attempt(options, current)), roundBackoff(rounds))
  );
}

/** Whether each of the `hosts` has failed or been refused since an attempt was last accepted. */
function everyHostFailed(streak: Streak, hosts: number): boolean {
  return new Set([...streak.refused, ...streak.unreachable, ...streak.ended]).size >= hosts;
}

function attempt(options: SocketOptions, streak: Streak | undefined): Socket {
  const state: AttemptState = {
    abandoned: false,
    refused: false,
    queued: false,
    started: !options.target_session_attrs || !!options.ssl,
  };
  const socket = new Socket();
  let index = 0;
  if (!options.path) {
    index = nextHost.get(options) ?? 0;
    nextHost.set(options, (index + 1) % options.port.length);
  }
  const host = options.path ? options.path : options.host[index];
  const port = options.path ? undefined : options.port[index];
  const where = port === undefined ? host : `${host}:${port}`;
  socket.once("data", (data: Uint8Array) => {
    if (FIRST_REPLIES.has(data[0])) return;
    socket.destroy(Object.assign(
      new AkadzeError(
        `the server at ${where} did not answer as PostgreSQL does (another kind of server ` +
          "listens there): check the host and port of the database URL",
      ),
      { code: NOT_POSTGRES },
    ));
  });
  Object.assign(socket, { host, port });
  if (port === undefined) socket.connect(host);
  else socket.connect(port, host);
  // After connect(), which installs the runtime's own write.
  if (streak) watchAttempt(socket, options, streak, where, state);
  guardWrites(socket, options, state);
  if (!state.started) checkStartupReply(socket, options, state);
  return socket;
}

/** What the guards of one attempt learned, shared with its streak accounting. */
interface AttemptState {
  /** Ended by akadze before it was used: its connection object had lost track of its writes. */
  abandoned: boolean;
  /** Ended by akadze: the server is not what `target_session_attrs` asks for. */
  refused: boolean;
  /** The driver wrote statements behind its startup before the server's startup reply. */
  queued: boolean;
  /** The server's startup reply was read (or will not be checked). */
  started: boolean;
}

/** The protocol version of a startup message, and the codes of the other opening messages. */
const OPENING_CODES = new Set([196608, 80877103, 80877102, 80877104]);

/** The length of the opening message (startup, SSL, cancel or GSS request) at `at`, or 0. */
function openingAt(data: Uint8Array, at: number): number {
  if (at + 8 > data.length) return 0;
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const length = view.getInt32(at);
  return length >= 8 && at + length <= data.length && OPENING_CODES.has(view.getInt32(at + 4))
    ? length
    : 0;
}

/**
 * Whether the first bytes of a connection attempt start as every attempt does, with an
 * opening message (startup, SSL, cancel or GSS request). postgres.js sends bytes before it
 * when its connection object kept a dead session's statements in its buffer (see
 * {@linkcode guardWrites}).
 *
 * @example
 * ```ts ignore
 * startsAttempt(new Uint8Array([0, 0, 0, 8, 4, 210, 22, 47])); // true: an SSL request
 * startsAttempt(new Uint8Array([0x53, 0, 0, 0, 4, 0, 0, 0, 8, 4, 210, 22, 47])); // false
 * ```
 */
export function startsAttempt(data: Uint8Array): boolean {
  return openingAt(data, 0) > 0;
}

/**
 * Fail what the driver's connection object is waiting for, as its own error handling does
 * for a single-host pool: the statement that asked for the connection hears the error (a
 * transient `CONNECTION_CLOSED`), statements queued on the object are dropped, and the
 * object reconnects on its next statement. On a multi-host pool the driver ignores an error
 * while it connects (to try the next host), which would leave those statements queued with
 * answers the next session would then hand to other statements; its host list is shortened
 * for the one synchronous call so that it does not.
 */
function failAttempt(socket: Socket, options: SocketOptions, message: string): void {
  const hosts = options.host;
  options.host = hosts.slice(0, 1);
  try {
    socket.emit("error", Object.assign(new AkadzeError(message), { code: "CONNECTION_CLOSED" }));
  } finally {
    options.host = hosts;
  }
  socket.destroy();
}

/**
 * Follow what the driver writes on one attempt. postgres.js writes its startup (or SSL
 * request) on the next turn of the event loop after it has the socket. When a transaction's
 * connection dies, postgres.js rejects the transaction but sends the statements its callback
 * still makes, and its own `rollback`, on that connection; written once the socket was let
 * go, they throw inside the driver (`Cannot read properties of null (reading 'write')`) and
 * leave the connection object unable to send: each next attempt's startup waits behind them
 * in its buffer until the connect timeout, about a dozen times, until the buffer is full.
 * So an attempt on which nothing is written on the next turn is ended at once, and the next
 * one made; and when the buffer goes out with the dead session's statements before the
 * startup, none of it is sent: the attempt fails, as does what waits on the object
 * ({@linkcode failAttempt}), and the next attempt starts clean.
 */
function guardWrites(socket: Socket, options: SocketOptions, state: AttemptState): void {
  let written = false;
  const write = socket.write.bind(socket);
  Object.assign(socket, {
    write: (data: unknown, ...rest: unknown[]) => {
      if (data instanceof Uint8Array && data.length > 0) {
        if (!written) {
          written = true;
          if (!startsAttempt(data)) {
            state.abandoned = true;
            failAttempt(
              socket,
              options,
              "a database connection was reopened after its session ended under a transaction; " +
                "the statement was not sent, to be retried on another connection",
            );
            return true;
          }
          if (data.length > openingAt(data, 0) && !state.started) state.queued = true;
        } else if (!state.started) state.queued = true;
      }
      return write(data as never, ...rest as []);
    },
  });
  // With a direct TLS negotiation the runtime's TLS code writes on the socket itself.
  if (options.ssl && options.sslnegotiation === "direct") return;
  // Two turns: the driver's write is queued on the first, right after the socket is made.
  setImmediate(() =>
    setImmediate(() => {
      if (written || socket.destroyed) return;
      state.abandoned = true;
      socket.destroy();
    })
  );
}

/**
 * What the server reports about itself at startup (PostgreSQL 14 and later) against what
 * `target_session_attrs` asks for, as postgres.js decides it (`prefer-standby` and `any`
 * accept any server). Unknown (an older server): undefined, and the driver asks the server.
 *
 * @example
 * ```ts ignore
 * checkSessionAttrs("primary", { in_hot_standby: "on", default_transaction_read_only: "off" });
 * // false
 * ```
 */
export function checkSessionAttrs(
  attrs: string,
  reported: Record<string, string>,
): boolean | undefined {
  const standby = reported.in_hot_standby;
  const readOnly = reported.default_transaction_read_only;
  if (standby === undefined || readOnly === undefined) return undefined;
  if (attrs === "primary") return standby === "off";
  if (attrs === "standby") return standby === "on";
  if (attrs === "read-write") return readOnly === "off";
  if (attrs === "read-only") return readOnly === "on";
  return true;
}

function where(socket: Socket): string {
  const { host, port } = socket as unknown as { host?: string; port?: number };
  return port === undefined ? String(host) : `${host}:${port}`;
}

/** Backend message types of a startup reply. */
const PARAMETER_STATUS = 0x53;
const READY_FOR_QUERY = 0x5a;

/**
 * Check the server against `target_session_attrs` before the driver reads the end of its
 * startup reply: the driver checks too, but skips its check when it takes a dead session's
 * unanswered statement for the startup's answer. A server that does not fit never reaches
 * the driver's reading; the attempt ends as the driver ends one it refuses (a Terminate),
 * and it tries the next host.
 */
function checkStartupReply(socket: Socket, options: SocketOptions, state: AttemptState): void {
  const attrs = String(options.target_session_attrs);
  const reported: Record<string, string> = {};
  let pending = new Uint8Array(0);
  let done = false;
  const emit = socket.emit.bind(socket);
  const decoder = new TextDecoder();
  Object.assign(socket, {
    emit: (event: string | symbol, ...args: unknown[]) => {
      if (done || event !== "data" || !(args[0] instanceof Uint8Array)) {
        return emit(event, ...args);
      }
      const chunk = args[0];
      const joined = new Uint8Array(pending.length + chunk.length);
      joined.set(pending);
      joined.set(chunk, pending.length);
      const view = new DataView(joined.buffer);
      let at = 0;
      while (!done && at + 5 <= joined.length) {
        const length = view.getInt32(at + 1);
        if (length < 4 || at + 1 + length > joined.length) break;
        const type = joined[at];
        if (type === PARAMETER_STATUS) {
          const [key, value] = decoder.decode(joined.subarray(at + 5, at + 1 + length)).split("\0");
          reported[key] = value;
        } else if (type === READY_FOR_QUERY) {
          done = state.started = true;
          if (checkSessionAttrs(attrs, reported) === false) {
            state.refused = true;
            if (state.queued) {
              // Statements went out behind the startup and their answers will not be read:
              // fail them rather than leave the driver waiting for answers on another server.
              failAttempt(
                socket,
                options,
                `the database server at ${where(socket)} is not a ${attrs} server ` +
                  `(target_session_attrs=${attrs}); the statements sent while connecting are failed, ` +
                  "to be retried on another connection",
              );
            } else {
              // The driver's own refusal: Terminate, then the socket ends.
              socket.end(new Uint8Array([0x58, 0, 0, 0, 4]));
            }
            return true;
          }
        }
        at += 1 + length;
      }
      pending = joined.subarray(at);
      return emit(event, ...args);
    },
  });
}

/** Frontend message types: Parse and Query (a statement: the server was accepted), Terminate. */
const PARSE = 0x50;
const QUERY = 0x51;
const TERMINATE = 0x58;

/**
 * Follow one attempt of a multi-host pool: accepted once the driver sends a statement
 * (a Parse, its type fetch, or a simple Query); refused when it ends the connection before that (the server is
 * not what `target_session_attrs` asks for); unreachable when the server never answered.
 */
function watchAttempt(
  socket: Socket,
  options: SocketOptions,
  streak: Streak,
  where: string,
  state: AttemptState,
) {
  let answered = false;
  let accepted = false;
  let terminated = false;
  socket.once("data", () => answered = true);
  const sent = (data: unknown) => {
    if (accepted || !(data instanceof Uint8Array) || data.length === 0) return;
    // A simple Query is also how the driver asks an older server (before PostgreSQL 14)
    // whether it is a standby: with target_session_attrs only a Parse tells.
    if (data[0] === PARSE || (data[0] === QUERY && !options.target_session_attrs)) {
      accepted = true;
      if (streak.warned) {
        log.info("the database server at {address} accepts connections again", {
          event: "db_server_found",
          address: where,
        });
      }
      streak.failed = 0;
      streak.refused.clear();
      streak.unreachable.clear();
      streak.ended.clear();
      streak.warned = false;
    } else if (data[0] === TERMINATE && data.length === 5) terminated = true;
  };
  const write = socket.write.bind(socket);
  const end = socket.end.bind(socket);
  Object.assign(socket, {
    write: (data: unknown, ...rest: unknown[]) => (sent(data), write(data as never, ...rest as [])),
    end: (data?: unknown, ...rest: unknown[]) => (sent(data), end(data as never, ...rest as [])),
  });
  socket.once("close", () => {
    // An abandoned attempt says nothing about the server.
    if (accepted || state.abandoned) return;
    streak.failed++;
    if ((answered && terminated) || state.refused) streak.refused.add(where);
    else if (!answered) streak.unreachable.add(where);
    else streak.ended.add(where);
    const hosts = options.port.length;
    if (streak.warned || streak.failed < hosts || !everyHostFailed(streak, hosts)) return;
    streak.warned = true;
    const attrs = options.target_session_attrs;
    const refused = [...streak.refused].join(", ");
    const unreachable = [...streak.unreachable].join(", ");
    const ended = [...streak.ended].join(", ");
    log.warn(
      "no server of the database URL could be used: " + [
        refused && attrs ? `${refused}: not a ${attrs} server (target_session_attrs=${attrs})` : "",
        unreachable ? `${unreachable}: no answer` : "",
        ended ? `${ended}: the connection ended before it could be used` : "",
      ].filter(Boolean).join("; ") +
        ". akadze keeps trying every host, less often, and statements wait until one is " +
        "accepted: check that one server is up and, during a failover, that a standby is promoted",
      { event: "db_no_server", refused, unreachable, ended, targetSessionAttrs: attrs ?? null },
    );
  });
}
