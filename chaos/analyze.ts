// The assertions of the chaos soak, computed from what the harness saw (faults, outages,
// processes, samples, logs) and from the database after the drain (jobs, the producers'
// `expected` rows, the execution ledger and the trigger's transition log).
import { SANDBOX_CRASHED } from "../src/worker/sandbox_pool.ts";
import { pidOfWorkerId, type WorkerProcess } from "./fleet.ts";
import { COMPLETE_TX_KINDS, type Kind, TASKS } from "./tasks.ts";

/** A fault the harness injected. Times are epoch ms. */
export interface Fault {
  at: number;
  kind: "kill" | "stop" | "cont" | "terminate" | "restart" | "halt" | "failover" | "migrate";
  /** The worker hit (kill, stop, cont, terminate). */
  idx?: number;
  pid?: number;
  /** Connections terminated (terminate). */
  count?: number;
  /** Human-readable detail for the fault log. */
  detail?: string;
}

/** The outcome a flow step must reach: by its task, or cancelled by a failed dependency. */
export type FlowExpect = "succeed" | "fail" | "cancel";

/** A window during which the database refused or dropped connections. */
export interface Outage {
  kind: "restart" | "halt" | "failover";
  from: number;
  to: number;
}

/** One assertion's verdict. */
export interface Verdict {
  ok: boolean;
  name: string;
  detail: string;
  /** Extra lines (offenders), printed indented. */
  lines?: string[];
}

/** Rows read back from the database after the drain. */
export interface DbState {
  jobs: {
    id: string;
    task: string;
    state: string;
    attempt: number;
    max_attempts: number;
    run_count: number;
    result: { nonce?: string; runCount?: number; spunMs?: number } | null;
    /** `worker` and `attempt`: the run that ended with the error (absent in test data). */
    errors: {
      error: string;
      message: string;
      dependency?: string;
      worker?: string;
      attempt?: number;
    }[];
    created_at: Date;
    finished_at: Date | null;
    /** Whether the count that ended the drain saw this row version (true without a drain). */
    seen_at_drain: boolean;
    /** How a `chaos.crash` job crashes its sandbox process ("exit" or "oom"). */
    how?: string | null;
  }[];
  expected: { seq: number; kind: Kind; job_id: string; limit_key: string | null }[];
  transitions: {
    job_id: string;
    old_state: string;
    new_state: string;
    old_run_count: number;
    new_run_count: number;
    old_attempt: number;
    new_attempt: number;
    old_worker: string | null;
    new_worker: string | null;
    error: string | null;
    message: string | null;
    limit_running: number | null;
    /** The job's run_at after the change (absent in hand-made test data). */
    run_at?: Date | null;
    at: Date;
  }[];
  starts: { job_id: string; run_count: number; nonce: string; pid: number; at: Date }[];
  commits: { job_id: string; run_count: number; nonce: string; pid: number }[];
  /** The fires of the `chaos.tick` schedule. */
  periodic: { fire_at: Date; job_id: string | null }[];
  /** The steps of the flows: each one's dependencies (job ids) and expected outcome. */
  flowSteps: { job_id: string; flow: string; step: string; deps: string[]; expect: FlowExpect }[];
  /** Every stored error message and result, as text (scanned for secrets). */
  storedTexts: string[];
}

/** Everything the analysis needs. */
export interface RunData {
  jobsPlanned: number;
  heartbeatInterval: number;
  heartbeatTtl: number;
  rescueSlack: number;
  /** Added to the rescue bound for each outage a rescue waited through (reconnect). */
  reconnectAllowance: number;
  /** The interval of the `chaos.tick` schedule, ms. */
  tickEvery: number;
  /** maxRunning per limit key. */
  limits: Record<string, number>;
  /** Jobs per second the producers offered. */
  offeredRate: number;
  producerErrors: string[];
  duplicatesHandled: number;
  faults: Fault[];
  outages: Outage[];
  workers: WorkerProcess[];
  samples: {
    count: number;
    failed: number;
    /** Lock waits longer than a second seen by the sampler, with their blockers. */
    lockWaits: string[];
    maxRunning: Record<string, number>;
    uniqueViolations: string[];
    /** Each worker's heartbeat age (ms) by worker id, at each sample (database clock, ms). */
    heartbeats: { at: number; ages: Record<string, number> }[];
  };
  chaos: { from: number; to: number; terminalAtEnd: number };
  drained: boolean;
  /** When the drain found every job finished (epoch ms). */
  drainedAt: number;
  finalStopFrom: number;
  secrets: { name: string; value: string }[];
  /** Error messages the harness itself caught (also scanned for secrets). */
  harnessMessages: string[];
  rssLimitMb: number;
  /** The failover phase ran: its fault must be in the log. */
  failover: boolean;
  /** The migrate phase, when it ran: the version the run started at and what migrate did. */
  migration?: { from: string; at: number | null; to: number | null; error: string | null };
  /** The bound on the longest stall (no job finishing while work was ready), ms. */
  stallBound: number;
  /** The heap cap of `chaos.crash`'s sandbox process, MiB. */
  crashHeapMb: number;
  db: DbState;
}

const KIND_OF_TASK = new Map<string, Kind>(
  Object.entries(TASKS).map(([kind, task]) => [task, kind as Kind]),
);
/** How far before a run's claim a terminated connection or an outage may explain its error. */
const LOOKBACK_MS = 3_000;
/**
 * Errors of a connection the server closed (terminated backend, shutdown, reset), and of one
 * akadze reopened after that (src/startup_guard.ts).
 */
const CONNECTION_LOST =
  /terminating connection|57P0[123]|CONNECTION_(CLOSED|ENDED|DESTROYED)|ECONNRESET|EPIPE|ECONNREFUSED|ended by the other party|reopened after its session ended/;

const ms = (d: Date) => d.getTime();
const s = (n: number, digits = 1) => `${(n / 1000).toFixed(digits)} s`;

/** Run every assertion. */
export async function analyze(run: RunData): Promise<Verdict[]> {
  const { db } = run;
  const verdicts: Verdict[] = [];
  const add = (ok: boolean, name: string, detail: string, lines: string[] = []) =>
    verdicts.push({ ok, name, detail, lines: lines.slice(0, 25) });
  const jobs = new Map(db.jobs.map((j) => [j.id, j]));
  const kindOf = (task: string) => KIND_OF_TASK.get(task);
  const byPid = new Map(run.workers.map((w) => [w.pid, w]));
  const startsOf = new Map<string, DbState["starts"]>();
  for (const row of db.starts) {
    const key = `${row.job_id}:${row.run_count}`;
    startsOf.set(key, [...(startsOf.get(key) ?? []), row]);
  }
  const transitionsOf = new Map<string, DbState["transitions"]>();
  for (const t of db.transitions) {
    transitionsOf.set(t.job_id, [...(transitionsOf.get(t.job_id) ?? []), t]);
  }

  // 1. Enqueued: every planned job, by the producers, without errors.
  add(
    db.expected.length === run.jobsPlanned && run.producerErrors.length === 0,
    "every planned job was enqueued",
    `${db.expected.length} of ${run.jobsPlanned} jobs enqueued in the producers' transactions ` +
      `(${run.duplicatesHandled} DuplicateJob refusals handled inside them), ` +
      `${run.producerErrors.length} producer errors`,
    run.producerErrors,
  );

  // 2. Nothing lost, nothing invented.
  const missing = db.expected.filter((e) => !jobs.has(e.job_id));
  const expectedIds = new Set(db.expected.map((e) => e.job_id));
  const fired = new Set(db.periodic.map((p) => p.job_id));
  const ticks = db.jobs.filter((j) => kindOf(j.task) === "tick");
  const extra = db.jobs.filter((j) => !expectedIds.has(j.id) && !fired.has(j.id));
  add(
    missing.length === 0 && extra.length === 0,
    "no job lost, none invented",
    `${db.jobs.length} job rows: ${db.expected.length} enqueued by the producers, ` +
      `${ticks.length} by the schedule; ${missing.length} missing, ${extra.length} unexpected`,
    [
      ...missing.map((e) => `missing: seq ${e.seq} job ${e.job_id}`),
      ...extra.map((j) => `unexpected: job ${j.id} ${j.task}`),
    ],
  );

  // 3. Terminal.
  const byState: Record<string, number> = {};
  for (const j of db.jobs) byState[j.state] = (byState[j.state] ?? 0) + 1;
  // A schedule keeps firing until the workers stop: a tick enqueued after the drain may
  // still be queued, for the next worker to run. "After" is by the drain's snapshot, not by
  // created_at: a tick's transaction can start before the drain's count and commit after it.
  const late = (j: DbState["jobs"][number]) =>
    kindOf(j.task) === "tick" && j.state === "queued" && !j.seen_at_drain;
  const active = db.jobs.filter((j) =>
    (j.state === "waiting" || j.state === "queued" || j.state === "running") && !late(j)
  );
  const leftTicks = db.jobs.filter(late).length;
  add(
    active.length === 0,
    "every job is terminal, none running",
    `${Object.entries(byState).map(([k, v]) => `${v} ${k}`).join(", ")}` +
      (leftTicks ? ` (${leftTicks} queued: ticks fired after the drain)` : "") +
      (run.drained ? "" : " (the drain timed out)"),
    active.map((j) => `job ${j.id} ${j.task} is ${j.state} (run ${j.run_count})`),
  );

  // 4. Outcomes as planned: doomed jobs fail, every other job succeeds.
  const wrong: string[] = [];
  const tally = { succeed: 0, succeeded: 0, doomed: 0, failed: 0 };
  const stepOf = new Map(db.flowSteps.map((f) => [f.job_id, f]));
  for (const j of db.jobs) {
    // A flow step cancelled by its failed dependency is judged with the flows (4c), a job
    // that crashes its sandbox with the sandboxes (27).
    if (stepOf.get(j.id)?.expect === "cancel" || kindOf(j.task) === "crash") continue;
    const doomed = kindOf(j.task) === "doomed";
    if (doomed) {
      tally.doomed++;
      if (j.state === "failed" && j.attempt === j.max_attempts) tally.failed++;
      else wrong.push(`doomed job ${j.id} is ${j.state} (attempt ${j.attempt}/${j.max_attempts})`);
    } else if (!late(j)) {
      tally.succeed++;
      if (j.state === "succeeded") tally.succeeded++;
      else {
        wrong.push(
          `job ${j.id} ${j.task} is ${j.state} (attempt ${j.attempt}/${j.max_attempts}, ` +
            `last error ${j.errors.at(-1)?.error ?? "none"})`,
        );
      }
    }
  }
  add(
    wrong.length === 0,
    "every job expected to succeed succeeded",
    `${tally.succeeded}/${tally.succeed} succeeded; ${tally.failed}/${tally.doomed} always-failing ` +
      `jobs failed after their ${tally.doomed ? "last" : ""} attempt`,
    wrong,
  );

  // 4b. The schedule: every fire enqueued once across all workers, none missed for long.
  const fires = db.periodic.map((p) => ms(p.fire_at)).sort((a, b) => a - b);
  const linked = db.periodic.filter((p) => p.job_id !== null).length;
  const gaps = fires.slice(1).map((at, i) => at - fires[i]);
  const maxGap = Math.max(0, ...gaps);
  const window = run.chaos.to - run.chaos.from;
  const unlinked = ticks.filter((j) => !fired.has(j.id));
  add(
    ticks.length === linked && unlinked.length === 0 && fires.length >= window / run.tickEvery / 2,
    "every schedule fire was enqueued once across all workers",
    `${fires.length} fires of a ${s(run.tickEvery)} schedule, ${ticks.length} tick jobs, ` +
      `${linked} linked fires; longest gap between fires ${s(maxGap)}`,
    unlinked.map((j) => `tick job ${j.id} has no periodic_runs row`),
  );

  // 4c. Flows: steps ran only after their dependencies were terminal, left waiting in the
  // transaction that made the last one terminal, and ended as planned.
  verdicts.push(...judgeFlows(db, jobs, transitionsOf, startsOf));

  // 5. One execution per claim at most.
  const twice = [...startsOf.entries()].filter(([, rows]) => rows.length > 1);
  add(
    twice.length === 0,
    "each claim ran its handler at most once",
    `${db.starts.length} executions recorded for ${sum(db.jobs.map((j) => j.run_count))} claims; ` +
      `${twice.length} claims ran twice`,
    twice.map(([key, rows]) => `job:run ${key} ran ${rows.length} times`),
  );

  // 6. Every run beyond the first explained.
  const reasons: Record<string, number> = {};
  /** Why each run that did not succeed ended, by `job:run` (for the sandbox assertions). */
  const whyRun = new Map<string, string>();
  const unexplained: string[] = [];
  const latencies: { job: string; latency: number; down: number; cause: string }[] = [];
  let reruns = 0;
  for (const j of db.jobs) {
    const ts = transitionsOf.get(j.id) ?? [];
    const claims = new Map(
      ts.filter((t) => t.new_state === "running").map((t) => [t.new_run_count, t]),
    );
    const ends = new Map(
      ts.filter((t) => t.old_state === "running").map((t) => [t.old_run_count, t]),
    );
    const kind = kindOf(j.task);
    for (let r = 1; r <= j.run_count; r++) {
      const end = ends.get(r);
      const claim = claims.get(r);
      if (!end || end.new_state === "succeeded") continue;
      const last = r === j.run_count;
      if (
        last && kind === "doomed" && end.new_state === "failed" && end.error === "PlannedFailure"
      ) {
        whyRun.set(`${j.id}:${r}`, "planned failure");
        continue;
      }
      if (!last) reruns++;
      const started = startsOf.has(`${j.id}:${r}`);
      const why = explain(run, end, claim, kind, byPid, started);
      whyRun.set(`${j.id}:${r}`, why.reason);
      reasons[why.reason] = (reasons[why.reason] ?? 0) + 1;
      if (why.reason === "unexplained") {
        unexplained.push(
          `job ${j.id} ${j.task} run ${r} on ${end.old_worker ?? "?"}: ${end.old_state}→` +
            `${end.new_state} at ${new Date(end.at).toISOString()} ` +
            `(${end.error ?? "no error"}${end.message ? `: ${end.message.slice(0, 120)}` : ""})`,
          ...await workerAround(run, byPid, end.old_worker, new Date(end.at).getTime()),
        );
      }
      if (why.latency !== undefined) {
        latencies.push({ job: j.id, latency: why.latency, down: why.down ?? 0, cause: why.reason });
      }
    }
  }
  const reasonText = Object.entries(reasons).sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${v} ${k}`).join(", ");
  add(
    unexplained.length === 0,
    "every execution beyond the first is explained",
    `${reruns} reruns in ${db.jobs.filter((j) => j.run_count > 1).length} jobs; runs that ` +
      `did not succeed: ${reasonText || "none"}`,
    unexplained,
  );

  // 7. completeTx: exactly once per succeeded job, from its last run.
  const commitsOf = new Map<string, DbState["commits"]>();
  for (const c of db.commits) commitsOf.set(c.job_id, [...(commitsOf.get(c.job_id) ?? []), c]);
  const txProblems: string[] = [];
  let txJobs = 0;
  for (const j of db.jobs) {
    const kind = kindOf(j.task);
    if (!kind || !COMPLETE_TX_KINDS.includes(kind)) {
      if (commitsOf.has(j.id)) txProblems.push(`job ${j.id} ${j.task} has completeTx rows`);
      continue;
    }
    txJobs++;
    const commits = commitsOf.get(j.id) ?? [];
    const want = j.state === "succeeded" ? 1 : 0;
    if (commits.length !== want) {
      txProblems.push(`job ${j.id} ${j.task} is ${j.state} with ${commits.length} completeTx rows`);
    }
  }
  add(
    txProblems.length === 0,
    "completeTx wrote exactly once per succeeded job",
    `${db.commits.length} completeTx rows for ` +
      `${db.jobs.filter((j) => j.state === "succeeded" && isTx(kindOf(j.task))).length} ` +
      `succeeded completeTx jobs (${txJobs} such jobs in all)`,
    txProblems,
  );

  // 8. Fencing: the outcome stored is that of the job's last run.
  const stale: string[] = [];
  const lastStartOf = new Map<string, number>();
  for (const r of db.starts) {
    lastStartOf.set(r.job_id, Math.max(lastStartOf.get(r.job_id) ?? 0, r.run_count));
  }
  let checked = 0;
  for (const j of db.jobs) {
    if (j.state !== "succeeded") continue;
    checked++;
    const lastStart = lastStartOf.get(j.id) ?? 0;
    const mine = startsOf.get(`${j.id}:${j.run_count}`)?.[0];
    let written: { nonce?: string; runCount?: number } | null;
    if (isTx(kindOf(j.task))) {
      const c = commitsOf.get(j.id)?.[0];
      written = c ? { nonce: c.nonce, runCount: c.run_count } : null;
    } else if (kindOf(j.task) === "cpu" && mine && j.result) {
      // A sandboxed handler cannot see the nonce its worker recorded: its run count tells.
      written = { ...j.result, nonce: mine.nonce };
    } else {
      written = j.result;
    }
    if (
      lastStart !== j.run_count || !mine || !written || written.runCount !== j.run_count ||
      written.nonce !== mine.nonce
    ) {
      stale.push(
        `job ${j.id} ${j.task}: row run ${j.run_count}, ledger last run ${lastStart}, outcome ` +
          `from run ${written?.runCount ?? "?"} nonce ${written?.nonce ?? "?"} ` +
          `(last run's nonce ${mine?.nonce ?? "?"})`,
      );
    }
  }
  add(
    stale.length === 0,
    "no outcome overwritten by a stale run",
    `${checked} succeeded jobs: the ledger's last run, the row's run_count and the stored ` +
      `outcome's run and nonce agree for ${checked - stale.length}`,
    stale,
  );

  // 9. Attempts.
  const over = db.jobs.filter((j) => j.attempt > j.max_attempts || j.attempt > j.run_count);
  add(
    over.length === 0,
    "attempt ≤ max_attempts (and ≤ run_count)",
    `max attempt spent ${Math.max(0, ...db.jobs.map((j) => j.attempt))}, ` +
      `max run_count ${Math.max(0, ...db.jobs.map((j) => j.run_count))}`,
    over.map((j) => `job ${j.id}: attempt ${j.attempt}/${j.max_attempts}, runs ${j.run_count}`),
  );

  // 10. maxRunning.
  const atClaim: Record<string, number> = {};
  const limitKeyOf = new Map(db.expected.map((e) => [e.job_id, e.limit_key]));
  for (const t of db.transitions) {
    const key = limitKeyOf.get(t.job_id);
    if (t.limit_running === null || !key) continue;
    atClaim[key] = Math.max(atClaim[key] ?? 0, t.limit_running);
  }
  const limitLines: string[] = [];
  let limitOk = run.samples.count > 0;
  for (const [key, max] of Object.entries(run.limits)) {
    const sampled = run.samples.maxRunning[key] ?? 0;
    const claimed = atClaim[key] ?? 0;
    if (sampled > max || claimed > max) limitOk = false;
    limitLines.push(`${key} ≤ ${max}: sampled max ${sampled}, at-claim max ${claimed}`);
  }
  add(
    limitOk,
    "maxRunning never exceeded",
    `${limitLines.join("; ")} (${run.samples.count} samples every ~50 ms, ` +
      `${run.samples.failed} failed during outages)`,
  );

  // 11. uniqueKey.
  add(
    run.samples.uniqueViolations.length === 0 && run.samples.count > 0,
    "uniqueKey never had two active jobs",
    `${run.samples.uniqueViolations.length} violations in ${run.samples.count} samples`,
    run.samples.uniqueViolations,
  );

  // 12. Rescue latency: from the kill (or stop) to the rescue, not counting the time the
  // database was down (no worker can rescue then; the restart and the halt are separate
  // faults), plus one reconnect per outage.
  const bound = run.heartbeatTtl + run.heartbeatInterval + run.rescueSlack;
  const effective = (m: { latency: number; down: number }) =>
    m.down > 0 ? m.latency - m.down - run.reconnectAllowance : m.latency;
  const measured = latencies.sort((a, b) => effective(b) - effective(a));
  const raw = [...latencies].sort((a, b) => b.latency - a.latency)[0];
  add(
    measured.length > 0 && effective(measured[0]) <= bound,
    "slowest rescue within heartbeatTtl + heartbeatInterval + slack",
    measured.length === 0
      ? "no rescue of a killed or stopped worker's job was observed"
      : `${measured.length} rescues after kill/stop; slowest ${s(effective(measured[0]), 2)}` +
        `${
          measured[0].down > 0
            ? ` (${s(measured[0].latency, 2)} with the database down ${s(measured[0].down, 2)})`
            : ""
        }, ` +
        `median ${s(effective(measured[Math.floor(measured.length / 2)]), 2)}, slowest raw ` +
        `${s(raw.latency, 2)}; bound ${s(bound, 2)} ` +
        `(${s(run.heartbeatTtl)} + ${s(run.heartbeatInterval)} + ${s(run.rescueSlack)})`,
    measured.filter((m) => effective(m) > bound).map((m) =>
      `job ${m.job}: ${m.cause} after ${s(m.latency, 2)} (database down ${s(m.down, 2)} of it)`
    ),
  );

  // 13. The chaos was real.
  const count = (kind: Fault["kind"]) => run.faults.filter((f) => f.kind === kind).length;
  const faultText = `${count("kill")} SIGKILL, ${count("stop")} SIGSTOP/SIGCONT, ` +
    `${count("terminate")} pg_terminate_backend rounds ` +
    `(${sum(run.faults.filter((f) => f.kind === "terminate").map((f) => f.count ?? 0))} ` +
    `connections), ${count("restart")} restart, ${count("halt")} halt` +
    (run.failover ? `, ${count("failover")} failover ` : " ") +
    `(${run.outages.map((o) => `${o.kind} ${s(o.to - o.from, 2)}`).join(", ")})`;
  add(
    count("kill") > 0 && count("stop") > 0 && count("terminate") > 0 && count("restart") === 1 &&
      count("halt") === 1 && count("failover") === (run.failover ? 1 : 0),
    "every kind of fault was injected",
    faultText,
  );

  // 14 and 15. Worker exits. A worker frozen (SIGSTOP), or cut off from the database, for
  // longer than its TTL has lost its lease: it stops with exit 1 by rule.
  const frozen = run.workers.filter((w) => leaseLost(run, w) === "stop");
  const cutOff = run.workers.filter((w) => leaseLost(run, w) === "outage");
  const unexpected = run.workers.filter((w) =>
    (w.exitedAt !== null && w.endedBy === null && leaseLost(run, w) === null) ||
    w.endedBy === "kill" && w.signal !== "SIGKILL"
  );
  const killed = run.workers.filter((w) => w.endedBy === "kill");
  add(
    unexpected.length === 0,
    "no worker exited unexpectedly",
    `${run.workers.length} worker processes: ${killed.length} SIGKILLed by the harness, ` +
      `${frozen.length} exited 1 on waking from a SIGSTOP longer than the TTL and ` +
      `${cutOff.length} after a database outage longer than the TTL (lease lost), ` +
      `${run.workers.filter((w) => w.endedBy === "final").length} stopped at the end, ` +
      `${unexpected.length} unexpected exits`,
    await Promise.all(
      unexpected.map(async (w) =>
        `w${w.idx} pid ${w.pid}: code ${w.code} signal ${w.signal} at ` +
        `+${s((w.exitedAt ?? 0) - run.chaos.from)}: ${await lastLine(w.stderrPath)}`
      ),
    ),
  );
  const final = run.workers.filter((w) => w.endedBy === "final");
  const notGraceful = final.filter((w) => w.code !== 0);
  add(
    final.length > 0 && notGraceful.length === 0,
    "every worker stopped gracefully at the end (SIGTERM → exit 0)",
    `${final.length - notGraceful.length} of ${final.length} exited 0, the slowest after ` +
      `${s(Math.max(0, ...final.map((w) => (w.exitedAt ?? 0) - run.finalStopFrom)), 2)}`,
    notGraceful.map((w) => `w${w.idx} pid ${w.pid}: code ${w.code} signal ${w.signal}`),
  );

  // 16 and 17. Logs: secrets, and well-formed JSON lines.
  const scan = await scanLogs(run);
  add(
    scan.hits.length === 0,
    "no password or task-argument secret in any log line or error message",
    `${scan.lines} log lines of ${run.workers.length} workers, ${db.storedTexts.length} stored ` +
      `errors and results, ${run.harnessMessages.length} harness-side error messages scanned ` +
      `for ${run.secrets.map((x) => x.name).join(" and ")}`,
    scan.hits,
  );
  add(
    scan.malformed.length === 0,
    "worker logs are JSON lines only (no stray output, no uncaught error)",
    `${scan.records} JSON records; events: ${
      Object.entries(scan.events).sort((a, b) => b[1] - a[1]).slice(0, 12)
        .map(([k, v]) => `${k} ${v}`).join(", ")
    }`,
    scan.malformed,
  );

  // 18. Memory.
  const peak = run.workers.reduce((a, w) => w.peakRssKb > a.peakRssKb ? w : a, run.workers[0]);
  const peakMb = (peak?.peakRssKb ?? 0) / 1024;
  add(
    peakMb > 0 && peakMb <= run.rssLimitMb,
    "peak RSS of the workers",
    `${peakMb.toFixed(0)} MiB (w${peak?.idx}), limit ${run.rssLimitMb} MiB; median of the ` +
      `longest-lived three ${
        median(
          [...run.workers].sort((a, b) => lifetime(b) - lifetime(a)).slice(0, 3)
            .map((w) => w.peakRssKb / 1024),
        ).toFixed(0)
      } MiB`,
  );

  // 19. Throughput under chaos.
  const rate = run.chaos.terminalAtEnd / (window / 1000);
  add(
    rate >= 0.5 * run.offeredRate,
    "jobs/s under chaos",
    `${rate.toFixed(1)} jobs/s finished during the ${s(window)} chaos window ` +
      `(${run.chaos.terminalAtEnd} jobs; offered ${run.offeredRate.toFixed(1)}/s; ` +
      `pass at ≥ 50 % of the offered rate)`,
  );

  // 24. The longest stall: no job finished while work was ready.
  const stall = longestStall(db, run.chaos.from, run.drainedAt);
  const during = (from: number, to: number) => [
    ...run.outages.filter((o) => o.from < to && o.to > from).map((o) => o.kind),
    ...run.faults.filter((f) => f.kind === "migrate" && f.at < to && f.at > from - 5_000)
      .map(() => "migrate"),
  ];
  add(
    stall.ms <= run.stallBound,
    "longest stall within bound",
    `longest time with work ready and no job finishing ${s(stall.ms, 2)}` +
      (stall.ms > 0
        ? ` (from +${s(stall.from - run.chaos.from)}` +
          `${during(stall.from, stall.from + stall.ms).map((k) => `, over the ${k}`).join("")})`
        : "") +
      `; bound ${s(run.stallBound)}`,
  );

  // 25. The migration under load.
  if (run.migration) {
    const m = run.migration;
    add(
      m.error === null && m.at !== null && m.to !== null,
      "akadze migrate under load succeeded",
      m.error !== null
        ? `akadze migrate from ${m.from} failed: ${m.error}`
        : m.at === null || m.to === null
        ? `akadze migrate from ${m.from} did not run within the window`
        : `from ${m.from} to the current schema at +${s(m.at - run.chaos.from)}, ` +
          `in ${s(m.to - m.at, 2)}, while the workers and the producers ran`,
    );
  }

  // 26, 27 and 28. The sandboxed tasks: crashes charged to their own jobs only, CPU-bound
  // runs beside an unaffected loop.
  verdicts.push(...judgeSandboxes(run, whyRun, scan.loopBlocks));
  return verdicts;
}

/**
 * The longest time during which some job was ready (queued and due) and no job reached a
 * terminal state, between `from` and `to` (epoch ms), from the jobs and their transitions.
 */
export function longestStall(
  db: Pick<DbState, "jobs" | "transitions">,
  from: number,
  to: number,
): { ms: number; from: number } {
  const byJob = new Map<string, DbState["transitions"]>();
  for (const t of db.transitions) byJob.set(t.job_id, [...(byJob.get(t.job_id) ?? []), t]);
  // Each job's ready intervals: from the time it became queued (or its run_at, if later)
  // to its next change of state.
  const ready: [number, number][] = [];
  const finishes: number[] = [];
  for (const job of db.jobs) {
    const ts = byJob.get(job.id) ?? [];
    let state = ts.length > 0 ? ts[0].old_state : job.state;
    let since = ms(job.created_at);
    for (const t of ts) {
      const at = ms(t.at);
      if (state === "queued" && t.old_state === "queued" && at > since) ready.push([since, at]);
      if (TERMINAL.has(t.new_state) && !TERMINAL.has(t.old_state)) finishes.push(at);
      state = t.new_state;
      since = Math.max(at, t.run_at ? ms(t.run_at) : at);
    }
    if (state === "queued" && job.seen_at_drain) ready.push([since, to]);
  }
  // The union of the ready intervals within [from, to].
  ready.sort((a, b) => a[0] - b[0]);
  const merged: [number, number][] = [];
  for (const [a0, b0] of ready) {
    const a = Math.max(a0, from), b = Math.min(b0, to);
    if (a >= b) continue;
    const last = merged[merged.length - 1];
    if (last && a <= last[1]) last[1] = Math.max(last[1], b);
    else merged.push([a, b]);
  }
  finishes.sort((a, b) => a - b);
  let best = { ms: 0, from };
  let i = 0;
  for (const [a, b] of merged) {
    while (i < finishes.length && finishes[i] <= a) i++;
    let start = a;
    for (; i < finishes.length && finishes[i] < b; i++) {
      if (finishes[i] - start > best.ms) best = { ms: finishes[i] - start, from: start };
      start = finishes[i];
    }
    if (b - start > best.ms) best = { ms: b - start, from: start };
  }
  return best;
}

interface Explanation {
  reason: string;
  /** Rescue latency from the fault that caused it (kill/stop), ms. */
  latency?: number;
  /** The part of `latency` during which the database was down (no one could rescue). */
  down?: number;
}

/** Latency from `from` to `to`, and how much of it the database spent down. */
function latency(run: RunData, from: number, to: number): { latency: number; down: number } {
  let down = 0;
  for (const o of run.outages) down += Math.max(0, Math.min(o.to, to) - Math.max(o.from, from));
  return { latency: to - from, down };
}

/** Why a run ended without succeeding (docs/reliability.md, assertion 7). */
function explain(
  run: RunData,
  end: DbState["transitions"][number],
  claim: DbState["transitions"][number] | undefined,
  kind: Kind | undefined,
  byPid: Map<number, WorkerProcess>,
  started: boolean,
): Explanation {
  const endAt = ms(end.at);
  const claimAt = claim ? ms(claim.at) : endAt - 60_000;
  const pid = pidOfWorkerId(end.old_worker);
  const worker = pid === null ? undefined : byPid.get(pid);
  const faultsOf = (k: Fault["kind"]) =>
    run.faults.filter((f) => f.kind === k && worker !== undefined && f.idx === worker.idx);
  const outage = run.outages.some((o) => o.from <= endAt && o.to >= claimAt - LOOKBACK_MS);
  if (end.error === "PlannedFailure") {
    return { reason: kind === "flaky" || kind === "doomed" ? "planned failure" : "unexplained" };
  }
  // Only chaos.crash crashes its sandbox (assertion 27 checks how the crash is named).
  if (end.error === SANDBOX_CRASHED) {
    return { reason: kind === "crash" ? "planned sandbox crash" : "unexplained" };
  }
  if (end.error === "WorkerLost") {
    const kill = faultsOf("kill").find((f) => f.at >= claimAt - 1_000 && f.at <= endAt);
    // Latency runs from the fault, or from the claim when that came later (a claim in
    // flight when the worker died or froze can commit after it): no rescue precedes it.
    if (kill) {
      return {
        reason: "rescued after SIGKILL",
        ...latency(run, Math.max(kill.at, claimAt), endAt),
      };
    }
    const stop = faultsOf("stop").filter((f) => f.at <= endAt).at(-1);
    const cont = stop && faultsOf("cont").find((f) => f.at >= stop.at);
    // (A claim the frozen worker had in flight can complete just after it wakes.)
    if (stop && (!cont || cont.at + 2_000 >= claimAt)) {
      return {
        reason: "rescued after SIGSTOP",
        ...latency(run, Math.max(stop.at, claimAt), endAt),
      };
    }
    if (outage) return { reason: "rescued after a database outage" };
    return { reason: "unexplained" };
  }
  if (end.error !== null) {
    const terminated = faultsOf("terminate").some((f) =>
      f.at >= claimAt - LOOKBACK_MS && f.at <= endAt
    );
    if (terminated) return { reason: "error after pg_terminate_backend" };
    if (outage) return { reason: "error during a database outage" };
    const stopped = faultsOf("stop").some((f) => f.at <= endAt && f.at >= claimAt - LOOKBACK_MS);
    if (stopped) return { reason: "error after SIGSTOP" };
    // A pooled connection killed while idle reports it on its next query, which can come
    // much later ("the first query after a server restart may fail with 57P01").
    const since = worker?.startedAt ?? 0;
    const killedEarlier = CONNECTION_LOST.test(`${end.error} ${end.message ?? ""}`) && (
      faultsOf("terminate").some((f) => f.at >= since && f.at <= endAt) ||
      run.outages.some((o) => o.to >= since && o.from <= endAt)
    );
    if (killedEarlier) return { reason: "error from a connection killed earlier" };
    return { reason: "unexplained" };
  }
  if (end.new_state === "queued" && end.new_attempt === end.old_attempt) {
    // A graceful stop (the end of the run) or a lease-lost exit gives running jobs back.
    const stopping = worker !== undefined && (
      (worker.endedBy === "final" && endAt >= run.finalStopFrom) ||
      (worker.endedBy === null && worker.exitedAt !== null && endAt <= worker.exitedAt &&
        endAt >= worker.exitedAt - 10_000)
    );
    if (stopping) return { reason: "released by a stopping worker" };
    // The claim committed but its reply was lost (the connection was killed right then):
    // the handler never ran, and the worker's next heartbeat gives the job back.
    const near = (at: number) => at >= claimAt - 1_000 && at <= claimAt + 2_000;
    const cut = faultsOf("terminate").some((f) => near(f.at)) ||
      run.outages.some((o) => o.from <= claimAt + 2_000 && o.to >= claimAt - 1_000);
    if (!started && cut) return { reason: "claim reply lost, released by its worker" };
    return { reason: "unexplained" };
  }
  return { reason: "unexplained" };
}

/**
 * Why a worker that exited 1 had lost its lease (the rule: no heartbeat for
 * heartbeatTtl → stop, exit 1), or null: it woke from a SIGSTOP that outlasted its TTL,
 * or the database was unreachable for longer than that. Either way the exit follows
 * within the few seconds a stopping worker takes to give its jobs back.
 */
export function leaseLost(
  run: Pick<RunData, "faults" | "outages" | "heartbeatTtl" | "heartbeatInterval">,
  w: WorkerProcess,
): "stop" | "outage" | null {
  if (w.exitedAt === null || w.endedBy !== null || w.code !== 1) return null;
  const exited = w.exitedAt;
  const stopped = run.faults.some((stop) => {
    if (stop.kind !== "stop" || stop.idx !== w.idx) return false;
    const cont = run.faults.find((f) => f.kind === "cont" && f.idx === w.idx && f.at >= stop.at);
    return cont !== undefined && cont.at - stop.at > run.heartbeatTtl && exited >= cont.at &&
      exited <= cont.at + 10_000;
  });
  if (stopped) return "stop";
  const down = run.outages.some((o) =>
    o.to - o.from > run.heartbeatTtl - run.heartbeatInterval && w.startedAt < o.from &&
    exited >= o.from + run.heartbeatTtl - run.heartbeatInterval && exited <= o.to + 12_000
  );
  return down ? "outage" : null;
}

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
/** How long after its deciding dependency became terminal a step may still be waiting. */
const LEFT_WAITING_MAX_MS = 1_000;

/** The flow assertions (4c), from the database state after the drain. */
export function judgeFlows(
  db: DbState,
  jobs: Map<string, DbState["jobs"][number]>,
  transitionsOf: Map<string, DbState["transitions"]>,
  startsOf: Map<string, DbState["starts"]>,
): Verdict[] {
  const out: Verdict[] = [];
  const add = (ok: boolean, name: string, detail: string, lines: string[] = []) =>
    out.push({ ok, name, detail, lines: lines.slice(0, 25) });
  // When each job became terminal (its first transition to a terminal state).
  const terminalAt = (id: string): number | null => {
    const t = (transitionsOf.get(id) ?? []).find((t) => TERMINAL.has(t.new_state));
    return t ? ms(t.at) : null;
  };
  const steps = db.flowSteps;
  const flows = new Set(steps.map((f) => f.flow));
  const startsByJob = new Map<string, DbState["starts"]>();
  for (const rows of startsOf.values()) {
    for (const r of rows) startsByJob.set(r.job_id, [...(startsByJob.get(r.job_id) ?? []), r]);
  }

  // Started (ledger_start, and claims) only once every dependency was terminal.
  const early: string[] = [];
  let checkedStarts = 0;
  for (const f of steps) {
    if (f.deps.length === 0) continue;
    const depEnds = f.deps.map(terminalAt);
    const ready = depEnds.some((t) => t === null) ? Infinity : Math.max(...(depEnds as number[]));
    const claims = (transitionsOf.get(f.job_id) ?? []).filter((t) => t.new_state === "running");
    for (const s of startsByJob.get(f.job_id) ?? []) {
      checkedStarts++;
      if (ms(s.at) < ready) {
        early.push(
          `${f.flow} step ${f.step} (job ${f.job_id}) run ${s.run_count} started at ` +
            `${s.at.toISOString()}, before its dependencies were terminal ` +
            (ready === Infinity ? "(one never was)" : `(at ${new Date(ready).toISOString()})`),
        );
      }
    }
    for (const c of claims) {
      if (ms(c.at) < ready) {
        early.push(
          `${f.flow} step ${f.step} (job ${f.job_id}) claimed before its dependencies ended`,
        );
      }
    }
  }
  add(
    early.length === 0,
    "no flow step started before its dependencies were terminal",
    `${steps.length} steps in ${flows.size} flows; ${checkedStarts} runs of dependent steps ` +
      `checked against their dependencies' terminal transitions; ${early.length} early`,
    early,
  );

  // Left waiting (queued, or cancelled) in the transaction that decided it; none still waiting.
  const stuck: string[] = [];
  let maxGap = 0;
  for (const f of steps) {
    if (f.deps.length === 0) continue;
    const job = jobs.get(f.job_id);
    const left = (transitionsOf.get(f.job_id) ?? []).find((t) => t.old_state === "waiting");
    if (!job || job.state === "waiting" || !left) {
      stuck.push(`${f.flow} step ${f.step} (job ${f.job_id}) is still ${job?.state ?? "missing"}`);
      continue;
    }
    // Its deciding dependency: the one that cancelled it, else the last to become terminal.
    const cause = left.new_state === "cancelled" ? job.errors.at(-1)?.dependency : undefined;
    const decided = cause !== undefined
      ? terminalAt(cause)
      : Math.max(...f.deps.map((d) => terminalAt(d) ?? Infinity));
    if (decided === null || !Number.isFinite(decided)) {
      stuck.push(
        `${f.flow} step ${f.step} (job ${f.job_id}) left waiting with a dependency active`,
      );
      continue;
    }
    const gap = ms(left.at) - decided;
    maxGap = Math.max(maxGap, gap);
    if (gap > LEFT_WAITING_MAX_MS || gap < 0) {
      stuck.push(
        `${f.flow} step ${f.step} (job ${f.job_id}) left waiting ${gap} ms after its ` +
          "deciding dependency became terminal",
      );
    }
  }
  add(
    stuck.length === 0,
    "no flow step left waiting once its dependencies were terminal",
    `${steps.filter((f) => f.deps.length > 0).length} dependent steps; the longest from the ` +
      `deciding dependency's terminal transition to leaving waiting: ${maxGap} ms`,
    stuck,
  );

  // Every step's final state as planned; a cancelled step names a failed or cancelled dependency.
  const wrong: string[] = [];
  const tally: Record<string, number> = {};
  for (const f of steps) {
    const job = jobs.get(f.job_id);
    const state = job?.state ?? "missing";
    tally[state] = (tally[state] ?? 0) + 1;
    const want = { succeed: "succeeded", fail: "failed", cancel: "cancelled" }[f.expect];
    if (state !== want) {
      wrong.push(`${f.flow} step ${f.step} (job ${f.job_id}) is ${state}, expected ${want}`);
      continue;
    }
    if (f.expect !== "cancel") continue;
    const last = job!.errors.at(-1);
    const dep = last?.dependency;
    const depState = dep === undefined ? undefined : jobs.get(dep)?.state;
    if (
      last?.error !== "DependencyFailed" || dep === undefined || !f.deps.includes(dep) ||
      (depState !== "failed" && depState !== "cancelled")
    ) {
      wrong.push(
        `${f.flow} step ${f.step} (job ${f.job_id}) is cancelled without a failed dependency ` +
          `as its cause (${last?.error ?? "no error"}, dependency ${dep ?? "none"} ${
            depState ?? ""
          })`,
      );
    }
  }
  add(
    wrong.length === 0,
    "every flow's final state is explained",
    `${steps.length} steps: ${Object.entries(tally).map(([k, v]) => `${v} ${k}`).join(", ")}; ` +
      "each as planned, every cancelled one by a failed or cancelled dependency",
    wrong,
  );
  return out;
}

function isTx(kind: Kind | undefined): boolean {
  return kind !== undefined && COMPLETE_TX_KINDS.includes(kind);
}

/** Before this long before an unexplained end, a worker's heartbeats and warnings are shown. */
const AROUND_MS = 8_000;

/**
 * What the worker `workerId` showed around `at` (an unexplained end of one of its runs):
 * its heartbeat ages as sampled in the seconds before, and its warnings and errors then, so
 * that a rescue of a live worker can be read from the report instead of reproduced.
 */
async function workerAround(
  run: RunData,
  byPid: Map<number, WorkerProcess>,
  workerId: string | null,
  at: number,
): Promise<string[]> {
  if (workerId === null) return [];
  const ages = run.samples.heartbeats
    .filter((h) => h.at >= at - AROUND_MS && h.at <= at && h.ages[workerId] !== undefined)
    .map((h) => `${((h.at - at) / 1000).toFixed(1)}s:${h.ages[workerId]}ms`);
  const lines = [`  heartbeat ages before it: ${ages.slice(-12).join(" ") || "none sampled"}`];
  const pid = pidOfWorkerId(workerId);
  const worker = pid === null ? undefined : byPid.get(pid);
  if (!worker) return lines;
  const text = await Deno.readTextFile(worker.stderrPath).catch(() => "");
  for (const line of text.split("\n")) {
    let record: Record<string, unknown>;
    try {
      record = JSON.parse(line);
    } catch {
      continue;
    }
    const when = Date.parse(String(record["@timestamp"]));
    const level = String(record.level ?? "").toLowerCase();
    if (!(when >= at - AROUND_MS && when <= at + 2_000)) continue;
    if (!["warn", "warning", "error", "fatal"].includes(level)) continue;
    const props = (record.properties ?? record) as Record<string, unknown>;
    lines.push(
      `  w${worker.idx} ${((when - at) / 1000).toFixed(1)}s ${level} ${
        String(props.event ?? "")
      }: ${String(record.message ?? "").slice(0, 140)}`,
    );
  }
  return lines.slice(0, 20);
}

async function scanLogs(run: RunData) {
  const hits: string[] = [];
  const malformed: string[] = [];
  const events: Record<string, number> = {};
  const loopBlocks: LoopBlockRecord[] = [];
  let lines = 0;
  let records = 0;
  const check = (text: string, where: string) => {
    for (const secret of run.secrets) {
      if (text.includes(secret.value)) {
        hits.push(`${secret.name} in ${where}: ${text.slice(0, 200)}`);
      }
    }
  };
  for (const w of run.workers) {
    for (const path of [w.stderrPath, w.stdoutPath]) {
      const text = await Deno.readTextFile(path).catch(() => "");
      const all = text.split("\n");
      const killed = w.signal === "SIGKILL";
      let summaries = 0;
      all.forEach((line, i) => {
        if (line === "") return;
        lines++;
        check(line, `w${w.idx} ${path.split("/").pop()} line ${i + 1}`);
        try {
          const record = JSON.parse(line);
          records++;
          const event = record.event ?? record.properties?.event;
          if (typeof event === "string") events[event] = (events[event] ?? 0) + 1;
          if (event === "loop_blocked") {
            const props = { ...record.properties, ...record };
            loopBlocks.push({
              idx: w.idx,
              at: Date.parse(record["@timestamp"]),
              blockedMs: Number(props.blockedMs),
              task: props.task,
              jobId: props.jobId === undefined ? undefined : String(props.jobId),
            });
          }
        } catch {
          // A SIGKILL may cut the last line short; a worker run that ends with code 1 gets
          // the CLI's one-line summary, even if the process is killed before it
          // exits. Deno's own "error: Uncaught …" is not one.
          if (/^error: (?!Uncaught)/.test(line) && summaries++ === 0) return;
          if (!(killed && i === all.length - 1)) {
            malformed.push(`w${w.idx} line ${i + 1}: ${line.slice(0, 200)}`);
          }
        }
      });
    }
  }
  run.db.storedTexts.forEach((t, i) => check(t, `stored error/result #${i + 1}`));
  run.harnessMessages.forEach((t, i) => check(t, `harness error #${i + 1}`));
  return { hits, malformed, events, lines, records, loopBlocks };
}

async function lastLine(path: string): Promise<string> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.trim().split("\n").at(-1)?.slice(0, 300) ?? "";
}

function lifetime(w: WorkerProcess): number {
  return (w.exitedAt ?? Date.now()) - w.startedAt;
}

function sum(values: number[]): number {
  return values.reduce((a, b) => a + b, 0);
}

function median(values: number[]): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

/** A `loop_blocked` record of a worker's log: the event loop was held for `blockedMs`. */
export interface LoopBlockRecord {
  /** The worker process (its `idx`). */
  idx: number;
  /** When it was logged, as the block ended (epoch ms). */
  at: number;
  blockedMs: number;
  /** The job that held the loop, when the worker knows it. */
  task?: string;
  jobId?: string;
}

/** One run of a job: from its claim to the transition that ended it (if any). */
interface RunSpan {
  job: DbState["jobs"][number];
  kind: Kind | undefined;
  run: number;
  worker: string | null;
  from: number;
  to: number;
  end: DbState["transitions"][number] | undefined;
}

/** The name of the crash a `chaos.crash` job's stored errors must give. */
function crashText(how: string | null | undefined, heapMb: number): RegExp {
  const exit = "exited with code 3";
  const oom = `ran out of memory \\(maxHeapMb ${heapMb}\\)`;
  const what = how === "exit" ? exit : how === "oom" ? oom : `(?:${exit}|${oom})`;
  return new RegExp(`^the handler's process ${what}; `);
}

/**
 * The sandbox assertions (26-28), from the database state after the drain, the fault log,
 * the workers' heartbeat ages sampled meanwhile and their `loop_blocked` records. `whyRun`
 * says why each run that did not succeed ended (`job:run` → the reason of assertion 7).
 */
export function judgeSandboxes(
  run: Pick<
    RunData,
    | "db"
    | "faults"
    | "outages"
    | "workers"
    | "heartbeatTtl"
    | "heartbeatInterval"
    | "samples"
    | "crashHeapMb"
  >,
  whyRun: Map<string, string>,
  loopBlocks: LoopBlockRecord[],
): Verdict[] {
  const { db } = run;
  const out: Verdict[] = [];
  const add = (ok: boolean, name: string, detail: string, lines: string[] = []) =>
    out.push({ ok, name, detail, lines: lines.slice(0, 25) });
  const kindOf = (task: string) => KIND_OF_TASK.get(task);
  const byPid = new Map(run.workers.map((w) => [w.pid, w]));
  const processOf = (worker: string | null) => byPid.get(pidOfWorkerId(worker) ?? -1);
  const transitionsOf = new Map<string, DbState["transitions"]>();
  for (const t of db.transitions) {
    transitionsOf.set(t.job_id, [...(transitionsOf.get(t.job_id) ?? []), t]);
  }
  const runs: RunSpan[] = [];
  for (const job of db.jobs) {
    const ts = transitionsOf.get(job.id) ?? [];
    for (const claim of ts.filter((t) => t.new_state === "running")) {
      const end = ts.find((t) =>
        t.old_state === "running" && t.old_run_count === claim.new_run_count
      );
      runs.push({
        job,
        kind: kindOf(job.task),
        run: claim.new_run_count,
        worker: claim.new_worker,
        from: ms(claim.at),
        to: end ? ms(end.at) : Infinity,
        end,
      });
    }
  }
  const reasonOf = (r: RunSpan) => whyRun.get(`${r.job.id}:${r.run}`);
  const label = (r: RunSpan) => `job ${r.job.id} ${r.job.task} run ${r.run} on ${r.worker ?? "?"}`;
  const tally = (reasons: (string | undefined)[]) => {
    const counts: Record<string, number> = {};
    for (const reason of reasons) counts[reason ?? "?"] = (counts[reason ?? "?"] ?? 0) + 1;
    return Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ") || "none";
  };

  // 26. A sandbox crash charges its own job only: every job run beside one in its worker
  // ended as it would have anyway (a success, or a cause of its own that assertion 7
  // explains), no job but chaos.crash has a SandboxCrashed error, and the worker went on.
  const crashes = runs.filter((r) => r.kind === "crash" && r.end?.error === SANDBOX_CRASHED);
  const problems26: string[] = [];
  const beside = new Set<RunSpan>();
  for (const c of crashes) {
    for (const r of runs) {
      // Another crashing job beside it (waiting for the pool's one process) is judged by 27.
      if (r.kind === "crash" || r.worker !== c.worker || r.from >= c.to || r.to <= c.from) continue;
      beside.add(r);
    }
    const w = processOf(c.worker);
    if (
      w && w.exitedAt !== null && w.exitedAt >= c.to && w.exitedAt <= c.to + 10_000 &&
      w.endedBy === null && leaseLost(run, w) === null
    ) {
      problems26.push(`${label(c)}: its worker exited (code ${w.code}) after the crash`);
    }
  }
  const besideEnds: (string | undefined)[] = [];
  for (const r of beside) {
    const state = r.end?.new_state;
    if (state === "succeeded" || state === undefined) {
      besideEnds.push(state ?? "still running");
      continue;
    }
    const reason = reasonOf(r);
    besideEnds.push(reason);
    if (r.end?.error === SANDBOX_CRASHED || reason === undefined || reason === "unexplained") {
      problems26.push(
        `${label(r)}, beside a crash, ended ${state} (${r.end?.error ?? "no error"}: ` +
          `${(r.end?.message ?? "").slice(0, 120)}), ${reason ?? "no reason"}`,
      );
    }
  }
  const stray = db.jobs.filter((j) =>
    kindOf(j.task) !== "crash" && j.errors.some((e) => e.error === SANDBOX_CRASHED)
  );
  for (const j of stray) problems26.push(`job ${j.id} ${j.task} has a ${SANDBOX_CRASHED} error`);
  add(
    crashes.length > 0 && beside.size > 0 && problems26.length === 0,
    "a sandbox crash charged only its own job",
    `${crashes.length} crashes of a sandbox process; ${beside.size} runs of other jobs beside ` +
      `them in the same worker ended: ${tally(besideEnds)}; ${stray.length} other jobs with ` +
      `a ${SANDBOX_CRASHED} error` +
      (crashes.length === 0 || beside.size === 0 ? " (nothing to judge: no run beside one)" : ""),
    problems26,
  );

  // 27. The crashing jobs fail within their attempts, every stored error the crash (named
  // as the process ended) or a fault that assertion 7 explains (a SIGKILL of its worker…).
  const crashJobs = db.jobs.filter((j) => kindOf(j.task) === "crash");
  const problems27: string[] = [];
  let named = 0;
  const faulted: string[] = [];
  for (const j of crashJobs) {
    if (j.state !== "failed" || j.attempt > j.max_attempts) {
      problems27.push(`job ${j.id} is ${j.state}, attempt ${j.attempt}/${j.max_attempts}`);
    }
    const want = crashText(j.how, run.crashHeapMb);
    let mine = 0;
    for (const e of j.errors) {
      if (e.error === SANDBOX_CRASHED) {
        if (want.test(e.message)) mine++;
        else problems27.push(`job ${j.id} (${j.how}): ${e.error}: ${e.message.slice(0, 120)}`);
        continue;
      }
      // The run it ended: by its worker and attempt (a rescue's entry is re-worded after a
      // loop block, which the transition log does not see), else by its words.
      const end = (transitionsOf.get(j.id) ?? []).find((t) =>
        t.old_state === "running" && (
          (e.worker !== undefined && t.old_worker === e.worker && t.new_attempt === e.attempt) ||
          (t.error === e.error && t.message === e.message)
        )
      );
      const reason = end && whyRun.get(`${j.id}:${end.old_run_count}`);
      if (e.error === "LoopBlocked") {
        // Its handler runs in a process of its own: it cannot have blocked the loop.
        problems27.push(`job ${j.id}: charged for blocking the event loop: ${e.message}`);
      } else if (!reason || reason === "unexplained") {
        problems27.push(`job ${j.id}: ${e.error}: ${e.message.slice(0, 120)} (not explained)`);
      } else faulted.push(reason);
    }
    if (mine === 0) problems27.push(`job ${j.id} (${j.how}): no error names the crash`);
    named += mine;
  }
  const hows = crashJobs.map((j) => j.how ?? "?");
  add(
    crashJobs.length > 0 && problems27.length === 0,
    "every crashing sandboxed job failed within its attempts, its errors naming the crash",
    `${crashJobs.length} jobs (${hows.filter((h) => h === "exit").length} by Deno.exit(3), ` +
      `${hows.filter((h) => h === "oom").length} out of a ${run.crashHeapMb} MiB heap): ` +
      `${crashJobs.filter((j) => j.state === "failed").length} failed, attempts spent ` +
      `${crashJobs.map((j) => `${j.attempt}/${j.max_attempts}`).join(" ")}; ${named} errors ` +
      `name the crash, ${faulted.length} are faults: ${tally(faulted)}`,
    problems27,
  );

  // 28. CPU-bound sandboxed jobs succeed, and their workers' loops carry on meanwhile: no
  // heartbeat as old as the TTL while one ran (outside a fault of that worker: a SIGSTOP, a
  // kill, its connections terminated, a database outage) and no loop block.
  const cpuJobs = db.jobs.filter((j) => kindOf(j.task) === "cpu");
  const cpuRuns = runs.filter((r) => r.kind === "cpu");
  const problems28: string[] = [];
  const spun: number[] = [];
  for (const j of cpuJobs) {
    const spunMs = j.result?.spunMs ?? 0;
    spun.push(spunMs);
    if (j.state !== "succeeded" || j.result?.runCount !== j.run_count) {
      problems28.push(
        `job ${j.id} is ${j.state} (run ${j.run_count}, result of run ` +
          `${j.result?.runCount ?? "none"})`,
      );
    } else if (spunMs < run.heartbeatTtl) {
      problems28.push(`job ${j.id} computed ${s(spunMs, 2)}, less than the heartbeat TTL`);
    }
  }
  const cut: (string | undefined)[] = [];
  for (const r of cpuRuns) {
    if (r.end === undefined || r.end.new_state === "succeeded") continue;
    const reason = reasonOf(r);
    cut.push(reason);
    if (reason === undefined || reason === "unexplained") {
      problems28.push(`${label(r)} ended ${r.end.new_state} (${r.end.error ?? "no error"})`);
    }
  }
  const overlaps = (a0: number, a1: number, b0: number, b1: number) => a0 <= b1 && b0 <= a1;
  /** Whether worker `idx` had a fault that explains a stale heartbeat or a late loop in [a, b]. */
  const excused = (w: WorkerProcess, a: number, b: number) =>
    (w.exitedAt !== null && w.exitedAt <= b) ||
    run.faults.some((f) => {
      if (f.idx !== w.idx) return false;
      if (f.kind === "kill") return f.at <= b;
      if (f.kind === "terminate") return overlaps(f.at, f.at + run.heartbeatTtl, a, b);
      if (f.kind !== "stop") return false;
      const cont = run.faults.find((c) => c.kind === "cont" && c.idx === w.idx && c.at >= f.at);
      return overlaps(f.at, (cont?.at ?? Infinity) + 1_000, a, b);
    }) ||
    run.outages.some((o) => overlaps(o.from, o.to + 1_000, a, b));
  let maxAge = 0;
  let sampled = 0;
  let excusedSamples = 0;
  for (const r of cpuRuns) {
    const w = processOf(r.worker);
    if (!w || r.worker === null) continue;
    for (const sample of run.samples.heartbeats) {
      const age = sample.ages[r.worker];
      if (age === undefined || sample.at < r.from || sample.at > r.to) continue;
      if (excused(w, sample.at - age, sample.at)) {
        excusedSamples++;
        continue;
      }
      sampled++;
      maxAge = Math.max(maxAge, age);
      if (age >= run.heartbeatTtl) {
        problems28.push(
          `${label(r)}: its worker's heartbeat was ${s(age, 2)} old at ` +
            `${new Date(sample.at).toISOString()}`,
        );
      }
    }
    for (const b of loopBlocks) {
      if (b.idx !== w.idx || !overlaps(b.at - b.blockedMs, b.at, r.from, r.to)) continue;
      if (excused(w, b.at - b.blockedMs, b.at)) continue;
      problems28.push(
        `${label(r)}: its worker's loop was blocked ${s(b.blockedMs, 2)} ` +
          `(${b.task ?? "no job named"})`,
      );
    }
  }
  for (const b of loopBlocks) {
    if (b.task === TASKS.cpu || b.task === TASKS.crash) {
      problems28.push(`w${b.idx}: ${b.task} job ${b.jobId} blocked the event loop`);
    }
  }
  for (const j of cpuJobs) {
    for (const e of j.errors.filter((e) => e.error === "LoopBlocked")) {
      problems28.push(`job ${j.id}: charged for blocking the event loop: ${e.message}`);
    }
  }
  add(
    cpuJobs.length > 0 && sampled > 0 && problems28.length === 0,
    "CPU-bound sandboxed jobs succeeded, their workers' heartbeat unaffected",
    `${cpuJobs.filter((j) => j.state === "succeeded").length}/${cpuJobs.length} succeeded, ` +
      `each computing ${s(spun.length ? Math.min(...spun) : 0, 2)} or more without yielding ` +
      `(heartbeat TTL ${s(run.heartbeatTtl)}); runs cut: ` +
      `${tally(cut)}; oldest heartbeat of their worker while one ran ${s(maxAge, 2)} ` +
      `(${sampled} samples, ${excusedSamples} left out over faults of that worker); ` +
      `${loopBlocks.length} loop_blocked records in all`,
    problems28,
  );
  return out;
}
