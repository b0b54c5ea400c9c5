/**
 * What a running job reads of the jobs it depends on (`ctx.dependencies()`,
 * `ctx.resultOf(task)`): their states, results and last errors, keyed by step name.
 *
 * @module
 */
import { quoteSchema, type Sql } from "./db.ts";
import { AkadzeError } from "./errors.ts";
import type { JobContext } from "./context.ts";

/** The outcome of one dependency, as a dependent's handler sees it (`ctx.dependencies()`). */
export type DependencyOutcome = Awaited<ReturnType<JobContext["dependencies"]>>[string];

/** A task, as far as {@linkcode resultOf} needs it: its name and its handler's result type. */
export interface ResultSource<R> {
  /** The task name. */
  readonly name: string;
  /** The task's handler: its return type is the result's. */
  readonly handler: (...args: never[]) => R;
}

/**
 * The dependencies of job `jobId`, keyed by step name (a job outside the flow by its id).
 */
export async function readDependencies(
  sql: Sql,
  schema: string,
  jobId: string,
): Promise<Record<string, DependencyOutcome>> {
  const s = quoteSchema(schema);
  const rows = await sql.unsafe(
    `select j.id::pg_catalog.text as id, j.step, j.task::pg_catalog.text as task, j.state, j.result,
            j.flow_id operator(pg_catalog.=) (select flow_id from ${s}.jobs where id
              operator(pg_catalog.=) $1::bigint) as same_flow,
            case when pg_catalog.jsonb_array_length(j.errors) operator(pg_catalog.>) 0
                 then pg_catalog.jsonb_build_object('error', j.errors operator(pg_catalog.->) -1
                   operator(pg_catalog.->>) 'error',
                                         'message', j.errors operator(pg_catalog.->) -1
                                           operator(pg_catalog.->>) 'message') end as error
       from ${s}.job_dependencies d join ${s}.jobs j on j.id operator(pg_catalog.=) d.depends_on
      where d.job_id operator(pg_catalog.=) $1::bigint order by j.id`,
    [jobId],
  );
  const out: Record<string, DependencyOutcome> = {};
  for (const row of rows) {
    const key = row.same_flow && row.step !== null ? row.step : row.id;
    out[key] = {
      id: row.id,
      step: row.step,
      task: row.task,
      state: row.state,
      result: row.result,
      error: row.error,
    };
  }
  return out;
}

/**
 * The result of the dependency that ran `task` (the one named `step` when several did).
 * Throws an `AkadzeError` when there is none, or it did not succeed.
 */
export function resultOf<R>(
  dependencies: Record<string, DependencyOutcome>,
  task: ResultSource<R>,
  step?: string,
): Awaited<R> {
  const all = Object.entries(dependencies).filter(([key, d]) =>
    d.task === task.name && (step === undefined || key === step)
  );
  if (all.length === 0) {
    throw new AkadzeError(
      `this job has no dependency that ran task "${task.name}"${
        step === undefined ? "" : ` as step ${JSON.stringify(step)}`
      }`,
    );
  }
  if (all.length > 1) {
    throw new AkadzeError(
      `this job has ${all.length} dependencies that ran task "${task.name}" (${
        all.map(([key]) => JSON.stringify(key)).join(", ")
      }): name the step, resultOf(task, step)`,
    );
  }
  const [key, d] = all[0];
  if (d.state !== "succeeded") {
    throw new AkadzeError(
      `dependency ${JSON.stringify(key)} (job ${d.id}) did not succeed: it is ${d.state}${
        d.error ? ` (${d.error.error}: ${d.error.message})` : ""
      }`,
    );
  }
  return d.result as Awaited<R>;
}
