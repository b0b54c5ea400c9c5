// The chaos soak's flow assertions (chaos/analyze.ts, judgeFlows) tell a sound run from one
// where a step started before its dependency ended, stayed waiting, or was cancelled
// without a failed dependency: each case is a database state as the soak reads it back.
// So does its longest stall (longestStall): ready work and no job finishing.
import { type DbState, judgeFlows, longestStall } from "../chaos/analyze.ts";
import { assertEquals } from "./assert.ts";

const at = (ms: number) => new Date(Date.UTC(2026, 0, 1) + ms);
type Job = DbState["jobs"][number];
const job = (id: string, state: string, errors: Job["errors"] = []): Job => ({
  id,
  task: "chaos.quick",
  state,
  attempt: 1,
  max_attempts: 25,
  run_count: 1,
  result: null,
  errors,
  created_at: at(0),
  finished_at: at(0),
  seen_at_drain: true,
});
const move = (jobId: string, from: string, to: string, ms: number) => ({
  job_id: jobId,
  old_state: from,
  new_state: to,
  old_run_count: 0,
  new_run_count: 1,
  old_attempt: 0,
  new_attempt: 0,
  old_worker: null,
  new_worker: null,
  error: null,
  message: null,
  limit_running: null,
  at: at(ms),
});
const start = (jobId: string, ms: number) => ({
  job_id: jobId,
  run_count: 1,
  nonce: "n",
  pid: 1,
  at: at(ms),
});
const STEPS: DbState["flowSteps"] = [
  { job_id: "1", flow: "f", step: "a", deps: [], expect: "succeed" },
  { job_id: "2", flow: "f", step: "b", deps: ["1"], expect: "succeed" },
];

/** Which of the three flow verdicts fail for this state. */
function failing(state: Partial<DbState>): string[] {
  const db: DbState = {
    jobs: [],
    expected: [],
    transitions: [],
    starts: [],
    commits: [],
    periodic: [],
    storedTexts: [],
    flowSteps: STEPS,
    ...state,
  };
  const transitionsOf = new Map<string, DbState["transitions"]>();
  for (const t of db.transitions) {
    transitionsOf.set(t.job_id, [...(transitionsOf.get(t.job_id) ?? []), t]);
  }
  const startsOf = new Map(db.starts.map((s) => [`${s.job_id}:${s.run_count}`, [s]]));
  return judgeFlows(db, new Map(db.jobs.map((j) => [j.id, j])), transitionsOf, startsOf)
    .filter((v) => !v.ok).map((v) => v.name);
}

const SOUND = [
  move("1", "running", "succeeded", 100),
  move("2", "waiting", "queued", 101),
  move("2", "queued", "running", 110),
  move("2", "running", "succeeded", 130),
];

Deno.test("the flow assertions pass a step that ran after its dependency ended", () => {
  assertEquals(
    failing({
      jobs: [job("1", "succeeded"), job("2", "succeeded")],
      transitions: SOUND,
      starts: [start("2", 120)],
    }),
    [],
  );
});

Deno.test("the flow assertions catch an early start, a step left waiting, a bad cancel", () => {
  assertEquals(
    failing({
      jobs: [job("1", "succeeded"), job("2", "succeeded")],
      transitions: SOUND,
      starts: [start("2", 50)],
    }),
    ["no flow step started before its dependencies were terminal"],
  );
  assertEquals(
    failing({
      jobs: [job("1", "succeeded"), job("2", "waiting")],
      transitions: [move("1", "running", "succeeded", 100)],
    }),
    [
      "no flow step left waiting once its dependencies were terminal",
      "every flow's final state is explained",
    ],
  );
  assertEquals(
    failing({
      jobs: [job("1", "succeeded"), job("2", "succeeded")],
      transitions: [move("1", "running", "succeeded", 100), move("2", "waiting", "queued", 5_000)],
    }),
    ["no flow step left waiting once its dependencies were terminal"],
  );
  assertEquals(
    failing({
      jobs: [
        job("1", "succeeded"),
        job("2", "cancelled", [{ error: "DependencyFailed", message: "x", dependency: "1" }]),
      ],
      transitions: [move("1", "running", "succeeded", 100), move("2", "waiting", "cancelled", 100)],
      flowSteps: [STEPS[0], { ...STEPS[1], expect: "cancel" }],
    }),
    ["every flow's final state is explained"],
  );
});

Deno.test("the longest stall counts only time with a job queued and due, and ends at a finish", () => {
  // Job 1 is queued from 0 and finishes at 1 s; job 2 is queued from 0, runs at 3 s and fails
  // its first run at 4 s, retried after a run_at 2 s on, and succeeds at 9 s; job 3 is
  // waiting (not ready) until 6 s, then queued until it succeeds at 7.5 s.
  const retry = { ...move("2", "running", "queued", 4_000), run_at: at(6_000) };
  const jobs = [job("1", "succeeded"), job("2", "succeeded"), job("3", "succeeded")];
  const transitions = [
    move("1", "queued", "running", 500),
    move("1", "running", "succeeded", 1_000),
    move("2", "queued", "running", 3_000),
    retry,
    move("2", "queued", "running", 8_000),
    move("2", "running", "succeeded", 9_000),
    move("3", "waiting", "queued", 6_000),
    move("3", "queued", "running", 7_000),
    move("3", "running", "succeeded", 7_500),
  ];
  const from = at(0).getTime();
  // Ready: [0, 3 s] (jobs 1 and 2), then [6 s, 8 s] (jobs 2 and 3). Finishes at 1, 7.5, 9 s:
  // the longest stall is 1 s → 3 s, as long as 6 s → 7.5 s is not.
  assertEquals(longestStall({ jobs, transitions }, from, from + 10_000), {
    ms: 2_000,
    from: from + 1_000,
  });
  // Nothing ready: no stall, however long nothing finished.
  assertEquals(longestStall({ jobs: [], transitions: [] }, from, from + 10_000).ms, 0);
});
