/**
 * `akadze workers list`.
 *
 * @module
 */
import { listWorkers, type WorkerSummary } from "../admin/workers.ts";
import { DATABASE_FOOTER, dispatch, parseSubcommand, SCHEMA_OPTION, withSql } from "./ops.ts";
import { type Column, isoTime, msToSeconds, printJson, printTable } from "./output.ts";

/** Help text of `akadze workers`. */
export const WORKERS_HELP = `Usage: akadze workers <command> [options]

Commands:
  list [--json]        registered worker processes, most recent heartbeat first

Run akadze workers list --help for its options.`;

const LIST_HELP = `Usage: akadze workers list [--json]

Registered worker processes, most recent heartbeat first. ALIVE is false once a worker's
heartbeat is older than its heartbeat TTL (its running jobs are then rescued by the
others).

Options:
  --json          a JSON array of objects with the keys id, hostname, pid, queues (array),
                  startedAt, heartbeatAt, heartbeatTtlSeconds, alive, running,
                  runningJobs (array of job ids)
${SCHEMA_OPTION}
  -h, --help      show this help

Output: a header line, then one line per worker; columns separated by a tab:
  ID HOSTNAME PID QUEUES STARTED_AT HEARTBEAT_AT HEARTBEAT_TTL_SECONDS ALIVE RUNNING JOBS
QUEUES and JOBS (the ids of the jobs it runs now, - for none) are comma-separated; times are
ISO 8601 in UTC. akadze jobs show ID tells more about a job.

${DATABASE_FOOTER}`;

/** Run `akadze workers`; returns the exit code. */
export function workersCommand(args: string[]): Promise<number> {
  return dispatch("workers", args, WORKERS_HELP, { list: listCommand });
}

const COLUMNS: Column<WorkerSummary>[] = [
  { header: "ID", value: (w) => w.id },
  { header: "HOSTNAME", value: (w) => w.hostname },
  { header: "PID", value: (w) => w.pid },
  { header: "QUEUES", value: (w) => w.queues },
  { header: "STARTED_AT", value: (w) => w.startedAt },
  { header: "HEARTBEAT_AT", value: (w) => w.heartbeatAt },
  { header: "HEARTBEAT_TTL_SECONDS", value: (w) => msToSeconds(w.heartbeatTtl) },
  { header: "ALIVE", value: (w) => w.alive },
  { header: "RUNNING", value: (w) => w.running },
  { header: "JOBS", value: (w) => w.runningJobs },
];

async function listCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    json: { type: "boolean" },
  }, {
    help: LIST_HELP,
    positionals: [],
    usage: "akadze workers list [--json]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const workers = await withSql((sql) => listWorkers(sql, { schema }));
  if (values.json) {
    printJson(workers.map((w) => ({
      id: w.id,
      hostname: w.hostname,
      pid: w.pid,
      queues: w.queues,
      startedAt: isoTime(w.startedAt),
      heartbeatAt: isoTime(w.heartbeatAt),
      heartbeatTtlSeconds: msToSeconds(w.heartbeatTtl),
      alive: w.alive,
      running: w.running,
      runningJobs: w.runningJobs,
    })));
  } else {
    printTable(COLUMNS, workers);
  }
  return 0;
}
