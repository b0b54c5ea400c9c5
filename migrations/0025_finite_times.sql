-- akadze schema, version 0025: SQL enqueue refuses an infinite run_at or expires_at.
-- "{{schema}}" is replaced by the quoted schema name.
--
-- A timestamptz takes 'infinity' and '-infinity', and enqueue, enqueue_many and enqueue_flow
-- stored them: a job at run_at 'infinity' never ran, one at '-infinity' ran before every other
-- job of its queue, one with expires_at '-infinity' was cancelled as expired. TypeScript enqueue
-- cannot make either (a Date is finite). enqueue_many (0015, which enqueue calls) and
-- enqueue_flow (0018) are replaced with the same arguments, grants and bodies, plus the check.
-- Replacing a function takes no lock on the jobs table; callers call the new body unchanged.

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
  -- A timestamp column takes 'infinity' and '-infinity': a job that would never run, or would
  -- run before every other (and expire at once); TypeScript's dates cannot be either.
  IF NOT isfinite(enqueue_many.run_at) THEN
    RAISE EXCEPTION 'run_at must be a finite time, got %: pass NULL to run the job now',
        enqueue_many.run_at
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF NOT isfinite(enqueue_many.expires_at) THEN
    RAISE EXCEPTION 'expires_at must be a finite time, got %: pass NULL for a job that never expires',
        enqueue_many.expires_at
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

CREATE OR REPLACE FUNCTION {{schema}}.enqueue_flow(steps jsonb, in_flow bigint DEFAULT NULL,
                                        trace_context jsonb DEFAULT NULL)
RETURNS TABLE (step text, id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_max CONSTANT bigint := coalesce(
    nullif(current_setting('akadze.max_args_bytes', true), '')::bigint,
    1048576);
  v_keys CONSTANT text[] := '{name,task,args,queue,priority,max_attempts,run_at,delay_ms,expires_at,unique_key,limit_key,depends_on}';
  v_n integer;
  v_names text[];
  v_index jsonb;
  v_depended jsonb;
  v_queues text[];
  v_seq regclass;
  v_i bigint;
  v_problem text;
  v_from integer[];
  v_to integer[];
  v_job bigint[];
  v_policy text[];
  v_rank integer[];
  v_ids bigint[];
  v_ext_ids bigint[];
  v_ext_states text[];
  v_k integer;
  v_traceparent CONSTANT text := current_setting('akadze.traceparent', true);
  v_trace_context jsonb := enqueue_flow.trace_context;
BEGIN
  IF jsonb_typeof(steps) IS DISTINCT FROM 'array'
     OR jsonb_array_length(steps) = 0 THEN
    RAISE EXCEPTION 'steps must be a non-empty JSON array of step objects'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_n := jsonb_array_length(steps);
  -- The caller's trace: TypeScript passes its enqueue span's; SQL may set akadze.traceparent
  -- (SET LOCAL) as for enqueue and enqueue_many.
  IF v_trace_context IS NOT NULL AND NOT (
       jsonb_typeof(v_trace_context) = 'object'
       AND (v_trace_context ->> 'traceparent') ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       AND v_trace_context - '{traceparent,tracestate}'::text[] = '{}'::jsonb) THEN
    RAISE EXCEPTION 'trace_context must be {"traceparent": "<W3C traceparent>", "tracestate": "..."} or null'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF v_trace_context IS NULL
     AND v_traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
    v_trace_context := jsonb_strip_nulls(jsonb_build_object('traceparent', v_traceparent,
      'tracestate', nullif(current_setting('akadze.tracestate', true), '')));
  END IF;

  -- Each step on its own: the first problem found is reported.
  SELECT t.i, t.problem INTO v_i, v_problem FROM (
    SELECT s.i, CASE
        WHEN jsonb_typeof(s.x) <> 'object'
          THEN 'must be a JSON object'
        WHEN jsonb_typeof(s.x -> 'name') IS DISTINCT FROM 'string'
          OR length(s.x ->> 'name') NOT BETWEEN 1 AND 200
          THEN 'needs a "name": a string of 1 to 200 characters'
        WHEN jsonb_typeof(s.x -> 'task') IS DISTINCT FROM 'string'
          OR length(s.x ->> 'task') NOT BETWEEN 1 AND 200
          THEN 'needs a "task": a task name of 1 to 200 characters'
        WHEN s.x - v_keys <> '{}'::jsonb
          THEN 'has an unknown key (keys: ' ||
               array_to_string(v_keys, ', ') || ')'
        WHEN s.x ? 'args'
          AND jsonb_typeof(s.x -> 'args') <> 'object'
          THEN '"args" must be a JSON object'
        WHEN s.x ? 'queue'
          AND (jsonb_typeof(s.x -> 'queue') <> 'string'
               OR NOT (s.x ->> 'queue') ~ '^[A-Za-z0-9_.:-]{1,64}$')
          THEN '"queue" must be 1 to 64 letters, digits, or _ . : -'
        WHEN s.x ? 'priority'
          AND NOT CASE WHEN jsonb_typeof(s.x -> 'priority') = 'number'
                       THEN (s.x ->> 'priority')::numeric BETWEEN -32768 AND 32767
                            AND (s.x ->> 'priority')::numeric % 1 = 0
                       ELSE false END
          THEN '"priority" must be an integer from -32768 to 32767'
        WHEN s.x ? 'max_attempts'
          AND NOT CASE WHEN jsonb_typeof(s.x -> 'max_attempts') = 'number'
                       THEN (s.x ->> 'max_attempts')::numeric BETWEEN 1 AND 2147483647
                            AND (s.x ->> 'max_attempts')::numeric % 1 = 0
                       ELSE false END
          THEN '"max_attempts" must be an integer from 1 to 2147483647'
        WHEN s.x ? 'delay_ms'
          AND (jsonb_typeof(s.x -> 'delay_ms') <> 'number'
               OR (s.x ->> 'delay_ms')::numeric NOT BETWEEN 0 AND 31536000000)
          THEN '"delay_ms" must be a number of milliseconds from 0 to 31536000000 (365 days)'
        WHEN s.x ? 'run_at' AND s.x ? 'delay_ms'
          THEN '"run_at" and "delay_ms" cannot both be set'
        WHEN (s.x ? 'run_at' AND jsonb_typeof(s.x -> 'run_at') <> 'string')
          OR (s.x ? 'expires_at' AND jsonb_typeof(s.x -> 'expires_at') <> 'string')
          THEN '"run_at" and "expires_at" must be timestamps (strings)'
        WHEN (s.x ? 'run_at' AND NOT isfinite((s.x ->> 'run_at')::timestamptz))
          OR (s.x ? 'expires_at' AND NOT isfinite((s.x ->> 'expires_at')::timestamptz))
          THEN '"run_at" and "expires_at" must be finite times, not infinity (leave them out to run now and never expire)'
        WHEN (s.x ? 'unique_key'
              AND (jsonb_typeof(s.x -> 'unique_key') <> 'string'
                   OR length(s.x ->> 'unique_key') NOT BETWEEN 1 AND 500))
          OR (s.x ? 'limit_key'
              AND (jsonb_typeof(s.x -> 'limit_key') <> 'string'
                   OR length(s.x ->> 'limit_key') NOT BETWEEN 1 AND 500))
          THEN '"unique_key" and "limit_key" must be strings of 1 to 500 characters'
        WHEN s.x ? 'depends_on'
          AND jsonb_typeof(s.x -> 'depends_on') <> 'array'
          THEN '"depends_on" must be an array of step names, {"step": name} or {"job": id} objects'
        END AS problem
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i)) t
   WHERE t.problem IS NOT NULL ORDER BY t.i LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'step % of this flow %', v_i, v_problem USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT t.i, t.bytes INTO v_i, v_k FROM (
    SELECT s.i, octet_length((s.x -> 'args')::text) AS bytes
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i)) t
   WHERE t.bytes > v_max ORDER BY t.i LIMIT 1;
  IF v_i IS NOT NULL AND v_k IS NOT NULL THEN
    RAISE EXCEPTION 'arguments of step % of this flow are % bytes of JSON, over the limit of % bytes (the setting akadze.max_args_bytes); store large data elsewhere and pass a reference',
        v_i, v_k, v_max
      USING ERRCODE = 'program_limit_exceeded';
  END IF;
  -- Each step's position by name: a lookup in a JSON object (a binary search), not a scan of
  -- every name per dependency, which a fan-in of thousands would pay quadratically. The names
  -- in the order given, in the same pass (the function scan yields them in order).
  SELECT jsonb_object_agg(s.x ->> 'name', s.i), array_agg(s.x ->> 'name')
    INTO v_index, v_names
    FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i);
  -- A repeated name keeps one key of the index: only then look for it.
  IF (SELECT count(*) FROM jsonb_object_keys(v_index)) < v_n THEN
    SELECT n INTO v_problem FROM unnest(v_names) n GROUP BY n
    HAVING count(*) > 1 LIMIT 1;
    RAISE EXCEPTION 'this flow has two steps named %: step names must be unique',
        to_json(v_problem)::text
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The dependencies: each a step of this flow (by name) or an existing job (by id). One pass
  -- checks them and collects the four arrays, in the order the steps and their dependencies
  -- are given (a nested loop over the two lists, unsorted, so the first problem is the first
  -- step's); a dependency that is not well-formed yields no id (the CASEs below).
  SELECT min(e.i) FILTER (WHERE e.problem IS NOT NULL),
         (array_agg(e.problem) FILTER (WHERE e.problem IS NOT NULL))[1],
         array_agg(e.i::integer), array_agg(e.dep), array_agg(e.job), array_agg(e.policy)
    INTO v_i, v_problem, v_from, v_to, v_job, v_policy
    FROM (
      SELECT s.i,
             CASE
             WHEN jsonb_typeof(d.x) = 'string'
                  AND NOT v_index ? (d.x #>> '{}')
               THEN 'depends on ' || d.x::text ||
                    ', which is not a step of this flow'
             WHEN jsonb_typeof(d.x) = 'string' THEN NULL
             WHEN jsonb_typeof(d.x) <> 'object'
               OR (d.x ? 'step') = (d.x ? 'job')
               OR d.x - '{step,job,on_failure}'::text[] <> '{}'::jsonb
               THEN 'has a dependency that is neither a step name nor {"step": name} or {"job": id} (with an optional "on_failure")'
             WHEN d.x ? 'on_failure'
               AND NOT coalesce(d.x ->> 'on_failure' =
                                  ANY ('{cancel,ignore,continue}'::text[]), false)
               THEN 'has an "on_failure" other than "cancel", "ignore" or "continue"'
             WHEN d.x ? 'step'
               AND NOT coalesce(v_index ? (d.x ->> 'step'), false)
               THEN 'depends on ' || (d.x -> 'step')::text
                    || ', which is not a step of this flow'
             WHEN d.x ? 'job'
               AND NOT coalesce((d.x ->> 'job') ~ '^[1-9][0-9]{0,18}$', false)
               THEN 'depends on job ' || (d.x -> 'job')::text
                    || ', which is not a job id'
             END AS problem,
             (v_index ->> coalesce(
               CASE WHEN jsonb_typeof(d.x) = 'object' THEN d.x ->> 'step' END,
               CASE WHEN jsonb_typeof(d.x) = 'string'
                    THEN d.x #>> '{}' END))::integer AS dep,
             CASE WHEN jsonb_typeof(d.x) = 'object'
                   AND coalesce((d.x ->> 'job') ~ '^[1-9][0-9]{0,18}$', false)
                  THEN (d.x ->> 'job')::bigint END AS job,
             coalesce(CASE WHEN jsonb_typeof(d.x) = 'object' THEN d.x ->> 'on_failure' END,
                      'cancel') AS policy
        FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i),
             jsonb_array_elements(
               coalesce(s.x -> 'depends_on', '[]'::jsonb)) AS d(x)) e;
  IF v_i IS NOT NULL THEN
    RAISE EXCEPTION 'step % of this flow (%) %', v_i,
        to_json(v_names[v_i])::text, v_problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_from := coalesce(v_from, '{}');
  v_to := coalesce(v_to, '{}');
  v_job := coalesce(v_job, '{}');
  v_policy := coalesce(v_policy, '{}');
  SELECT x.f INTO v_i
    FROM unnest(v_from, v_to, v_job) AS x(f, t, j)
   GROUP BY x.f, x.t, x.j HAVING count(*) > 1 LIMIT 1;
  IF v_i IS NOT NULL THEN
    RAISE EXCEPTION 'step % of this flow (%) lists the same dependency twice', v_i,
        to_json(v_names[v_i])::text
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- Dependency order: the order given when every step comes after its dependencies (as
  -- app.enqueueFlow sends them), else a topological sort; a step left over is on a cycle.
  v_rank := {{schema}}.flow_order(v_n, v_from, v_to);
  IF 0 = ANY (v_rank) THEN
    RAISE EXCEPTION 'this flow has a cycle: these steps are on it or after it: %', (
        SELECT string_agg(to_json(v_names[x.i])::text, ', ' ORDER BY x.i)
          FROM (SELECT i FROM generate_subscripts(v_rank, 1) i
                 WHERE v_rank[i] = 0 ORDER BY i LIMIT 10) x)
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'A step cannot depend, directly or through other steps, on itself.';
  END IF;

  -- The existing jobs depended on: marked (and locked, so that one finishing now settles
  -- this flow's steps after this transaction, or before it and is seen terminal here).
  v_ext_ids := ARRAY (SELECT DISTINCT j FROM unnest(v_job) j WHERE j IS NOT NULL);
  IF cardinality(v_ext_ids) > 0 THEN
    WITH marked AS (
      UPDATE {{schema}}.jobs j SET has_dependents = true
       WHERE j.id = ANY (v_ext_ids)
      RETURNING j.id, j.state)
    SELECT array_agg(m.id ORDER BY m.id), array_agg(m.state ORDER BY m.id)
      INTO v_ext_ids, v_ext_states FROM marked m;
    SELECT j INTO v_i FROM unnest(v_job) j
     WHERE j IS NOT NULL AND NOT j = ANY (coalesce(v_ext_ids, '{}'))
     LIMIT 1;
    IF v_i IS NOT NULL THEN
      RAISE EXCEPTION 'this flow depends on job %, which does not exist', v_i
        USING ERRCODE = 'foreign_key_violation';
    END IF;
  END IF;

  -- The steps others depend on (by position), for has_dependents.
  v_depended := coalesce((SELECT jsonb_object_agg(x.t::text, true)
                            FROM unnest(v_to) AS x(t) WHERE x.t IS NOT NULL), '{}');
  -- The sequence looked up once, not for every id.
  v_seq := pg_get_serial_sequence('{{schema}}.jobs', 'id')::regclass;
  v_ids := ARRAY (SELECT nextval(v_seq) FROM generate_series(1, v_n));
  BEGIN
    -- No joins: a step's dependencies are its depends_on (none is listed twice), and
    -- whether others depend on it a lookup, so the plan cannot turn quadratic.
    WITH inserted AS (
    INSERT INTO {{schema}}.jobs
      (id, task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
       state, pending_deps, has_dependents, flow_id, step, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT v_ids[v_rank[s.i]], s.x ->> 'task',
           coalesce(s.x ->> 'queue', 'default'),
           coalesce((s.x ->> 'priority')::smallint, 0),
           coalesce(s.x -> 'args', '{}'::jsonb),
           coalesce((s.x ->> 'max_attempts')::integer, 3),
           coalesce((s.x ->> 'run_at')::timestamptz,
                    now() +
                      (coalesce((s.x ->> 'delay_ms')::float8, 0)
                       * interval '1 millisecond')),
           (s.x ->> 'expires_at')::timestamptz,
           s.x ->> 'unique_key', s.x ->> 'limit_key',
           CASE WHEN s.x ? 'depends_on' AND jsonb_array_length(s.x -> 'depends_on') > 0
                THEN 'waiting' ELSE 'queued' END,
           coalesce(jsonb_array_length(s.x -> 'depends_on'), 0),
           v_depended ? s.i::text, coalesce(in_flow, v_ids[1]),
           s.x ->> 'name', v_trace_context
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i)
    RETURNING queue, state)
    SELECT array_agg(DISTINCT i.queue::text) FILTER (WHERE i.state = 'queued')
      INTO v_queues FROM inserted i;
  EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a step''s unique_key is already held by a waiting, queued or running job; nothing of this flow was enqueued'
      USING ERRCODE = 'AKDUP', CONSTRAINT = 'jobs_active_unique_key_idx',
            HINT = 'Catch SQLSTATE AKDUP in a savepoint.';
  END;
  INSERT INTO {{schema}}.job_dependencies (job_id, depends_on, on_failure)
  SELECT v_ids[v_rank[e.f]], coalesce(v_ids[v_rank[e.t]], e.j), e.p
    FROM unnest(v_from, v_to, v_job, v_policy) AS e(f, t, j, p);

  -- Dependencies that had already finished count now.
  FOR v_k IN 1 .. coalesce(cardinality(v_ext_ids), 0) LOOP
    IF v_ext_states[v_k] = ANY ('{succeeded,failed,cancelled}'::text[]) THEN
      PERFORM {{schema}}.settle_dependents(v_ext_ids[v_k], v_ext_states[v_k], v_ids);
    END IF;
  END LOOP;
  -- The queues of the steps queued at once (settle_dependents announces those it queues).
  PERFORM pg_notify(v_channel, q) FROM unnest(v_queues) q;
  RETURN QUERY
  -- unnest, not v_names[i]: finding the i-th element of a text array walks the ones before.
  SELECT s.name, v_ids[v_rank[s.i]]
    FROM unnest(v_names) WITH ORDINALITY AS s(name, i) ORDER BY s.i;
END
$$;
