-- akadze schema, version 0016: the hand-off. A worker writing a success whose dependent becomes
-- ready takes that dependent in the same transaction, so it starts without a second commit (a
-- claim after the NOTIFY). "{{schema}}" is replaced by the quoted schema name.
--
-- complete_jobs(13 arguments) is 0014's outcome write (the same statement for the outcomes),
-- plus five arguments saying what the calling worker may take: its id, its queues with free
-- slots and how many each (p_hand_queues, p_hand_slots), how many in all (p_hand_total), and the
-- tasks it runs (p_hand_tasks). The dependents this statement queues in one of those queues, of
-- one of those tasks, are not announced; a second statement claims them as claim_one does (the
-- ready rule, no limits row on their key, the queue not paused, SET and RETURNING the claim's),
-- each queue up to its slots and all up to p_hand_total, and only when no other ready job this
-- worker could take from that queue has their priority or a higher one (so a flow does not jump
-- ahead of the queue). It returns them as rows in state 'running' whose `claimed` holds the
-- claim's columns (src/job_columns.ts, compared by tests/job_columns_test.ts). The dependents it
-- did not take are announced as before. An outcome's row also says whether others depend on its
-- job (has_dependents), from which the worker learns which tasks' successes to keep a slot for.
-- A batch that queues no dependent runs only the first statement. The 8-argument complete_jobs,
-- which workers of earlier versions call while a deploy rolls, is unchanged. Creating a function takes no lock on the jobs table.
CREATE FUNCTION {{schema}}.complete_jobs(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[], p_dead_tasks text[], p_dead_queues text[], p_worker text,
  p_hand_queues text[], p_hand_slots integer[], p_hand_total integer, p_hand_tasks text[])
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
  -- As in 0001: each outcome finds its job by primary key.
  v_running CONSTANT text := 'running';
  v_failed CONSTANT text := 'failed';
  v_succeeded CONSTANT text := 'succeeded';
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_hand text;
  v_ids bigint[];
BEGIN
  -- The trigger leaves this statement's successes to the statement (0014).
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
  -- Per dependent, how many of its dependencies succeeded in this batch (0014).
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
    RETURNING w.id, w.queue::text AS queue, w.state,
              -- Queued now where this worker may take it: offered to the claim below.
              (w.state = 'queued' AND p_hand_total > 0 AND w.queue = ANY (p_hand_queues)
               AND w.task = ANY (p_hand_tasks)) AS offered),
  -- Always evaluated: the outer query reads it once, whatever the batch holds.
  announced AS (
    SELECT (SELECT count(pg_notify(v_channel, q.queue))
              FROM (SELECT DISTINCT p.queue FROM promoted p
                     WHERE p.state = 'queued' AND NOT p.offered) q) AS n,
           set_config('akadze.hand_off',
                      coalesce((SELECT string_agg(p.id::text, ',') FROM promoted p
                                 WHERE p.offered), ''),
                      true) AS offered)
  SELECT d.id::text, d.state, d.attempt, date_part('epoch', d.run_at) * 1000, d.has_dependents,
         NULL::jsonb
    FROM announced a, done d WHERE a.n >= 0 AND a.offered IS NOT NULL;
  PERFORM set_config('akadze.outcome_settles', '', true);
  v_hand := current_setting('akadze.hand_off', true);
  IF v_hand IS NULL OR v_hand = '' THEN
    RETURN;
  END IF;
  PERFORM set_config('akadze.hand_off', '', true);
  v_ids := string_to_array(v_hand, ',')::bigint[];
  -- The claim of the offered dependents (rows this transaction holds locked since the update
  -- above): claim_one's rule, per queue up to its slots, in claim order.
  RETURN QUERY
  -- Per queue, the first ready job in claim order that this worker could take and that is
  -- not offered: a dependent is handed only ahead of it (a flow does not jump the queue).
  -- Materialized, so it is looked up once per queue: looked up per dependent, with hundreds
  -- offered (a DAG's layer), each lookup walked past the offered ones (quadratic).
  WITH firsts AS MATERIALIZED (
    SELECT q.name, q.n, f.priority
      FROM unnest(p_hand_queues, p_hand_slots) AS q(name, n)
      LEFT JOIN LATERAL (
        SELECT a.priority FROM {{schema}}.jobs a
         WHERE a.state = 'queued' AND a.queue = q.name AND a.run_at <= now()
           AND a.cancel_requested_at IS NULL
           AND (a.expires_at IS NULL OR a.expires_at > now())
           AND a.task = ANY (p_hand_tasks)
           AND a.id <> ALL (v_ids)
           AND (a.limit_key IS NULL
                OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = a.limit_key))
         ORDER BY a.priority DESC, a.run_at, a.id
         LIMIT 1) AS f ON true),
  ready AS (
    SELECT c.ctid, c.queue, c.priority, c.run_at, c.id, q.n
      FROM firsts q
      JOIN {{schema}}.jobs c ON c.id = ANY (v_ids)
     WHERE c.state = 'queued' AND c.queue = q.name AND c.run_at <= now()
       AND c.cancel_requested_at IS NULL
       AND (c.expires_at IS NULL OR c.expires_at > now())
       AND c.task = ANY (p_hand_tasks)
       AND (c.limit_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = c.limit_key))
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = q.name)
       AND (q.priority IS NULL OR c.priority > q.priority)
     FOR UPDATE OF c SKIP LOCKED),
  candidates AS (
    SELECT r.ctid FROM (
      SELECT x.ctid, x.n,
             row_number() OVER (PARTITION BY x.queue ORDER BY x.priority DESC, x.run_at, x.id)
               AS rn,
             row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS total
        FROM ready x) r
     WHERE r.rn <= r.n AND r.total <= p_hand_total),
  handed AS (
    UPDATE {{schema}}.jobs j
       SET state = 'running', run_count = j.run_count + 1, worker_id = p_worker,
           started_at = now()
     WHERE j.ctid = ANY (ARRAY (SELECT ctid FROM candidates))
    RETURNING j.id::text AS id, j.task::text AS task, j.queue::text AS queue,
              j.priority AS priority, j.attempt AS attempt, j.run_count AS run_count,
              j.max_attempts AS max_attempts, j.snoozes AS snoozes,
              date_part('epoch', j.run_at) * 1000 AS run_at,
              date_part('epoch', j.expires_at) * 1000 AS expires_at,
              j.unique_key::text AS unique_key, j.limit_key::text AS limit_key,
              date_part('epoch', j.created_at) * 1000 AS created_at,
              date_part('epoch', j.started_at) * 1000 AS started_at, j.args::jsonb AS args)
  SELECT h.id, v_running, h.attempt, h.run_at, NULL::boolean, to_jsonb(h) FROM handed h;
  -- The offered dependents not taken are announced, as the first statement would have.
  PERFORM pg_notify(v_channel, x.queue)
     FROM (SELECT DISTINCT m.queue::text AS queue FROM {{schema}}.jobs m
            WHERE m.id = ANY (v_ids) AND m.state = 'queued') x;
END
$$;
