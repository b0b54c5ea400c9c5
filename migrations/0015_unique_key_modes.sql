-- akadze schema, version 0015: what a duplicate unique key does. "{{schema}}" is replaced by the
-- quoted schema name.
--
-- Until now a held unique_key refused the enqueue (AKDUP, or nothing with on_duplicate =>
-- 'ignore'). enqueue_keyed decides instead, for one job with a unique key, what a duplicate
-- does; TypeScript enqueue (src/enqueue.ts) calls it for the options onDuplicate, whileRunning
-- and throttle, and enqueue/enqueue_many call it for their new arguments of the same names.
--
--   on_duplicate  'raise' (AKDUP; TypeScript's DuplicateJob), 'ignore' (no id), 'keep' (the
--                 holder's id, the holder unchanged), 'replace' (a queued holder takes the new
--                 task, arguments and options, run_at included) or 'debounce' (as 'replace',
--                 but run_at only moves later: the later of the holder's and the new one).
--   while_running 'keep' (a running holder stays the holder: on_duplicate's rule, with
--                 'replace' and 'debounce' keeping it as 'keep' does) or 'queue_one' (the
--                 running holder gives its key up, its unique_key becomes NULL, and a new job
--                 is queued with the key: at most one queued after the running one).
--   throttle      a window: once a job of the key is enqueued (or found holding it), every
--                 enqueue of the key until the window ends returns that job, whatever its
--                 state, even finished. The windows are rows of unique_windows.
--
-- A waiting holder (a flow step) and a queued holder in a flow are kept as they are, as a
-- running one is with 'keep'. A duplicate never raises inside enqueue_keyed: it reports the
-- outcome ('inserted', 'replaced', 'kept' or 'duplicate') and the caller decides (enqueue_many
-- raises AKDUP for 'duplicate' with 'raise', TypeScript throws DuplicateJob after a statement
-- that succeeded), so the caller's transaction stays usable.
--
-- Concurrent enqueues of one key: the INSERT's ON CONFLICT on jobs_active_unique_key_idx lets
-- one in and makes the others wait for its transaction; each then finds the holder and applies
-- its mode, or tries again when the holder was claimed or finished meanwhile. Only what a mode
-- changes is locked (to the end of the caller's transaction): a replaced queued job, which a
-- claim skips meanwhile, and a running job that gives its key up, whose outcome write waits. A
-- throttled key is serialized by its unique_windows row, so that a job finished between two
-- enqueues cannot let a second one into its window.
--
-- Nothing here touches jobs' definition or takes a lock on it: a new table, new functions, and
-- enqueue/enqueue_many replaced with the same arguments plus two (the old ones dropped in the
-- same transaction, their grants carried over).

-- One row per throttled key: the job that holds the key until `until`. An expired row is
-- replaced by the next throttled enqueue of its key, and a few are deleted by each new window.
CREATE TABLE {{schema}}.unique_windows (
  unique_key text PRIMARY KEY,
  job_id bigint NOT NULL,
  until timestamptz NOT NULL
);
CREATE INDEX unique_windows_until_idx ON {{schema}}.unique_windows (until);

-- One job with a unique key, by the rules above; returns it: its id, the outcome, and the
-- columns onEnqueue hooks receive. p_run_at NULL means now. The owner's rights: a 'replace'
-- updates a queued job and 'queue_one' a running one, which the enqueue role may not do
-- directly (docs/production.md); it changes only the job that holds p_unique_key, inserts only
-- queued jobs, and its search_path is pinned.
CREATE FUNCTION {{schema}}.enqueue_keyed(
  p_task text,
  p_queue text,
  p_priority integer,
  p_args jsonb,
  p_max_attempts integer,
  p_run_at timestamptz,
  p_expires_at timestamptz,
  p_unique_key text,
  p_limit_key text,
  p_trace_context jsonb,
  p_on_duplicate text,
  p_while_running text,
  p_throttle interval,
  p_notify boolean)
RETURNS TABLE (id bigint, outcome text, run_at timestamptz, expires_at timestamptz, args jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_run_at CONSTANT timestamptz := coalesce(p_run_at, now());
  v_window boolean := false;
  v_id bigint;
  v_state text;
  v_flow bigint;
  v_outcome text;
  v_run timestamptz;
  v_expires timestamptz;
  v_args jsonb;
  v_tries integer := 0;
BEGIN
  IF p_unique_key IS NULL THEN
    RAISE EXCEPTION 'enqueue_keyed needs a unique_key' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_on_duplicate IS NULL
     OR p_on_duplicate NOT IN ('raise', 'ignore', 'keep', 'replace', 'debounce') THEN
    RAISE EXCEPTION 'on_duplicate must be ''raise'', ''ignore'', ''keep'', ''replace'' or ''debounce'', got %',
        coalesce(to_json(p_on_duplicate)::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_while_running IS NULL OR p_while_running NOT IN ('keep', 'queue_one') THEN
    RAISE EXCEPTION 'while_running must be ''keep'' or ''queue_one'', got %',
        coalesce(to_json(p_while_running)::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_throttle IS NOT NULL AND p_throttle <= interval '0' THEN
    RAISE EXCEPTION 'throttle must be a positive interval, got %', p_throttle
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  IF p_throttle IS NOT NULL THEN
    -- Open the key's window unless one is open. The row stays locked to the end of the
    -- caller's transaction, open or not: the next throttled enqueue of the key waits for it.
    INSERT INTO {{schema}}.unique_windows AS w (unique_key, job_id, until)
    VALUES (p_unique_key, 0, now() + p_throttle)
    ON CONFLICT (unique_key) DO UPDATE SET job_id = 0, until = excluded.until
      WHERE w.until <= now()
    RETURNING true INTO v_window;
    IF v_window IS NULL THEN
      -- Inside the window: its job, whatever its state now (NULL columns once pruned).
      SELECT w.job_id INTO v_id FROM {{schema}}.unique_windows w
       WHERE w.unique_key = p_unique_key;
      RETURN QUERY SELECT v_id, 'kept'::text, j.run_at, j.expires_at, j.args::jsonb
        FROM (SELECT 1) AS one LEFT JOIN {{schema}}.jobs j ON j.id = v_id;
      RETURN;
    END IF;
    -- A few expired windows go with each new one (not this key's: it is open now).
    DELETE FROM {{schema}}.unique_windows w
     WHERE w.ctid = ANY (ARRAY(
       SELECT e.ctid FROM {{schema}}.unique_windows e
        WHERE e.until < now() ORDER BY e.until LIMIT 8 FOR UPDATE SKIP LOCKED));
  END IF;

  LOOP
    -- Each pass after the first follows a change of the holder by another transaction.
    v_tries := v_tries + 1;
    IF v_tries > 100 THEN
      RAISE EXCEPTION 'unique_key % changed hands 100 times during one enqueue',
          to_json(p_unique_key)::text
        USING ERRCODE = 'lock_not_available';
    END IF;
    -- The key free: this job. Held by a transaction in progress: waits for it to end.
    INSERT INTO {{schema}}.jobs AS j
      (task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
       trace_context)
    VALUES (p_task, p_queue, p_priority::smallint, p_args, p_max_attempts, v_run_at,
            p_expires_at, p_unique_key, p_limit_key, p_trace_context)
    ON CONFLICT (unique_key) WHERE state IN ('waiting', 'queued', 'running') AND unique_key IS NOT NULL
      DO NOTHING
    RETURNING j.id, j.run_at, j.expires_at, j.args INTO v_id, v_run, v_expires, v_args;
    IF v_id IS NOT NULL THEN
      v_outcome := 'inserted';
      EXIT;
    END IF;
    -- The holder, committed (the INSERT waited for it). Not locked: keeping it or refusing
    -- must not hold back a worker's outcome write. The UPDATEs below lock what they change and
    -- check the state again; a holder that changed meanwhile means another pass.
    SELECT j.id, j.state, j.flow_id, j.run_at, j.expires_at, j.args
      INTO v_id, v_state, v_flow, v_run, v_expires, v_args
      FROM {{schema}}.jobs j
     WHERE j.unique_key = p_unique_key AND j.state IN ('waiting', 'queued', 'running');
    IF v_id IS NULL THEN
      CONTINUE; -- it finished between the two statements: the key is free again
    END IF;
    IF v_state = 'running' AND p_while_running = 'queue_one' THEN
      -- The running job gives its key up (a retry of it then queues without the key), and the
      -- INSERT runs again: this transaction's update frees the index entry for it. The row
      -- stays locked until the caller's transaction ends: its outcome write waits for that.
      UPDATE {{schema}}.jobs j SET unique_key = NULL
       WHERE j.id = v_id AND j.state = 'running' AND j.unique_key = p_unique_key;
      CONTINUE;
    END IF;
    IF v_state = 'queued' AND v_flow IS NULL AND p_on_duplicate IN ('replace', 'debounce') THEN
      -- A retry keeps its attempts: the budget never drops below the attempts made. A claim
      -- skips the row while it is locked, until the caller's transaction ends.
      UPDATE {{schema}}.jobs j
         SET task = p_task, queue = p_queue, priority = p_priority::smallint, args = p_args,
             max_attempts = greatest(p_max_attempts, j.attempt),
             run_at = CASE WHEN p_on_duplicate = 'debounce' THEN greatest(j.run_at, v_run_at)
                           ELSE v_run_at END,
             expires_at = p_expires_at, limit_key = p_limit_key,
             trace_context = p_trace_context, cancel_requested_at = NULL
       WHERE j.id = v_id AND j.state = 'queued' AND j.unique_key = p_unique_key
      RETURNING j.run_at, j.expires_at, j.args INTO v_run, v_expires, v_args;
      IF NOT FOUND THEN
        CONTINUE; -- claimed or finished meanwhile
      END IF;
      v_outcome := 'replaced';
    ELSIF p_on_duplicate IN ('raise', 'ignore') THEN
      v_outcome := 'duplicate';
    ELSE
      v_outcome := 'kept';
    END IF;
    EXIT;
  END LOOP;

  IF v_window AND v_outcome = 'duplicate' THEN
    -- Refused: no window, as when enqueue_many's AKDUP undoes this statement.
    DELETE FROM {{schema}}.unique_windows w WHERE w.unique_key = p_unique_key;
  ELSIF v_window THEN
    UPDATE {{schema}}.unique_windows w SET job_id = v_id WHERE w.unique_key = p_unique_key;
  END IF;
  IF p_notify AND v_outcome IN ('inserted', 'replaced') THEN
    PERFORM pg_notify(v_channel, p_queue);
  END IF;
  RETURN QUERY SELECT v_id, v_outcome, v_run, v_expires, v_args;
END
$$;

-- 0010's enqueue_many with two more arguments, while_running and throttle, and more values of
-- on_duplicate, all of enqueue_keyed's meaning. A call that uses none of them runs 0010's
-- statement, unchanged; one that does (with a unique_key, and one job) calls enqueue_keyed.
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
  on_duplicate text DEFAULT 'raise',
  while_running text DEFAULT 'keep',
  throttle interval DEFAULT NULL)
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
  v_while_running CONSTANT text := coalesce(enqueue_many.while_running, 'keep');
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
  v_id bigint;
  v_outcome text;
BEGIN
  IF v_priority NOT BETWEEN -32768 AND 32767 THEN
    RAISE EXCEPTION 'priority must be an integer from -32768 to 32767, got %', v_priority
      USING ERRCODE = 'numeric_value_out_of_range';
  END IF;
  IF v_max_attempts < 1 THEN
    RAISE EXCEPTION 'max_attempts must be an integer from 1 to 2147483647, got %', v_max_attempts
      USING ERRCODE = 'numeric_value_out_of_range';
  END IF;
  IF v_on_duplicate NOT IN ('raise', 'ignore', 'keep', 'replace', 'debounce') THEN
    RAISE EXCEPTION 'on_duplicate must be ''raise'', ''ignore'', ''keep'', ''replace'' or ''debounce'', got %',
        to_json(v_on_duplicate)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v_while_running NOT IN ('keep', 'queue_one') THEN
    RAISE EXCEPTION 'while_running must be ''keep'' or ''queue_one'', got %', to_json(v_while_running)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF enqueue_many.throttle <= interval '0' THEN
    RAISE EXCEPTION 'throttle must be a positive interval, got %', enqueue_many.throttle
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF enqueue_many.unique_key IS NULL
     AND (v_on_duplicate NOT IN ('raise', 'ignore') OR v_while_running <> 'keep'
          OR enqueue_many.throttle IS NOT NULL) THEN
    RAISE EXCEPTION 'on_duplicate %, while_running % and throttle need a unique_key',
        to_json(v_on_duplicate), to_json(v_while_running)
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
  IF enqueue_many.unique_key IS NOT NULL AND v_wanted = 1
     AND (v_on_duplicate NOT IN ('raise', 'ignore') OR v_while_running <> 'keep'
          OR enqueue_many.throttle IS NOT NULL) THEN
    SELECT k.id, k.outcome INTO v_id, v_outcome
      FROM {{schema}}.enqueue_keyed(enqueue_many.task, v_queue, v_priority, args_list -> 0,
             v_max_attempts, enqueue_many.run_at, enqueue_many.expires_at,
             enqueue_many.unique_key, enqueue_many.limit_key, v_trace_context, v_on_duplicate,
             v_while_running, enqueue_many.throttle, true) AS k;
    IF v_outcome = 'duplicate' AND v_on_duplicate = 'raise' THEN
      RAISE EXCEPTION 'a job with unique_key % is already waiting, queued or running',
          to_json(enqueue_many.unique_key)::text
        USING ERRCODE = 'AKDUP', CONSTRAINT = 'jobs_active_unique_key_idx',
              HINT = 'Catch SQLSTATE AKDUP in a savepoint, or pass on_duplicate => ''ignore''.';
    END IF;
    IF v_outcome <> 'duplicate' THEN
      RETURN QUERY SELECT v_id;
    END IF;
    RETURN;
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

-- 0003's enqueue with the two new arguments; returns the job's id: the new job's, or the
-- holder's (kept or replaced), or NULL when on_duplicate => 'ignore' found the key held.
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
  on_duplicate text DEFAULT 'raise',
  while_running text DEFAULT 'keep',
  throttle interval DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT id FROM {{schema}}.enqueue_many(
    enqueue.task, jsonb_build_array(coalesce(enqueue.args, '{}'::jsonb)), enqueue.queue,
    enqueue.priority, enqueue.run_at, enqueue.max_attempts, enqueue.unique_key,
    enqueue.limit_key, enqueue.expires_at, enqueue.on_duplicate, enqueue.while_running,
    enqueue.throttle)
$$;

-- The new enqueue and enqueue_many get the old ones' grants (a database that revoked EXECUTE
-- from PUBLIC granted them to its roles by name), then the old ones go: in this transaction,
-- so no caller ever sees two of either.
DO $$
DECLARE
  r record;
  g record;
BEGIN
  FOR r IN
    SELECT o.oid::regprocedure AS old_fn, n.oid::regprocedure AS new_fn, o.proacl
      FROM pg_catalog.pg_proc o
      JOIN pg_catalog.pg_proc n
        ON n.pronamespace = o.pronamespace AND n.proname = o.proname AND n.oid <> o.oid
     WHERE o.oid IN (
       '{{schema}}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, timestamptz, text)'::regprocedure,
       '{{schema}}.enqueue_many(text, jsonb, text, integer, timestamptz, integer, text, text, timestamptz, text)'::regprocedure)
  LOOP
    IF r.proacl IS NOT NULL THEN
      EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', r.new_fn);
      FOR g IN SELECT a.grantee, a.is_grantable FROM pg_catalog.aclexplode(r.proacl) a
                WHERE a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', r.new_fn,
          CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
          CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
      END LOOP;
    END IF;
    EXECUTE pg_catalog.format('DROP FUNCTION %s', r.old_fn);
  END LOOP;
END
$$;
