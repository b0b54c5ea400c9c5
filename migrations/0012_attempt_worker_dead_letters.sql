-- akadze schema, version 0012: each stored error entry says which attempt it ended (1-based)
-- and which worker ran it; a finished job keeps the worker that ran its last run; and a job
-- that fails for good can get a dead letter in the same statement. "{{schema}}" is replaced
-- by the quoted schema name.
--
-- complete_jobs(8 arguments) is 0001's outcome write with 0005's search_path, except that:
-- - it keeps worker_id (the partial indexes on running jobs do not hold finished ones, so
--   nothing reads more);
-- - the error entry it appends gets `attempt`, the number of the run's attempt (the attempts
--   spent before it, plus one), and `worker`, the worker that ran it;
-- - an outcome with a dead-letter task (p_dead_tasks, p_dead_queues) that leaves its job
--   `failed` inserts a job of that task in that queue whose arguments are the failed job's
--   id, task, queue, arguments and errors (src/dead_letter.ts, DeadLetter).
-- The 6-argument complete_jobs, which workers of earlier versions call while a deploy rolls,
-- is the same write without dead letters. Creating and replacing functions takes no lock on
-- the jobs table: running workers call the old body or the new one, statement by statement.
CREATE FUNCTION {{schema}}.complete_jobs(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[], p_dead_tasks text[], p_dead_queues text[])
RETURNS TABLE (id text, state text, attempt integer, run_at_ms float8)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  -- As in 0001: each outcome finds its job by primary key.
  v_running CONSTANT text := 'running';
  v_failed CONSTANT text := 'failed';
BEGIN
  RETURN QUERY
  WITH done AS (
    UPDATE {{schema}}.jobs j SET
      state = {{schema}}.outcome_state(
        j.cancel_requested_at IS NOT NULL, o.kind, j.attempt, j.max_attempts),
      attempt = j.attempt + (j.cancel_requested_at IS NULL AND o.kind IN ('retry', 'fail'))::int,
      snoozes = j.snoozes + (j.cancel_requested_at IS NULL AND o.kind = 'snooze')::int,
      run_at = CASE WHEN {{schema}}.outcome_state(
                           j.cancel_requested_at IS NOT NULL, o.kind, j.attempt, j.max_attempts)
                         = 'queued'
                    THEN now() + coalesce(o.delay_ms, 0) * interval '1 millisecond'
                    ELSE j.run_at END,
      result = CASE WHEN {{schema}}.outcome_state(
                           j.cancel_requested_at IS NOT NULL, o.kind, j.attempt, j.max_attempts)
                         = 'succeeded'
                    THEN o.result::jsonb END,
      -- Both branches of the domain type: no domain check unless an error is appended.
      errors = CASE WHEN o.error IS NULL THEN j.errors
                    ELSE {{schema}}.append_error(j.errors,
                           o.error::jsonb || jsonb_build_object('attempt', j.attempt + 1,
                                                                'worker', j.worker_id)) END,
      finished_at = CASE WHEN {{schema}}.outcome_state(
                                j.cancel_requested_at IS NOT NULL, o.kind, j.attempt,
                                j.max_attempts) = 'queued'
                         THEN NULL ELSE now() END
    FROM unnest(p_ids, p_run_counts, p_kinds, p_results, p_errors, p_delays_ms, p_dead_tasks,
                p_dead_queues)
           AS o(id, run_count, kind, result, error, delay_ms, dead_task, dead_queue)
    WHERE j.id = o.id AND j.run_count = o.run_count AND j.state = v_running
    RETURNING j.id, j.task, j.queue, j.state, j.attempt, j.run_at, j.args, j.errors,
              o.dead_task, o.dead_queue),
  dead AS (
    INSERT INTO {{schema}}.jobs (task, queue, args)
    SELECT d.dead_task, d.dead_queue,
           jsonb_build_object('id', d.id::text, 'task', d.task, 'queue', d.queue, 'args', d.args,
                              'errors', d.errors)
      FROM done d
     WHERE d.state = v_failed AND d.dead_task IS NOT NULL)
  SELECT d.id::text, d.state, d.attempt, date_part('epoch', d.run_at) * 1000 FROM done d;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.complete_jobs(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[])
RETURNS TABLE (id text, state text, attempt integer, run_at_ms float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN QUERY SELECT * FROM {{schema}}.complete_jobs(
    p_ids, p_run_counts, p_kinds, p_results, p_errors, p_delays_ms, NULL::text[], NULL::text[]);
END
$$;
