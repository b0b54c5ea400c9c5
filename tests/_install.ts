// The `akadze` command installed from this checkout with `deno install -g` into a temporary
// root, as a user installs it from JSR (docs/getting-started.md): shared by
// tests/consumer_cli_test.ts and tests/consumer_docs_test.ts.
import { assertEquals } from "./assert.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const DENO_DIR = Deno.execPath().replace(/[\\/][^\\/]+$/, "");

/** The install line of the README and docs/getting-started.md. */
export const INSTALL_PERMISSIONS = [
  "--allow-net",
  "--allow-env",
  "--allow-sys=hostname,uid",
  "--allow-read",
  "--allow-write",
  "--allow-run",
];

/** An installed `akadze` command. */
export interface InstalledAkadze {
  /** The command's path (`<root>/bin/akadze`). */
  path: string;
  /** Uninstall: remove the temporary root. */
  remove(): Promise<void>;
}

/**
 * The PATH for running the installed command: its shim runs `deno` from PATH, so this
 * runtime comes first.
 */
export function installedPath(): string {
  return `${DENO_DIR}:${Deno.env.get("PATH") ?? ""}`;
}

/**
 * `deno install -g -n akadze <permissions> ./cli.ts` of this checkout into a temporary
 * root (with `--config`: a checkout needs its deno.json for the import map; from JSR it
 * comes along).
 */
export async function installAkadze(
  permissions: string[] = INSTALL_PERMISSIONS,
): Promise<InstalledAkadze> {
  const root = await Deno.makeTempDir({ prefix: "akadze-consumer-install-" });
  const remove = () => Deno.remove(root, { recursive: true }).catch(() => {});
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "install",
        "--global",
        "--root",
        root,
        "--name",
        "akadze",
        "--config",
        `${ROOT}deno.json`,
        ...permissions,
        `${ROOT}cli.ts`,
      ],
      cwd: ROOT,
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    assertEquals(out.code, 0, new TextDecoder().decode(out.stderr));
  } catch (error) {
    await remove();
    throw error;
  }
  return { path: `${root}/bin/akadze`, remove };
}

/** Run `fn` with `akadze` installed with `permissions`; uninstall afterwards. */
export async function withInstalledAkadze(
  fn: (akadze: string) => Promise<void>,
  permissions: string[] = INSTALL_PERMISSIONS,
): Promise<void> {
  const installed = await installAkadze(permissions);
  try {
    await fn(installed.path);
  } finally {
    await installed.remove();
  }
}
