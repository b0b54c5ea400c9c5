// Every TypeScript sample in README.md and docs/*.md type-checks against this checkout,
// and so do the JSDoc examples of the sources and the examples/ programs.
//
// The convention (also in docs/README.md):
// - A ```ts block is written to its own module under tests/.doc_samples/ (gitignored,
//   removed afterwards) and checked with `deno check`. `@akadze/akadze` and its subpaths
//   resolve to this checkout (deno.json's name and exports), and the bare npm imports of
//   deno.json (`valibot`, `postgres`, ...) work as in the project.
// - ```ts ignore blocks are not checked (pseudo-code, or code for another project).
// - An HTML comment right before a block, `<!-- prelude: ... -->`, is prepended to that
//   block and not shown when the Markdown is rendered: it declares what the sample takes
//   as given, e.g. `<!-- prelude: import type { Akadze } from "@akadze/akadze"; declare
//   const app: Akadze; -->`.
import { assert, assertEquals } from "./assert.ts";

const ROOT = new URL("..", import.meta.url);

/** A ```ts block of a Markdown file. */
export interface Sample {
  /** The Markdown file, relative to the repository root. */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The prelude from the `<!-- prelude: ... -->` comment before it, if any. */
  prelude: string;
  /** The code. */
  code: string;
}

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)([^\n]*)$/;
const PRELUDE = /<!--\s*prelude:([\s\S]*?)-->\s*$/;

/** The ```ts blocks of a Markdown text, without the ```ts ignore ones. */
export function extractSamples(file: string, markdown: string): Sample[] {
  const lines = markdown.split("\n");
  const samples: Sample[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, lang, rest] = open;
    let end = i + 1;
    while (end < lines.length && lines[end].trim() !== fence) end++;
    const body = lines.slice(i + 1, end).map((l) =>
      l.startsWith(indent) ? l.slice(indent.length) : l
    );
    const ignored = /\bignore\b/.test(rest);
    if ((lang === "ts" || lang === "typescript") && !ignored) {
      const before = lines.slice(Math.max(0, i - 20), i).join("\n");
      samples.push({
        file,
        line: i + 1,
        // One line, so that the sample keeps its line numbers after it.
        prelude: PRELUDE.exec(before)?.[1].trim().replace(/\s*\n\s*/g, " ") ?? "",
        code: body.join("\n"),
      });
    }
    i = end;
  }
  return samples;
}

async function markdownFiles(): Promise<string[]> {
  const files = ["README.md"];
  for await (const entry of Deno.readDir(new URL("docs/", ROOT))) {
    if (entry.isFile && entry.name.endsWith(".md")) files.push(`docs/${entry.name}`);
  }
  return files.sort();
}

async function denoCheck(args: string[]): Promise<{ ok: boolean; output: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["check", "--quiet", ...args],
    cwd: ROOT.pathname,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { ok: out.success, output: text.decode(out.stdout) + text.decode(out.stderr) };
}

Deno.test("the sample extractor: fences, ignore, preludes", () => {
  const md = [
    "<!-- prelude: declare const a: number; -->",
    "```ts",
    "a + 1;",
    "```",
    "```ts ignore",
    "nonsense(",
    "```",
    "```sh",
    "echo",
    "```",
    "````ts",
    "const b = 1;",
    "````",
  ].join("\n");
  assertEquals(extractSamples("x.md", md), [
    { file: "x.md", line: 2, prelude: "declare const a: number;", code: "a + 1;" },
    { file: "x.md", line: 11, prelude: "", code: "const b = 1;" },
  ]);
});

Deno.test("every ts sample in README.md and docs/*.md type-checks", async () => {
  const dir = new URL(`tests/.doc_samples/${crypto.randomUUID().slice(0, 8)}/`, ROOT);
  await Deno.mkdir(dir, { recursive: true });
  try {
    const written = new Map<string, Sample>();
    const perFile = new Map<string, number>();
    for (const file of await markdownFiles()) {
      const samples = extractSamples(file, await Deno.readTextFile(new URL(file, ROOT)));
      perFile.set(file, samples.length);
      for (const sample of samples) {
        const name = `${file.replace(/[^A-Za-z0-9]+/g, "_")}_L${sample.line}.ts`;
        const header = `// ${file}:${sample.line}\n`;
        await Deno.writeTextFile(
          new URL(name, dir),
          `${header}${sample.prelude}\n${sample.code}\nexport {};\n`,
        );
        written.set(name, sample);
      }
    }
    for (const file of ["README.md", "docs/getting-started.md", "docs/celery.md"]) {
      assert((perFile.get(file) ?? 0) > 0, `${file} has no checked samples`);
    }
    const { ok, output } = await denoCheck(
      [...written.keys()].map((n) => new URL(n, dir).pathname),
    );
    // Point each error at the Markdown: sample line N is file line (fence + N - 2).
    const located = output.replace(
      /file:\/\/\S*\/tests\/\.doc_samples\/[^/]+\/(\S+?\.ts):(\d+):(\d+)/g,
      (_, name: string, line: string, col: string) => {
        const sample = written.get(name);
        return sample
          ? `${sample.file}:${sample.line + Number(line) - 2}:${col}`
          : `${name}:${line}:${col}`;
      },
    );
    assert(ok, `doc samples do not type-check:\n${located}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(new URL("tests/.doc_samples/", ROOT)).catch(() => {});
  }
});

Deno.test("the JSDoc examples of the sources type-check", async () => {
  const { ok, output } = await denoCheck(["--doc", "mod.ts", "cli.ts", "src/"]);
  assert(ok, output);
});

Deno.test("the examples/ programs type-check", async () => {
  const { ok, output } = await denoCheck(["examples/"]);
  assert(ok, output);
});

Deno.test("README links every page of docs/", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", ROOT));
  for (const file of await markdownFiles()) {
    if (file === "README.md" || file === "docs/README.md") continue;
    assert(readme.includes(`](${file})`), `README.md does not link ${file}`);
  }
});
