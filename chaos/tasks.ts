// The tasks of the chaos soak (chaos/run.ts) and the tables they write. Every execution
// records itself in `chaos.ledger_start` with a fresh nonce before doing anything else
// (the at-least-once part: one row per execution that got that far), and the tasks that
// finish through `ctx.completeTx` record `chaos.ledger_commit` inside it (the
// exactly-once part: committed with the transition to succeeded, or not at all). The
// other tasks return `{ nonce, runCount }`, so the stored result names the execution
// whose outcome was written.
import type { Akadze, JobContext, Sql } from "../mod.ts";

/** The task names, by kind. */
export const TASKS = {
  quick: "chaos.quick",
  slow: "chaos.slow",
  flaky: "chaos.flaky",
  doomed: "chaos.doomed",
  limited: "chaos.limited",
  unique: "chaos.unique",
  tick: "chaos.tick",
  cpu: "chaos.cpu",
  crash: "chaos.crash",
} as const;

/** The interval of the `chaos.tick` schedule, which every worker runs. */
export const TICK_EVERY = 2_000;

/** A kind of chaos job. */
export type Kind = keyof typeof TASKS;

/** Kinds whose success is written by `ctx.completeTx` (and so by `chaos.ledger_commit`). */
export const COMPLETE_TX_KINDS: readonly Kind[] = ["slow", "flaky", "limited"];

/** Attempt budget of the jobs expected to succeed: room for the faults that spend one. */
export const MAX_ATTEMPTS = 25;
/** Attempt budget of `chaos.doomed` (always fails). */
export const DOOMED_ATTEMPTS = 3;
/** Attempt budget of `chaos.crash` (its sandbox process always crashes). */
export const CRASH_ATTEMPTS = 3;
/** The heap cap of `chaos.crash`'s sandbox process, MiB (its `oom` runs fill it). */
export const CRASH_HEAP_MB = 32;
/** The sandboxed tasks' handlers (chaos/sandboxed.ts). */
const SANDBOXED = import.meta.resolve("./sandboxed.ts");

/** The error a task throws on purpose (its name marks a planned failure in `errors`). */
export class PlannedFailure extends Error {
  /** @param message What failed. */
  constructor(message: string) {
    super(message);
    this.name = "PlannedFailure";
  }
}

/** The harness's tables, and a trigger that logs every state change of a job. */
export const CHAOS_SCHEMA = `
create schema chaos;
-- One row per enqueued job, written in the producer's enqueue transaction.
create table chaos.expected (
  seq int primary key,
  kind text not null,
  job_id bigint not null unique,
  unique_key text,
  limit_key text,
  secret boolean not null,
  enqueued_at timestamptz not null default clock_timestamp());
-- The steps of the flows, written with them: each step's dependencies (job ids) and the
-- outcome it must reach ('succeed', 'fail', or 'cancel': by a failed dependency).
create table chaos.flow_steps (
  job_id bigint primary key,
  flow text not null,
  step text not null,
  deps bigint[] not null,
  expect text not null);
-- DuplicateJob refusals, recorded in the same transaction after the refusal.
create table chaos.duplicates (
  seq int not null,
  unique_key text not null,
  at timestamptz not null default clock_timestamp());
create table chaos.ledger_start (
  job_id bigint not null,
  run_count int not null,
  attempt int not null,
  nonce uuid not null,
  pid int not null,
  worker_id text,
  at timestamptz not null default clock_timestamp());
create table chaos.ledger_commit (
  job_id bigint not null,
  run_count int not null,
  nonce uuid not null,
  pid int not null,
  at timestamptz not null default clock_timestamp());
-- Every change of state or run_count, in the transaction that made it.
create table chaos.transitions (
  id bigserial primary key,
  job_id bigint not null,
  old_state text not null,
  new_state text not null,
  old_run_count int not null,
  new_run_count int not null,
  old_attempt int not null,
  new_attempt int not null,
  old_worker text,
  new_worker text,
  error text,
  message text,
  -- For claims of a job with a limit key: how many jobs of that key run now, this one
  -- included (the claim holds the key's limits row lock, so this is exact).
  limit_running int,
  -- When the job may run (for the soak's longest stall: ready is queued and due).
  run_at timestamptz,
  at timestamptz not null default clock_timestamp());
create function chaos.log_transition() returns trigger language plpgsql volatile as $$
declare
  err jsonb;
begin
  if new.state is distinct from old.state or new.run_count <> old.run_count then
    if new.errors is distinct from old.errors then
      err := new.errors -> -1;
    end if;
    insert into chaos.transitions (job_id, old_state, new_state, old_run_count, new_run_count,
        old_attempt, new_attempt, old_worker, new_worker, error, message, limit_running, run_at)
    values (new.id, old.state, new.state, old.run_count, new.run_count, old.attempt,
        new.attempt, old.worker_id, new.worker_id, err ->> 'error', err ->> 'message',
        case when new.state = 'running' and new.limit_key is not null then
          (select count(*) from akadze.jobs j
            where j.state = 'running' and j.limit_key = new.limit_key) end, new.run_at);
  end if;
  return null;
end $$;
create trigger chaos_transitions after update on akadze.jobs
  for each row execute function chaos.log_transition();
`;

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Register the chaos tasks on an app (`app.include({ register })`). */
export function register(app: Akadze): void {
  const sql: Sql = app.sql;
  const start = async (ctx: JobContext): Promise<string> => {
    const nonce = crypto.randomUUID();
    const { id, runCount, attempt, workerId } = ctx.job;
    await sql`insert into chaos.ledger_start (job_id, run_count, attempt, nonce, pid, worker_id)
              values (${id}, ${runCount}, ${attempt}, ${nonce}, ${Deno.pid}, ${workerId})`;
    return nonce;
  };
  const commit = (ctx: JobContext, nonce: string) =>
    ctx.completeTx(async (tx) => {
      await tx`insert into chaos.ledger_commit (job_id, run_count, nonce, pid)
               values (${ctx.job.id}, ${ctx.job.runCount}, ${nonce}, ${Deno.pid})`;
    });
  const ms = (value: unknown) => Number(value ?? 0);
  const attempts = { maxAttempts: MAX_ATTEMPTS };

  app.task(TASKS.quick, attempts, async (args, ctx) => {
    const nonce = await start(ctx);
    await sleep(ms(args.ms), ctx.signal);
    return { nonce, runCount: ctx.job.runCount };
  });
  app.task(TASKS.slow, { ...attempts, queue: "slow" }, async (args, ctx) => {
    const nonce = await start(ctx);
    await sleep(ms(args.ms), ctx.signal);
    await commit(ctx, nonce);
  });
  // Fails while fewer than `failures` attempts are spent, then succeeds.
  app.task(TASKS.flaky, { ...attempts, backoff: () => 150 }, async (args, ctx) => {
    const nonce = await start(ctx);
    const failures = Number(args.failures);
    if (ctx.job.attempt <= failures) { // attempts are numbered from 1
      throw new PlannedFailure(`planned failure ${ctx.job.attempt} of ${failures}`);
    }
    await commit(ctx, nonce);
  });
  // Always fails; its message carries the database URL, which the worker must redact.
  app.task(
    TASKS.doomed,
    { maxAttempts: DOOMED_ATTEMPTS, backoff: () => 150 },
    async (_args, ctx) => {
      await start(ctx);
      const url = Deno.env.get("AKADZE_DATABASE_URL") ?? "";
      throw new PlannedFailure(`doomed: pretend ${url} refused us`);
    },
  );
  app.task(TASKS.limited, attempts, async (args, ctx) => {
    const nonce = await start(ctx);
    await sleep(ms(args.ms), ctx.signal);
    await commit(ctx, nonce);
  });
  app.task(TASKS.unique, attempts, async (args, ctx) => {
    const nonce = await start(ctx);
    await sleep(ms(args.ms), ctx.signal);
    return { nonce, runCount: ctx.job.runCount };
  });
  // A schedule: each fire must be enqueued once across all workers.
  app.periodic(TASKS.tick, { ...attempts, every: TICK_EVERY }, async (_args, ctx) => {
    const nonce = await start(ctx);
    return { nonce, runCount: ctx.job.runCount };
  });
  // The sandboxed tasks. The migrate phase's release workers (AKADZE_CHAOS_RELEASE=1) leave
  // them to the workers of the current code (a worker claims only the tasks it knows): an
  // older release's sandboxes may predate what the soak asserts of them (one passed V8's
  // out-of-memory report on into the worker's JSON log).
  if (Deno.env.get("AKADZE_CHAOS_RELEASE") === "1") return;
  // The harness's producers may run on the migrate phase's release, which may predate these
  // options (an unknown option of a task is refused): they leave such a task out and enqueue
  // its jobs once the migration brought the current code (chaos/run.ts).
  const sandboxed = (define: () => unknown) => {
    try {
      define();
    } catch (error) {
      if (!/sandbox/.test(String((error as Error)?.message))) throw error;
    }
  };
  // CPU-bound, in a thread of the worker (one at a time, with no permissions: the worker
  // needs --unstable-worker-options for that): a loop longer than the heartbeat TTL, which
  // must neither cost the worker its lease nor hold its other jobs.
  sandboxed(() =>
    app.task(TASKS.cpu, {
      ...attempts,
      sandbox: { module: SANDBOXED, export: "spin", pool: 1, permissions: "none" },
    })
  );
  // Always crashes its sandbox process (Deno.exit(3), or out of its heap cap): each run must
  // fail only its own attempt, saying how the process ended, until its attempts run out.
  sandboxed(() =>
    app.task(TASKS.crash, {
      maxAttempts: CRASH_ATTEMPTS,
      backoff: () => 150,
      sandbox: {
        module: SANDBOXED,
        export: "crash",
        isolation: "process",
        maxHeapMb: CRASH_HEAP_MB,
        pool: 1,
        permissions: "none",
      },
    })
  );
  // The sandboxed runs cannot reach the database: the worker records their start.
  app.hooks.beforeRun.push(async (job) => {
    if (job.task !== TASKS.cpu && job.task !== TASKS.crash) return;
    await sql`insert into chaos.ledger_start (job_id, run_count, attempt, nonce, pid, worker_id)
              values (${job.id}, ${job.runCount}, ${job.attempt}, ${crypto.randomUUID()},
                      ${Deno.pid}, ${job.workerId})`;
  });
}
