/**
 * The sockets akadze's connections open: the same as postgres.js's own, plus a check of
 * the server's first reply. postgres.js reads whatever a server answers to its startup
 * message as PostgreSQL messages; a server of another kind (an HTTP server on the port,
 * say) that answers and closes makes it reconnect and wait again, forever, with the query
 * still pending. A first reply that no PostgreSQL server sends ends the attempt with
 * {@linkcode NOT_POSTGRES}, which the query then fails with. On a multi-host URL, rounds
 * of failed or refused attempts are paced (see {@linkcode openSocket}).
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
  const rounds = Math.floor(streak.failed / hosts);
  if (rounds === 0) return attempt(options, streak);
  const current = streak;
  return new Promise((resolve) =>
    setTimeout(() => resolve(attempt(options, current)), roundBackoff(rounds))
  );
}

function attempt(options: SocketOptions, streak: Streak | undefined): Socket {
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
  if (streak) watchAttempt(socket, options, streak, where);
  return socket;
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
function watchAttempt(socket: Socket, options: SocketOptions, streak: Streak, where: string) {
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
    if (accepted) return;
    streak.failed++;
    if (answered && terminated) streak.refused.add(where);
    else if (!answered) streak.unreachable.add(where);
    else streak.ended.add(where);
    const hosts = options.port.length;
    if (streak.warned || streak.failed < hosts) return;
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
