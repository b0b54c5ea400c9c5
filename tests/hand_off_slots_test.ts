// Which successes keep their slot for the hand-off (src/worker/hand_off_slots.ts): a task's,
// once it is known to have dependents, as long as its writes hand jobs over.
import { HandOffSlots } from "../src/worker/hand_off_slots.ts";
import { assertEquals } from "./assert.ts";

let nextId = 0;

/** Of `n` successes of `task`, the jobs that keep their slot now. */
function keepMany(slots: HandOffSlots, task: string, n: number): { id: string; task: string }[] {
  const kept = [];
  for (let i = 0; i < n; i++) {
    const id = String(++nextId);
    if (slots.keep(task, id)) kept.push({ id, task });
  }
  return kept;
}

Deno.test("a success keeps its slot only once its task is known to have dependents", () => {
  const slots = new HandOffSlots();
  assertEquals(slots.keep("t", "1"), false);
  slots.learn("t");
  assertEquals(keepMany(slots, "t", 500).length, 500);
  assertEquals(slots.keep("other", "2"), false);
});

Deno.test("after a write that handed nothing (a fan-in's children), a task keeps one slot, not all", () => {
  const slots = new HandOffSlots();
  slots.learn("child");
  slots.settle(keepMany(slots, "child", 500), 0);
  // One probe at a time; the others free their slots at once.
  const probe = keepMany(slots, "child", 500);
  assertEquals(probe.length, 1);
  slots.settle(probe, 0);
  const next = keepMany(slots, "child", 3);
  assertEquals(next.length, 1);
  // The probe's write hands the parent: every kept slot was used, so all are kept again.
  slots.settle(next, 1);
  assertEquals(keepMany(slots, "child", 500).length, 500);
});

Deno.test("a write that uses every kept slot (a chain, a DAG's layer) keeps them all; one that uses a few keeps about as many", () => {
  const slots = new HandOffSlots();
  slots.learn("step");
  slots.settle(keepMany(slots, "step", 500), 500);
  const all = keepMany(slots, "step", 500);
  assertEquals(all.length, 500);
  slots.settle(all, 10);
  const some = keepMany(slots, "step", 500);
  assertEquals(some.length, 20);
  // A failed write frees its slots and teaches nothing.
  slots.settle(some, null);
  assertEquals(keepMany(slots, "step", 500).length, 20);
});

Deno.test("a write's slots kept for another reason (a limit key's) are not counted here", () => {
  const slots = new HandOffSlots();
  slots.learn("step");
  const kept = keepMany(slots, "step", 2);
  // The write also ended a keyed job's run whose slot the worker kept for its key.
  slots.settle([...kept, { id: "keyed", task: "step" }], 0);
  // Two counted slots freed (not three): one probe is kept, as after any write that handed none.
  assertEquals(keepMany(slots, "step", 5).length, 1);
});
