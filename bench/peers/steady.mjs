// The steady-rate run of the pinned-horizon scenario (bench/horizon.ts), the same for every
// system: an open-loop producer enqueuing at a fixed rate (every tick the jobs due since the
// last, in calls of at most `batch` jobs), and the bookkeeping of the handler starts. Plain JavaScript so that the peers' Node drivers and
// akadze's Deno driver run this very code (bench/.peers/drivers/ holds a copy for Node).
//
// Talks JSON lines on stdout, reads commands on stdin:
//   -> {"event":"ready"}                          set up, producer idle
//   <- go                                         start producing
//   -> {"event":"tick","t":..,"enqueued":..,"started":..,"issued":..,"failed":..,"lat":[..]}
//                                                 every `reportMs`: totals so far and the
//                                                 enqueue->start latencies (ms) since the last
//   <- stop SECONDS                               stop producing, wait up to SECONDS for every
//                                                 enqueued job to start, stop the worker
//   <- abort                                      stop producing and stop the worker now
//   -> {"event":"done", ...totals, "missing":.., "duplicates":.., "error":..}
// stdin closing (the harness is gone) aborts.
import process from "node:process";
import { createInterface } from "node:readline";

/** Wall-clock milliseconds with sub-millisecond precision (comparable across processes). */
export const wallMs = () => performance.timeOrigin + performance.now();

const send = (message) => process.stdout.write(`${JSON.stringify(message)}\n`);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The producer and the start bookkeeping of one run.
 *
 * @param {{ rate: number, tickMs?: number, batch?: number, reportMs?: number, maxInFlight?: number }} options
 *   jobs per second; producer tick (ms); jobs per enqueue call at most; tick report interval
 *   (ms); jobs in flight at most (beyond it the producer waits, and catches up once they
 *   complete)
 */
export function createSteady(options) {
  const rate = options.rate;
  const tickMs = options.tickMs ?? 10;
  const batch = Math.max(1, options.batch ?? 100);
  const reportMs = options.reportMs ?? 250;
  const maxInFlight = options.maxInFlight ?? Math.max(100, rate * 5);
  let seen = new Uint8Array(1 << 16);
  let issued = 0, enqueued = 0, failed = 0, inFlight = 0, started = 0, duplicates = 0;
  let firstError = null;
  let lat = [];

  /**
   * Call from the handler with the job's arguments ({ t0, seq }): records its start. A job
   * started a second time is counted as a duplicate, not as a start.
   *
   * @param {{ t0: number, seq: number }} args
   */
  function record(args) {
    const now = wallMs();
    const seq = args.seq;
    if (seq >= seen.length) {
      const grown = new Uint8Array(Math.max(seen.length * 2, seq + 1));
      grown.set(seen);
      seen = grown;
    }
    if (seen[seq]) {
      duplicates++;
      return;
    }
    seen[seq] = 1;
    started++;
    lat.push(Math.round((now - args.t0) * 100) / 100);
  }

  function tickLine() {
    const line = { event: "tick", t: wallMs(), enqueued, started, issued, failed, lat };
    lat = [];
    return line;
  }

  /**
   * Run the protocol above; resolves after "done" was printed.
   *
   * @param {(jobs: { t0: number, seq: number }[]) => Promise<unknown>} enqueue these jobs
   *   (one call, one transaction)
   * @param {() => Promise<void>} stopWorker stop the worker and close the pools
   * @param {Promise<unknown>} [workerExit] settles when the worker stops by itself
   */
  async function run(enqueue, stopWorker, workerExit) {
    const commands = createInterface({ input: process.stdin });
    const queue = [];
    let wake = () => {};
    commands.on("line", (line) => {
      queue.push(line.trim());
      wake();
    });
    commands.on("close", () => {
      queue.push("abort");
      wake();
    });
    const nextCommand = async () => {
      while (queue.length === 0) await new Promise((resolve) => wake = resolve);
      return queue.shift();
    };
    let workerError = null;
    workerExit?.then(
      (exit) => {
        workerError = `the worker stopped by itself: ${JSON.stringify(exit)}`;
        queue.push("abort");
        wake();
      },
      (error) => {
        workerError = `the worker failed: ${error?.message ?? error}`;
        queue.push("abort");
        wake();
      },
    );

    send({ event: "ready" });
    let command = await nextCommand();
    let producer = null, reporter = null;
    if (command === "go") {
      const origin = performance.now();
      const tick = () => {
        const due = Math.floor((performance.now() - origin) * rate / 1000) - issued;
        const n = Math.min(due, maxInFlight - inFlight);
        for (let i = 0; i < n; i += batch) {
          const t0 = wallMs();
          const jobs = Array.from(
            { length: Math.min(batch, n - i) },
            () => ({ t0, seq: issued++ }),
          );
          inFlight += jobs.length;
          enqueue(jobs).then(
            () => {
              inFlight -= jobs.length;
              enqueued += jobs.length;
            },
            (error) => {
              inFlight -= jobs.length;
              failed += jobs.length;
              firstError ??= error?.message ?? String(error);
            },
          );
        }
      };
      producer = setInterval(tick, tickMs);
      reporter = setInterval(() => send(tickLine()), reportMs);
      command = await nextCommand();
    }
    clearInterval(producer);
    const stop = /^stop (\d+(\.\d+)?)$/.exec(command);
    if (stop && !workerError) {
      const until = performance.now() + Number(stop[1]) * 1000;
      while ((inFlight > 0 || started < enqueued) && performance.now() < until) await sleep(20);
    }
    clearInterval(reporter);
    send(tickLine());
    let stopError = null;
    try {
      await Promise.race([
        stopWorker(),
        sleep(20_000).then(() => {
          throw new Error("the worker did not stop within 20 s");
        }),
      ]);
    } catch (error) {
      stopError = error?.message ?? String(error);
    }
    commands.close();
    send({
      event: "done",
      issued,
      enqueued,
      failed,
      in_flight: inFlight,
      started,
      missing: Math.max(0, enqueued - started),
      duplicates,
      error: workerError ?? firstError ?? stopError,
    });
  }

  return { record, run };
}
