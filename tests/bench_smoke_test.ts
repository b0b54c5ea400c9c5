// Keeps the benchmark harness from rotting: `bench/run.ts --smoke` (200 jobs, akadze only,
// its own throwaway PostgreSQL, nothing written) must succeed and report a drain rate.
import { assert, assertEquals, assertMatch } from "./assert.ts";

Deno.test("bench: the smoke run drains its jobs and reports akadze's drain rate", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", new URL("../bench/run.ts", import.meta.url).pathname, "--smoke"],
    cwd: new URL("..", import.meta.url).pathname,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  const stderr = new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 0, `bench --smoke failed:\n${stderr}\n${stdout}`);
  assertMatch(stdout, /^akadze: drain [\d,]+ jobs\/s/m);
  const rate = Number(/^akadze: drain ([\d,]+) jobs\/s/m.exec(stdout)![1].replaceAll(",", ""));
  assert(rate > 0, `drain rate ${rate}`);
});
