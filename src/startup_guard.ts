/**
 * The sockets akadze's connections open: the same as postgres.js's own, plus a check of
 * the server's first reply. postgres.js reads whatever a server answers to its startup
 * message as PostgreSQL messages; a server of another kind (an HTTP server on the port,
 * say) that answers and closes makes it reconnect and wait again, forever, with the query
 * still pending. A first reply that no PostgreSQL server sends ends the attempt with
 * {@linkcode NOT_POSTGRES}, which the query then fails with.
 *
 * @module
 */
import { Socket } from "node:net";
import { AkadzeError } from "./errors.ts";

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
}

/** The next host each pool tries, as postgres.js goes round its hosts per attempt. */
const nextHost = new WeakMap<object, number>();

/**
 * Open a socket for one connection attempt (postgres.js's `socket` option): to the pool's
 * Unix socket, or to its next host in turn. Writes made before it connects are buffered.
 *
 * @example
 * ```ts ignore
 * const sql = postgres(url, { socket: openSocket });
 * ```
 */
export function openSocket(options: SocketOptions): Socket {
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
  return socket;
}
