/**
 * The completer: writes run outcomes, batched into one statement, each fenced on the
 * run_count the job was claimed with (`AND state = 'running'`), so a stale run can never
 * overwrite a newer one. Transient failures are retried with the same outcome while the
 * run still owns the job; the handler is never run again for it.
 *
 * @module
 */
import { isTransientError, PREPARED, quoteSchema, type Sql, type TransactionSql } from "../db.ts";
import type { JobState, OnTransitionHook } from "../job.ts";
import type { DeadLetterTarget } from "../dead_letter.ts";
import type { ErrorEntry } from "./error_entry.ts";
import { applyTransitions, JOB_RETURNING, type JobRow } from "./job_row.ts";
import { decodeClaimed } from "../job_columns.ts";
import type { ClaimedJob, ClaimRequest } from "./claimer.ts";

/** How a run ended, as the completer writes it. */
export type OutcomeKind = "succeeded" | "retry" | "fail" | "snooze" | "cancel" | "release";

/** One run's outcome. */
export interface Outcome {
  /** Job id. */
  id: string;
  /** The run_count the job was claimed with (the fencing token). */
  runCount: number;
  /**
   * succeeded: store `result`; retry: spend an attempt, queue again after `delayMs` or fail
   * when none remain; fail: spend an attempt and fail; snooze: queue again after
   * `delayMs` without spending one; cancel: end cancelled; release: back to queued as is.
   * A cancel request on the job turns any of them into cancelled (attempt not spent).
   */
  kind: OutcomeKind;
  /** The JSON result (succeeded only). */
  result?: unknown;
  /**
   * The error entry to append (`{ error, message, stack? }`; `at` is added from the
   * database clock).
   */
  error?: ErrorEntry;
  /** How long the failed run took, in milliseconds (for the log; not stored). */
  durationMs?: number;
  /** Milliseconds until the job is ready again (retry, snooze). */
  delayMs?: number;
  /** Where the job goes if this outcome fails it for good (its task's `deadLetter`). */
  deadLetter?: DeadLetterTarget;
}

/**
 * A written job as the batch write reports it: only what the worker logs, so the rows
 * cost little to send and decode.
 */
export interface WrittenRow {
  /** Job id. */
  id: string;
  /** The new state. */
  state: JobState;
  /** Attempts spent (absent when unchanged: a deleted succeeded job). */
  attempt?: number;
  /** When a queued job is ready again, epoch milliseconds (absent when deleted). */
  runAt?: number;
  /** Whether other jobs depend on it (absent when deleted). */
  hasDependents?: boolean;
}

/**
 * What the outcome write may hand to the writing worker: the dependents its successes queue,
 * claimed in the same transaction (migrations/0016_hand_off.sql, 0019), up to these slots.
 */
export interface HandOffer {
  /** The worker's id (the handed jobs run under it). */
  workerId: string;
  /** Free slots per queue, as a claim's requests. */
  requests: readonly ClaimRequest[];
  /** How many jobs in all. */
  total: number;
  /** The tasks the worker runs. */
  tasks: readonly string[];
  /**
   * Also the next ready jobs of the limit keys whose runs the write ends, as many as the key
   * has room for (migrations/0020_limit_hand_off.sql): the room those runs free goes to this
   * worker's kept slots in the same transaction, not to a later claim.
   */
  keys?: boolean;
}

/** The result of writing outcomes. */
export interface CompleteResult {
  /** Rows written, with their new state. */
  written: WrittenRow[];
  /** Outcomes discarded because the run no longer owns the job. */
  stale: Outcome[];
  /** Outcomes whose transition an onTransition hook rolled back (to be retried). */
  rolledBack: { item: Outcome; error: unknown }[];
  /** Dependents claimed for the writing worker in the write's transaction (a `HandOffer`). */
  handed: ClaimedJob[];
}

/** Writes outcomes for one app. */
export class Completer {
  #sql: Sql;
  #hooks: readonly OnTransitionHook[];
  #shortText: string;
  #keysText: string;
  #plainText: string;
  #rowsText: string;
  #deleteText: string | null;
  /**
   * Where the pool's sessions lack settings the worker needs (session_settings.ts): how each
   * write's transaction begins, and the statement that sets the rest for the transaction.
   */
  #begin: string | null = null;
  #local: { text: string; values: string[] } | null = null;

  /**
   * Make a completer on a pool. With `deleteSucceeded` (the app's `retention: 0`, no
   * onTransition hooks), a succeeded job's row is deleted instead of marked succeeded.
   */
  constructor(
    sql: Sql,
    schema: string,
    hooks: readonly OnTransitionHook[],
    options: { deleteSucceeded?: boolean } = {},
  ) {
    this.#sql = sql;
    this.#hooks = hooks;
    const s = quoteSchema(schema);
    this.#shortText = completeStatement(s);
    this.#keysText = completeKeysStatement(s);
    this.#plainText = completePlainStatement(s);
    this.#rowsText = `select ${JOB_RETURNING} from ${s}.jobs j where j.id
        operator(pg_catalog.=) any($1::bigint[])`;
    this.#deleteText = options.deleteSucceeded && hooks.length === 0 ? deleteStatement(s) : null;
  }

  /**
   * Write each batch in a transaction with these settings (session_settings.ts), the pool's
   * sessions defaulting to others: at its isolation level (at serializable the writes of
   * several workers would fail against each other), with the rest set for the transaction
   * alone (`set_config(…, true)`: a pooler's other clients never see them).
   */
  use(settings: Record<string, string>): void {
    const { default_transaction_isolation: level, ...rest } = settings;
    this.#begin = level ? `isolation level ${level}` : "";
    const names = Object.keys(rest);
    this.#local = names.length === 0 ? null : {
      text: `select ${
        names.map((_, i) => `pg_catalog.set_config($${2 * i + 1}, $${2 * i + 2}, true)`).join(", ")
      }`,
      values: names.flatMap((name) => [name, rest[name]]),
    };
  }

  /** `fn` in a transaction of its own, with the settings of {@linkcode Completer.use}. */
  async #inTransaction<T>(fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
    const local = this.#local;
    return await this.#sql.begin(this.#begin ?? "", async (tx) => {
      if (local) await tx.unsafe(local.text, local.values);
      return await fn(tx);
    }) as T;
  }

  /**
   * Write a batch of outcomes (one statement without onTransition hooks). With an `offer`
   * (no hooks, no `deleteSucceeded`), the dependents the successes queue may be claimed for
   * the writing worker in the same statement: `handed`.
   */
  async write(
    outcomes: readonly Outcome[],
    offer?: HandOffer,
    options: {
      /**
       * No job of the batch is known to have dependents: without a dead letter or a slot
       * offered, the update alone writes it (`complete_jobs_plain`). A job that has dependents
       * all the same has them settled by the row trigger, one row at a time; the full write
       * counts them down per statement.
       */
      plain?: boolean;
    } = {},
  ): Promise<CompleteResult> {
    if (this.#deleteText !== null && outcomes.some((o) => o.kind === "succeeded")) {
      return this.#result(outcomes, await this.#deleteAndUpdate(this.#deleteText, outcomes), []);
    }
    if (this.#hooks.length === 0) {
      const handed: ClaimedJob[] = [];
      const write = (tx: Sql | TransactionSql) =>
        this.#short(outcomes, tx, offer, handed, options.plain);
      const written = this.#begin !== null
        ? await this.#inTransaction(write)
        : await write(this.#sql);
      return this.#result(outcomes, written, [], handed);
    }
    const { rows, rolledBack } = await applyTransitions(
      this.#sql,
      this.#hooks,
      outcomes,
      () => "running",
      (tx, items) => this.#statement(tx, items),
    );
    const written = rows.map((r) => ({
      id: r.id,
      state: r.state,
      attempt: r.attempt,
      runAt: r.run_at.getTime(),
    }));
    return this.#result(outcomes, written, rolledBack);
  }

  /**
   * The batch write, read as arrays of {@linkcode WrittenRow} fields; the jobs handed to the
   * worker (with an `offer`) are added to `handed`.
   */
  async #short(
    outcomes: readonly Outcome[],
    tx: Sql | TransactionSql = this.#sql,
    offer?: HandOffer,
    handed?: ClaimedJob[],
    plainAllowed = false,
  ): Promise<WrittenRow[]> {
    // The 14-argument write only when it may hand keyed jobs: it calls the 13-argument one;
    // the plain write when nothing but the outcomes is to be done (see `encode`).
    const keys = offer?.keys === true && offer.total > 0;
    const { values, plain } = encode(outcomes, offer, keys, plainAllowed);
    const text = plain ? this.#plainText : keys ? this.#keysText : this.#shortText;
    const rows = await tx.unsafe(text, values as never, PREPARED).values();
    const written: WrittenRow[] = [];
    let claimed: Record<string, unknown>[] | null = null;
    for (const v of rows) {
      if (v[5] !== null) (claimed ??= []).push(v[5]);
      else written.push({ id: v[0], state: v[1], attempt: v[2], runAt: v[3], hasDependents: v[4] });
    }
    if (claimed && offer && handed) {
      handed.push(
        ...decodeClaimed(claimed, { worker_id: offer.workerId, state: "running" as const }),
      );
    }
    return written;
  }

  /**
   * `retention: 0`: delete the succeeded runs' jobs, then write the other outcomes (and a
   * succeeded run whose job has a cancel request: it ends cancelled). A batch that needs
   * both statements runs them in one transaction, so a retry repeats both.
   */
  async #deleteAndUpdate(text: string, outcomes: readonly Outcome[]): Promise<WrittenRow[]> {
    const succeeded = outcomes.filter((o) => o.kind === "succeeded");
    const run = async (tx: Sql | TransactionSql): Promise<WrittenRow[]> => {
      const ids = await tx.unsafe(text, [
        succeeded.map((o) => o.id),
        succeeded.map((o) => o.runCount),
      ] as never).values();
      const deleted = ids.map((v): WrittenRow => ({ id: v[0], state: "succeeded" }));
      if (deleted.length === outcomes.length) return deleted;
      const gone = new Set(deleted.map((r) => r.id));
      return [...deleted, ...await this.#short(outcomes.filter((o) => !gone.has(o.id)), tx)];
    };
    const mixed = succeeded.length < outcomes.length;
    return mixed || this.#begin !== null ? await this.#inTransaction(run) : await run(this.#sql);
  }

  #result(
    outcomes: readonly Outcome[],
    written: WrittenRow[],
    rolledBack: { item: Outcome; error: unknown }[],
    handed: ClaimedJob[] = [],
  ): CompleteResult {
    const done = new Set(written.map((r) => r.id));
    const failed = new Set(rolledBack.map((r) => r.item));
    return {
      written,
      stale: outcomes.filter((o) => !done.has(o.id) && !failed.has(o)),
      rolledBack,
      handed,
    };
  }

  /**
   * Write one outcome inside the caller's transaction (completeTx): returns the row, or
   * null when the run no longer owns the job.
   */
  async writeIn(tx: TransactionSql, outcome: Outcome): Promise<JobRow | null> {
    const [row] = await this.#statement(tx, [outcome]);
    return row ?? null;
  }

  /**
   * The outcome write whose rows the hooks see (always inside a transaction): the batch
   * write, then the written rows in full.
   */
  async #statement(tx: Sql | TransactionSql, outcomes: readonly Outcome[]): Promise<JobRow[]> {
    const ids = (await this.#short(outcomes, tx)).map((r) => r.id);
    if (ids.length === 0) return [];
    return [...await tx.unsafe(this.#rowsText, [ids])] as unknown as JobRow[];
  }
}

/** Outcomes made by {@linkcode unstorableOutcome}: never replaced again. */
const REPLACEMENTS = new WeakSet<Outcome>();

/**
 * The outcome to write instead of one whose write failed on its own (a batch of one) with
 * a non-transient error that says the values were refused: a data exception (SQLSTATE
 * class 22, e.g. a delay past the timestamp range, text PostgreSQL cannot encode), a
 * program limit (class 54), or an error raised while encoding the parameters (a result
 * whose getter throws when it is read again, say). It ends the job `failed` with a fixed error naming only the SQLSTATE (no
 * values), spending an attempt (`ResultNotStorable` for a result, `OutcomeNotStorable`
 * otherwise), or `cancelled` for a cancel, so the run cannot be put back and run again and
 * again. Null when the error is not about the values, for a release (it carries none),
 * and for a replacement.
 */
export function unstorableOutcome(outcome: Outcome, error: unknown): Outcome | null {
  if (outcome.kind === "release" || REPLACEMENTS.has(outcome)) return null;
  let code: unknown;
  try {
    code = (error as { code?: unknown } | null)?.code;
  } catch {
    code = undefined;
  }
  const sqlstate = typeof code === "string" && /^(22|54)[0-9A-Z]{3}$/.test(code) ? code : null;
  if (sqlstate === null && !(error instanceof OutcomeEncodingError)) return null;
  const what = outcome.kind === "succeeded" ? "result" : "outcome (its error or delay)";
  const reason = sqlstate === null
    ? "could not be encoded for the database"
    : `was refused by the database (SQLSTATE ${sqlstate}, class ${sqlstate.slice(0, 2)}: ${
      sqlstate.startsWith("22") ? "data exception" : "program limit exceeded"
    })`;
  const replacement: Outcome = {
    id: outcome.id,
    runCount: outcome.runCount,
    ...(outcome.deadLetter ? { deadLetter: outcome.deadLetter } : {}),
    kind: outcome.kind === "cancel" ? "cancel" : "fail",
    error: {
      error: outcome.kind === "succeeded" ? "ResultNotStorable" : "OutcomeNotStorable",
      message: `this run's ${what} ${reason}; the job is not run again`,
    },
  };
  REPLACEMENTS.add(replacement);
  return replacement;
}

/** An outcome could not be turned into the statement's parameters. */
class OutcomeEncodingError extends Error {
  constructor() {
    super("an outcome could not be encoded for the database");
    this.name = "OutcomeEncodingError";
  }
}

/**
 * The parameters of a batch write, and whether the plain write takes them (allowed, no dead
 * letter, no slot offered). An error of {@linkcode params} is an {@linkcode OutcomeEncodingError}
 * (without the original as its cause: whatever a result's getter threw must not look
 * transient).
 */
function encode(
  outcomes: readonly Outcome[],
  offer?: HandOffer,
  keys = false,
  plainAllowed = false,
): { values: unknown[]; plain: boolean } {
  let outcome: unknown[];
  try {
    outcome = params(outcomes);
  } catch {
    throw new OutcomeEncodingError();
  }
  // No dead letter (columns 7 and 8 all null) and no slot offered: the plain write's six.
  if (plainAllowed && outcome[6] === null && outcome[7] === null && (!offer || offer.total <= 0)) {
    return { values: outcome.slice(0, 6), plain: true };
  }
  const values = [...outcome, ...handOffParams(offer)];
  return { values: keys ? [...values, true] : values, plain: false };
}

/** The parameters of the outcome UPDATE: parallel arrays, one element per outcome. */
function params(outcomes: readonly Outcome[]): unknown[] {
  // Arrays for unnest: planned in a fraction of the time a JSON document takes.
  const n = outcomes.length;
  const ids = new Array<string>(n);
  const runCounts = new Array<number>(n);
  const kinds = new Array<string>(n);
  const results = new Array<string | null>(n);
  const errors = new Array<string | null>(n);
  const delays = new Array<number | null>(n);
  const deadTasks = new Array<string | null>(n);
  const deadQueues = new Array<string | null>(n);
  for (let i = 0; i < n; i++) {
    const o = outcomes[i];
    ids[i] = o.id;
    runCounts[i] = o.runCount;
    kinds[i] = o.kind;
    results[i] = o.kind === "succeeded" && o.result != null ? JSON.stringify(o.result) : null;
    errors[i] = o.error ? JSON.stringify(o.error) : null;
    delays[i] = o.delayMs ?? null;
    // Only an outcome that can fail the job needs one (a retry fails it when none are left).
    const dead = o.kind === "retry" || o.kind === "fail" ? o.deadLetter : undefined;
    deadTasks[i] = dead?.task ?? null;
    deadQueues[i] = dead?.queue ?? null;
  }
  // An all-null column goes as one NULL (unnest pads it), not as n NULLs to encode and parse.
  return [
    ids,
    runCounts,
    kinds,
    nullIfAllNull(results),
    nullIfAllNull(errors),
    nullIfAllNull(delays),
    nullIfAllNull(deadTasks),
    nullIfAllNull(deadQueues),
  ];
}

/**
 * The hand-off parameters of the outcome write: worker id, queues, slots per queue, total,
 * tasks; none offered without an offer (the statement then queues every dependent).
 */
function handOffParams(offer?: HandOffer): unknown[] {
  if (!offer || offer.total <= 0) return ["", [], [], 0, []];
  return [
    offer.workerId,
    offer.requests.map((r) => r.queue),
    offer.requests.map((r) => r.slots),
    offer.total,
    offer.tasks,
  ];
}

function nullIfAllNull<T>(values: (T | null)[]): (T | null)[] | null {
  return values.every((v) => v === null) ? null : values;
}

/** Retry `write` while it fails transiently, with capped exponential backoff. */
export async function retryTransient<T>(
  write: () => Promise<T>,
  options: { signal?: AbortSignal; onRetry?: (error: unknown, delay: number) => void } = {},
): Promise<T> {
  for (let attempt = 0;; attempt++) {
    try {
      return await write();
    } catch (error) {
      if (!isTransientError(error) || options.signal?.aborted) throw error;
      const delay = Math.min(100 * 2 ** attempt, 5_000);
      options.onRetry?.(error, delay);
      await new Promise((r) => setTimeout(r, delay));
    }
  }
}

/**
 * Delete succeeded runs' jobs (`retention: 0`), fenced like the UPDATE; a job with a cancel
 * request is left to the UPDATE, which ends it cancelled, and so is an awaited job (its
 * waiters read the outcome; the next prune deletes it).
 */
function deleteStatement(s: string): string {
  return `
    delete from ${s}.jobs j
     using rows from (pg_catalog.unnest($1::bigint[]),
       pg_catalog.unnest($2::int[])) as o(id, run_count)
     where j.id operator(pg_catalog.=) o.id and j.run_count operator(pg_catalog.=) o.run_count
       and j.state operator(pg_catalog.=) 'running'
       and j.cancel_requested_at is null and not j.awaited
    returning j.id::pg_catalog.text`;
}

/**
 * The outcome UPDATE: the `complete_jobs` function of migrations/0016 and 0019 (fenced on
 * run_count and state 'running'; its plan is kept per connection; a job it fails for good
 * gets its dead letter in the same statement; the dependents it makes ready may be handed to
 * the worker, $9 to $13, in the update that counts them down). Reads a
 * {@linkcode WrittenRow}: id, new state, attempts, run_at in epoch milliseconds, whether
 * others depend on it; or a handed job's claim columns (`claimed`).
 */
function completeStatement(s: string): string {
  return `select id, state, attempt, run_at_ms, has_dependents, claimed
            from ${s}.complete_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`;
}

/**
 * {@linkcode completeStatement} for a batch that needs nothing but its outcomes written (no
 * dead letter, no slot offered): migrations/0024's `complete_jobs_plain`, the same UPDATE
 * alone. A job it ends that has dependents has them settled by the row trigger.
 */
function completePlainStatement(s: string): string {
  return `select id, state, attempt, run_at_ms, has_dependents, claimed
            from ${s}.complete_jobs_plain($1, $2, $3, $4, $5, $6)`;
}

/**
 * {@linkcode completeStatement} that also hands the writing worker the next ready jobs of the
 * limit keys whose runs it ends ($14 true): the 14-argument `complete_jobs` of
 * migrations/0020, which runs the 13-argument one, then that hand-off.
 */
function completeKeysStatement(s: string): string {
  return `select id, state, attempt, run_at_ms, has_dependents, claimed
            from ${s}.complete_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`;
}
