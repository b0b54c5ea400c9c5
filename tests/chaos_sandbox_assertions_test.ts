// The chaos soak's sandbox assertions (chaos/analyze.ts, judgeSandboxes) tell a sound run
// from one where a sandbox crash charged a job beside it, a crashing job's errors do not
// name its crash, or a CPU-bound job's worker went without a heartbeat or a turn of its
// loop: each case is a database state, a fault log and samples as the soak reads them.
import {
  type DbState,
  judgeSandboxes,
  type LoopBlockRecord,
  type RunData,
} from "../chaos/analyze.ts";
import type { WorkerProcess } from "../chaos/fleet.ts";
import { assertEquals } from "./assert.ts";

const T0 = Date.UTC(2026, 0, 1);
const at = (ms: number) => new Date(T0 + ms);
const W = "host:100:0123abcd";
const CRASHED = "the handler's process exited with code 3; the run failed and its sandbox " +
  "process was replaced";
type Job = DbState["jobs"][number];
type Transition = DbState["transitions"][number];

const job = (id: string, task: string, state: string, extra: Partial<Job> = {}): Job => ({
  id,
  task,
  state,
  attempt: 1,
  max_attempts: 1,
  run_count: 1,
  result: null,
  errors: [],
  created_at: at(0),
  finished_at: at(0),
  seen_at_drain: true,
  ...extra,
});
const run = (
  jobId: string,
  from: number,
  to: number,
  end: string,
  error?: string,
): Transition[] => [
  transition(jobId, "queued", "running", from, W),
  {
    ...transition(jobId, "running", end, to, W),
    error: error ?? null,
    message: error ? CRASHED : null,
  },
];
function transition(jobId: string, from: string, to: string, ms: number, worker: string) {
  const claim = to === "running";
  return {
    job_id: jobId,
    old_state: from,
    new_state: to,
    old_run_count: claim ? 0 : 1,
    new_run_count: 1,
    old_attempt: 0,
    new_attempt: 0,
    old_worker: claim ? null : worker,
    new_worker: worker,
    error: null,
    message: null,
    limit_running: null,
    at: at(ms),
  } as Transition;
}
const worker: WorkerProcess = {
  idx: 1,
  pid: 100,
  startedAt: T0,
  exitedAt: null,
  code: null,
  signal: null,
  endedBy: null,
  stopped: false,
  peakRssKb: 0,
  stdoutPath: "",
  stderrPath: "",
  done: Promise.resolve(),
  send: () => {},
};

interface Case {
  jobs?: Job[];
  transitions?: Transition[];
  ages?: number[];
  faults?: RunData["faults"];
  blocks?: LoopBlockRecord[];
  why?: [string, string][];
}

/** Which of the three sandbox verdicts fail. */
function failing(c: Case = {}): string[] {
  // A crash from 0 to 1.5 s with a quick job beside it, a CPU-bound job from 2 s to 6 s.
  const jobs = c.jobs ?? [
    job("1", "chaos.crash", "failed", {
      how: "exit",
      errors: [{ error: "SandboxCrashed", message: CRASHED }],
    }),
    job("2", "chaos.quick", "succeeded"),
    job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 4_000 } }),
  ];
  const transitions = c.transitions ?? [
    ...run("1", 0, 1_500, "failed", "SandboxCrashed"),
    ...run("2", 100, 900, "succeeded"),
    ...run("3", 2_000, 6_000, "succeeded"),
  ];
  const db: DbState = {
    jobs,
    expected: [],
    transitions,
    starts: [],
    commits: [],
    periodic: [],
    flowSteps: [],
    storedTexts: [],
  };
  const ages = c.ages ?? [400, 200, 500, 300];
  const whyRun = new Map([["1:1", "planned sandbox crash"], ...(c.why ?? [])]);
  const data = {
    db,
    faults: c.faults ?? [],
    outages: [],
    workers: [worker],
    heartbeatTtl: 3_000,
    heartbeatInterval: 500,
    crashHeapMb: 32,
    samples: {
      count: ages.length,
      failed: 0,
      lockWaits: [],
      maxRunning: {},
      uniqueViolations: [],
      heartbeats: ages.map((age, i) => ({ at: T0 + 2_500 + i * 1_000, ages: { [W]: age } })),
    },
  };
  return judgeSandboxes(data, whyRun, c.blocks ?? []).filter((v) => !v.ok).map((v) => v.name);
}

const BYSTANDERS = "a sandbox crash charged only its own job";
const CRASHERS =
  "every crashing sandboxed job failed within its attempts, its errors naming the crash";
const CPU = "CPU-bound sandboxed jobs succeeded, their workers' heartbeat unaffected";

Deno.test("the sandbox assertions pass a crash that charged only its own job and a CPU-bound job beside a live loop", () => {
  assertEquals(failing(), []);
});

Deno.test("the sandbox assertions catch a job charged by a crash beside it", () => {
  const crashed = { error: "SandboxCrashed", message: CRASHED };
  assertEquals(
    failing({
      jobs: [
        job("1", "chaos.crash", "failed", { how: "exit", errors: [crashed] }),
        job("2", "chaos.quick", "failed", { errors: [crashed] }),
        job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 4_000 } }),
      ],
      transitions: [
        ...run("1", 0, 1_500, "failed", "SandboxCrashed"),
        ...run("2", 100, 1_500, "failed", "SandboxCrashed"),
        ...run("3", 2_000, 6_000, "succeeded"),
      ],
    }),
    [BYSTANDERS],
  );
});

Deno.test("the sandbox assertions leave a crashing job beside another to assertion 27", () => {
  const crashed = { error: "SandboxCrashed", message: CRASHED };
  assertEquals(
    failing({
      jobs: [
        job("1", "chaos.crash", "failed", { how: "exit", errors: [crashed] }),
        job("4", "chaos.crash", "failed", { how: "exit", errors: [crashed] }),
        job("2", "chaos.quick", "succeeded"),
        job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 4_000 } }),
      ],
      transitions: [
        ...run("1", 0, 1_500, "failed", "SandboxCrashed"),
        ...run("4", 200, 3_000, "failed", "SandboxCrashed"),
        ...run("2", 100, 900, "succeeded"),
        ...run("3", 2_000, 6_000, "succeeded"),
      ],
      why: [["4:1", "planned sandbox crash"]],
    }),
    [],
  );
});

Deno.test("the sandbox assertions catch a crashing job whose error does not name its crash, or that did not fail", () => {
  const cpu = job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 4_000 } });
  assertEquals(
    failing({
      jobs: [
        job("1", "chaos.crash", "failed", {
          how: "oom",
          errors: [{ error: "SandboxCrashed", message: CRASHED }],
        }),
        job("2", "chaos.quick", "succeeded"),
        cpu,
      ],
    }),
    [CRASHERS],
  );
  assertEquals(
    failing({
      jobs: [
        job("1", "chaos.crash", "succeeded", { how: "exit" }),
        job("2", "chaos.quick", "succeeded"),
        cpu,
      ],
    }),
    [CRASHERS],
  );
});

Deno.test("the sandbox assertions catch a CPU-bound job's worker without a heartbeat or a turn of its loop, unless a fault explains it", () => {
  assertEquals(failing({ ages: [400, 3_200, 500] }), [CPU]);
  // Frozen by a SIGSTOP meanwhile: not the job's doing.
  const stop = [
    { at: T0 + 2_800, kind: "stop" as const, idx: 1, pid: 100 },
    { at: T0 + 3_400, kind: "cont" as const, idx: 1, pid: 100 },
  ];
  assertEquals(failing({ ages: [400, 3_200, 500], faults: stop }), []);
  const block = { idx: 1, at: T0 + 5_000, blockedMs: 1_200 };
  assertEquals(failing({ blocks: [block] }), [CPU]);
  assertEquals(failing({ blocks: [{ ...block, at: T0 + 3_300 }], faults: stop }), []);
  // Too short to have held the loop past the TTL, and a job that failed.
  assertEquals(
    failing({
      jobs: [
        job("1", "chaos.crash", "failed", {
          how: "exit",
          errors: [{ error: "SandboxCrashed", message: CRASHED }],
        }),
        job("2", "chaos.quick", "succeeded"),
        job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 2_000 } }),
      ],
    }),
    [CPU],
  );
});

Deno.test("the sandbox assertions take a crashing job's rescue during a SIGSTOP for a fault, not a charge for blocking the loop", () => {
  // Run 2 rescued while its worker was stopped; the woken worker re-words the rescue's entry.
  const rescue = {
    ...transition("1", "running", "queued", 6_000, W),
    old_run_count: 2,
    new_run_count: 2,
    new_attempt: 2,
    error: "WorkerLost",
    message: `worker ${W} stopped heartbeating during the run`,
  };
  const state = (reworded: { error: string; message: string }): Case => ({
    jobs: [
      job("1", "chaos.crash", "failed", {
        how: "exit",
        attempt: 1,
        max_attempts: 3,
        run_count: 3,
        errors: [
          { error: "SandboxCrashed", message: CRASHED },
          { ...reworded, worker: W, attempt: 2 },
          { error: "SandboxCrashed", message: CRASHED },
        ],
      }),
      job("2", "chaos.quick", "succeeded"),
      job("3", "chaos.cpu", "succeeded", { result: { runCount: 1, spunMs: 4_000 } }),
    ],
    transitions: [
      ...run("1", 0, 1_500, "queued", "SandboxCrashed"),
      { ...transition("1", "queued", "running", 2_000, W), old_run_count: 1, new_run_count: 2 },
      rescue,
      ...run("2", 100, 900, "succeeded"),
      ...run("3", 2_000, 6_000, "succeeded"),
    ],
    why: [["1:2", "rescued after SIGSTOP"]],
  });
  const refunded = `worker ${W} stopped heartbeating during the run: its event loop was held ` +
    "for 4.5 s; this attempt is not counted";
  assertEquals(failing(state({ error: "WorkerLost", message: refunded })), []);
  const charged = `the run blocked the event loop of worker ${W} for 4.5 s, past its heartbeat ` +
    "lease, so the job was rescued as from a dead worker; run CPU-bound work outside the " +
    "worker's loop";
  assertEquals(failing(state({ error: "LoopBlocked", message: charged })), [CRASHERS]);
});
