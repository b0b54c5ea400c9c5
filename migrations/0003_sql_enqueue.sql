-- akadze schema, version 0003: enqueue from SQL. "{{schema}}" is replaced by the quoted schema
-- name.
--
-- {{schema}}.enqueue(...) and {{schema}}.enqueue_many(...) insert jobs in the caller's
-- transaction, for what cannot use the TypeScript API: other drivers, triggers, psql scripts,
-- other languages. They apply the rules of the TypeScript API (src/enqueue.ts): the names, key
-- lengths and the object shape of the arguments are the domains of 0001, which the columns
-- check; the ranges are checked here, with the messages of the TypeScript API. A task's
-- argument schema cannot run in SQL: the worker validates the arguments when it runs the job.
--
-- SQLSTATEs: 22003 for a priority or max_attempts out of range, 22023 for another invalid
-- argument, 23514 for a value a domain refuses (task or queue name, key length, arguments
-- that are not an object), and AKDUP when a unique_key is held by a queued or running job.
-- AKDUP ends the statement like any error: catch it in a savepoint (or a PL/pgSQL EXCEPTION
-- block), or pass on_duplicate => 'ignore' to get NULL (no row) instead, which needs neither.

-- Insert one job per element of `args_list` (a JSON array of argument objects; NULL: none),
-- all sharing the other columns, in one statement; returns their ids (column `id`) in order.
-- NULL for any optional argument means its default. One NOTIFY on the channel of src/db.ts's
-- jobsChannel ("<schema>_jobs", payload: the queue), delivered at commit, and only when a row
-- was inserted.
CREATE FUNCTION {{schema}}.enqueue_many(
  task text,
  args_list jsonb,
  queue text DEFAULT 'default',
  priority integer DEFAULT 0,
  run_at timestamptz DEFAULT NULL,
  max_attempts integer DEFAULT 3,
  unique_key text DEFAULT NULL,
  limit_key text DEFAULT NULL,
  expires_at timestamptz DEFAULT NULL,
  on_duplicate text DEFAULT 'raise')
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
  v_queue CONSTANT text := coalesce(enqueue_many.queue, 'default');
  v_priority CONSTANT integer := coalesce(enqueue_many.priority, 0);
  v_max_attempts CONSTANT integer := coalesce(enqueue_many.max_attempts, 3);
  v_on_duplicate CONSTANT text := coalesce(enqueue_many.on_duplicate, 'raise');
  -- The placeholder is the quoted schema name; the channel has it bare.
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_wanted integer;
  v_inserted integer;
BEGIN
  IF v_priority NOT BETWEEN -32768 AND 32767 THEN
    RAISE EXCEPTION 'priority must be an integer from -32768 to 32767, got %', v_priority
      USING ERRCODE = 'numeric_value_out_of_range';
  END IF;
  IF v_max_attempts < 1 THEN
    RAISE EXCEPTION 'max_attempts must be an integer from 1 to 2147483647, got %', v_max_attempts
      USING ERRCODE = 'numeric_value_out_of_range';
  END IF;
  IF v_on_duplicate NOT IN ('raise', 'ignore') THEN
    RAISE EXCEPTION 'on_duplicate must be ''raise'' or ''ignore'', got %', to_json(v_on_duplicate)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- NULL is what jsonb_agg gives for no rows (a statement trigger's empty insert): no jobs.
  IF args_list IS NULL THEN
    RETURN;
  END IF;
  IF jsonb_typeof(args_list) <> 'array' THEN
    RAISE EXCEPTION 'args_list must be a JSON array of argument objects'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_wanted := jsonb_array_length(args_list);
  -- Each job after the first would find the key held by the first (enqueueMany refuses it too).
  IF enqueue_many.unique_key IS NOT NULL AND v_wanted > 1 THEN
    RAISE EXCEPTION 'the % jobs of this batch cannot share unique_key %: at most one job per key is queued or running; nothing of this batch was enqueued',
        v_wanted, to_json(enqueue_many.unique_key)::text
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- The statement of src/enqueue.ts's insertStatement, ON CONFLICT included: a held key
  -- inserts nothing, and no error aborts the caller's transaction unless raised below.
  RETURN QUERY
  WITH ins AS (
    INSERT INTO {{schema}}.jobs
      (task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key)
    SELECT enqueue_many.task, v_queue, v_priority::smallint, x.args, v_max_attempts,
           coalesce(enqueue_many.run_at, now()), enqueue_many.expires_at,
           enqueue_many.unique_key, enqueue_many.limit_key
      FROM jsonb_array_elements(args_list) WITH ORDINALITY AS x(args, i)
     ORDER BY x.i
    ON CONFLICT (unique_key) WHERE state IN ('queued', 'running') AND unique_key IS NOT NULL
      DO NOTHING
    RETURNING id)
  SELECT ins.id FROM ins ORDER BY ins.id;
  GET DIAGNOSTICS v_inserted = ROW_COUNT;
  IF v_inserted < v_wanted AND v_on_duplicate = 'raise' THEN
    RAISE EXCEPTION 'a job with unique_key % is already queued or running',
        to_json(enqueue_many.unique_key)::text
      USING ERRCODE = 'AKDUP', CONSTRAINT = 'jobs_unique_key_idx',
            HINT = 'Catch SQLSTATE AKDUP in a savepoint, or pass on_duplicate => ''ignore''.';
  END IF;
  IF v_inserted > 0 THEN
    PERFORM pg_notify(v_channel, v_queue);
  END IF;
END
$$;

-- Insert one job; returns its id, or NULL when on_duplicate => 'ignore' found its unique_key
-- held. NULL for any optional argument means its default (NULL args: an empty object).
CREATE FUNCTION {{schema}}.enqueue(
  task text,
  args jsonb DEFAULT '{}',
  queue text DEFAULT 'default',
  priority integer DEFAULT 0,
  run_at timestamptz DEFAULT NULL,
  max_attempts integer DEFAULT 3,
  unique_key text DEFAULT NULL,
  limit_key text DEFAULT NULL,
  expires_at timestamptz DEFAULT NULL,
  on_duplicate text DEFAULT 'raise')
RETURNS bigint
LANGUAGE sql
AS $$
  SELECT id FROM {{schema}}.enqueue_many(
    enqueue.task, jsonb_build_array(coalesce(enqueue.args, '{}'::jsonb)), enqueue.queue,
    enqueue.priority, enqueue.run_at, enqueue.max_attempts, enqueue.unique_key,
    enqueue.limit_key, enqueue.expires_at, enqueue.on_duplicate)
$$;
