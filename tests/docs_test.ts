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
// - A block the text before it saves as a file ("Save this as `app.ts`") is written under
//   that name beside the other samples of its page, so a later sample can import it.
// tests/consumer_docs_test.ts runs the samples of README.md and docs/*.md.
import { assert, assertEquals } from "./assert.ts";
import { type Block, extractBlocks } from "./_markdown.ts";

const ROOT = new URL("..", import.meta.url);

/** A ```ts block of a Markdown file (see {@link Block}). */
export type Sample = Pick<Block, "file" | "line" | "prelude" | "saveAs" | "code">;

/** The ```ts blocks of a Markdown text, without the ```ts ignore ones. */
export function extractSamples(file: string, markdown: string): Sample[] {
  return extractBlocks(file, markdown)
    .filter((b) => (b.lang === "ts" || b.lang === "typescript") && !b.ignored)
    .map(({ file, line, prelude, saveAs, code }) => ({
      file,
      line,
      prelude,
      ...(saveAs ? { saveAs } : {}),
      code,
    }));
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
        // A sample the text saves as a file is written under that name, beside the other
        // samples of its page, so that they can import each other (`./app.ts`).
        const slug = file.replace(/[^A-Za-z0-9]+/g, "_");
        const name = sample.saveAs ? `${slug}/${sample.saveAs}` : `${slug}_L${sample.line}.ts`;
        if (sample.saveAs) await Deno.mkdir(new URL(`${slug}/`, dir), { recursive: true });
        assert(!written.has(name), `${file}:${sample.line} saves a second ${sample.saveAs}`);
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
    // A page after getting started may import its `app.ts` (as tests/consumer_docs_test.ts
    // runs them): a page that saves files but no app.ts gets that one beside them.
    const app = written.get("docs_getting_started_md/app.ts");
    assert(app, "docs/getting-started.md saves no app.ts");
    for (
      const slug of new Set(
        [...written.keys()].map((n) => n.split("/")).filter((p) => p.length > 1).map((p) => p[0]),
      )
    ) {
      if (slug === "README_md" || written.has(`${slug}/app.ts`)) continue;
      await Deno.writeTextFile(
        new URL(`${slug}/app.ts`, dir),
        `// docs/getting-started.md:${app.line}\n${app.prelude}\n${app.code}\nexport {};\n`,
      );
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
  const { ok, output } = await denoCheck(["--doc", "mod.ts", "admin.ts", "cli.ts", "src/"]);
  assert(ok, output);
});

Deno.test("the examples/ programs type-check", async () => {
  const { ok, output } = await denoCheck(["examples/"]);
  assert(ok, output);
});

/** Where the README's links go: it is shown on JSR, which has no docs/ or bench/. */
const REPOSITORY = "https://github.com/akadze/akadze/blob/main/";

Deno.test("README links every page of docs/ by its repository URL", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", ROOT));
  for (const file of await markdownFiles()) {
    if (file === "README.md" || file === "docs/README.md") continue;
    assert(readme.includes(`](${REPOSITORY}${file})`), `README.md does not link ${file}`);
  }
});

Deno.test("README links work where the package is published", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", ROOT));
  const { publish } = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  const excluded: string[] = publish.exclude;
  for (const [, target] of readme.matchAll(/\]\(([^)\s]+)\)/g)) {
    if (target.startsWith(REPOSITORY)) {
      // A repository link must name a file or directory of this checkout.
      const path = target.slice(REPOSITORY.length).replace(/#.*$/, "");
      await Deno.stat(new URL(path, ROOT)).catch(() => {
        throw new Error(`README.md links ${target}, but there is no ${path}`);
      });
    } else if (!/^(https?:|mailto:|#)/.test(target)) {
      const path = target.replace(/^\.\//, "").replace(/#.*$/, "");
      assert(
        !excluded.some((dir) => path.startsWith(dir)),
        `README.md links ${target}, which the published package leaves out: link ${REPOSITORY}${path}`,
      );
    }
  }
});
