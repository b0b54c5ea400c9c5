// What tests/sandbox_test.ts and tests/sandbox_process_test.ts share: the handlers' module,
// a job's row as they check it, and a temporary directory.
import type { Sql } from "../src/db.ts";

/** The module of the sandboxed handlers (tests/fixtures/sandbox_handlers.ts). */
export const HANDLERS = import.meta.resolve("./fixtures/sandbox_handlers.ts");

export type Entry = { error: string; message: string };
export type Row = {
  state: string;
  attempt: number;
  run_count: number;
  errors: Entry[] | null;
  result: unknown;
  progress: unknown;
};

export async function row(sql: Sql, id: string): Promise<Row> {
  const [r] = await sql`select state, attempt, run_count, errors, result, progress
    from akadze.jobs where id = ${id}`;
  return r as unknown as Row;
}

export function ended(r: Record<string, unknown>): boolean {
  return ["succeeded", "failed", "cancelled"].includes(r.state as string);
}

export async function withTempDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "akadze_sandbox_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
