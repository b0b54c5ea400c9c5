/**
 * The application module of the HTTP example: the akadze app, its task and the example's
 * own table. `examples/http_service.ts` serves HTTP with it and enqueues inside its
 * request transactions; a worker runs its jobs:
 *
 * ```sh
 * export AKADZE_DATABASE_URL=postgres://app:secret@localhost:5432/app
 * deno run --allow-net --allow-env --allow-read examples/http_service.ts   # the web process
 * deno run --allow-net --allow-env --allow-sys=hostname --allow-read \
 *   cli.ts worker examples/http_app.ts --queue mail                     # the worker process
 * ```
 *
 * @module
 */
import * as v from "valibot";
import { Akadze, type Sql } from "@akadze/akadze";

/** The application: its pool reads `AKADZE_DATABASE_URL` when the module is imported. */
export const app: Akadze = new Akadze({ databaseUrl: Deno.env.get("AKADZE_DATABASE_URL") });

/** Where the example's "mails" go: a stand-in for an SMTP or HTTP mail API client. */
async function sendMail(to: string, subject: string, signal: AbortSignal): Promise<void> {
  signal.throwIfAborted();
  await new Promise((resolve) => setTimeout(resolve, 10));
  console.error(`mail to ${to}: ${subject}`);
}

/**
 * Sends the welcome mail, then marks the user welcomed in the same transaction that
 * marks the job succeeded (`completeTx`), so the flag and the job's state never disagree.
 */
export const welcome = app.task(
  "mail.welcome",
  {
    args: v.object({ userId: v.number(), email: v.pipe(v.string(), v.email()) }),
    queue: "mail",
    maxAttempts: 5,
    timeout: 30_000,
  },
  async ({ userId, email }, ctx) => {
    await sendMail(email, "Welcome!", ctx.signal);
    await ctx.completeTx(async (tx) => {
      await tx`update example_users set welcomed_at = now() where id = ${userId}`;
    });
  },
);

/** Create the example's own table (an application would use its own migrations). */
export async function createTables(sql: Sql): Promise<void> {
  await sql`
    create table if not exists example_users (
      id bigint generated always as identity primary key,
      email text not null unique,
      created_at timestamptz not null default now(),
      welcomed_at timestamptz
    )`;
}
