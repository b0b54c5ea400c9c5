// `promtool check metrics` for the tests that render Prometheus text (Debian's prometheus
// package; .ci/run installs it, and those checks are skipped where it cannot be installed).
import { assertEquals } from "./assert.ts";

/** Whether promtool runs on this machine. */
export const HAVE_PROMTOOL: boolean = await new Deno.Command("promtool", {
  args: ["--version"],
  stdout: "null",
  stderr: "null",
}).output().then((o) => o.success, () => false);

/** `promtool check metrics` on `text`: no error and no lint problem (when promtool exists). */
export async function assertPromtoolAccepts(text: string): Promise<void> {
  if (!HAVE_PROMTOOL) return;
  const child = new Deno.Command("promtool", {
    args: ["check", "metrics"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(text));
  await writer.close();
  const result = await child.output();
  const report = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
  assertEquals(result.code, 0, `promtool check metrics:\n${report}\n${text}`);
  assertEquals(report.trim(), "", `promtool reported lint problems:\n${report}\n${text}`);
}
