/**
 * The claimer: claims ready jobs into the free slots in one statement (`FOR UPDATE SKIP
 * LOCKED`, priority order, pauses honoured, only tasks this worker knows); cancelling
 * queued jobs is the canceller's (canceller.ts). While `limits` has rows,
 * a claim first picks and locks the limit keys that have room and a ready job, best job first,
 * then claims their jobs and jobs without a limit together in one claim order, so `maxRunning`
 * is never exceeded cluster-wide, `maxStarts` per window is counted in `limit_starts`, and a
 * keyed job does not wait behind lower-priority jobs without a key. The claim commits before
 * any handler runs.
 *
 * @module
 */
import { PREPARED, quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import type { OnTransitionHook } from "../job.ts";
import { decodeClaimed } from "../job_columns.ts";
import { claimOrder, claimReturning, claimSet, noLimitPredicate } from "./claim_rule.ts";
import { readyCondition } from "../ready_rule.ts";
import { type JobRow, transitionOneByOne } from "./job_row.ts";
import type { TraceContext } from "../tracing.ts";

/** A claimed job: its row and its stored arguments. */
export interface ClaimedJob extends JobRow {
  /** The stored arguments. */
  args: unknown;
  /** The enqueue's trace context: read after the claim, only when tracing is on (tracing.ts). */
  trace_context?: TraceContext;
  /**
   * Its limit key had a `limits` row when it was claimed (a key the limited claim locked, or
   * handed by the write that ended a run of its key): its success keeps the slot for the
   * hand-off of the key's next job (migrations/0020_limit_hand_off.sql).
   */
  limited?: boolean;
}

/** Free slots of one queue. */
export interface ClaimRequest {
  /** The queue. */
  queue: string;
  /** How many jobs it may take now. */
  slots: number;
}

/** What one claim did. */
export interface ClaimResult {
  /** Jobs now running on this worker. */
  claimed: ClaimedJob[];
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
  /** The clock, in ms (tests). Default `performance.now()`. */
  now?: () => number;
}

/** How long "there are (no) limits" is trusted before asking again (ms). */
const LIMITS_RECHECK = 2_000;
/**
 * How far behind the latest run_at claimed at a priority level the next one-queue claim of that
 * level starts (ms): a job enqueued by a transaction that commits up to this much later than it
 * began (run_at defaults to its start) is still found by the claim from floors.
 */
const FLOOR_SLACK = 5_000;
/**
 * How often at most the one-queue claim scans the whole queue instead of starting from floors
 * (ms): the longest extra wait of a ready job behind a floor (see `#claimOne`), while a
 * whole-queue claim is cheap.
 */
const FULL_CLAIM_EVERY = 2_000;
/**
 * A whole-queue claim that took longer waits this many times its duration for the next one
 * (at most 0.4% of the loop's time): while an old snapshot holds cleanup back, it visits every
 * dead entry of the claim index, and the loop waits for it; at 100 times, four such pauses a
 * minute lifted the p99 start latency above 100 ms at 450,000 dead entries (bench/README.md).
 */
const FULL_CLAIM_COST_FACTOR = 250;
/** The longest time between two whole-queue claims, however costly (ms). */
const FULL_CLAIM_EVERY_MAX = 30_000;

/** How long after a whole-queue claim that took `durationMs` the next one runs (ms). */
function fullClaimInterval(durationMs: number): number {
  return Math.min(
    FULL_CLAIM_EVERY_MAX,
    Math.max(FULL_CLAIM_EVERY, FULL_CLAIM_COST_FACTOR * durationMs),
  );
}
/**
 * How many distinct keys of queued jobs the check for a key with room looks at before it asks
 * the limits rows instead (see `anyKeyStatement`).
 */
const KEY_WALK = 100;
/** The row locks of the limit keys statement (left out where it only checks). */
const KEYS_LOCK = "for update of l skip locked";
/** Above this many known priority levels in a queue, the one-queue claim scans the whole queue. */
const MAX_LEVELS = 16;

/** Claims jobs for one worker. */
export class Claimer {
  #sql: Sql;
  #config: ClaimerConfig;
  #statements: {
    claimOne: string;
    claimOneFloor: string;
    claimOneChecked: string;
    claim: string;
    hasLimits: string;
    keys: string;
    anyKey: string;
    anyKeyByLimits: string;
    unkeyed: string;
    limited: string;
  };
  #limitsCheckedAt = -Infinity;
  #limitsExist = false;
  /** Whether the last limited claim found a key to serve (see `#claimLimited`). */
  #keysFound = true;
  /** Per queue, per priority level: where the next one-queue claim starts (run_at, epoch ms). */
  #floors = new Map<string, Map<number, number>>();
  /** Per queue: when its next full one-queue claim is due (performance.now()). */
  #fullClaimDue = new Map<string, number>();
  /** The clock (performance.now(); a test's fake one). */
  #now: () => number;

  /** Make a claimer on a pool. */
  constructor(sql: Sql, config: ClaimerConfig) {
    this.#sql = sql;
    this.#config = config;
    this.#now = config.now ?? (() => performance.now());
    const s = quoteSchema(config.schema);
    this.#statements = {
      claimOne: claimOneStatement(s),
      claimOneFloor: `select * from ${s}.claim_one_floor($1, $2, $3, $4, $5, $6, $7)`,
      claimOneChecked: `select * from ${s}.claim_one_checked($1, $2, $3, $4, $5, $6, $7)`,
      claim: claimStatement(s),
      hasLimits: `select exists (select 1 from ${s}.limits) as any`,
      keys: limitKeysStatement(s),
      anyKey: anyKeyStatement(s),
      anyKeyByLimits: limitKeysStatement(s).replace(KEYS_LOCK, ""),
      unkeyed: unkeyedCandidatesStatement(s),
      limited: limitedClaimStatement(s),
    };
  }

  /**
   * Claim up to `total` jobs spread over the requests. With `fair`, every queue may
   * contribute up to `total`, taken round-robin starting at queue `offset`.
   */
  async claim(requests: readonly ClaimRequest[], total: number, offset = 0): Promise<ClaimResult> {
    if (await this.#limitsMayApply()) return await this.#claimLimited(requests, total, offset);
    return await this.#claimUnlimited(requests, total, offset);
  }

  /**
   * A run of a job with a limit key ended and its outcome is written: its key may have room
   * again, so the next claim looks for keys at once.
   */
  limitFreed(): void {
    this.#keysFound = true;
  }

  /** The claim of jobs without a limits row. */
  async #claimUnlimited(
    requests: readonly ClaimRequest[],
    total: number,
    offset: number,
  ): Promise<ClaimResult> {
    const run = (sql: Sql | TransactionSql, n: number, excluded: string[]) =>
      this.#unlimited(sql, requests, n, offset, excluded);
    if (this.#config.hooks.length === 0) {
      return { claimed: await run(this.#sql, total, []), rolledBack: 0 };
    }
    const { rows, rolledBack } = await this.#oneByOne(total, (tx, excluded) => {
      offset++;
      return run(tx, 1, excluded);
    });
    return { claimed: rows, rolledBack };
  }

  /** One claim of jobs without a limits row, on `sql`. */
  #unlimited(
    sql: Sql | TransactionSql,
    requests: readonly ClaimRequest[],
    n: number,
    offset: number,
    excluded: string[],
  ): Promise<ClaimedJob[]> {
    const tasks = this.#config.tasks as string[];
    const workerId = this.#config.workerId;
    if (requests.length === 1) {
      return this.#claimOne(sql, requests[0].queue, Math.min(n, requests[0].slots), excluded);
    }
    const slots = requests.map((r) => r.slots);
    return this.#claimed(sql.unsafe(this.#statements.claim, [
      requests.map((r) => r.queue),
      slots,
      tasks,
      n,
      offset,
      excluded,
      workerId,
      // A constant per-queue LIMIT (the largest request) lets the planner see how few
      // rows it fetches; an expression makes it guess a tenth of the queue, which pushes
      // the plan past jit_above_cost on big queues (~45 ms of JIT per claim).
      Math.min(n, Math.max(0, ...slots)),
    ]));
  }

  /**
   * Claim from one queue (the common case), through functions whose plans each connection
   * keeps. While an old snapshot holds the MVCC horizon back, every claimed job leaves a dead
   * entry at the front of the claim index that a scan from the start visits on every claim; so
   * the claim starts each known priority level at its floor, FLOOR_SLACK before the latest run_at
   * claimed there (`claim_one_floor`, migrations/0004_claim_floor.sql), and scans the whole
   * queue (`claim_one`) first, at least every FULL_CLAIM_EVERY (every FULL_CLAIM_COST_FACTOR
   * times its duration when that is longer, at most FULL_CLAIM_EVERY_MAX), and with too many
   * levels.
   * Priorities not known yet are scanned whole. A ready job behind its level's floor (a run_at
   * set in the past, an enqueue transaction that committed more than FLOOR_SLACK after it
   * began, a job another worker's rolled-back claim skipped) waits for the next full claim.
   */
  async #claimOne(
    sql: Sql | TransactionSql,
    queue: string,
    n: number,
    excluded: string[],
    checked?: { keyed: string | null },
  ): Promise<ClaimedJob[]> {
    const params = [queue, this.#config.tasks as string[], n, excluded, this.#config.workerId];
    const floors = this.#floors.get(queue);
    const now = this.#now();
    const fast = floors !== undefined && floors.size <= MAX_LEVELS &&
      now < (this.#fullClaimDue.get(queue) ?? -Infinity);
    let rows: ClaimedJob[];
    if (checked) {
      // claim_one_checked: the check for a limit key with room, then one of the two claims.
      const levels = fast ? [[...floors.keys()], [...floors.values()]] : [null, null];
      rows = await this.#claimed(
        sql.unsafe(this.#statements.claimOneChecked, [...params, ...levels], PREPARED),
      );
      let keyed: string | null = null;
      for (const row of rows) {
        const r = row as { keyed?: string | null };
        keyed ??= r.keyed ?? null;
        delete r.keyed;
      }
      if (keyed !== null) {
        // A key has room (or more keys are queued than the check looks at): nothing claimed.
        checked.keyed = keyed;
        return [];
      }
      if (!fast) this.#fullClaimDue.set(queue, now + fullClaimInterval(this.#now() - now));
    } else if (fast) {
      rows = await this.#claimed(sql.unsafe(this.#statements.claimOneFloor, [
        ...params,
        [...floors.keys()],
        [...floors.values()],
      ], PREPARED));
    } else {
      rows = await this.#claimed(sql.unsafe(this.#statements.claimOne, params, PREPARED));
      // The cost of a whole-queue claim spaces the next one (fullClaimInterval).
      this.#fullClaimDue.set(queue, now + fullClaimInterval(this.#now() - now));
    }
    if (rows.length === 0) {
      // A queue with no known level yet has its floor at the start: the next claim is fast,
      // and as cheap as a full one.
      if (floors === undefined) this.#floors.set(queue, new Map());
      return rows;
    }
    const known = floors ?? new Map<number, number>();
    for (const row of rows) {
      const floor = row.run_at.getTime() - FLOOR_SLACK;
      if (floor > (known.get(row.priority) ?? -Infinity)) known.set(row.priority, floor);
    }
    this.#floors.set(queue, known);
    return rows;
  }

  /**
   * The claim while limits rows exist: the keys with room and a ready job, best job first
   * (at most one per job wanted), are locked, then their jobs and jobs without a limit are
   * claimed together in claim order. Keys are chosen by need, not by name, so with
   * thousands of keys each one with room gets its turn.
   */
  async #claimLimited(
    requests: readonly ClaimRequest[],
    total: number,
    offset: number,
  ): Promise<ClaimResult> {
    const queues = requests.map((r) => r.queue);
    const slots = requests.map((r) => r.slots);
    const tasks = this.#config.tasks as string[];
    if (!this.#keysFound) {
      // The last pass found no key with room and a ready job (limits exist, but their jobs
      // are done or at their limit): while that stays so, claim as without limits, sparing
      // the transaction and its round trips. From one queue without hooks, the check and the
      // claim are one call (`claim_one_checked`, migrations/0020).
      // "key": a key has room; "unknown": more keys are queued than the check looks at.
      let answer: "none" | "key" | "unknown";
      if (requests.length === 1 && this.#config.hooks.length === 0) {
        const checked = { keyed: null as string | null };
        const n = Math.min(total, requests[0].slots);
        const rows = await this.#claimOne(this.#sql, requests[0].queue, n, [], checked);
        if (checked.keyed === null) return { claimed: rows, rolledBack: 0 };
        answer = checked.keyed === "key" ? "key" : "unknown";
      } else {
        const [walk] = await this.#sql.unsafe(this.#statements.anyKey, [queues, tasks, []]);
        answer = walk.key !== null ? "key" : walk.complete ? "none" : "unknown";
      }
      const none = answer === "none" || (answer === "unknown" &&
        (await this.#sql.unsafe(this.#statements.anyKeyByLimits, [queues, tasks, 1, []]))
            .length === 0);
      if (none) return await this.#claimUnlimited(requests, total, offset);
    }
    const maxSlots = (n: number) => Math.min(n, Math.max(0, ...slots));
    const run = async (
      tx: TransactionSql,
      n: number,
      excluded: string[],
    ): Promise<ClaimedJob[]> => {
      // First the jobs without a limits row that the claim may take, locked before any key
      // is: their scan passes every queued job of a limited key (jobs_claim_idx has no
      // limit_key; tens of milliseconds behind a hot key's backlog), and a key's limits row
      // held meanwhile kept the key's hand-offs (migrations/0020) waiting.
      const unkeyed = (await tx.unsafe(this.#statements.unkeyed, [
        queues,
        slots,
        tasks,
        excluded,
        maxSlots(n),
      ])).map((r) => r.ctid);
      // Lock the chosen keys' limits rows, serialising claimers of the same key; the claim
      // below then counts with a fresh snapshot (a new statement), so what it sees running
      // is what is running. A key another claimer holds is skipped (the next best one is
      // taken instead): never wait, for that claimer may be frozen mid-transaction (a
      // stopped process, a partition) and waiting would stall this loop and its heartbeat.
      const keys = (await tx.unsafe(this.#statements.keys, [queues, tasks, n, excluded]))
        .map((r) => r.key);
      this.#keysFound = keys.length > 0;
      // Without a key, the same statement claims from the jobs found first alone.
      const rows = await this.#claimed(tx.unsafe(this.#statements.limited, [
        keys,
        queues,
        slots,
        tasks,
        n,
        offset,
        excluded,
        this.#config.workerId,
        unkeyed,
      ]));
      const locked = new Set(keys);
      for (const row of rows) {
        if (row.limit_key !== null && locked.has(row.limit_key)) row.limited = true;
      }
      return rows;
    };
    if (this.#config.hooks.length === 0) {
      return {
        claimed: await this.#sql.begin((tx) => run(tx, total, [])) as ClaimedJob[],
        rolledBack: 0,
      };
    }
    const { rows, rolledBack } = await this.#oneByOne(total, (tx, excluded) => {
      offset++;
      return run(tx, 1, excluded);
    });
    return { claimed: rows, rolledBack };
  }

  /** Repeat a one-row transition in its own transaction with the hooks, up to `budget`. */
  #oneByOne<R extends JobRow>(
    budget: number,
    statement: (tx: TransactionSql, excluded: string[]) => Promise<R[]>,
  ): Promise<{ rows: R[]; rolledBack: number }> {
    return transitionOneByOne(this.#sql, this.#config.hooks, budget, statement);
  }

  /** Claimed rows, decoded by column name (job_columns.ts). */
  async #claimed(query: ReturnType<Sql["unsafe"]>): Promise<ClaimedJob[]> {
    return decodeClaimed(await query, { worker_id: this.#config.workerId, state: "running" });
  }

  /**
   * Whether `limits` has rows, asked at most every LIMITS_RECHECK. Either answer may be
   * stale that long: with no rows the limited claim claims what the plain one would, and a
   * new row's jobs wait (the plain claim leaves any job whose key has a row).
   */
  async #limitsMayApply(): Promise<boolean> {
    const now = performance.now();
    if (now - this.#limitsCheckedAt < LIMITS_RECHECK) return this.#limitsExist;
    const [{ any }] = await this.#sql.unsafe(this.#statements.hasLimits);
    this.#limitsExist = any;
    this.#limitsCheckedAt = now;
    return any;
  }
}

/**
 * The best `limit` ready jobs of queue `queue` whose task is in `tasks` and id not in
 * `excluded`, with no limit key or one without a limits row, locked SKIP LOCKED (for a
 * lateral join).
 */
function unlimitedReady(
  s: string,
  queue: string,
  tasks: string,
  excluded: string,
  limit: string,
): string {
  return `select c.ctid, c.id, c.priority, c.run_at from ${s}.jobs c
     where ${readyCondition(queue)}
       and c.task operator(pg_catalog.=) any(${tasks}::pg_catalog.text[])
       and c.id operator(pg_catalog.<>) all(${excluded}::bigint[])
       and ${noLimitPredicate(s)}
     order by ${claimOrder("c")}
     limit ${limit}
     for update of c skip locked`;
}

/** `unnest(queues, slots)` as `q(name, n, ord)` without the paused queues. */
function openQueues(s: string, queues: string, slots: string): string {
  return `(select * from rows from (pg_catalog.unnest(${queues}::pg_catalog.text[]),
    pg_catalog.unnest(${slots}::int[])) with ordinality as u(name, n, ord)
           where not exists (select 1 from ${s}.queue_pauses p where p.queue
             operator(pg_catalog.=) u.name)) as q`;
}

/**
 * The claim's UPDATE of the rows that `candidates` locked. By ctid (a TID scan): the rows
 * are locked by this same statement, so their ctid cannot change under it, and a join
 * through the primary key costs a third of the claim.
 */
function claimUpdate(s: string, workerId: string): string {
  return `update ${s}.jobs j
       set ${claimSet(workerId)}
     where j.ctid operator(pg_catalog.=) any(array(select ctid from candidates))
    returning ${claimReturning()}`;
}

/**
 * Claim from one queue: $1 queue, $2 tasks, $3 how many, $4 excluded ids, $5 worker id.
 * The statement is the `claim_one` function of migrations/0001_init.sql (its plan cached
 * per connection); it returns the columns of `claimReturning` (claim_rule.ts).
 */
function claimOneStatement(s: string): string {
  return `select * from ${s}.claim_one($1, $2, $3, $4, $5)`;
}

/**
 * Claim from several queues: $1 queues, $2 slots per queue, $3 tasks, $4 how many in all,
 * $5 round-robin offset, $6 excluded ids, $7 worker id, $8 the largest per-queue slots.
 */
function claimStatement(s: string): string {
  return `
    with candidates as (
      select r.ctid from (
        select x.ctid, q.ord, q.n,
               pg_catalog.row_number() over (partition by q.ord order by ${claimOrder("x")}) as rn
          from ${openQueues(s, "$1", "$2")}
          cross join lateral (${unlimitedReady(s, "q.name", "$3", "$6", "$8")}) x
      ) r
      where r.rn operator(pg_catalog.<=) r.n
      order by r.rn, (r.ord operator(pg_catalog.+) $5) operator(pg_catalog.%)
        pg_catalog.cardinality($1::pg_catalog.text[])
      limit $4
    )
    ${claimUpdate(s, "$7")}`;
}

/** How many more jobs of key `l` (a `limits` row) may start now, counted per key. */
function room(s: string): string {
  const never = 2147483647;
  return `least(
    coalesce(l.max_running operator(pg_catalog.-) (select pg_catalog.count(*) from ${s}.jobs r
                               where r.state operator(pg_catalog.=) 'running' and r.limit_key
                                 operator(pg_catalog.=) l.key), ${never}),
    coalesce(l.max_starts operator(pg_catalog.-) (select pg_catalog.count(*) from
      ${s}.limit_starts m
                              where m.key operator(pg_catalog.=) l.key and m.started_at
                                operator(pg_catalog.>) (pg_catalog.now()
                                  operator(pg_catalog.-) l."window")),
             ${never}))`;
}

/**
 * Whether some limit key has room and a ready job, found from the keys of queued jobs: $1
 * queues, $2 tasks, $3 excluded ids. Returns `key`, one such key or null, and `complete`,
 * whether the queued jobs have at most KEY_WALK distinct keys, all of which were looked at
 * (each found by one descent of `jobs_queued_key_idx`). With thousands of limits rows and
 * few keys queued this reads a few index pages, where a pass over the limits rows (the
 * claim's own way, {@linkcode limitKeysStatement}) took tens of milliseconds on every claim
 * and held the jobs without a key back; when `key` is null and the walk is not complete, the
 * caller asks that way instead.
 */
function anyKeyStatement(s: string): string {
  const keyed = `c.state operator(pg_catalog.=) 'queued' and c.limit_key is not null`;
  return `
    with recursive queued_keys(key, depth) as (
      (select pg_catalog.min(c.limit_key)::pg_catalog.text, 1 from ${s}.jobs c where ${keyed})
      union all
      select (select pg_catalog.min(c.limit_key)::pg_catalog.text from ${s}.jobs c
               where ${keyed} and c.limit_key operator(pg_catalog.>) q.key), q.depth
                 operator(pg_catalog.+) 1
        from queued_keys q where q.key is not null and q.depth operator(pg_catalog.<=) ${KEY_WALK}
    )
    select exists (select 1 from queued_keys where key is null) as complete,
      (select q.key from queued_keys q
        cross join lateral (
          select l.key from ${s}.limits l where l.key operator(pg_catalog.=) q.key and ${
    room(s)
  } operator(pg_catalog.>) 0 offset 0) l
        cross join lateral (
          select 1 from ${s}.jobs c
           where ${keyReadyJob(s, "$3")}
           limit 1) best
        where q.key is not null
        limit 1) as key`;
}

/**
 * The condition of a ready job (alias `c`) of limit key `l.key` that this claim may take: in
 * one of the queues $1 that is not paused, of a task of $2, not among the excluded ids
 * (parameter `excluded`). Shared by the check for a key with room and the key pick.
 */
function keyReadyJob(s: string, excluded: string): string {
  return `c.limit_key operator(pg_catalog.=) l.key
          and c.queue operator(pg_catalog.=) any(array(select u.name from
            pg_catalog.unnest($1::pg_catalog.text[]) as u(name)
                                   where not exists (select 1 from ${s}.queue_pauses p
                                                      where p.queue operator(pg_catalog.=) u.name)))
          and ${readyCondition("c.queue")}
          and c.task operator(pg_catalog.=) any($2::pg_catalog.text[])
          and c.id operator(pg_catalog.<>) all(${excluded}::bigint[])`;
}

/**
 * Pick and lock the limit keys to serve: $1 queues, $2 tasks, $3 how many, $4
 * excluded ids.
 * Only keys with room and a ready job in an open queue, ordered by that key's best ready
 * job (claim order), at most $3, each `limits` row locked `SKIP LOCKED` (the Limit sits
 * above the row locks, so a key held by another claimer makes room for the next one). The
 * counts are hashed once (running jobs and marks in the window are few; a count per key
 * costs more with thousands of keys), and the room they give is a hint from this
 * statement's snapshot: the claim counts again under the lock.
 */
function limitKeysStatement(s: string): string {
  const never = 2147483647;
  return `
    with running as (
      select r.limit_key as key, pg_catalog.count(*) as n from ${s}.jobs r
       where r.state operator(pg_catalog.=) 'running' and r.limit_key is not null
       group by r.limit_key
    ),
    starts as (
      select m.key, pg_catalog.count(*) as n from ${s}.limit_starts m
        join ${s}.limits w on w.key operator(pg_catalog.=) m.key
       where m.started_at operator(pg_catalog.>) (pg_catalog.now()
         operator(pg_catalog.-) w."window")
       group by m.key
    )
    select l.key from ${s}.limits l
      left join running on running.key operator(pg_catalog.=) l.key
      left join starts on starts.key operator(pg_catalog.=) l.key
     cross join lateral (
       select c.priority, c.run_at, c.id from ${s}.jobs c
        where ${keyReadyJob(s, "$4")}
        order by ${claimOrder("c")}
        limit 1) best
     where coalesce(l.max_running operator(pg_catalog.-) coalesce(running.n, 0), ${never})
       operator(pg_catalog.>) 0
       and coalesce(l.max_starts operator(pg_catalog.-) coalesce(starts.n, 0), ${never})
         operator(pg_catalog.>) 0
     order by ${claimOrder("best")}
     limit $3
     ${KEYS_LOCK}`;
}

/**
 * The jobs without a limits row that the limited claim may take, locked for it: $1 queues,
 * $2 slots per queue, $3 tasks, $4 excluded ids, $5 the largest per-queue slots. Returns
 * their ctids (text), the best $5 of each queue that is not paused, as the plain claim
 * picks them.
 */
function unkeyedCandidatesStatement(s: string): string {
  return `select x.ctid::pg_catalog.text as ctid
    from ${openQueues(s, "$1", "$2")}
    cross join lateral (${unlimitedReady(s, "q.name", "$3", "$4", "$5")}) x`;
}

/**
 * Claim from the locked keys and from jobs without a limit, in one claim order: $1 locked
 * keys, $2 queues, $3 slots per queue, $4 tasks, $5 how many in all, $6 round-robin offset,
 * $7 excluded ids, $8 worker id, $9 the ctids of the jobs without a limits row that this
 * transaction found and locked before the keys ({@linkcode unkeyedCandidatesStatement}).
 * Each key gives at most its room (counted now, under the lock), each queue at most its
 * slots; within a queue the best jobs win whether they have a key or not, and queues take
 * turns as in the plain claim. Starts of keys with `maxStarts` are marked in `limit_starts`.
 */
function limitedClaimStatement(s: string): string {
  return `
    with room as (
      select l.key, l.max_starts, ${room(s)} as n
        from pg_catalog.unnest($1::pg_catalog.text[]) as k(key) join ${s}.limits l on l.key
          operator(pg_catalog.=) k.key
    ),
    oq as (select * from ${openQueues(s, "$2", "$3")}),
    keyed as (
      select x.* from room cross join lateral (
        select c.ctid, c.id, c.queue, c.priority, c.run_at from ${s}.jobs c
         where c.limit_key operator(pg_catalog.=) room.key
           and c.queue operator(pg_catalog.=) any(array(select name from oq))
           and ${readyCondition("c.queue")}
           and c.task operator(pg_catalog.=) any($4::pg_catalog.text[])
           and c.id operator(pg_catalog.<>) all($7::bigint[])
         order by ${claimOrder("c")}
         limit least(greatest(room.n, 0), $5)
         for update of c skip locked) x
    ),
    unkeyed as (
      -- Locked by this transaction since it found them: still queued, their ctids unchanged.
      select c.ctid, c.id, c.queue, c.priority, c.run_at from ${s}.jobs c
       where c.ctid operator(pg_catalog.=) any($9::pg_catalog.tid[])
    ),
    candidates as (
      select r.ctid from (
        select u.ctid, oq.ord, oq.n,
               pg_catalog.row_number() over (partition by oq.ord order by ${claimOrder("u")}) as rn
          from (select * from keyed union all select * from unkeyed) u
          join oq on oq.name operator(pg_catalog.=) u.queue
      ) r
      where r.rn operator(pg_catalog.<=) r.n
      order by r.rn, (r.ord operator(pg_catalog.+) $6) operator(pg_catalog.%)
        pg_catalog.cardinality($2::pg_catalog.text[])
      limit $5
    ),
    claimed as (
      update ${s}.jobs j
         set ${claimSet("$8")}
       where j.ctid operator(pg_catalog.=) any(array(select ctid from candidates))
      returning j.*
    ),
    marks as (
      insert into ${s}.limit_starts (key, job_id)
      select c.limit_key, c.id from claimed c
        join room on room.key operator(pg_catalog.=) c.limit_key
       where room.max_starts is not null
    )
    select ${claimReturning("claimed")} from claimed`;
}
