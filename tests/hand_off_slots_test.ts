// Which successes keep their slot for the hand-off (src/worker/hand_off_slots.ts): a task's,
// once it is known to have dependents, as long as its writes hand jobs over.
import { HandOffSlots } from "../src/worker/hand_off_slots.ts";
import { assertEquals } from "./assert.ts";

/** How many of `n` successes of `task` keep their slot now. */
function keepMany(slots: HandOffSlots, task: string, n: number): number {
  let kept = 0;
  for (let i = 0; i < n; i++) if (slots.keep(task)) kept++;
  return kept;
}

Deno.test("a success keeps its slot only once its task is known to have dependents", () => {
  const slots = new HandOffSlots();
  assertEquals(slots.keep("t"), false);
  slots.learn("t");
  assertEquals(keepMany(slots, "t", 500), 500);
  assertEquals(slots.keep("other"), false);
});

Deno.test("after a write that handed nothing (a fan-in's children), a task keeps one slot, not all", () => {
  const slots = new HandOffSlots();
  slots.learn("child");
  assertEquals(keepMany(slots, "child", 500), 500);
  slots.settle(Array(500).fill("child"), 0);
  // One probe at a time; the others free their slots at once.
  assertEquals(keepMany(slots, "child", 500), 1);
  slots.settle(["child"], 0);
  assertEquals(keepMany(slots, "child", 3), 1);
  // The probe's write hands the parent: every kept slot was used, so all are kept again.
  slots.settle(["child"], 1);
  assertEquals(keepMany(slots, "child", 500), 500);
});

Deno.test("a write that uses every kept slot (a chain, a DAG's layer) keeps them all; one that uses a few keeps about as many", () => {
  const slots = new HandOffSlots();
  slots.learn("step");
  assertEquals(keepMany(slots, "step", 500), 500);
  slots.settle(Array(500).fill("step"), 500);
  assertEquals(keepMany(slots, "step", 500), 500);
  slots.settle(Array(500).fill("step"), 10);
  assertEquals(keepMany(slots, "step", 500), 20);
  // A failed write frees its slots and teaches nothing.
  slots.settle(Array(20).fill("step"), null);
  assertEquals(keepMany(slots, "step", 500), 20);
});
