-- akadze schema, version 0024: complete_jobs_plain, the outcome write of a batch that needs
-- nothing but the outcomes: no job of it fails into a dead letter, and the worker offers no
-- slot for a hand-off. "{{schema}}" is replaced by the quoted schema name. Creating a function
-- takes no lock on the jobs table; workers of earlier versions call their functions unchanged.
--
-- complete_jobs (13 arguments, 0019) writes every batch in one statement of seven parts: the
-- dead letters, the dependents counted down and handed over, their notification. A batch of
-- plain jobs runs them all for nothing: 1 to 2.5 ms more per 500 outcomes than the update alone
-- (pg_stat_statements, a drain of 20,000 no-op jobs), a fifth of the write. This function is
-- that update alone, its SET the same as 0019's (tests/job_columns_test.ts compares them). A
-- job it ends that has dependents (a flow enqueued onto it while it ran) has them settled by
-- the row trigger, as for any other path that ends a job.
CREATE FUNCTION {{schema}}.complete_jobs_plain(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[])
RETURNS TABLE (id text, state text, attempt integer, run_at_ms float8, has_dependents boolean,
               claimed jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_running CONSTANT text := 'running';
BEGIN
  RETURN QUERY
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
    FROM unnest(p_ids, p_run_counts, p_kinds, p_results, p_errors, p_delays_ms)
           AS o(id, run_count, kind, result, error, delay_ms)
    WHERE j.id = o.id AND j.run_count = o.run_count AND j.state = v_running
    RETURNING j.id::text, j.state::text, j.attempt, date_part('epoch', j.run_at) * 1000,
              j.has_dependents, NULL::jsonb;
END
$$;
