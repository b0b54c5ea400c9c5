// akadze from the outside. tests/consumer/ is a project that depends on @akadze/akadze the
// way a JSR user's does (its own deno.json and imports; `links` points the JSR package at
// this checkout, so jsr.io is not contacted). In a copy of it:
// - the code blocks of README.md and docs/getting-started.md run as written, in order: a
//   ```ts block that the text saves as a file ("Save this as `app.ts`") is written there,
//   and every line of a ```sh block runs (```sh ignore and ```ts ignore blocks do not);
// - `deno test -A` runs the project's own test file (tests/consumer/reminders_test.ts),
//   which uses @akadze/akadze/testing on a throwaway server.
//
// The shell lines run as written except for these rewrites (see runLine):
// - `export AKADZE_DATABASE_URL=<example>` uses a fresh database of the test server instead;
// - `deno add` leaves out `jsr:@akadze/akadze`: the project already imports it (and links it
//   here); the rest of the line runs as written;
// - `deno install -g ... jsr:@akadze/akadze/cli` is not run (it fetches from jsr.io), and the
//   `akadze` command after it is akadzeCommand's stand-in;
// - a `worker` or `dev` command without `--batch` or `--max-jobs` runs until its work is done
//   (see untilDone), then gets SIGTERM and must exit 0, as after a Ctrl-C.
import postgres from "postgres";
import { assert, assertEquals } from "./assert.ts";
import { type Block, extractBlocks } from "./_markdown.ts";
import { waitFor } from "./_helpers.ts";
import { createTestDatabase, type TestDatabase } from "../src/testing.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const CONSUMER = `${ROOT}tests/consumer/`;
/**
 * The environment of a user's shell: this one's, without the suite's database (each page
 * exports its own, and the project's test starts its own server).
 */
function userEnv(): Record<string, string> {
  const env = Deno.env.toObject();
  delete env.AKADZE_DATABASE_URL;
  return { ...env, NO_COLOR: "1" };
}

/** How long a long-running command of the docs may take to do its work. */
const LONG_RUNNING_MS = 90_000;

/**
 * The installed `akadze` command, as the docs' `deno install -g ... jsr:@akadze/akadze/cli`
 * would make it: a stand-in, since that install fetches from jsr.io. Arguments for `deno`.
 */
function akadzeCommand(args: string[]): string[] {
  return ["run", "-A", `${ROOT}cli.ts`, ...args];
}

/**
 * A copy of tests/consumer/ in a temporary directory. Its `links` name this checkout by its
 * absolute path (the committed "../.." is relative to tests/consumer/); nothing else changes.
 */
async function consumerProject(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "akadze-consumer-" });
  for await (const entry of Deno.readDir(CONSUMER)) {
    if (!entry.isFile || entry.name === "deno.lock") continue;
    let text = await Deno.readTextFile(`${CONSUMER}${entry.name}`);
    if (entry.name === "deno.json") {
      assert(text.includes(`"links": ["../.."]`), "tests/consumer/deno.json links ../..");
      text = text.replace(`"links": ["../.."]`, `"links": [${JSON.stringify(ROOT)}]`);
    }
    await Deno.writeTextFile(`${dir}/${entry.name}`, text);
  }
  return dir;
}

interface Output {
  code: number;
  stdout: string;
  stderr: string;
}

/** Where the docs' commands run: the project, the exported variables, the test database. */
interface Shell {
  cwd: string;
  env: Record<string, string>;
  database: TestDatabase;
  /** Whether the docs installed the `akadze` command yet. */
  installed: boolean;
  /** The ts files the page saved, by name. */
  saved: Map<string, string>;
}

const decoder = new TextDecoder();

/** The commands of a ```sh block: continuations joined, comments and blank lines dropped. */
function shellCommands(code: string, where: string): string[][] {
  return code.replace(/\\\n\s*/g, " ").split("\n")
    .map((line) => line.replace(/(^|\s)#.*$/, "").trim())
    .filter(Boolean)
    .map((line) => {
      // Quotes, variables, pipes and redirections would need a shell; the docs' commands
      // are plain words.
      assert(!/["'`$|;&<>()]/.test(line), `${where}: not a plain command: ${line}`);
      return line.split(/\s+/);
    });
}

/** The akadze subcommand of `deno run ... <cli> SUB ...` or `akadze SUB ...`, if any. */
function subcommand(args: string[]): string | undefined {
  const cli = args.findIndex((a) => a === "jsr:@akadze/akadze/cli" || a.endsWith("/cli.ts"));
  return cli >= 0 ? args[cli + 1] : undefined;
}

/**
 * When a long-running command has done its work: for `worker`, every job of the database is
 * done and at least one succeeded; for `dev` (its own database), a job succeeded when the
 * page's app has a schedule, else the worker started.
 */
async function untilDone(
  shell: Shell,
  sub: string,
  stderr: () => string,
): Promise<void> {
  if (sub === "dev") {
    const periodic = [...shell.saved.values()].some((code) => code.includes(".periodic("));
    const done = periodic ? /job \S+ succeeded/ : /worker \S+ started/;
    await waitFor(() => done.test(stderr()), `akadze dev: ${done}`, LONG_RUNNING_MS);
    return;
  }
  const sql = postgres(shell.env.AKADZE_DATABASE_URL, { max: 1, onnotice: () => {} });
  try {
    await waitFor(
      async () => {
        const [{ open, succeeded }] = await sql`
        select count(*) filter (where state in ('queued', 'running'))::int as open,
               count(*) filter (where state = 'succeeded')::int as succeeded
          from akadze.jobs`;
        return open === 0 && succeeded > 0;
      },
      "the worker to run every job",
      LONG_RUNNING_MS,
    );
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** Run one command of the docs (see the rewrites in this file's header). */
async function runLine(shell: Shell, line: string[], where: string): Promise<void> {
  const words = [...line];
  const env = { ...shell.env };
  const assign = (name: string, value: string, into: Record<string, string>) => {
    into[name] = name === "AKADZE_DATABASE_URL" ? shell.database.url : value;
  };
  if (words[0] === "export") {
    for (const word of words.slice(1)) {
      const [name, ...value] = word.split("=");
      assign(name, value.join("="), shell.env);
    }
    return;
  }
  while (/^[A-Z_][A-Z0-9_]*=/.test(words[0])) {
    const [name, ...value] = words.shift()!.split("=");
    assign(name, value.join("="), env);
  }
  let args: string[];
  if (words[0] === "deno") {
    args = words.slice(1);
    if (args[0] === "add") {
      args = args.filter((a) => a !== "jsr:@akadze/akadze");
      if (args.length === 1) return;
    } else if (args[0] === "install" && args.includes("jsr:@akadze/akadze/cli")) {
      shell.installed = true;
      return;
    }
  } else if (words[0] === "akadze") {
    assert(shell.installed, `${where}: \`akadze\` is used before the page installs it`);
    args = akadzeCommand(words.slice(1));
  } else {
    throw new Error(`${where}: \`${words[0]}\` cannot run here; mark the block \`\`\`sh ignore`);
  }

  const command = new Deno.Command(Deno.execPath(), {
    args,
    cwd: shell.cwd,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
  const sub = subcommand(args);
  const longRunning = (sub === "worker" || sub === "dev") &&
    !args.includes("--batch") && !args.includes("--max-jobs");
  let out: Output;
  if (longRunning) {
    const child = command.spawn();
    let stdout = "";
    let stderr = "";
    const collect = async (stream: ReadableStream<Uint8Array>, add: (s: string) => void) => {
      for await (const chunk of stream) add(decoder.decode(chunk, { stream: true }));
    };
    const reading = Promise.all([
      collect(child.stdout, (s) => stdout += s),
      collect(child.stderr, (s) => stderr += s),
    ]);
    let exited = false;
    const status = child.status.finally(() => exited = true);
    try {
      await Promise.race([
        untilDone(shell, sub, () => stderr),
        status.then(() => {
          throw new Error(`${where}: ${line.join(" ")} exited early:\n${stderr}`);
        }),
      ]);
    } finally {
      if (!exited) child.kill("SIGTERM");
    }
    const { code } = await status;
    await reading;
    out = { code, stdout, stderr };
  } else {
    const result = await command.output();
    out = {
      code: result.code,
      stdout: decoder.decode(result.stdout),
      stderr: decoder.decode(result.stderr),
    };
  }
  assertEquals(
    out.code,
    0,
    `${where}: ${line.join(" ")} exited ${out.code}:\n${out.stdout}${out.stderr}`,
  );
}

/** Run a page's blocks in order in a fresh copy of the consumer project. */
async function runPage(file: string): Promise<Shell> {
  const blocks = extractBlocks(file, await Deno.readTextFile(`${ROOT}${file}`));
  const cwd = await consumerProject();
  const database = await createTestDatabase({ name: file });
  const shell: Shell = {
    cwd,
    env: userEnv(),
    database,
    installed: false,
    saved: new Map(),
  };
  try {
    for (const block of blocks.filter((b: Block) => !b.ignored)) {
      const where = `${file}:${block.line}`;
      if (block.lang === "ts") {
        assert(block.saveAs, `${where}: say where to save this sample, or mark it \`\`\`ts ignore`);
        await Deno.writeTextFile(`${cwd}/${block.saveAs}`, `${block.code}\n`);
        shell.saved.set(block.saveAs, block.code);
      } else if (block.lang === "sh") {
        for (const line of shellCommands(block.code, where)) await runLine(shell, line, where);
      }
    }
    return shell;
  } finally {
    await database.close();
    await Deno.remove(cwd, { recursive: true });
  }
}

Deno.test("the README's samples run as written in a project that depends on akadze", async () => {
  const shell = await runPage("README.md");
  assert(shell.saved.has("app.ts"), "the README saves no app.ts");
});

Deno.test("docs/getting-started.md runs as written in a project that depends on akadze", async () => {
  const shell = await runPage("docs/getting-started.md");
  assert(shell.installed, "docs/getting-started.md installs no akadze command");
});

Deno.test("a dependent project's own test of its tasks passes with deno test", async () => {
  const cwd = await consumerProject();
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["test", "-A"],
      cwd,
      env: userEnv(), // it starts its own server
      clearEnv: true,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = decoder.decode(out.stdout) + decoder.decode(out.stderr);
    assertEquals(out.code, 0, text);
    assert(/ok \| 1 passed \| 0 failed/.test(text), text);
  } finally {
    await Deno.remove(cwd, { recursive: true });
  }
});
