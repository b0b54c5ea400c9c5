/**
 * Reading the registered workers from code.
 *
 * @module
 */
import { explainMissingSchema } from "../db.ts";
import { type AdminOptions, type Database, readTarget } from "./database.ts";

/** A worker row, as `listWorkers` returns it. */
export interface WorkerSummary {
  /** Worker id. */
  id: string;
  /** Host name. */
  hostname: string;
  /** Process id. */
  pid: number;
  /** Its queues. */
  queues: string[];
  /** Started at. */
  startedAt: Date;
  /** Last heartbeat. */
  heartbeatAt: Date;
  /** Its heartbeat TTL (ms). */
  heartbeatTtl: number;
  /** Whether its heartbeat is within its TTL. */
  alive: boolean;
  /** How many jobs it runs now. */
  running: number;
  /** The ids of the jobs it runs now, in id order. */
  runningJobs: string[];
}

/**
 * Registered workers, most recent heartbeat first.
 *
 * @example
 * ```ts ignore
 * import { listWorkers } from "@akadze/akadze/admin";
 * console.table(await listWorkers(app));
 * ```
 */
export async function listWorkers(
  db: Database,
  options: AdminOptions = {},
): Promise<WorkerSummary[]> {
  const [sql, s, schema] = readTarget(db, options);
  const rows = await explainMissingSchema(schema, () =>
    sql.unsafe(
      `select w.id, w.hostname, w.pid, w.queues, w.started_at, w.heartbeat_at, w.heartbeat_ttl_ms,
            w.heartbeat_at operator(pg_catalog.>=) (pg_catalog.now() operator(pg_catalog.-)
              (w.heartbeat_ttl_ms operator(pg_catalog.*) interval '1 millisecond')) as alive,
            array(select j.id::pg_catalog.text from ${s}.jobs j
                   where j.worker_id operator(pg_catalog.=) w.id and j.state
                     operator(pg_catalog.=) 'running' order by j.id) as running_jobs
       from ${s}.workers w order by w.heartbeat_at desc, w.id`,
    ));
  return rows.map((r) => ({
    id: r.id,
    hostname: r.hostname,
    pid: r.pid,
    queues: r.queues,
    startedAt: r.started_at,
    heartbeatAt: r.heartbeat_at,
    heartbeatTtl: r.heartbeat_ttl_ms,
    alive: r.alive,
    running: r.running_jobs.length,
    runningJobs: r.running_jobs,
  }));
}
