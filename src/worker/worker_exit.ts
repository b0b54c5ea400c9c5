/**
 * How a worker's run ends: {@linkcode WorkerExit}, and the exit of a fatal database error.
 *
 * @module
 */
import {
  describeError,
  grantMissingMessage,
  isGrantMissing,
  isSchemaMissing,
  schemaMissingMessage,
} from "../db.ts";

/** Why `worker.run()` returned, with the process exit code it implies. */
export interface WorkerExit {
  /** 0: graceful stop, batch done or maxJobs reached; 1: fatal error or lost heartbeat. */
  code: 0 | 1;
  /** What ended the run. */
  reason: "stopped" | "batch_done" | "max_jobs" | "heartbeat_lost" | "fatal";
  /** For `fatal` and `heartbeat_lost`: what went wrong (credential-free). */
  message?: string;
}

/** The exit of a database error the worker cannot retry (code 1, credential-free). */
export function fatalExit(error: unknown, schema: string): WorkerExit {
  const message = isSchemaMissing(error, schema)
    ? schemaMissingMessage(schema, error)
    : isGrantMissing(error, schema)
    ? grantMissingMessage(error)
    : describeError(error);
  return { code: 1, reason: "fatal", message };
}
