// `--rtt MS`: the database a round trip of MS away. Every system connects through a delaying
// TCP proxy (bench/lib/delay_proxy.py) instead of straight to the server; the bench's own
// admin connection and its CPU accounting still use the server directly.

import postgres from "postgres";
import { killGroup, release, track } from "./children.ts";
import { LineReader } from "./lines.ts";

const PROXY = new URL("./delay_proxy.py", import.meta.url).pathname;

/** A running delay proxy in front of a server. */
export interface RemoteServer {
  /** `serverUrl` with the proxy's port: connections through it pay the round trip. */
  readonly url: string;
  /** The round trip asked for, ms. */
  readonly rttMs: number;
  /** Measured: median `select 1` round trip through the proxy and straight, ms. */
  readonly measured: { proxied_ms: number; direct_ms: number };
  /** Stop the proxy (also done on an interrupt, as for every child of the bench). */
  stop(): void;
}

/**
 * Start the delay proxy in front of the server at `serverUrl` (127.0.0.1), each direction
 * delayed by half of `rttMs`, and measure the round trip it adds.
 */
export async function startRemote(serverUrl: string, rttMs: number): Promise<RemoteServer> {
  const target = new URL(serverUrl);
  const child = new Deno.Command("python3", {
    args: [PROXY, target.hostname, target.port, String(rttMs / 2)],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
    detached: true,
  }).spawn();
  track(child);
  try {
    const first = await new LineReader(child.stdout).next();
    const port = first?.match(/^PORT (\d+)$/)?.[1];
    if (!port) throw new Error(`the delay proxy did not start (it printed ${first})`);
    const proxied = new URL(serverUrl);
    proxied.port = port;
    const url = proxied.toString();
    const measured = {
      proxied_ms: await medianRoundTrip(url),
      direct_ms: await medianRoundTrip(serverUrl),
    };
    return { url, rttMs, measured, stop: () => release(child) };
  } catch (error) {
    killGroup(child);
    release(child);
    throw error;
  }
}

/** The median time of 200 `select 1` on one connection, ms. */
async function medianRoundTrip(url: string): Promise<number> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await sql`select 1`;
    const times: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = performance.now();
      await sql`select 1`;
      times.push(performance.now() - t);
    }
    times.sort((a, b) => a - b);
    return times[times.length >> 1];
  } finally {
    await sql.end({ timeout: 1 });
  }
}
