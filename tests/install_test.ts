// The CLI as an installed command: `deno install -g` of ./cli.ts into a temporary root,
// then `akadze --version` and `akadze migrate` through the installed command, with the
// permission set docs/getting-started.md documents.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };
import { withDatabase } from "./_helpers.ts";
import { knownVersions } from "../src/migrate.ts";

const ROOT = new URL("..", import.meta.url).pathname;
/**
 * The least permissions that cover every subcommand (`dev` is the one that needs
 * `--allow-run`, `--allow-write` and `--allow-sys=uid`).
 * docs/getting-started.md shows this exact line.
 */
const INSTALL_PERMISSIONS = [
  "--allow-net",
  "--allow-env",
  "--allow-sys=hostname,uid",
  "--allow-read",
  "--allow-write",
  "--allow-run",
];
const IS_WINDOWS = Deno.build.os === "windows";

async function run(
  command: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  // The installed shim runs `deno` from PATH: put this runtime first.
  const denoDir = Deno.execPath().replace(/[\\/][^\\/]+$/, "");
  const sep = IS_WINDOWS ? ";" : ":";
  const out = await new Deno.Command(command, {
    args,
    cwd: ROOT,
    env: { NO_COLOR: "1", PATH: `${denoDir}${sep}${Deno.env.get("PATH") ?? ""}`, ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return {
    code: out.code,
    stdout: decoder.decode(out.stdout),
    stderr: decoder.decode(out.stderr),
  };
}

Deno.test("deno install -g puts a working akadze command on the PATH", async () => {
  const root = await Deno.makeTempDir({ prefix: "akadze-install-" });
  try {
    const install = await run(Deno.execPath(), [
      "install",
      "--global",
      "--root",
      root,
      "--name",
      "akadze",
      // A local checkout needs its config for the import map; from JSR it comes along.
      "--config",
      `${ROOT}deno.json`,
      ...INSTALL_PERMISSIONS,
      `${ROOT}cli.ts`,
    ]);
    assertEquals(install.code, 0, install.stderr);
    const akadze = `${root}/bin/akadze${IS_WINDOWS ? ".cmd" : ""}`;
    assert((await Deno.stat(akadze)).isFile, `${akadze} was not created`);

    const version = await run(akadze, ["--version"]);
    assertEquals([version.code, version.stdout.trim()], [0, denoJson.version], version.stderr);

    await withDatabase("install", async (db) => {
      const env = { AKADZE_DATABASE_URL: db.url };
      const first = await run(akadze, ["migrate"], env);
      assertEquals(
        [first.code, first.stdout],
        [0, knownVersions().map((v) => `applied ${v}\n`).join("")],
        first.stderr,
      );
      const again = await run(akadze, ["migrate"], env);
      assertEquals([again.code, again.stdout], [0, "schema up to date\n"], again.stderr);
      const status = await run(akadze, ["migrate", "--status"], env);
      assertMatch(status.stdout, /^0001_init\tapplied\t\S+$/m);
      assertMatch(status.stdout, /^0002_limit_key_order\tapplied\t\S+$/m);
    }, { migrated: false });

    const uninstall = await run(Deno.execPath(), [
      "uninstall",
      "--global",
      "--root",
      root,
      "akadze",
    ]);
    assertEquals(uninstall.code, 0, uninstall.stderr);
    await Deno.stat(akadze).then(
      () => assert(false, "deno uninstall left the command behind"),
      (error) => assert(error instanceof Deno.errors.NotFound, String(error)),
    );
  } finally {
    await Deno.remove(root, { recursive: true }).catch(() => {});
  }
});

Deno.test("getting started documents the install command with these permissions", async () => {
  const line = `deno install -g -n akadze ${INSTALL_PERMISSIONS.join(" ")}`;
  const text = await Deno.readTextFile(`${ROOT}docs/getting-started.md`);
  assert(text.replace(/\\\n\s*/g, "").includes(line), `expected the install line: ${line}`);
});
