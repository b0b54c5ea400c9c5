/**
 * Dead letters: where the jobs of a task with the `deadLetter` option go when they fail for
 * good. The outcome write (`complete_jobs`, migrations/0010) and the rescuer enqueue the
 * dead-letter job in the statement that fails the original, so both commit or neither does.
 *
 * @module
 */
import type { JobError } from "./admin/jobs.ts";
import type { AnyTask } from "./task.ts";

/**
 * The arguments of a dead-letter job: the failed job as it was when it failed. The failed
 * job itself stays `failed` (`akadze jobs requeue` still puts it back).
 *
 * @example
 * ```ts
 * import { Akadze, type DeadLetter } from "@akadze/akadze";
 * const app = new Akadze({ databaseUrl: "postgres://localhost/app" });
 * app.task("billing.charge", { deadLetter: "billing.charge_failed" }, () => {});
 * app.task("billing.charge_failed", (args) => {
 *   const failed = args as unknown as DeadLetter;
 *   console.log(`job ${failed.id} failed: ${failed.errors.at(-1)?.message}`);
 * });
 * await app.close();
 * ```
 */
export interface DeadLetter {
  /** The failed job's id. */
  id: string;
  /** Its task. */
  task: string;
  /** Its queue. */
  queue: string;
  /** Its arguments. */
  args: Record<string, unknown>;
  /** Its stored errors, oldest first (the last one ended it). */
  errors: JobError[];
}

/** Where a task's failed jobs go: the dead-letter task and its queue. */
export interface DeadLetterTarget {
  /** The dead-letter task. */
  readonly task: string;
  /** Its queue. */
  readonly queue: string;
}

/**
 * The dead-letter targets of an app's tasks, by task name: the queue named in the option,
 * else the dead-letter task's own queue when the app defines it, else `"default"`.
 */
export function deadLetterTargets(
  tasks: ReadonlyMap<string, AnyTask>,
): Map<string, DeadLetterTarget> {
  const targets = new Map<string, DeadLetterTarget>();
  for (const task of tasks.values()) {
    if (!task.deadLetter) continue;
    const queue = task.deadLetter.queue ?? tasks.get(task.deadLetter.task)?.queue ?? "default";
    targets.set(task.name, { task: task.deadLetter.task, queue });
  }
  return targets;
}

/**
 * The SQL of a dead letter's arguments from a job row (alias `alias`, after its update):
 * the shape of {@linkcode DeadLetter}.
 */
export function deadLetterArgs(alias: string): string {
  return `pg_catalog.jsonb_build_object('id', ${alias}.id::pg_catalog.text, 'task',
    ${alias}.task, 'queue', ` +
    `${alias}.queue, 'args', ${alias}.args, 'errors', ${alias}.errors)`;
}
