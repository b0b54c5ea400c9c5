/**
 * `akadze schedules list APP[:export]`: the app's periodic schedules and their next fire
 * times, read from the app module (no database needed).
 *
 * @module
 */
import type { Akadze } from "../app.ts";
import type { Schedule } from "../schedule.ts";
import { runUnderAppConfig } from "./app_config.ts";
import { parseFlags, UsageError } from "./common.ts";
import { loadApp, parseAppTarget } from "./load_app.ts";
import { dispatch, positionalArgs } from "./ops.ts";
import { type Column, isoTime, msToSeconds, printJson, printTable } from "./output.ts";

/** Help text of `akadze schedules`. */
export const SCHEDULES_HELP = `Usage: akadze schedules <command> [options]

Commands:
  list APP[:export] [--json]   the app's schedules with their next fire times

Schedules run inside every worker (akadze worker APP); there is no beat process.
Run akadze schedules list --help for its options.`;

const LIST_HELP = `Usage: akadze schedules list APP[:export] [--after TIME] [--json]

Load the Akadze app exported by the module APP (as akadze worker does: the export named
after the colon, else "app", else the default export) and print its schedules by name,
with the first fire after now. Nothing connects to the database, but the module is
imported, so it must load (e.g. AKADZE_DATABASE_URL set when the app reads it).

Options:
  --after TIME    the first fire after TIME (ISO 8601, e.g. 2030-03-31T00:30:00Z)
                  instead of after now
  --json          a JSON array of objects with the keys name, task, schedule, cron,
                  everySeconds, timezone, overlap, nextFire (cron and timezone are null
                  for an interval schedule, everySeconds null for a cron one)
  -h, --help      show this help

Output: a header line, then one line per schedule; columns separated by a tab:
  NAME TASK SCHEDULE OVERLAP NEXT_FIRE
SCHEDULE reads 'cron "0 3 * * *" (Europe/Berlin)' or "every 30000 ms"; NEXT_FIRE is
ISO 8601 in UTC ("-" when it never fires again).

Exit codes: 0 listed, 1 the module fails to load, 2 usage error (APP missing or not an
app).`;

/** Run `akadze schedules`; returns the exit code. */
export function schedulesCommand(args: string[]): Promise<number> {
  return dispatch("schedules", args, SCHEDULES_HELP, { list: listCommand });
}

interface ScheduleRow {
  schedule: Schedule;
  nextFire: Date | null;
}

const COLUMNS: Column<ScheduleRow>[] = [
  { header: "NAME", value: (r) => r.schedule.name },
  { header: "TASK", value: (r) => r.schedule.task.name },
  { header: "SCHEDULE", value: (r) => r.schedule.describe() },
  { header: "OVERLAP", value: (r) => r.schedule.overlap },
  { header: "NEXT_FIRE", value: (r) => r.nextFire },
];

const ISO_TIME =
  /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?$/;

async function listCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseFlags(
    args,
    {
      after: { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    true,
    "akadze schedules list",
  );
  if (values.help) {
    console.log(LIST_HELP);
    return 0;
  }
  const [spec] = positionalArgs(positionals, ["APP"], "akadze schedules list APP[:export]");
  let now = new Date();
  if (values.after !== undefined) {
    now = new Date(values.after);
    if (!ISO_TIME.test(values.after) || Number.isNaN(now.getTime())) {
      throw new UsageError(`--after must be an ISO 8601 time, got "${values.after}"`);
    }
  }
  const target = parseAppTarget(spec);
  const rerun = await runUnderAppConfig(target);
  if (rerun !== undefined) return rerun;
  const { app } = await loadApp(target);
  try {
    const rows = scheduleRows(app, now);
    if (values.json) {
      printJson(rows.map(({ schedule: s, nextFire }) => ({
        name: s.name,
        task: s.task.name,
        schedule: s.describe(),
        cron: s.cron ?? null,
        everySeconds: msToSeconds(s.every),
        timezone: s.cron !== undefined ? s.timezone : null,
        overlap: s.overlap,
        nextFire: isoTime(nextFire),
      })));
    } else {
      printTable(COLUMNS, rows);
    }
  } finally {
    try {
      await app.close(); // its pool never connected
    } catch {
      // Exiting anyway.
    }
  }
  return 0;
}

function scheduleRows(app: Akadze, now: Date): ScheduleRow[] {
  const schedules = [...(app.schedules?.values() ?? [])];
  schedules.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return schedules.map((schedule) => ({ schedule, nextFire: schedule.nextFire(now) }));
}
