/**
 * `akadze metrics`: print the Prometheus text of `renderMetrics`.
 *
 * @module
 */
import { renderMetrics } from "../metrics.ts";
import { DATABASE_FOOTER, parseSubcommand, SCHEMA_OPTION, withSql } from "./ops.ts";

/** Help text of `akadze metrics`. */
export const METRICS_HELP = `Usage: akadze metrics

Print akadze's gauges in the Prometheus text exposition format (version 0.0.4), read
from one consistent snapshot: akadze_jobs{queue,state}, akadze_queue_lag_seconds{queue},
akadze_queue_paused{queue}, akadze_worker_busy, akadze_workers and the limit gauges
(akadze_limit_running, akadze_limit_max_running, akadze_limit_starts,
akadze_limit_max_starts), and what holds back the cleanup of the jobs table:
akadze_oldest_transaction_seconds{source}, akadze_horizon_age_transactions{source},
akadze_horizon_hidden_sessions, akadze_jobs_dead_tuples and
akadze_jobs_last_vacuum_timestamp_seconds. No job arguments, results or error texts,
and no other session's query or user.

To be scraped, serve the same text from your application with renderMetrics (from
@akadze/akadze/metrics), or write it to a node_exporter textfile collector directory.

Options:
${SCHEMA_OPTION}
  -h, --help      show this help

${DATABASE_FOOTER}`;

/** Run `akadze metrics`; returns the exit code. */
export async function metricsCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {}, {
    help: METRICS_HELP,
    positionals: [],
    usage: "akadze metrics [--schema NAME]",
  });
  if (!parsed) return 0;
  const { schema } = parsed;
  const text = await withSql((sql) => renderMetrics(sql, { schema }));
  await Deno.stdout.write(new TextEncoder().encode(text));
  return 0;
}
