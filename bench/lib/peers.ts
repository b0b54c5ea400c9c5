// The peers (graphile-worker 0.18, pg-boss 12, BullMQ 6 with node-postgres for its
// PostgreSQL backend, and a Node >= 22 to run them): installed
// once with npm into bench/.peers (ignored by git) and reused while the versions match.
import { readText } from "./machine.ts";

const BENCH = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
/** Where the peers are installed. */
export const PEERS_DIR = `${BENCH}/.peers`;
/** The Node binary the peers' drivers run with. */
export const NODE = `${PEERS_DIR}/node_modules/.bin/node`;
const PEER_PACKAGES = ["node@22", "graphile-worker@0.18", "pg-boss@12", "bullmq@6.7", "pg"];
/** The drivers copied next to the packages (bench/peers/*.mjs). */
const DRIVERS = [
  "common.mjs",
  "graphile.mjs",
  "pgboss.mjs",
  "bullmq.mjs",
  "bullmq_flows.mjs",
  "flow_shapes.mjs",
  "pgboss_flows.mjs",
  "steady.mjs",
  "horizon.mjs",
];

async function peerVersions(): Promise<Record<string, string> | null> {
  try {
    const out = await new Deno.Command(NODE, { args: ["--version"], stderr: "null" }).output();
    const node = new TextDecoder().decode(out.stdout).trim();
    const pkg = async (name: string) =>
      JSON.parse(await Deno.readTextFile(`${PEERS_DIR}/node_modules/${name}/package.json`))
        .version as string;
    const versions = {
      node,
      "graphile-worker": await pkg("graphile-worker"),
      "pg-boss": await pkg("pg-boss"),
      bullmq: await pkg("bullmq"),
      pg: await pkg("pg"),
    };
    const major = Number(/^v(\d+)/.exec(node)?.[1]);
    if (
      major >= 22 && versions["graphile-worker"].startsWith("0.18.") &&
      versions["pg-boss"].startsWith("12.") && versions.bullmq.startsWith("6.")
    ) return versions;
  } catch {
    // not installed
  }
  return null;
}

/**
 * Install the peers if they are missing (once), copy the drivers to bench/.peers/drivers
 * (Node resolves the packages from bench/.peers/node_modules when the scripts sit there),
 * and return the installed versions.
 */
export async function ensurePeers(): Promise<Record<string, string>> {
  let versions = await peerVersions();
  if (!versions) {
    console.error(`installing ${PEER_PACKAGES.join(" ")} into bench/.peers (once) ...`);
    await Deno.mkdir(PEERS_DIR, { recursive: true });
    const manifest = `${PEERS_DIR}/package.json`;
    if (!(await readText(manifest))) {
      await Deno.writeTextFile(manifest, '{ "name": "akadze-bench-peers", "private": true }\n');
    }
    const out = await new Deno.Command("npm", {
      args: ["install", "--no-audit", "--no-fund", "--loglevel=error", ...PEER_PACKAGES],
      cwd: PEERS_DIR,
      stdout: "inherit",
      stderr: "inherit",
    }).output();
    if (!out.success) throw new Error(`npm install in bench/.peers failed (${out.code})`);
    versions = await peerVersions();
    if (!versions) throw new Error("the peers did not install as expected (Node >= 22 missing?)");
  }
  await Deno.mkdir(`${PEERS_DIR}/drivers`, { recursive: true });
  for (const name of DRIVERS) {
    await Deno.copyFile(`${BENCH}/peers/${name}`, `${PEERS_DIR}/drivers/${name}`);
  }
  return versions;
}

/** The results' line naming the peers' versions. */
export function peersLine(peers: Record<string, string>): string {
  return `Peers: graphile-worker ${peers["graphile-worker"]}, pg-boss ${peers["pg-boss"]}, ` +
    `BullMQ ${peers.bullmq ?? "–"} (PostgreSQL backend), pg ${peers.pg}, Node ${peers.node}.`;
}
