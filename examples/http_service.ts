/**
 * A Deno HTTP service that enqueues jobs inside its own request transactions.
 *
 * `POST /signup` with `{"email": "..."}` inserts a user row and enqueues the welcome mail
 * (`examples/http_app.ts`) in one transaction: both commit, or neither does (a duplicate
 * email or an invalid one leaves no user and no job). `GET /users/:id` shows whether the
 * mail went out; `GET /metrics` serves the queue gauges for Prometheus.
 *
 * Run it with nothing but Deno (the embedded default: a throwaway PostgreSQL, removed on
 * exit, and a worker inside this process):
 *
 * ```sh
 * deno run -A examples/http_service.ts
 * curl -s -X POST localhost:8000/signup -d '{"email": "ada@example.com"}'  # {"userId":"1","jobId":"1"}
 * curl -s localhost:8000/users/1                                            # "welcomedAt": "..."
 * ```
 *
 * Against your database, the web process and the worker run separately (add `--worker`
 * to run one inside this process too):
 *
 * ```sh
 * export AKADZE_DATABASE_URL=postgres://app:secret@localhost:5432/app
 * deno run --allow-net --allow-env --allow-read examples/http_service.ts
 * deno run --allow-net --allow-env --allow-sys=hostname --allow-read \
 *   cli.ts worker examples/http_app.ts --queue mail --slots 4
 * ```
 *
 * `PORT` (default 8000) and `HOST` (default 127.0.0.1) choose where it listens.
 *
 * @module
 */
import { EnqueueError, Worker } from "@akadze/akadze";
import { migrate } from "@akadze/akadze/admin";
import { renderMetrics } from "@akadze/akadze/metrics";
import { startThrowawayPostgres, type ThrowawayPostgres } from "@akadze/akadze/testing";
import type * as HttpApp from "./http_app.ts";

/** What the service needs from the application module. */
export type AppModule = Pick<typeof HttpApp, "app" | "welcome">;

/** The request handler of the service. */
export function handler({ app, welcome }: AppModule): (request: Request) => Promise<Response> {
  return async (request) => {
    const url = new URL(request.url);
    if (request.method === "POST" && url.pathname === "/signup") {
      const body = await request.json().catch(() => null);
      const email = (body as { email?: unknown } | null)?.email;
      if (typeof email !== "string") return json(400, { error: "give a JSON body with email" });
      try {
        const created = await app.sql.begin(async (tx) => {
          const [user] = await tx`
            insert into example_users (email) values (${email}) returning id::text`;
          // Same transaction: the job exists only if the user row commits.
          const jobId = await welcome.using({ session: tx }).enqueue({
            userId: Number(user.id),
            email,
          });
          return { userId: user.id as string, jobId };
        });
        return json(201, created);
      } catch (error) {
        if ((error as { code?: string }).code === "23505") {
          return json(409, { error: "this email has signed up already" });
        }
        // The task's schema refused the arguments: the insert rolled back with it.
        if (error instanceof EnqueueError) return json(400, { error: error.message });
        throw error;
      }
    }
    const user = /^\/users\/(\d+)$/.exec(url.pathname);
    if (request.method === "GET" && user) {
      const [row] = await app.sql`
        select id::text, email, created_at, welcomed_at from example_users where id = ${user[1]}`;
      if (!row) return json(404, { error: "no such user" });
      return json(200, {
        id: row.id,
        email: row.email,
        createdAt: row.created_at,
        welcomedAt: row.welcomed_at,
      });
    }
    if (request.method === "GET" && url.pathname === "/metrics") {
      return new Response(await renderMetrics(app.sql, { schema: app.schema }), {
        headers: { "content-type": "text/plain; version=0.0.4" },
      });
    }
    return json(404, { error: "not found" });
  };
}

function json(status: number, body: unknown): Response {
  return Response.json(body, { status });
}

if (import.meta.main) {
  let server: ThrowawayPostgres | undefined;
  if (!Deno.env.get("AKADZE_DATABASE_URL")) {
    server = await startThrowawayPostgres();
    // The app module reads the URL when it is imported, as a real one would.
    Deno.env.set("AKADZE_DATABASE_URL", server.url);
    console.error(
      `throwaway PostgreSQL ${server.version} at ${server.url} (removed on exit); ` +
        "running a worker in this process",
    );
  }
  const module = await import("./http_app.ts");
  const { app } = module;
  await migrate(app.sql, { schema: app.schema });
  await module.createTables(app.sql);

  const stop = new AbortController();
  for (
    const signal of Deno.build.os === "windows"
      ? ["SIGINT"] as const
      : ["SIGINT", "SIGTERM"] as const
  ) {
    Deno.addSignalListener(signal, () => stop.abort());
  }
  // With the embedded default nobody else can reach the database: run the worker here.
  const worker = server || Deno.args.includes("--worker")
    ? new Worker(app, { queues: ["mail"], slots: 4 })
    : undefined;
  // A worker that stops by itself (a fatal error) takes the HTTP server down with it.
  const working = worker?.run({ signal: stop.signal }).finally(() => stop.abort());
  const http = Deno.serve({
    port: Number(Deno.env.get("PORT") ?? 8000),
    hostname: Deno.env.get("HOST") ?? "127.0.0.1",
    signal: stop.signal,
    onListen: ({ hostname, port }) => console.error(`listening on http://${hostname}:${port}/`),
  }, handler(module));
  await http.finished;
  const exit = await working;
  await app.close();
  await server?.stop();
  Deno.exit(exit?.code ?? 0);
}
