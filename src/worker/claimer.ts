/**
 * The claimer: one statement that cancels queued jobs with a cancel request or a passed
 * expiry, and claims ready jobs into the free slots (`FOR UPDATE SKIP LOCKED`, priority
 * order, pauses honoured, only tasks this worker knows). The claim commits before any
 * handler runs.
 *
 * @module
 */
import { quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import type { OnTransitionHook } from "../job.ts";
import { JOB_RETURNING, type JobRow, runTransitionHooks, TransitionHookError } from "./job_row.ts";

/** A claimed job: its row and its stored arguments. */
export interface ClaimedJob extends JobRow {
  /** The stored arguments. */
  args: unknown;
}

/** Free slots of one queue. */
export interface ClaimRequest {
  /** The queue. */
  queue: string;
  /** How many jobs it may take now. */
  slots: number;
}

/** What one claim pass did. */
export interface ClaimResult {
  /** Jobs now running on this worker. */
  claimed: ClaimedJob[];
  /** Queued jobs cancelled (cancel requested or expired). */
  cancelled: JobRow[];
  /** Jobs whose claim an onTransition hook rolled back. */
  rolledBack: number;
}

/** Settings of a {@linkcode Claimer}. */
export interface ClaimerConfig {
  /** The schema name. */
  schema: string;
  /** This worker's id. */
  workerId: string;
  /** Task names this worker can run (others are left for other workers). */
  tasks: readonly string[];
  /** `onTransition` hooks; with hooks, each transition gets its own transaction. */
  hooks: readonly OnTransitionHook[];
}

/** How many queued jobs one pass cancels at most. */
const CANCEL_BATCH = 500;

/** Claims jobs for one worker. */
export class Claimer {
  #sql: Sql;
  #config: ClaimerConfig;
  #text: string;

  /** Make a claimer on a pool. */
  constructor(sql: Sql, config: ClaimerConfig) {
    this.#sql = sql;
    this.#config = config;
    this.#text = claimStatement(quoteSchema(config.schema));
  }

  /**
   * Claim up to `total` jobs spread over the requests. With `fair`, every queue may
   * contribute up to `total`, taken round-robin starting at queue `offset`.
   */
  async claim(requests: readonly ClaimRequest[], total: number, offset = 0): Promise<ClaimResult> {
    const queues = requests.map((r) => r.queue);
    const slots = requests.map((r) => r.slots);
    if (this.#config.hooks.length === 0) {
      const rows = await this.#run(this.#sql, queues, slots, total, offset, CANCEL_BATCH, []);
      return split(rows, 0);
    }
    // One transition per transaction, so a hook error rolls back only that one.
    const all: (ClaimedJob & { kind: string })[] = [];
    const excluded: string[] = [];
    let rolledBack = 0;
    for (const phase of ["cancel", "claim"] as const) {
      let budget = phase === "cancel" ? CANCEL_BATCH : total;
      while (budget > 0) {
        let rows: (ClaimedJob & { kind: string })[] = [];
        try {
          rows = await this.#sql.begin(async (tx) => {
            const got = await this.#run(
              tx,
              queues,
              slots,
              phase === "claim" ? 1 : 0,
              offset,
              phase === "cancel" ? 1 : 0,
              excluded,
            );
            for (const row of got) await runTransitionHooks(this.#config.hooks, tx, row, "queued");
            return got;
          }) as (ClaimedJob & { kind: string })[];
        } catch (error) {
          if (!(error instanceof TransitionHookError)) throw error;
          rolledBack++;
          budget--;
          excluded.push(error.jobId);
          continue;
        }
        if (rows.length === 0) break;
        all.push(...rows);
        budget -= rows.length;
        if (phase === "claim") offset++;
      }
    }
    return split(all, rolledBack);
  }

  async #run(
    sql: Sql | TransactionSql,
    queues: string[],
    slots: number[],
    total: number,
    offset: number,
    cancelLimit: number,
    excluded: string[],
  ): Promise<(ClaimedJob & { kind: string })[]> {
    const rows = await sql.unsafe(this.#text, [
      queues,
      slots,
      this.#config.tasks as string[],
      total,
      offset,
      cancelLimit,
      excluded,
      this.#config.workerId,
    ]);
    return rows as unknown as (ClaimedJob & { kind: string })[];
  }
}

function split(rows: (ClaimedJob & { kind: string })[], rolledBack: number): ClaimResult {
  return {
    claimed: rows.filter((r) => r.kind === "claimed"),
    cancelled: rows.filter((r) => r.kind === "cancelled"),
    rolledBack,
  };
}

function claimStatement(s: string): string {
  return `
    with cancelled as (
      update ${s}.jobs j set state = 'cancelled', finished_at = now()
       where j.id in (
         select c.id from ${s}.jobs c
          where c.state = 'queued' and c.queue = any($1::text[])
            and (c.cancel_requested_at is not null or c.expires_at <= now())
          limit $6
          for update skip locked)
      returning ${JOB_RETURNING}, null::jsonb as args, 'cancelled'::text as kind
    ),
    candidates as (
      select r.id from (
        select x.id, q.ord,
               row_number() over (partition by q.ord order by x.priority desc, x.run_at, x.id) as rn
          from unnest($1::text[], $2::int[]) with ordinality as q(name, n, ord)
          cross join lateral (
            select c.id, c.priority, c.run_at from ${s}.jobs c
             where c.state = 'queued' and c.queue = q.name and c.run_at <= now()
               and c.cancel_requested_at is null
               and (c.expires_at is null or c.expires_at > now())
               and c.task = any($3::text[])
               and c.id <> all($7::bigint[])
               and not exists (select 1 from ${s}.queue_pauses p where p.queue = q.name)
             order by c.priority desc, c.run_at, c.id
             limit least(q.n, $4)
             for update of c skip locked) x
      ) r
      order by r.rn, (r.ord + $5) % cardinality($1::text[])
      limit $4
    ),
    claimed as (
      update ${s}.jobs j
         set state = 'running', run_count = j.run_count + 1, worker_id = $8, started_at = now()
        from candidates where j.id = candidates.id
      returning ${JOB_RETURNING}, j.args, 'claimed'::text as kind
    )
    select * from claimed union all select * from cancelled`;
}
