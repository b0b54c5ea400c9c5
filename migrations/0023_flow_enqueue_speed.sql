-- akadze schema, version 0023: enqueue_flow_steps (0019, app.enqueueFlow's flow enqueue) with
-- the same arguments, checks, messages and rows, in less of the server's time. "{{schema}}" is
-- replaced by the quoted schema name. Replacing a function takes no lock on the jobs table, and
-- callers of 0019's function call this one unchanged.
--
-- Where a 10,000-step flow's time went, and what changed:
-- - A domain's CHECK runs on every value cast to it: the jobs INSERT cast each step's queue to
--   queue_name, whose pattern ('{1,64}' in it) cost some 5 µs a value. The first step's queue
--   and task are cast once, into variables of their domains, and every step in them takes
--   those; only a step in another queue or task is cast (and checked) itself. The per-step
--   check tests the first step's queue once too.
-- - How many steps each waits for and whether others wait for it: an aggregate over the steps
--   and the dependencies (two sorts); now counted in place in two arrays, a loop over the
--   dependencies (their positions were checked just before).
-- - The queues to announce: read back from the inserted rows (RETURNING, then a sort); now
--   the first step's queue when every step is in it, otherwise the distinct queues of the
--   steps that wait for nothing.
CREATE OR REPLACE FUNCTION {{schema}}.enqueue_flow_steps(
  p_names text[], p_tasks text[], p_queues text[], p_priorities integer[],
  p_max_attempts integer[], p_args text, p_run_at timestamptz[], p_delay_ms float8[],
  p_expires_at timestamptz[], p_unique_keys text[], p_limit_keys text[],
  p_dep_step integer[], p_dep_on integer[], p_dep_job bigint[], p_dep_policy text[],
  in_flow bigint DEFAULT NULL, trace_context jsonb DEFAULT NULL)
RETURNS bigint[]
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
  v_n CONSTANT integer := coalesce(cardinality(p_names), 0);
  v_m CONSTANT integer := coalesce(cardinality(p_dep_step), 0);
  v_args jsonb;
  v_pending integer[];
  v_depended boolean[];
  v_seq regclass;
  v_i bigint;
  v_k integer;
  v_problem text;
  v_ids bigint[];
  v_flow bigint;
  v_ext_ids bigint[];
  v_ext_states text[];
  v_traceparent CONSTANT text := current_setting('akadze.traceparent', true);
  v_trace_context jsonb := enqueue_flow_steps.trace_context;
  -- The first step's queue and task (checked once; most flows have one of each).
  v_queue0 CONSTANT text := p_queues[1];
  v_queue0_ok CONSTANT boolean := length(v_queue0) BETWEEN 1 AND 64
                                  AND v_queue0 ~ '^[A-Za-z0-9_.:-]+$';
  v_queue {{schema}}.queue_name;
  v_task {{schema}}.task_name;
BEGIN
  IF v_n = 0 THEN
    RAISE EXCEPTION 'a flow needs at least one step' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Every array of the steps has one element per step (an optional one may be null: none set).
  IF coalesce(cardinality(p_tasks), -1) <> v_n OR coalesce(cardinality(p_queues), -1) <> v_n
     OR coalesce(cardinality(p_priorities), -1) <> v_n
     OR coalesce(cardinality(p_max_attempts), -1) <> v_n
     OR coalesce(cardinality(p_run_at), v_n) <> v_n OR coalesce(cardinality(p_delay_ms), v_n) <> v_n
     OR coalesce(cardinality(p_expires_at), v_n) <> v_n
     OR coalesce(cardinality(p_unique_keys), v_n) <> v_n
     OR coalesce(cardinality(p_limit_keys), v_n) <> v_n
     OR coalesce(cardinality(p_dep_on), 0) <> v_m OR coalesce(cardinality(p_dep_job), 0) <> v_m
     OR coalesce(cardinality(p_dep_policy), 0) <> v_m THEN
    RAISE EXCEPTION 'the arrays of a flow''s steps (and of its dependencies) must have one element per step (per dependency)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
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

  -- Each step on its own, as enqueue_flow checks it: the first problem found is reported.
  SELECT t.i, t.problem INTO v_i, v_problem FROM (
    SELECT s.i, CASE
        WHEN s.name IS NULL OR length(s.name) NOT BETWEEN 1 AND 200
          THEN 'needs a "name": a string of 1 to 200 characters'
        WHEN s.task IS NULL OR length(s.task) NOT BETWEEN 1 AND 200
          THEN 'needs a "task": a task name of 1 to 200 characters'
        -- The length apart: '{1,64}' in the pattern costs some 10 µs a match.
        -- The first step's queue checked once, not on every step in it.
        WHEN s.queue IS NULL OR NOT CASE WHEN s.queue = v_queue0 THEN v_queue0_ok
                                         ELSE length(s.queue) BETWEEN 1 AND 64
                                              AND s.queue ~ '^[A-Za-z0-9_.:-]+$' END
          THEN '"queue" must be 1 to 64 letters, digits, or _ . : -'
        WHEN s.priority IS NULL OR s.priority NOT BETWEEN -32768 AND 32767
          THEN '"priority" must be an integer from -32768 to 32767'
        WHEN s.max_attempts IS NULL OR s.max_attempts < 1
          THEN '"max_attempts" must be an integer from 1 to 2147483647'
        WHEN s.delay_ms IS NOT NULL AND NOT s.delay_ms BETWEEN 0 AND 31536000000
          THEN '"delay_ms" must be a number of milliseconds from 0 to 31536000000 (365 days)'
        WHEN s.run_at IS NOT NULL AND s.delay_ms IS NOT NULL
          THEN '"run_at" and "delay_ms" cannot both be set'
        WHEN length(s.unique_key) NOT BETWEEN 1 AND 500 OR length(s.limit_key) NOT BETWEEN 1 AND 500
          THEN '"unique_key" and "limit_key" must be strings of 1 to 500 characters'
        END AS problem
      FROM ROWS FROM (unnest(p_names), unnest(p_tasks), unnest(p_queues), unnest(p_priorities),
                      unnest(p_max_attempts), unnest(p_run_at), unnest(p_delay_ms),
                      unnest(p_unique_keys), unnest(p_limit_keys))
           WITH ORDINALITY AS s(name, task, queue, priority, max_attempts, run_at, delay_ms,
                                unique_key, limit_key, i)) t
   WHERE t.problem IS NOT NULL ORDER BY t.i LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'step % of this flow %', v_i, v_problem USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- The arguments: a JSON array of one object per step.
  v_args := p_args::jsonb;
  IF jsonb_typeof(v_args) IS DISTINCT FROM 'array' OR jsonb_array_length(v_args) <> v_n THEN
    RAISE EXCEPTION 'the arguments of a flow''s steps must be a JSON array of one object per step'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Each step's arguments measured only when all of them together are over the limit.
  SELECT t.i, t.bytes INTO v_i, v_k FROM (
    SELECT a.i, CASE WHEN jsonb_typeof(a.x) <> 'object' THEN NULL
                     WHEN octet_length(p_args) <= v_max THEN 0
                     ELSE octet_length(a.x::text) END AS bytes
      FROM jsonb_array_elements(v_args) WITH ORDINALITY AS a(x, i)) t
   WHERE t.bytes IS NULL OR t.bytes > v_max ORDER BY t.i LIMIT 1;
  IF v_i IS NOT NULL AND v_k IS NULL THEN
    RAISE EXCEPTION 'step % of this flow "args" must be a JSON object', v_i
      USING ERRCODE = 'invalid_parameter_value';
  ELSIF v_i IS NOT NULL THEN
    RAISE EXCEPTION 'arguments of step % of this flow are % bytes of JSON, over the limit of % bytes (the setting akadze.max_args_bytes); store large data elsewhere and pass a reference',
        v_i, v_k, v_max
      USING ERRCODE = 'program_limit_exceeded';
  END IF;
  SELECT n INTO v_problem FROM unnest(p_names) n GROUP BY n HAVING count(*) > 1 LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'this flow has two steps named %: step names must be unique',
        to_json(v_problem)::text
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The dependencies: each a step before it (by position: steps come in dependency order, so a
  -- flow has no cycle) or an existing job (by id), listed once.
  SELECT e.k, e.f, CASE
      WHEN e.f IS NULL OR e.f NOT BETWEEN 1 AND v_n
        THEN 'has a dependency of no step of this flow'
      WHEN (e.t IS NULL) = (e.j IS NULL)
        THEN 'has a dependency that is neither a step nor an existing job'
      WHEN e.t IS NOT NULL AND NOT e.t BETWEEN 1 AND e.f - 1
        THEN 'depends on a step that does not come before it (steps come in dependency order)'
      WHEN e.j IS NOT NULL AND e.j < 1
        THEN 'depends on job ' || e.j || ', which is not a job id'
      WHEN e.p IS NOT NULL AND NOT e.p = ANY ('{cancel,ignore,continue}'::text[])
        THEN 'has an "on_failure" other than "cancel", "ignore" or "continue"'
      END
    INTO v_k, v_i, v_problem
    FROM unnest(p_dep_step, p_dep_on, p_dep_job, p_dep_policy) WITH ORDINALITY AS e(f, t, j, p, k)
   WHERE e.f IS NULL OR NOT e.f BETWEEN 1 AND v_n OR (e.t IS NULL) = (e.j IS NULL)
      OR (e.t IS NOT NULL AND NOT e.t BETWEEN 1 AND e.f - 1) OR e.j < 1
      OR (e.p IS NOT NULL AND NOT e.p = ANY ('{cancel,ignore,continue}'::text[]))
   ORDER BY e.k LIMIT 1;
  IF v_k IS NOT NULL THEN
    RAISE EXCEPTION 'dependency % of this flow (of step %) %', v_k, coalesce(v_i::text, 'none'),
        v_problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Per step, how many it waits for and whether others wait for it: counted in place (the
  -- positions were checked above), a loop over the dependencies.
  v_pending := array_fill(0, ARRAY[v_n]);
  v_depended := array_fill(false, ARRAY[v_n]);
  IF v_m > 0 THEN
    FOREACH v_k IN ARRAY p_dep_step LOOP
      v_pending[v_k] := v_pending[v_k] + 1;
    END LOOP;
    FOREACH v_k IN ARRAY p_dep_on LOOP
      IF v_k IS NOT NULL THEN
        v_depended[v_k] := true;
      END IF;
    END LOOP;
  END IF;

  -- The existing jobs depended on: marked (and locked, so that one finishing now settles
  -- this flow's steps after this transaction, or before it and is seen terminal here).
  v_ext_ids := ARRAY (SELECT DISTINCT j FROM unnest(p_dep_job) j WHERE j IS NOT NULL);
  IF cardinality(v_ext_ids) > 0 THEN
    WITH marked AS (
      UPDATE {{schema}}.jobs j SET has_dependents = true
       WHERE j.id = ANY (v_ext_ids)
      RETURNING j.id, j.state)
    SELECT array_agg(m.id ORDER BY m.id), array_agg(m.state ORDER BY m.id)
      INTO v_ext_ids, v_ext_states FROM marked m;
    SELECT j INTO v_i FROM unnest(p_dep_job) j
     WHERE j IS NOT NULL AND NOT j = ANY (coalesce(v_ext_ids, '{}'))
     LIMIT 1;
    IF v_i IS NOT NULL THEN
      RAISE EXCEPTION 'this flow depends on job %, which does not exist', v_i
        USING ERRCODE = 'foreign_key_violation';
    END IF;
  END IF;

  -- Ids in dependency order; the sequence looked up once, not for every id.
  v_seq := pg_get_serial_sequence('{{schema}}.jobs', 'id')::regclass;
  v_ids := ARRAY (SELECT nextval(v_seq) FROM generate_series(1, v_n));
  v_flow := coalesce(in_flow, v_ids[1]);
  v_queue := v_queue0;
  v_task := p_tasks[1];
  -- A dependency listed twice is found by the primary key of job_dependencies (and only then
  -- looked for), not by a pass of its own over every dependency.
  BEGIN
    INSERT INTO {{schema}}.jobs
      (id, task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
       state, pending_deps, has_dependents, flow_id, step, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT s.id,
           -- The first step's task and queue as their domains, checked once: a domain's
           -- CHECK runs on every value cast to it (the queue's pattern, some µs a value).
           CASE WHEN s.task = v_task THEN v_task ELSE s.task::{{schema}}.task_name END,
           CASE WHEN s.queue = v_queue THEN v_queue ELSE s.queue::{{schema}}.queue_name END,
           s.priority::smallint, s.args, s.max_attempts,
           coalesce(s.run_at, now() + coalesce(s.delay_ms, 0) * interval '1 millisecond'),
           s.expires_at, s.unique_key, s.limit_key,
           CASE WHEN s.pending > 0 THEN 'waiting' ELSE 'queued' END,
           s.pending, s.depended, v_flow, s.name, v_trace_context
      FROM ROWS FROM (unnest(v_ids), unnest(p_names), unnest(p_tasks), unnest(p_queues),
                      unnest(p_priorities), unnest(p_max_attempts),
                      jsonb_array_elements(v_args), unnest(p_run_at), unnest(p_delay_ms),
                      unnest(p_expires_at), unnest(p_unique_keys), unnest(p_limit_keys),
                      unnest(v_pending), unnest(v_depended))
           AS s(id, name, task, queue, priority, max_attempts, args, run_at, delay_ms,
                expires_at, unique_key, limit_key, pending, depended);
    INSERT INTO {{schema}}.job_dependencies (job_id, depends_on, on_failure)
    SELECT v_ids[e.f], coalesce(v_ids[e.t], e.j), coalesce(e.p, 'cancel')
      FROM unnest(p_dep_step, p_dep_on, p_dep_job, p_dep_policy) AS e(f, t, j, p);
  EXCEPTION WHEN unique_violation THEN
    GET STACKED DIAGNOSTICS v_problem = CONSTRAINT_NAME;
    IF v_problem = 'job_dependencies_pkey' THEN
      SELECT x.f INTO v_i
        FROM unnest(p_dep_step, p_dep_on, p_dep_job) AS x(f, t, j)
       GROUP BY x.f, x.t, x.j HAVING count(*) > 1 ORDER BY x.f LIMIT 1;
      RAISE EXCEPTION 'step % of this flow (%) lists the same dependency twice', v_i,
          to_json(p_names[v_i])::text
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RAISE EXCEPTION 'a step''s unique_key is already held by a waiting, queued or running job; nothing of this flow was enqueued'
      USING ERRCODE = 'AKDUP', CONSTRAINT = 'jobs_active_unique_key_idx',
            HINT = 'Catch SQLSTATE AKDUP in a savepoint.';
  END;

  -- Dependencies that had already finished count now.
  FOR v_k IN 1 .. coalesce(cardinality(v_ext_ids), 0) LOOP
    IF v_ext_states[v_k] = ANY ('{succeeded,failed,cancelled}'::text[]) THEN
      PERFORM {{schema}}.settle_dependents(v_ext_ids[v_k], v_ext_states[v_k], v_ids);
    END IF;
  END LOOP;
  -- The queues of the steps queued at once (settle_dependents announces those it queues).
  IF v_queue0 = ALL (p_queues) THEN
    IF 0 = ANY (v_pending) THEN
      PERFORM pg_notify(v_channel, v_queue0);
    END IF;
  ELSE
    PERFORM pg_notify(v_channel, d.q)
       FROM (SELECT DISTINCT x.q FROM unnest(p_queues, v_pending) AS x(q, n) WHERE x.n = 0) d
      ORDER BY d.q;
  END IF;
  -- The steps' ids, in the order given: one value (ten thousand rows cost the client more).
  RETURN v_ids;
END
$$;
