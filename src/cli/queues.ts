/**
 * `akadze queues list|pause|resume`.
 *
 * @module
 */
import {
  pauseQueue,
  queueKnown,
  type QueueSnapshot,
  queueSnapshot,
  resumeQueue,
} from "../admin/queues.ts";
import {
  DATABASE_FOOTER,
  dispatch,
  parseSubcommand,
  queueArg,
  SCHEMA_OPTION,
  withSql,
} from "./ops.ts";
import { type Column, printJson, printTable } from "./output.ts";
import { JOB_STATES, type JobState } from "../job.ts";

/** Help text of `akadze queues`. */
export const QUEUES_HELP = `Usage: akadze queues <command> [options]

Commands:
  list [--json]        every queue with jobs or a pause: paused flag, counts, lag
  pause NAME [--force] stop claims from a queue (running jobs finish, enqueue still works)
  resume NAME          resume claims from a paused queue

Run akadze queues <command> --help for a command's options.`;

/**
 * The counts of a queue, by key: one per job state, in lifecycle order, with the ready
 * jobs after the queued ones (they are some of them).
 */
const COUNT_KEYS: readonly ("ready" | JobState)[] = JOB_STATES.flatMap((state) =>
  state === "queued" ? [state, "ready" as const] : [state]
);

function count(q: QueueSnapshot, key: "ready" | JobState): number {
  return key === "ready" ? q.ready : q.counts[key];
}

const LIST_HELP = `Usage: akadze queues list [--json]

Every queue that has jobs or a pause, by name, with its counts from one consistent
snapshot. WAITING counts the steps of flows waiting for their dependencies; READY counts
queued jobs whose run_at has passed; LAG_SECONDS is how long the oldest ready job has
waited (0 when none).

Options:
  --json          a JSON array of objects with the keys queue, paused, ${
  COUNT_KEYS.slice(0, 3).join(", ")
},
                  ${COUNT_KEYS.slice(3).join(", ")}, lagSeconds
${SCHEMA_OPTION}
  -h, --help      show this help

Output: a header line, then one line per queue; columns separated by a tab:
  QUEUE PAUSED ${COUNT_KEYS.map((key) => key.toUpperCase()).join(" ")} LAG_SECONDS

${DATABASE_FOOTER}`;

const PAUSE_HELP = `Usage: akadze queues pause NAME [--force]

Stop claims from the queue NAME: running jobs finish, enqueue still works. Prints
"paused queue NAME", or "queue NAME was already paused". A queue that no job is in and
no worker serves is refused (exit 1), as the name is most likely a typo.

Options:
  --force         pause NAME even though no job is in it and no worker serves it
${SCHEMA_OPTION}
  -h, --help      show this help

${DATABASE_FOOTER}`;

const RESUME_HELP = `Usage: akadze queues resume NAME

Resume claims from the paused queue NAME and wake its workers. Prints "resumed queue
NAME", or "queue NAME was not paused".

Options:
${SCHEMA_OPTION}
  -h, --help      show this help

${DATABASE_FOOTER}`;

/** Run `akadze queues`; returns the exit code. */
export function queuesCommand(args: string[]): Promise<number> {
  return dispatch("queues", args, QUEUES_HELP, {
    list: listCommand,
    pause: (rest) => pauseOrResume(rest, "pause"),
    resume: (rest) => pauseOrResume(rest, "resume"),
  });
}

const round = (seconds: number) => Math.round(seconds * 1000) / 1000;

const COLUMNS: Column<QueueSnapshot>[] = [
  { header: "QUEUE", value: (q) => q.queue },
  { header: "PAUSED", value: (q) => q.paused },
  ...COUNT_KEYS.map((key) => ({
    header: key.toUpperCase(),
    value: (q: QueueSnapshot) => count(q, key),
  })),
  { header: "LAG_SECONDS", value: (q) => round(q.lagSeconds) },
];

async function listCommand(args: string[]): Promise<number> {
  const parsed = parseSubcommand(args, {
    json: { type: "boolean" },
  }, {
    help: LIST_HELP,
    positionals: [],
    usage: "akadze queues list [--json]",
  });
  if (!parsed) return 0;
  const { values, schema } = parsed;
  const queues = await withSql((sql) => queueSnapshot(sql, { schema }));
  if (values.json) {
    printJson(queues.map((q) => ({
      queue: q.queue,
      paused: q.paused,
      ...Object.fromEntries(COUNT_KEYS.map((key) => [key, count(q, key)])),
      lagSeconds: round(q.lagSeconds),
    })));
  } else {
    printTable(COLUMNS, queues);
  }
  return 0;
}

async function pauseOrResume(args: string[], action: "pause" | "resume"): Promise<number> {
  const parsed = parseSubcommand(args, action === "pause" ? { force: { type: "boolean" } } : {}, {
    help: action === "pause" ? PAUSE_HELP : RESUME_HELP,
    positionals: ["NAME"],
    usage: `akadze queues ${action} NAME`,
  });
  if (!parsed) return 0;
  const { positionals: [raw], schema } = parsed;
  const force = (parsed.values as { force?: boolean }).force === true;
  const queue = queueArg(raw);
  const changed = await withSql(async (sql) => {
    if (action === "resume") return await resumeQueue(sql, queue, { schema });
    if (!force && !await queueKnown(sql, queue, { schema })) return undefined;
    return await pauseQueue(sql, queue, { schema });
  });
  if (changed === undefined) {
    console.error(
      `error: no job is in queue ${queue} and no worker serves it: check the name, ` +
        "or pass --force to pause it anyway",
    );
    return 1;
  }
  if (action === "pause") {
    console.log(changed ? `paused queue ${queue}` : `queue ${queue} was already paused`);
  } else {
    console.log(changed ? `resumed queue ${queue}` : `queue ${queue} was not paused`);
  }
  return 0;
}
