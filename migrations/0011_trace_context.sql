-- akadze schema, version 0011: the trace context of a job. "{{schema}}" is replaced by the
-- quoted schema name.
--
-- `trace_context` holds the W3C trace context of the enqueue ({"traceparent": ...,
-- "tracestate": ...}) when tracing is on (src/tracing.ts), else NULL; the worker makes each
-- run's span a child of (first run) or linked to (later runs) that context. Added without a
-- rewrite (a NULL).
ALTER TABLE {{schema}}.jobs ADD COLUMN trace_context jsonb;

-- SQL enqueue joins the caller's trace: a transaction that did
--   SET LOCAL akadze.traceparent = '00-<trace id>-<span id>-<flags>'
-- (and optionally akadze.tracestate) stores that context with its jobs, so a job made by a
-- trigger belongs to the request that caused it. A value that is not a W3C traceparent is
-- ignored (the job starts a trace of its own), as the W3C rule says, rather than refusing
-- the enqueue. Otherwise enqueue_many is 0010's; enqueue calls it.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_many(
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
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_queue CONSTANT text := coalesce(enqueue_many.queue, 'default');
  v_priority CONSTANT integer := coalesce(enqueue_many.priority, 0);
  v_max_attempts CONSTANT integer := coalesce(enqueue_many.max_attempts, 3);
  v_on_duplicate CONSTANT text := coalesce(enqueue_many.on_duplicate, 'raise');
  -- The placeholder is the quoted schema name; the channel has it bare.
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_max CONSTANT bigint :=
    coalesce(nullif(current_setting('akadze.max_args_bytes', true), '')::bigint, 1048576);
  v_index bigint;
  v_bytes integer;
  v_wanted integer;
  v_inserted integer;
  v_traceparent CONSTANT text := current_setting('akadze.traceparent', true);
  v_trace_context jsonb;
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
  SELECT t.i, octet_length(t.x::text) INTO v_index, v_bytes
    FROM jsonb_array_elements(args_list) WITH ORDINALITY AS t(x, i)
   WHERE octet_length(t.x::text) > v_max
   ORDER BY t.i LIMIT 1;
  IF v_index IS NOT NULL THEN
    RAISE EXCEPTION 'arguments for job % of this batch of task % are % bytes of JSON, over the limit of % bytes (the setting akadze.max_args_bytes); store large data elsewhere and pass a reference',
        v_index, to_json(enqueue_many.task)::text, v_bytes, v_max
      USING ERRCODE = 'program_limit_exceeded';
  END IF;
  IF v_traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
    v_trace_context := jsonb_strip_nulls(jsonb_build_object('traceparent', v_traceparent,
      'tracestate', nullif(current_setting('akadze.tracestate', true), '')));
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
      (task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
       trace_context)
    SELECT enqueue_many.task, v_queue, v_priority::smallint, x.args, v_max_attempts,
           coalesce(enqueue_many.run_at, now()), enqueue_many.expires_at,
           enqueue_many.unique_key, enqueue_many.limit_key, v_trace_context
      FROM jsonb_array_elements(args_list) WITH ORDINALITY AS x(args, i)
     ORDER BY x.i
    ON CONFLICT (unique_key) WHERE state IN ('waiting', 'queued', 'running') AND unique_key IS NOT NULL
      DO NOTHING
    RETURNING id)
  SELECT ins.id FROM ins ORDER BY ins.id;
  GET DIAGNOSTICS v_inserted = ROW_COUNT;
  IF v_inserted < v_wanted AND v_on_duplicate = 'raise' THEN
    RAISE EXCEPTION 'a job with unique_key % is already waiting, queued or running',
        to_json(enqueue_many.unique_key)::text
      USING ERRCODE = 'AKDUP', CONSTRAINT = 'jobs_active_unique_key_idx',
            HINT = 'Catch SQLSTATE AKDUP in a savepoint, or pass on_duplicate => ''ignore''.';
  END IF;
  IF v_inserted > 0 THEN
    PERFORM pg_notify(v_channel, v_queue);
  END IF;
END
$$;
