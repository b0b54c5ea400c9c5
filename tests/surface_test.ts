// The public surface, as `deno doc` reads each entry point of deno.json's "exports":
// - the root (`@akadze/akadze`) is the application API, at most ROOT_MAX names, so that a
//   user takes it in at a glance;
// - operating functions (migrate, jobs, queues, limits, workers) live in
//   `@akadze/akadze/admin` and nowhere else: no name is exported by both;
// - plumbing is exported by no entry point;
// - every entry point has a module doc with an example (JSR's page of that entry point).
import { assert, assertEquals } from "./assert.ts";

const ROOT = new URL("..", import.meta.url);
/**
 * The most names the root may export (values and types alike): about 50, the application
 * API of tasks, flows, sandboxed tasks, dead letters, the running job, outcomes, errors and
 * the worker.
 */
const ROOT_MAX = 49;
/** Helpers of akadze's own code that no entry point exports. */
const PLUMBING = [
  "DEFAULT_SCHEMA",
  "MIGRATE_DEFAULT",
  "WAIT_POLL_DEFAULT",
  "WORKER_DEFAULTS",
  "appliedVersions",
  "describeError",
  "knownVersions",
  "pendingVersions",
  "quoteSchema",
  "redact",
];

interface Entry {
  /** Exported name → its kinds (function, class, interface, typeAlias, variable, ...). */
  names: Map<string, string[]>;
  /** The kinds of the module doc's tags (`example`, `module`). */
  moduleTags: string[];
}

/** What `deno doc --json` says an entry point exports. */
async function readEntry(path: string): Promise<Entry> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["doc", "--json", path],
    cwd: ROOT.pathname,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  assert(out.success, `deno doc --json ${path} failed: ${text.decode(out.stderr)}`);
  type Symbol = { name: string; declarations: { kind: string }[] };
  type Node = { module_doc?: { tags?: { kind: string }[] }; symbols: Symbol[] };
  const nodes = Object.values(JSON.parse(text.decode(out.stdout)).nodes as Record<string, Node>);
  assertEquals(nodes.length, 1, `deno doc --json ${path}: one module`);
  const names = new Map<string, string[]>();
  for (const symbol of nodes[0].symbols) {
    names.set(symbol.name, [
      ...(names.get(symbol.name) ?? []),
      ...symbol.declarations.map((d) => d.kind),
    ]);
  }
  return { names, moduleTags: (nodes[0].module_doc?.tags ?? []).map((t) => t.kind) };
}

const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
const exportsMap = config.exports as Record<string, string>;
const entries = new Map<string, Entry>();
for (const [name, path] of Object.entries(exportsMap)) entries.set(name, await readEntry(path));

Deno.test(`the root exports at most ${ROOT_MAX} names`, () => {
  const names = [...entries.get(".")!.names.keys()].sort();
  assert(
    names.length <= ROOT_MAX,
    `the root exports ${names.length} names (at most ${ROOT_MAX}): ${names.join(", ")}`,
  );
});

Deno.test("the admin functions are exported from @akadze/akadze/admin only", () => {
  const admin = entries.get("./admin");
  assert(admin, 'deno.json exports "./admin"');
  const functions = [...admin.names].filter(([, kinds]) => kinds.includes("function"));
  for (const name of ["migrate", "listJobs", "requeue", "pauseQueue", "setLimit", "pruneJobs"]) {
    assert(functions.some(([n]) => n === name), `@akadze/akadze/admin exports ${name}`);
  }
  const root = entries.get(".")!.names;
  assertEquals([...admin.names.keys()].filter((name) => root.has(name)), []);
});

Deno.test("no entry point exports akadze's plumbing", () => {
  const found: string[] = [];
  for (const [entry, { names }] of entries) {
    for (const name of PLUMBING) if (names.has(name)) found.push(`${entry}: ${name}`);
  }
  assertEquals(found, []);
});

Deno.test("every entry point has a module doc with an example", () => {
  const missing: string[] = [];
  for (const [entry, { moduleTags }] of entries) {
    if (!moduleTags.includes("module")) missing.push(`${entry}: no @module doc`);
    if (!moduleTags.includes("example")) missing.push(`${entry}: no @example in its module doc`);
  }
  assertEquals(missing, []);
});

Deno.test("`deno task check` lints the docs of every entry point", () => {
  const lint = (config.tasks.check as string).match(/deno doc --lint ([^&]+)/);
  assert(lint, "the check task runs deno doc --lint");
  const linted = new Set(lint[1].trim().split(/\s+/).map((p) => p.replace(/^\.\//, "")));
  const unlinted = Object.values(exportsMap).map((p) => p.replace(/^\.\//, ""))
    .filter((p) => !linted.has(p));
  assertEquals(unlinted, []);
});
