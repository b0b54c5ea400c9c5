/**
 * The heartbeat: one statement per worker (not per job) that registers the worker row or
 * renews its `heartbeat_at`, and reports which of its running jobs have a cancel request.
 *
 * @module
 */
import { quoteSchema, type Sql } from "../db.ts";

/** Who this worker is, as stored in the workers table. */
export interface WorkerIdentity {
  /** Unique per process. */
  id: string;
  /** Host name. */
  hostname: string;
  /** Process id. */
  pid: number;
  /** Queues it claims from. */
  queues: readonly string[];
  /** Its heartbeatTtl in ms (others rescue its jobs after that long without a beat). */
  heartbeatTtl: number;
}

/** What one beat found. */
export interface BeatResult {
  /** The row was (re-)inserted: first beat, or someone removed it. */
  registered: boolean;
  /** Ids of this worker's running jobs whose cancellation was requested. */
  cancelRequested: string[];
  /** This worker's running jobs as the database sees them (with their claim's run_count). */
  running: { id: string; runCount: number }[];
}

/** Keeps one worker's row alive. */
export class Heartbeat {
  #sql: Sql;
  #identity: WorkerIdentity;
  #beat: string;
  #remove: string;
  /** `performance.now()` of the last successful beat, or null before the first. */
  lastSuccess: number | null = null;

  /** Make a heartbeat on a connection (the worker gives it its loop's own). */
  constructor(sql: Sql, schema: string, identity: WorkerIdentity) {
    this.#sql = sql;
    this.#identity = identity;
    const s = quoteSchema(schema);
    this.#beat = `
      with hb as (
        insert into ${s}.workers (id, hostname, pid, queues, heartbeat_ttl_ms)
        values ($1, $2, $3, $4::text[], $5)
        on conflict (id) do update set heartbeat_at = now()
        returning (xmax = 0) as registered)
      select hb.registered,
             array(select id::text from ${s}.jobs
                    where worker_id = $1 and state = 'running'
                      and cancel_requested_at is not null) as cancel,
             array(select id::text || ':' || run_count from ${s}.jobs
                    where worker_id = $1 and state = 'running') as running
        from hb`;
    this.#remove = `delete from ${s}.workers w where w.id = $1
      and not exists (select 1 from ${s}.jobs j where j.worker_id = w.id and j.state = 'running')`;
  }

  /**
   * Beat once; records the time of success. A beat that takes longer than `timeoutMs`
   * (a connection hanging in a network partition) fails as a transient timeout, so the
   * lease clock keeps running.
   */
  async runOnce(timeoutMs = this.#identity.heartbeatTtl / 2): Promise<BeatResult> {
    const { id, hostname, pid, queues, heartbeatTtl } = this.#identity;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const [row] = await Promise.race([
      this.#sql.unsafe(this.#beat, [
        id,
        hostname,
        pid,
        queues as string[],
        Math.round(heartbeatTtl),
      ]),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(Object.assign(new Error(`heartbeat took over ${timeoutMs} ms`), {
              name: "HeartbeatTimeout",
              code: "ETIMEDOUT",
            })),
          timeoutMs,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    this.lastSuccess = performance.now();
    const running = (row.running as string[]).map((item) => {
      const [id, runCount] = item.split(":");
      return { id, runCount: Number(runCount) };
    });
    return { registered: row.registered, cancelRequested: row.cancel, running };
  }

  /** Remove the worker row (on a clean stop), unless jobs still run under it. */
  async remove(): Promise<boolean> {
    const result = await this.#sql.unsafe(this.#remove, [this.#identity.id]);
    return result.count > 0;
  }
}
