/**
 * What holds back the cleanup of dead rows in the database: the oldest transactions and
 * snapshots that VACUUM must keep rows for (open sessions, prepared transactions,
 * replication slots, standbys), and the jobs table's dead rows and last vacuum. Read by
 * the metrics and by `akadze health`.
 *
 * A role without pg_monitor (or pg_read_all_stats) sees, for other roles' sessions, which
 * transaction each one holds back (`backend_xmin`, `backend_xid`) but not when it began
 * (`xact_start`): such sessions count in the transaction age and as hidden, not in the
 * seconds. No query text, user or client address is read.
 *
 * @module
 */
import { DEFAULT_SCHEMA, quoteSchema, type Sql, type TransactionSql } from "./db.ts";

/** What holds a transaction or snapshot open: the `source` label. */
export type HorizonSource = "session" | "prepared" | "replication_slot" | "standby";

/** The sources, in the order the metrics list them. */
export const HORIZON_SOURCES: readonly HorizonSource[] = [
  "session",
  "prepared",
  "replication_slot",
  "standby",
];

/** The oldest holder of one source. */
export interface HorizonHolder {
  /** Seconds its transaction has been open (0 when unknown: slots, standbys, hidden). */
  seconds: number;
  /** How many transactions ago its oldest needed snapshot or transaction began. */
  transactions: number;
  /** The server process of the oldest session by start time (sessions only). */
  pid: number | null;
}

/** What {@linkcode readHorizon} found. */
export interface Horizon {
  /**
   * The oldest holder per source, absent for a source with none; null when the role may not
   * read the activity views.
   */
  holders: Partial<Record<HorizonSource, HorizonHolder>> | null;
  /** Sessions holding back cleanup whose start this role may not read (needs pg_monitor). */
  hiddenSessions: number;
  /** The jobs table's dead rows and last vacuum; null when its statistics cannot be read. */
  jobs: { deadTuples: number; lastVacuum: Date | null } | null;
}

/** Options of {@linkcode readHorizon}. */
export interface ReadHorizonOptions {
  /** The schema holding akadze's tables. Default `"akadze"`. */
  schema?: string;
}

/** insufficient_privilege: a managed database may restrict the statistics views. */
const INSUFFICIENT_PRIVILEGE = "42501";

// Sessions of this database, and processes of none (a standby's WAL sender with
// hot_standby_feedback holds back every database); never this session (the metrics' own
// snapshot) nor a VACUUM, which holds back nothing.
const HOLDERS_SQL = `
with holders as (
  select case when a.datid is null then 'standby' else 'session' end as source,
         a.pid, a.xact_start,
         greatest(pg_catalog.age(a.backend_xmin), pg_catalog.age(a.backend_xid)) as xids
    from pg_catalog.pg_stat_activity a
   where a.pid operator(pg_catalog.<>) pg_catalog.pg_backend_pid()
     and (a.backend_xmin is not null or a.backend_xid is not null)
     and (a.datid is null or a.datname operator(pg_catalog.=) pg_catalog.current_database())
     and a.pid operator(pg_catalog.<>) all (select v.pid from pg_catalog.pg_stat_progress_vacuum v)
  union all
  select 'prepared', null, p.prepared, pg_catalog.age(p.transaction)
    from pg_catalog.pg_prepared_xacts p
   where p.database operator(pg_catalog.=) pg_catalog.current_database()
  union all
  select 'replication_slot', null, null, pg_catalog.age(s.xmin)
    from pg_catalog.pg_replication_slots s
   where s.xmin is not null
     and (s.database is null or s.database operator(pg_catalog.=) pg_catalog.current_database())
)
select source,
       coalesce(greatest(pg_catalog.max(extract(epoch from pg_catalog.now()
         operator(pg_catalog.-) xact_start)), 0), 0)::pg_catalog.float8 as seconds,
       coalesce(pg_catalog.max(xids), 0)::pg_catalog.int8 as xids,
       (pg_catalog.array_agg(pid order by xact_start) filter
         (where xact_start is not null))[1] as pid,
       (pg_catalog.count(*) filter (where source operator(pg_catalog.=) 'session'
         and xact_start is null))::int as hidden
  from holders group by source`;

/**
 * Read what holds back the cleanup of dead rows: two statements of their own on `sql` (in
 * a savepoint each when `sql` is a transaction), so that a statistics view the role may
 * not read leaves its part null instead of failing anything else.
 *
 * @example
 * ```ts ignore
 * const horizon = await readHorizon(sql);
 * console.log(horizon.holders?.session?.seconds);
 * ```
 */
export async function readHorizon(
  sql: Sql | TransactionSql,
  options: ReadHorizonOptions = {},
): Promise<Horizon> {
  const jobsTable = `${quoteSchema(options.schema ?? DEFAULT_SCHEMA)}.jobs`;
  const rows = await unlessDenied(sql, (s) => s.unsafe(HOLDERS_SQL));
  const stats = await unlessDenied(sql, (s) =>
    s.unsafe(
      `select n_dead_tup::pg_catalog.int8 as dead,
        greatest(last_vacuum, last_autovacuum) as vacuumed
         from pg_catalog.pg_stat_user_tables where relid operator(pg_catalog.=)
           pg_catalog.to_regclass($1)`,
      [jobsTable],
    ));
  let holders: Horizon["holders"] = null;
  let hiddenSessions = 0;
  if (rows) {
    holders = {};
    for (const r of rows) {
      holders[r.source as HorizonSource] = {
        seconds: Number(r.seconds),
        transactions: Number(r.xids),
        pid: r.pid ?? null,
      };
      hiddenSessions += r.hidden;
    }
  }
  const table = stats?.[0];
  return {
    holders,
    hiddenSessions,
    jobs: table ? { deadTuples: Number(table.dead), lastVacuum: table.vacuumed ?? null } : null,
  };
}

/**
 * The horizon as Prometheus text lines (HELP, TYPE, samples); a part the role could not
 * read is left out.
 */
export function horizonGauges(horizon: Horizon): string[] {
  const out: string[] = [];
  const gauge = (name: string, help: string, samples: [string, number][]) => {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
    for (const [labels, value] of samples) out.push(`${name}${labels} ${value}`);
  };
  const { holders, jobs } = horizon;
  if (holders) {
    gauge(
      "akadze_oldest_transaction_seconds",
      "Seconds the oldest transaction that holds back the cleanup of dead rows in this " +
        "database has been open, by source (0 when none). Other roles' sessions count only " +
        "when this role has pg_monitor.",
      (["session", "prepared"] as const).map((source) => [
        `{source="${source}"}`,
        holders[source]?.seconds ?? 0,
      ]),
    );
    gauge(
      "akadze_horizon_age_transactions",
      "How many transactions ago the oldest snapshot or transaction that cleanup must keep " +
        "rows for began, by what holds it (0 when none).",
      HORIZON_SOURCES.map((source) => [
        `{source="${source}"}`,
        holders[source]?.transactions ?? 0,
      ]),
    );
    gauge(
      "akadze_horizon_hidden_sessions",
      "Sessions holding back cleanup whose start this role may not read (grant it " +
        "pg_monitor); they count in akadze_horizon_age_transactions only.",
      [["", horizon.hiddenSessions]],
    );
  }
  if (jobs) {
    gauge("akadze_jobs_dead_tuples", "Dead rows in the jobs table not yet cleaned up.", [[
      "",
      jobs.deadTuples,
    ]]);
    gauge(
      "akadze_jobs_last_vacuum_timestamp_seconds",
      "When the jobs table was last vacuumed (Unix time; 0 when never since the " +
        "statistics were reset).",
      [["", jobs.lastVacuum ? jobs.lastVacuum.getTime() / 1000 : 0]],
    );
  }
  return out;
}

/** `read` on `sql`, or null when the role may not read what it reads. */
async function unlessDenied<T>(
  sql: Sql | TransactionSql,
  read: (sql: Sql | TransactionSql) => Promise<T>,
): Promise<T | null> {
  const tx = sql as TransactionSql;
  try {
    // In a transaction, a failed statement would abort it: a savepoint keeps it usable.
    return typeof tx.savepoint === "function" ? await tx.savepoint(read) as T : await read(sql);
  } catch (error) {
    if ((error as { code?: unknown }).code === INSUFFICIENT_PRIVILEGE) return null;
    throw error;
  }
}
