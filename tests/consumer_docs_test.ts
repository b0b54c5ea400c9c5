// akadze from the outside. tests/consumer/ is a project that depends on @akadze/akadze the
// way a JSR user's does (its own deno.json and imports; `links` points the JSR package at
// this checkout, so jsr.io is not contacted). In a copy of it:
// - the code blocks of README.md and the docs pages (PAGES) run as written, in order: a
//   ```ts block that the text saves as a file ("Save this as `app.ts`") is written there,
//   every line of a ```sh block runs, and a ```sql block runs through
//   `psql "$AKADZE_DATABASE_URL" -v ON_ERROR_STOP=1` against the page's database. Ignored
//   blocks (```sh ignore, ```ts ignore, ```sql ignore) do not run (PAGES says why); a
//   ```ts block that is not saved is a fragment and must have a `<!-- prelude: ... -->`
//   (tests/docs_test.ts type-checks it, it does not run). README.md
//   and docs/getting-started.md start from the bare project, the other pages where getting
//   started leaves a user: its app.ts saved, AKADZE_DATABASE_URL exported and migrated;
// - `deno test -A` runs the project's own test file (tests/consumer/reminders_test.ts),
//   which uses @akadze/akadze/testing on a throwaway server.
//
// The shell lines run as written except for these rewrites (see invocation and runLine):
// - `AKADZE_DATABASE_URL=<example>` (exported or in front of a command) is the page's fresh
//   database of the test server instead, and a `deno run --allow-net=<host>,...` names that
//   database's host instead of the first (the doc's database), the rest as written; an
//   example URL of `akadze dev` (`.../akadze_dev`) is the URL the running `akadze dev`
//   printed; a `--allow-read=<paths>` also allows this checkout, which `links` puts in place
//   of the package (a package from JSR needs no read permission);
// - `deno add` leaves out `jsr:@akadze/akadze`: the project already imports it (and links it
//   here); the rest of the line runs as written;
// - `deno install -g -n akadze <flags> jsr:@akadze/akadze/cli` installs this checkout's
//   cli.ts with exactly those flags into a temporary root (tests/_install.ts), and later
//   `akadze ...` lines run that installed command. A page without an install line gets the
//   command as docs/getting-started.md installs it;
// - `akadze compile` runs with `--dry-run` (deno compile would download its runtime), and a
//   later command naming its output (`./worker ...`) runs the entry module with `deno run`,
//   the compile's flags, `--allow-net=<the test database's host>` instead of the doc's host,
//   and `--batch`;
// - `<command> > <file>` writes the command's output to that file of the project, as a
//   shell would (its directory must exist: `mkdir` runs as written);
// - `curl -s <url>` right after a worker with `--metrics-port` runs meanwhile (a second
//   shell) once the worker has started, as a GET that must answer 200;
// - a `worker` or `dev` command without `--batch` or `--max-jobs` runs until its work is done
//   (see runLine), then gets SIGTERM and must exit 0, as after a Ctrl-C. When the page's next
//   command uses the URL `akadze dev` prints, it runs meanwhile (a second shell) once the dev
//   worker has started, and `dev` runs until it has run every job. A `worker` on a database
//   without jobs runs until it has started.
import postgres from "postgres";
import { assert, assertEquals } from "./assert.ts";
import { extractBlocks } from "./_markdown.ts";
import { psql, waitFor } from "./_helpers.ts";
import { createTestDatabase, type TestDatabase } from "../src/testing.ts";
import { migrate } from "../admin.ts";
import { installAkadze, type InstalledAkadze, installedPath } from "./_install.ts";

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

/** A worker binary the page built with `akadze compile` (see compiled). */
interface Binary {
  /** `deno run` arguments that run its entry module as the binary would run. */
  args: string[];
  /** The temporary directory of the entry module. */
  dir: string;
}

/** Where the docs' commands run: the project, the exported variables, the test database. */
interface Shell {
  file: string;
  cwd: string;
  env: Record<string, string>;
  database: TestDatabase;
  /** The `akadze` command the docs installed, once they did. */
  akadze?: InstalledAkadze;
  /** Whether the page has its own install line (then `akadze` before it is an error). */
  installsAkadze: boolean;
  /** The worker binaries the page built, by the path it gave (`-o`). */
  binaries: Map<string, Binary>;
  /** The ts files the page saved, by name. */
  saved: Map<string, string>;
}

const decoder = new TextDecoder();
const INSTALL_SPEC = "jsr:@akadze/akadze/cli";
/** A URL `akadze dev` prints (the docs show one of these as an example). */
const DEV_URL = /^postgres:\/\/postgres@127\.0\.0\.1:\d+\/akadze_dev$/;

/** The commands of a ```sh block: continuations joined, comments and blank lines dropped. */
function shellCommands(code: string, where: string): string[][] {
  return code.replace(/\\\n\s*/g, " ").split("\n")
    .map((line) => line.replace(/(^|\s)#.*$/, "").trim())
    .filter(Boolean)
    .map((line) => {
      // Quotes, variables, pipes and redirections (but one `> file` at the end) would need
      // a shell; the docs' commands are plain words.
      const words = line.split(/\s+/);
      const plain = words.at(-2) === ">" ? words.slice(0, -2) : words;
      assert(!/["'`$|;&<>()]/.test(plain.join(" ")), `${where}: not a plain command: ${line}`);
      return words;
    });
}

/** The permission flags of a `deno install -g -n akadze <flags> jsr:@akadze/akadze/cli` line. */
function installFlags(args: string[]): string[] {
  const flags: string[] = [];
  for (let i = 1; i < args.length; i++) {
    const arg = args[i];
    if (arg === "-g" || arg === "--global" || arg === "-f" || arg === INSTALL_SPEC) continue;
    if (arg === "-n" || arg === "--name") {
      assertEquals(args[++i], "akadze", "the docs install the command as `akadze`");
      continue;
    }
    flags.push(arg);
  }
  return flags;
}

/** The install line of docs/getting-started.md: how the other pages' `akadze` is installed. */
async function gettingStartedInstall(): Promise<string[]> {
  const file = "docs/getting-started.md";
  for (const block of extractBlocks(file, await Deno.readTextFile(`${ROOT}${file}`))) {
    if (block.lang !== "sh" || block.ignored) continue;
    for (const line of shellCommands(block.code, file)) {
      if (line[0] === "deno" && line[1] === "install" && line.includes(INSTALL_SPEC)) {
        return installFlags(line.slice(1));
      }
    }
  }
  throw new Error(`${file} has no \`deno install ... ${INSTALL_SPEC}\` line`);
}

/** What a worker logs once it runs. */
const STARTED = /worker \S+ started/;

/** How many jobs the database has. */
async function jobCount(url: string): Promise<number> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const [{ n }] = await sql`select count(*)::int as n from akadze.jobs`;
    return n;
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** Until every job of the database is done and at least one succeeded. */
async function untilJobsDone(url: string, what: string): Promise<void> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await waitFor(
      async () => {
        const [{ open, succeeded }] = await sql`
        select count(*) filter (where state in ('queued', 'running'))::int as open,
               count(*) filter (where state = 'succeeded')::int as succeeded
          from akadze.jobs`;
        return open === 0 && succeeded > 0;
      },
      what,
      LONG_RUNNING_MS,
    );
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** A command that runs until it is stopped, its output collected as it comes. */
interface LongRunning {
  stderr(): string;
  /** Rejects when the command exits by itself. */
  exited: Promise<never>;
  /** SIGTERM it (as a Ctrl-C would stop it) and wait for its end. */
  stop(): Promise<Output>;
}

function spawnLong(command: Deno.Command, where: string, line: string): LongRunning {
  const child = command.spawn();
  let stdout = "";
  let stderr = "";
  const collect = async (stream: ReadableStream<Uint8Array>, add: (s: string) => void) => {
    for await (const text of stream.pipeThrough(new TextDecoderStream())) add(text);
  };
  const reading = Promise.all([
    collect(child.stdout, (s) => stdout += s),
    collect(child.stderr, (s) => stderr += s),
  ]);
  let done = false;
  const status = child.status.finally(() => done = true);
  const exited = status.then(() => {
    throw new Error(`${where}: ${line} exited early`); // runLine adds its stderr
  });
  exited.catch(() => {}); // observed by whoever races it
  return {
    stderr: () => stderr,
    exited,
    stop: async () => {
      if (!done) child.kill("SIGTERM");
      const { code } = await status;
      await reading;
      return { code, stdout, stderr };
    },
  };
}

/** The worker binary a `./worker`-like command names, if the page built it. */
function binaryOf(shell: Shell, word: string): Binary | undefined {
  return shell.binaries.get(word) ?? shell.binaries.get(word.replace(/^\.\//, ""));
}

/**
 * `akadze compile ... --dry-run`: the entry module and the `deno compile` command it would
 * run, turned into the `deno run` command that runs the entry the same way (`--output` and
 * `--target` are compile-only; `--allow-net=<host>` names the test database's host).
 */
function compiled(shell: Shell, out: Output, where: string): Binary {
  const entry = /entry module written to (\S+)/.exec(out.stderr)?.[1];
  assert(entry, `${where}: akadze compile --dry-run wrote no entry module:\n${out.stderr}`);
  const words = out.stdout.trim().split(" ").map((w) => w.replace(/^'(.*)'$/, "$1"));
  assertEquals(words.slice(0, 2), [Deno.execPath(), "compile"], out.stdout);
  const db = new URL(shell.database.url);
  const args = ["run"];
  for (let i = 2; i < words.length; i++) {
    const word = words[i];
    if (word === "--output" || word === "-o" || word === "--target") i++;
    else if (word.startsWith("--allow-net=")) args.push(`--allow-net=${db.host}`);
    else args.push(word);
  }
  assertEquals(args.at(-1), entry, out.stdout);
  return { args, dir: entry.replace(/\/[^/]+$/, "") };
}

/** What a line runs: the executable, its arguments, and the akadze subcommand. */
interface Invocation {
  cmd: string;
  args: string[];
  sub?: string;
}

/** Turn one command of the docs into what runs here (see the rewrites in this file's header). */
async function invocation(
  shell: Shell,
  words: string[],
  where: string,
): Promise<Invocation | undefined> {
  if (words[0] === "deno") {
    let args = words.slice(1);
    if (args[0] === "add") {
      args = args.filter((a) => a !== "jsr:@akadze/akadze");
      return args.length === 1 ? undefined : { cmd: Deno.execPath(), args };
    }
    if (args[0] === "install" && args.includes(INSTALL_SPEC)) {
      await shell.akadze?.remove();
      shell.akadze = await installAkadze(installFlags(args));
      return undefined;
    }
    const cli = args.findIndex((a) => a === INSTALL_SPEC);
    const db = new URL(shell.database.url).host;
    args = args.map((a, i) => {
      if (cli >= 0 && i > cli) return a;
      if (a.startsWith("--allow-net=")) {
        return [`--allow-net=${db}`, ...a.split(",").slice(1)].join(",");
      }
      return a.startsWith("--allow-read=") ? `${a},${ROOT}` : a;
    });
    return { cmd: Deno.execPath(), args, sub: cli >= 0 ? args[cli + 1] : undefined };
  }
  if (words[0] === "akadze") {
    if (!shell.akadze) {
      assert(!shell.installsAkadze, `${where}: \`akadze\` is used before the page installs it`);
      shell.akadze = await installAkadze(await gettingStartedInstall());
    }
    const args = words.slice(1);
    if (args[0] === "compile") {
      args.splice(args.includes("--") ? args.indexOf("--") : args.length, 0, "--dry-run");
    }
    return { cmd: shell.akadze.path, args, sub: args[0] };
  }
  if (words[0] === "mkdir") return { cmd: "mkdir", args: words.slice(1) };
  const binary = binaryOf(shell, words[0]);
  if (binary) {
    return { cmd: Deno.execPath(), args: [...binary.args, ...words.slice(1), "--batch"] };
  }
  throw new Error(`${where}: \`${words[0]}\` cannot run here; mark the block \`\`\`sh ignore`);
}

/** The `NAME=value` words in front of a command, applied to `env`; the rest of the words. */
function assignments(
  shell: Shell,
  line: string[],
  env: Record<string, string>,
  devUrl?: string,
): string[] {
  const words = [...line];
  while (/^[A-Z_][A-Z0-9_]*=/.test(words[0] ?? "")) {
    const [name, ...rest] = words.shift()!.split("=");
    const value = rest.join("=");
    if (name !== "AKADZE_DATABASE_URL") env[name] = value;
    else if (DEV_URL.test(value)) {
      assert(devUrl, `${shell.file}: ${value} names an \`akadze dev\` database, but none runs`);
      env[name] = devUrl;
    } else env[name] = shell.database.url;
  }
  return words;
}

/** A command of the docs, ready to run: what it runs and in which environment. */
interface Prepared {
  run: Invocation;
  env: Record<string, string>;
  command: Deno.Command;
}

/** Prepare one command line (`devUrl`: the URL a running `akadze dev` printed). */
async function prepare(
  shell: Shell,
  line: string[],
  where: string,
  devUrl?: string,
): Promise<Prepared | undefined> {
  const env: Record<string, string> = { ...shell.env, PATH: installedPath() };
  const run = await invocation(shell, assignments(shell, line, env, devUrl), where);
  if (!run) return undefined;
  const command = new Deno.Command(run.cmd, {
    args: run.args,
    cwd: shell.cwd,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
  return { run, env, command };
}

async function runToEnd(command: Deno.Command): Promise<Output> {
  const result = await command.output();
  return {
    code: result.code,
    stdout: decoder.decode(result.stdout),
    stderr: decoder.decode(result.stderr),
  };
}

function assertSucceeded(out: Output, where: string, line: string[]): void {
  assertEquals(
    out.code,
    0,
    `${where}: ${line.join(" ")} exited ${out.code}:\n${out.stdout}${out.stderr}`,
  );
}

/**
 * Run one command of the docs (see the rewrites in this file's header); `next` is the
 * page's next command, which a long-running `akadze dev` may run beside it. Returns whether
 * it ran `next` too.
 */
async function runLine(
  shell: Shell,
  words: string[],
  where: string,
  next?: { line: string[]; where: string },
): Promise<boolean> {
  if (words[0] === "export") {
    assignments(shell, words.slice(1), shell.env);
    return false;
  }
  const output = words.at(-2) === ">" ? words.at(-1) : undefined;
  const line = output ? words.slice(0, -2) : words;
  const prepared = await prepare(shell, line, where);
  if (!prepared) return false;
  const { run, env, command } = prepared;
  const longRunning = (run.sub === "worker" || run.sub === "dev") &&
    !run.args.includes("--batch") && !run.args.includes("--max-jobs");
  assert(!output || !longRunning, `${where}: a long-running command's output goes to the log`);
  if (!longRunning) {
    const out = await runToEnd(command);
    assertSucceeded(out, where, line);
    if (output) await Deno.writeTextFile(`${shell.cwd}/${output}`, out.stdout);
    if (run.sub === "compile") {
      assert(run.args.includes("-o"), `${where}: name the binary with -o`);
      shell.binaries.set(run.args[run.args.indexOf("-o") + 1], compiled(shell, out, where));
    }
    return false;
  }

  const proc = spawnLong(command, where, line.join(" "));
  const until = (what: Promise<unknown>) => Promise.race([what, proc.exited]);
  const logged = (pattern: RegExp) =>
    until(waitFor(() => pattern.test(proc.stderr()), `${where}: ${pattern}`, LONG_RUNNING_MS));
  let ranNext = false;
  let out: Output;
  try {
    if (run.sub === "worker") {
      const url = env.AKADZE_DATABASE_URL;
      if (await jobCount(url) > 0) await until(untilJobsDone(url, `${where}: every job to run`));
      else await logged(STARTED);
      if (next?.line[0] === "curl" && run.args.includes("--metrics-port")) {
        await until(scrape(next.line, next.where));
        ranNext = true;
      }
    } else if (next?.line.some((w) => DEV_URL.test(w.replace(/^AKADZE_DATABASE_URL=/, "")))) {
      // The page's next command runs in a second shell against the printed URL, once the
      // dev worker runs (the URL is printed before the schema is migrated).
      await logged(STARTED);
      const url = /^AKADZE_DATABASE_URL=(\S+)$/m.exec(proc.stderr())?.[1];
      assert(url, `${where}: akadze dev printed no URL line:\n${proc.stderr()}`);
      const second = await prepare(shell, next.line, next.where, url);
      assert(second, `${next.where}: runs nothing`);
      assertSucceeded(await runToEnd(second.command), next.where, next.line);
      ranNext = true;
      await until(untilJobsDone(url, `${where}: akadze dev to run the enqueued jobs`));
    } else {
      const periodic = [...shell.saved.values()].some((code) => code.includes(".periodic("));
      await logged(periodic ? /job \S+ succeeded/ : STARTED);
    }
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : error}\n${proc.stderr()}`);
  } finally {
    out = await proc.stop();
  }
  assertSucceeded(out, where, line);
  return ranNext;
}

/** `curl -s <url>` of a worker's metrics: until it answers, then it must answer 200. */
async function scrape(line: string[], where: string): Promise<void> {
  assertEquals(line.slice(0, 2), ["curl", "-s"], `${where}: curl -s <url>`);
  assertEquals(line.length, 3, `${where}: curl -s <url>`);
  const response = await waitFor(
    () => fetch(line[2]).catch((): undefined => undefined),
    `${where}: ${line[2]} to answer`,
    LONG_RUNNING_MS,
  );
  assert(response, `${where}: ${line[2]} did not answer`);
  const body = await response.text();
  assertEquals(response.status, 200, `${where}: ${line.join(" ")}:\n${body}`);
}

/** A ```sql block, run by psql against the page's database; it stops at its first error. */
async function runSql(shell: Shell, code: string, where: string): Promise<void> {
  const url = shell.env.AKADZE_DATABASE_URL;
  assert(url, `${where}: SQL before the page exports AKADZE_DATABASE_URL`);
  assertSucceeded(await psql(url, `${code}\n`), where, ["psql", "-v", "ON_ERROR_STOP=1"]);
}

/** A page whose samples run, and why each of its ignored blocks cannot run here. */
interface Page {
  file: string;
  /**
   * Where a user starts: from nothing (the install pages), or where docs/getting-started.md
   * leaves them: its `app.ts` saved, `AKADZE_DATABASE_URL` exported and migrated, the
   * `akadze` command installed (on first use).
   */
  start: "fresh" | "after getting started";
  /** The ignored blocks, by their first line, with the reason. */
  ignored: Record<string, string>;
}

const PAGES: Page[] = [
  {
    file: "README.md",
    start: "fresh",
    ignored: { "deno task demo": "runs in a checkout of akadze, not in a dependent project" },
  },
  {
    file: "docs/getting-started.md",
    start: "fresh",
    ignored: { "sha256sum -c SHA256SUMS --ignore-missing": "a release's downloaded binaries" },
  },
  { file: "docs/tasks-and-enqueue.md", start: "after getting started", ignored: {} },
  { file: "docs/worker.md", start: "after getting started", ignored: {} },
  { file: "docs/schedules.md", start: "after getting started", ignored: {} },
  { file: "docs/limits.md", start: "after getting started", ignored: {} },
  { file: "docs/testing.md", start: "after getting started", ignored: {} },
  { file: "docs/awaiting.md", start: "after getting started", ignored: {} },
  {
    file: "docs/flows.md",
    start: "after getting started",
    ignored: {
      "akadze jobs show 45": "the flow ids of a running system (`jobs show` prints them)",
    },
  },
  { file: "docs/metrics.md", start: "after getting started", ignored: {} },
  {
    file: "docs/observability.md",
    start: "after getting started",
    ignored: {
      "OTEL_DENO=true OTEL_SERVICE_NAME=worker OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector.internal:4318 \\":
        "the user's own collector",
    },
  },
  {
    file: "docs/operating.md",
    start: "after getting started",
    ignored: {
      "akadze jobs show 42": "job ids of a running system (`jobs list` shows them)",
      "akadze jobs show 45": "the flow ids of a running system (`jobs show` prints them)",
      "-- 12345 is a pid, 'the-gid' a gid and 'the_slot' a slot name the queries above showed.":
        "the sessions, prepared transactions and slots of a running system",
      "ALTER ROLE reporting SET idle_in_transaction_session_timeout = '5min';":
        "reporting is the user's own role",
    },
  },
  {
    file: "docs/production.md",
    start: "after getting started",
    ignored: {
      "deno run --allow-net=db.internal:5432 --allow-env=AKADZE_*,PG* --allow-sys=hostname \\":
        "the paths of a production host (/srv/app, /run/akadze)",
      "sudo systemctl enable --now akadze-worker": "systemd on a production host",
      "deno run --allow-read=/run/akadze jsr:@akadze/akadze/cli health \\":
        "the heartbeat files of a production host's workers",
      "CREATE ROLE akadze_owner LOGIN;": "run by tests/roles_test.ts with per-run role names",
      "-- Enqueue only (web processes): insert jobs, read back the columns the insert returns and its":
        "run by tests/roles_test.ts with per-run role names",
    },
  },
  { file: "docs/celery.md", start: "after getting started", ignored: {} },
  {
    file: "docs/sql-and-drivers.md",
    start: "after getting started",
    ignored: {
      "akadze.enqueue(": "the functions' signature, not a statement",
      "-- 3. From a client: a savepoint around the call.":
        "a client's steps: ROLLBACK TO runs after an AKDUP error, which stops a psql script " +
        "(tests/sql_enqueue_test.ts runs them)",
      "// deno-postgres (jsr:@db/postgres)":
        "needs deno-postgres, Kysely and Drizzle, and a transaction of each",
      "GRANT USAGE ON SCHEMA akadze TO app_writer;":
        "app_writer is the user's own role (tests/sql_enqueue_test.ts grants this to one)",
    },
  },
  {
    file: "docs/reliability.md",
    start: "after getting started",
    ignored: {
      "deno task chaos [--jobs N] [--workers K] [--minutes M] [--seed S]":
        "the soak runs in a checkout of akadze, for minutes",
      "deno task chaos --jobs 600 --workers 3 --minutes 1.5 --seed 1":
        "the soak runs in a checkout of akadze, for minutes",
    },
  },
];

/** The languages of the blocks that run (or say in PAGES why not). */
const RUN = ["ts", "sh", "sql"];

/** The state docs/getting-started.md leaves a user in (see Page.start). */
async function afterGettingStarted(shell: Shell): Promise<void> {
  const file = "docs/getting-started.md";
  const app = extractBlocks(file, await Deno.readTextFile(`${ROOT}${file}`))
    .find((b) => b.saveAs === "app.ts");
  assert(app, `${file} saves no app.ts`);
  await Deno.writeTextFile(`${shell.cwd}/app.ts`, `${app.code}\n`);
  shell.saved.set("app.ts", app.code);
  shell.env.AKADZE_DATABASE_URL = shell.database.url;
  await migrate(shell.database.url);
}

/** Run a page's blocks in order in a fresh copy of the consumer project. */
async function runPage(page: Page): Promise<Shell> {
  const { file } = page;
  const markdown = await Deno.readTextFile(`${ROOT}${file}`);
  const blocks = extractBlocks(file, markdown);
  const cwd = await consumerProject();
  const database = await createTestDatabase({ name: file });
  const shell: Shell = {
    file,
    cwd,
    env: userEnv(),
    database,
    installsAkadze: blocks.some((b) =>
      b.lang === "sh" && !b.ignored && /deno install .*jsr:@akadze\/akadze\/cli/.test(b.code)
    ),
    binaries: new Map(),
    saved: new Map(),
  };
  // The page's steps in order: a ts file to save, or a command.
  const steps: (
    | { save: string; code: string }
    | { sql: string; where: string }
    | { line: string[]; where: string }
  )[] = [];
  const ignored = new Set<string>();
  for (const block of blocks) {
    const where = `${file}:${block.line}`;
    if (!RUN.includes(block.lang)) continue;
    if (block.ignored) {
      const first = block.code.split("\n")[0].replace(/(^|\s)#.*$/, "").trim();
      assert(page.ignored[first], `${where}: say in PAGES why this block cannot run`);
      ignored.add(first);
    } else if (block.lang === "ts" && !block.saveAs) {
      // A fragment: what it takes as given is its prelude, and docs_test.ts type-checks it.
      assert(block.prelude, `${where}: say where to save this sample, or give it a prelude`);
    } else if (block.lang === "ts") {
      steps.push({ save: block.saveAs!, code: block.code });
    } else if (block.lang === "sql") {
      steps.push({ sql: block.code, where });
    } else {
      for (const line of shellCommands(block.code, where)) steps.push({ line, where });
    }
  }
  for (const first of Object.keys(page.ignored)) {
    assert(ignored.has(first), `${file}: no ignored block starts with ${first}`);
  }
  try {
    if (page.start === "after getting started") await afterGettingStarted(shell);
    for (let i = 0; i < steps.length; i++) {
      const step = steps[i];
      if ("save" in step) {
        await Deno.writeTextFile(`${cwd}/${step.save}`, `${step.code}\n`);
        shell.saved.set(step.save, step.code);
        continue;
      }
      if ("sql" in step) {
        await runSql(shell, step.sql, step.where);
        continue;
      }
      const next = steps[i + 1];
      if (await runLine(shell, step.line, step.where, next && "line" in next ? next : undefined)) {
        i++;
      }
    }
    return shell;
  } finally {
    await database.close();
    await shell.akadze?.remove();
    for (const binary of shell.binaries.values()) {
      await Deno.remove(binary.dir, { recursive: true }).catch(() => {});
    }
    await Deno.remove(cwd, { recursive: true });
  }
}

/** The page of PAGES for `file`. */
function page(file: string): Page {
  const found = PAGES.find((p) => p.file === file);
  assert(found, `${file} is not in PAGES`);
  return found;
}

Deno.test("the README's samples run as written in a project that depends on akadze", async () => {
  const shell = await runPage(page("README.md"));
  assert(shell.saved.has("app.ts"), "the README saves no app.ts");
});

Deno.test("docs/getting-started.md runs as written in a project that depends on akadze", async () => {
  const shell = await runPage(page("docs/getting-started.md"));
  assert(shell.akadze, "docs/getting-started.md installs no akadze command");
  assert(shell.binaries.size > 0, "docs/getting-started.md builds no worker binary");
});

for (const { file } of PAGES.filter((p) => p.start !== "fresh")) {
  Deno.test(`${file} runs as written after getting started`, async () => {
    await runPage(page(file));
  });
}

Deno.test("every page of docs/ with code blocks is in PAGES", async () => {
  for await (const entry of Deno.readDir(`${ROOT}docs`)) {
    const file = `docs/${entry.name}`;
    if (!entry.name.endsWith(".md")) continue;
    const blocks = extractBlocks(file, await Deno.readTextFile(`${ROOT}${file}`));
    if (blocks.some((b) => RUN.includes(b.lang))) page(file);
  }
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
