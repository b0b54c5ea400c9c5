// Keeps the benchmark harness from rotting: `bench/run.ts --smoke` (200 jobs, akadze only,
// its own throwaway PostgreSQL, nothing written) must succeed and report a drain rate, and
// `bench/run.ts --scenario horizon --smoke` (13 s of steady load, the horizon pinned for 5 s)
// must succeed and report akadze's latencies; `--scenario flows --smoke` must drain every
// shape and akadze's plain jobs.
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

Deno.test("bench: the pinned-horizon smoke run pins the horizon and reports akadze's latency", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      new URL("../bench/run.ts", import.meta.url).pathname,
      "--scenario",
      "horizon",
      "--smoke",
    ],
    cwd: new URL("..", import.meta.url).pathname,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  const stderr = new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 0, `bench --scenario horizon --smoke failed:\n${stderr}\n${stdout}`);
  assertMatch(stdout, /^akadze: unpinned p50 [\d.,]+ ms, end of pinned p50 [\d.,]+ m?s/m);
  assertMatch(stderr, /^ {2}pinned 0-\d+ s: enqueued [\d,]+, started [\d,]+/m);
});

Deno.test("bench: the flows smoke run drains every shape and akadze's plain jobs", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      new URL("../bench/run.ts", import.meta.url).pathname,
      "--scenario",
      "flows",
      "--smoke",
    ],
    cwd: new URL("..", import.meta.url).pathname,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  const stderr = new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 0, `bench --scenario flows --smoke failed:\n${stderr}\n${stdout}`);
  assertMatch(stdout, /^akadze plain: [\d,]+ jobs\/s$/m);
  for (const shape of ["fanout", "chain", "dag"]) {
    assertMatch(stdout, new RegExp(`^akadze ${shape}: [\\d,]+ jobs/s$`, "m"));
  }
});
