// The flows of the flows scenario (bench/flows.ts) and their bookkeeping, the same for every
// system: plain JavaScript so that the peers' Node drivers and akadze's Deno driver run this
// very code (bench/.peers/drivers/ holds a copy for Node).
//
// A shape is a list of steps 0..n-1; step i has `deps[i]`, the steps it waits for (all of a
// lower index). `tree: true` asks for the shape in which every step has at most one dependent
// (BullMQ's flows are trees: a job has one parent), when the shape has another form.

/**
 * The steps of a shape.
 *
 * @param {{ shape: "fanout" | "chain" | "dag", n: number, layers?: number, tree?: boolean }} spec
 *   fanout: n independent steps, then one that waits for all of them (n + 1 steps);
 *   chain: n steps, each waiting for the one before;
 *   dag: n steps in `layers` layers of n / layers; a step of layer L > 0 waits for two of
 *   layer L - 1 (the same position and the next, wrapping), or for one (the same position)
 *   when `tree` is asked for, which makes n / layers chains of `layers` steps.
 * @returns {{ deps: number[][], sinks: number[], edges: number }}
 */
export function flowShape(spec) {
  const deps = [];
  if (spec.shape === "fanout") {
    for (let i = 0; i < spec.n; i++) deps.push([]);
    deps.push(Array.from({ length: spec.n }, (_, i) => i));
  } else if (spec.shape === "chain") {
    for (let i = 0; i < spec.n; i++) deps.push(i === 0 ? [] : [i - 1]);
  } else if (spec.shape === "dag") {
    const layers = spec.layers ?? 20;
    const width = Math.max(1, Math.floor(spec.n / layers));
    for (let layer = 0; layer < layers; layer++) {
      for (let j = 0; j < width; j++) {
        if (layer === 0) deps.push([]);
        else {
          const below = (layer - 1) * width;
          const next = (j + 1) % width;
          deps.push(spec.tree || next === j ? [below + j] : [below + j, below + next]);
        }
      }
    }
  } else throw new Error(`unknown shape ${spec.shape}`);
  const dependents = new Uint32Array(deps.length);
  let edges = 0;
  for (const d of deps) {
    edges += d.length;
    for (const i of d) dependents[i]++;
  }
  const sinks = [];
  for (let i = 0; i < deps.length; i++) if (dependents[i] === 0) sinks.push(i);
  return { deps, sinks, edges };
}

/** Wall-clock milliseconds with sub-millisecond precision. */
const wallMs = () => performance.timeOrigin + performance.now();

/**
 * Handler bookkeeping: every step's start and end, steps started before their dependencies
 * ended (an error), repeats, and the hand-offs (dependency's handler end -> dependent's
 * handler start, the latest dependency for a step with several).
 *
 * @param {number[][]} deps
 */
export function createFlowLog(deps) {
  const n = deps.length;
  const start = new Float64Array(n);
  const end = new Float64Array(n);
  let started = 0, ended = 0, repeats = 0, early = 0;
  let allEnded;
  const done = new Promise((resolve) => (allEnded = resolve));
  return {
    /** Call first thing in the handler with the step's index. */
    begin(s) {
      const now = wallMs();
      if (start[s]) {
        repeats++;
        return;
      }
      start[s] = now;
      started++;
      for (const d of deps[s]) if (!end[d]) early++;
    },
    /** Call last thing in the handler. */
    finish(s) {
      if (end[s]) return;
      end[s] = wallMs();
      if (++ended === n) allEnded();
    },
    /** Resolves once every step's handler ended. */
    done,
    get started() {
      return started;
    },
    get ended() {
      return ended;
    },
    /** Hand-off samples and the errors found. */
    summary() {
      const handoffs = [];
      for (let s = 0; s < n; s++) {
        if (deps[s].length === 0 || !start[s]) continue;
        let latest = 0;
        for (const d of deps[s]) latest = Math.max(latest, end[d]);
        if (latest) handoffs.push(start[s] - latest);
      }
      handoffs.sort((a, b) => a - b);
      const at = (q) =>
        handoffs.length
          ? handoffs[Math.min(handoffs.length - 1, Math.floor(q * handoffs.length))]
          : null;
      return {
        steps: n,
        started,
        ended,
        repeats,
        started_early: early,
        handoff: {
          n: handoffs.length,
          p50: at(0.5),
          p99: at(0.99),
          max: handoffs.length ? handoffs[handoffs.length - 1] : null,
        },
      };
    },
  };
}
