// No import cycles under src/: every `import ... from`, `import type ... from`,
// `export ... from` and bare `import "..."` of a relative module is an edge; a cycle is
// reported as its path of files.
import { assert, assertEquals } from "./assert.ts";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const SRC = join(ROOT, "src");

/** The relative specifiers a module imports or re-exports statically. */
export function staticImports(text: string): string[] {
  // Comments first, so that an example in a JSDoc block is not an edge.
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  const found: string[] = [];
  const statement =
    /(?:^|;|\n)\s*(?:import|export)\s+(?:type\s+)?(?:[^;'"]*?\s+from\s+)?["']([^"']+)["']/g;
  for (const m of code.matchAll(statement)) {
    if (m[1].startsWith(".")) found.push(m[1]);
  }
  return found;
}

/** Every .ts file under `dir`, as absolute paths. */
function tsFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = join(dir, entry.name);
    if (entry.isDirectory) files.push(...tsFiles(path));
    else if (entry.name.endsWith(".ts")) files.push(path);
  }
  return files.sort();
}

/** The import graph of `files`: file → the files it imports (relative imports only). */
function importGraph(files: string[]): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const targets = staticImports(Deno.readTextFileSync(file))
      .map((spec) => normalize(join(dirname(file), spec)));
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/** The first cycle found in `graph`, as a path whose first and last files are the same. */
export function findCycle(graph: Map<string, string[]>): string[] | null {
  const done = new Set<string>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const visit = (node: string): string[] | null => {
    if (onStack.has(node)) return [...stack.slice(stack.indexOf(node)), node];
    if (done.has(node)) return null;
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    stack.pop();
    onStack.delete(node);
    done.add(node);
    return null;
  };
  for (const node of [...graph.keys()].sort()) {
    const cycle = visit(node);
    if (cycle) return cycle;
  }
  return null;
}

Deno.test("no import cycle under src/", () => {
  const graph = importGraph(tsFiles(SRC));
  assert(graph.size > 50, `expected the src/ modules, found ${graph.size}`);
  const cycle = findCycle(graph);
  const path = cycle?.map((file) => relative(ROOT, file)).join(" → ");
  assert(cycle === null, `an import cycle under src/: ${path}`);
});

Deno.test("the import parser sees every form of static import and the cycle finder its path", () => {
  const text = `/**
 * import { nothing } from "./in_a_comment.ts";
 */
import { a } from "./a.ts";
import type { B } from "../b.ts";
import {
  c,
  type D,
} from "./c.ts";
export { e } from "./e.ts";
export type { F } from "./f.ts";
export * from "./g.ts";
import "./h.ts";
import postgres from "postgres";
// import { x } from "./commented.ts";
const s = "import { y } from './in_a_string.ts'";
`;
  assertEquals(staticImports(text), [
    "./a.ts",
    "../b.ts",
    "./c.ts",
    "./e.ts",
    "./f.ts",
    "./g.ts",
    "./h.ts",
  ]);
  const graph = new Map([
    ["db", ["env"]],
    ["env", ["rules"]],
    ["rules", ["job"]],
    ["job", ["db"]],
    ["app", ["db"]],
  ]);
  assertEquals(findCycle(graph), ["db", "env", "rules", "job", "db"]);
  graph.set("job", []);
  assertEquals(findCycle(graph), null);
});
