-- akadze schema, version 0014: the outcome write counts a batch's successes down once per
-- dependent. "{{schema}}" is replaced by the quoted schema name.
--
-- Before, each succeeded job's row trigger updated each of its dependents: a fan-in's waiting
-- row was rewritten once per finished sibling, each time a new row version (and, once its page
-- was full, an entry in every index of jobs). complete_jobs now settles the successes of its
-- own batch itself, in the same statement: one update per dependent, counting down as many
-- dependencies as finished in the batch; siblings finished by concurrent batches still
-- serialise on the dependent's row lock, and the update that takes the count to 0 queues it.
-- The trigger skips the successes that the running complete_jobs statement settles (it marks
-- them with the statement's start time in a transaction-local setting); failures and every
-- other statement (completeTx, the rescuer, cancels, requeues) are settled by the trigger as
-- before. Creating and replacing functions takes no lock on the jobs table.

CREATE OR REPLACE FUNCTION {{schema}}.settle_dependents_trigger()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.state = 'succeeded'
     AND current_setting('akadze.outcome_settles', true)
           = date_part('epoch', statement_timestamp())::text THEN
    -- complete_jobs counts this success down with the rest of its batch.
    RETURN NULL;
  END IF;
  IF NEW.state = ANY ('{succeeded,failed,cancelled}'::text[]) THEN
    PERFORM {{schema}}.settle_dependents(NEW.id, NEW.state);
  ELSE
    PERFORM {{schema}}.revive_dependents(NEW.id);
  END IF;
  RETURN NULL;
END
$$;

-- 0012's outcome write, plus: the dependents of the batch's succeeded jobs are counted down
-- (and queued, and announced, when the count reaches 0) in the same statement.
CREATE OR REPLACE FUNCTION {{schema}}.complete_jobs(
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
  v_succeeded CONSTANT text := 'succeeded';
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
BEGIN
  -- The trigger leaves this statement's successes to the statement (see above).
  PERFORM set_config('akadze.outcome_settles',
                     date_part('epoch', statement_timestamp())::text, true);
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
              j.has_dependents, o.dead_task, o.dead_queue),
  dead AS (
    INSERT INTO {{schema}}.jobs (task, queue, args)
    SELECT d.dead_task, d.dead_queue,
           jsonb_build_object('id', d.id::text, 'task', d.task, 'queue', d.queue, 'args', d.args,
                              'errors', d.errors)
      FROM done d
     WHERE d.state = v_failed AND d.dead_task IS NOT NULL),
  -- Per dependent, how many of its dependencies succeeded in this batch. A waiting job is
  -- never in the batch (only running jobs are), so its row is not one this statement wrote.
  counted AS (
    SELECT e.job_id, count(*)::integer AS n
      FROM done d JOIN {{schema}}.job_dependencies e ON e.depends_on = d.id
     WHERE d.has_dependents AND d.state = v_succeeded
     GROUP BY e.job_id),
  promoted AS (
    UPDATE {{schema}}.jobs w SET
      pending_deps = w.pending_deps - c.n,
      state = CASE WHEN w.pending_deps <= c.n THEN 'queued' ELSE 'waiting' END,
      run_at = CASE WHEN w.pending_deps <= c.n
                    THEN greatest(w.run_at, now()) ELSE w.run_at END
      FROM counted c
     WHERE w.id = c.job_id AND w.state = 'waiting'
    RETURNING w.queue::text AS queue, w.state),
  -- Always evaluated: the outer query reads it once, whatever the batch holds.
  announced AS (
    SELECT count(pg_notify(v_channel, q.queue)) AS n
      FROM (SELECT DISTINCT p.queue FROM promoted p WHERE p.state = 'queued') q)
  SELECT d.id::text, d.state, d.attempt, date_part('epoch', d.run_at) * 1000
    FROM announced a, done d WHERE a.n >= 0;
  PERFORM set_config('akadze.outcome_settles', '', true);
END
$$;
