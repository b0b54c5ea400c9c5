// The CLI as an installed command: `deno install -g` of ./cli.ts into a temporary root,
// then `akadze --version` and `akadze migrate` through the installed command, with the
// permission set docs/getting-started.md documents.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };
import { withDatabase } from "./_helpers.ts";
import { knownVersions } from "../src/migrate.ts";
import { INSTALL_PERMISSIONS, installAkadze, installedPath } from "./_install.ts";

const ROOT = new URL("..", import.meta.url).pathname;

async function run(
  command: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(command, {
    args,
    cwd: ROOT,
    env: { NO_COLOR: "1", PATH: installedPath(), ...env },
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
  const installed = await installAkadze();
  const root = installed.path.replace(/[\\/]bin[\\/][^\\/]+$/, "");
  try {
    const akadze = installed.path;
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
    await installed.remove();
  }
});

Deno.test("getting started documents the install command with these permissions", async () => {
  const line = `deno install -g -n akadze ${INSTALL_PERMISSIONS.join(" ")}`;
  const text = await Deno.readTextFile(`${ROOT}docs/getting-started.md`);
  assert(text.replace(/\\\n\s*/g, "").includes(line), `expected the install line: ${line}`);
});
