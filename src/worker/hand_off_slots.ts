/**
 * Which successes keep their slot for the hand-off (migrations/0016_hand_off.sql): a success
 * of a task whose jobs have dependents keeps it while its outcome is written, so that the write
 * may start a dependent it makes ready in it. A kept slot is one the worker's claims cannot
 * fill meanwhile, so it is kept only where the writes hand jobs over: after a write that handed
 * fewer jobs than it had slots kept, a task's successes keep at most twice as many slots as it
 * handed, and at least one (the probe that tells when hand-offs resume). A fan-in's children,
 * whose one dependent waits for all of them, so free their slots at once, while a chain or a
 * layered DAG, whose writes use every kept slot, keeps them all.
 *
 * @module
 */

/** Per task: the slots its successes keep now, and how many they may keep. */
interface TaskSlots {
  kept: number;
  limit: number;
}

/** The hand-off's slot keeping of one worker. */
export class HandOffSlots {
  #tasks = new Map<string, TaskSlots>();
  /** The jobs whose success keeps a slot counted here, until their write ends. */
  #counted = new Set<string>();

  /** A job of `task` that finished here had dependents: its successes may keep slots. */
  learn(task: string): void {
    if (!this.#tasks.has(task)) this.#tasks.set(task, { kept: 0, limit: Infinity });
  }

  /** Whether the success of job `id` of `task` keeps its slot for its write's hand-off. */
  keep(task: string, id: string): boolean {
    const slots = this.#tasks.get(task);
    if (!slots || slots.kept >= slots.limit) return false;
    slots.kept++;
    this.#counted.add(id);
    return true;
  }

  /**
   * A write that kept slots for successes of `jobs` ended: the slots counted here are free
   * again (a slot kept for another reason, a limit key's, is not). `handed`: how many jobs it
   * handed over, or null when it failed (nothing learnt).
   */
  settle(jobs: readonly { id: string; task: string }[], handed: number | null): void {
    const tasks: string[] = [];
    for (const { id, task } of jobs) {
      if (!this.#counted.delete(id)) continue;
      tasks.push(task);
      const slots = this.#tasks.get(task);
      if (slots) slots.kept--;
    }
    if (handed === null) return;
    // Every kept slot used: keep as many as come; else about what the writes use.
    const limit = handed >= tasks.length ? Infinity : Math.max(1, 2 * handed);
    for (const task of new Set(tasks)) {
      const slots = this.#tasks.get(task);
      if (slots) slots.limit = limit;
    }
  }
}
