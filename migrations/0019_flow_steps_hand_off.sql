-- akadze schema, version 0019: enqueue_flow_steps, the flow enqueue of app.enqueueFlow, and the
-- hand-off of complete_jobs in one update per handed dependent. "{{schema}}" is replaced by the
-- quoted schema name. Creating and replacing functions takes no lock on the jobs table.
--
-- enqueue_flow (0018) takes the steps as one JSON document: a 10,000-step flow spent most of its
-- server time reading it (parsing 1.4 MB of JSON, then some twenty key lookups per step for the
-- checks, the dependencies and the insert). This function takes the same steps as parallel
-- arrays, one element per step, in dependency order (each step after the steps it depends on,
-- as app.enqueueFlow sends them), their arguments as one JSON array (as enqueue_many takes
-- them), and the dependencies as four arrays (the depending step's position, the position of the
-- step it depends on or the id of an existing job, and what a failure does); it returns the
-- steps' job ids in the same order. The checks are made on the arrays, with the same rules and
-- messages; the rows are those enqueue_flow inserts.
-- enqueue_flow stays for SQL callers (and for the children a running job adds); this function
-- gets its grants.
CREATE FUNCTION {{schema}}.enqueue_flow_steps(
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
  v_queues text[];
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
        WHEN s.queue IS NULL OR length(s.queue) NOT BETWEEN 1 AND 64
          OR NOT s.queue ~ '^[A-Za-z0-9_.:-]+$'
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
  -- Per step, how many it waits for and whether others wait for it: one aggregate over the
  -- steps and the dependencies (no join a generic plan could turn into a nested loop).
  SELECT array_agg(c.n ORDER BY c.i), array_agg(c.d ORDER BY c.i)
    INTO v_pending, v_depended
    FROM (SELECT u.i, (count(*) FILTER (WHERE u.kind = 1))::integer AS n,
                 bool_or(u.kind = 2) AS d
            FROM (SELECT g.i, 0 FROM generate_series(1, v_n) AS g(i)
                  UNION ALL SELECT f.i, 1 FROM unnest(p_dep_step) AS f(i)
                  UNION ALL SELECT t.i, 2 FROM unnest(p_dep_on) AS t(i) WHERE t.i IS NOT NULL)
                 AS u(i, kind)
           GROUP BY u.i) c;

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
  -- A dependency listed twice is found by the primary key of job_dependencies (and only then
  -- looked for), not by a pass of its own over every dependency.
  BEGIN
    WITH inserted AS (
    INSERT INTO {{schema}}.jobs
      (id, task, queue, priority, args, max_attempts, run_at, expires_at, unique_key, limit_key,
       state, pending_deps, has_dependents, flow_id, step, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT s.id, s.task, s.queue, s.priority::smallint, s.args, s.max_attempts,
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
                expires_at, unique_key, limit_key, pending, depended)
    RETURNING queue, state)
    SELECT array_agg(DISTINCT i.queue::text) FILTER (WHERE i.state = 'queued')
      INTO v_queues FROM inserted i;
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
  PERFORM pg_notify(v_channel, q) FROM unnest(v_queues) q;
  -- The steps' ids, in the order given: one value (ten thousand rows cost the client more).
  RETURN v_ids;
END
$$;

-- Who may enqueue a flow may call it: enqueue_flow's grants, copied (a database that revoked
-- EXECUTE from PUBLIC granted enqueue_flow to its roles by name).
DO $$
DECLARE
  v_old CONSTANT regprocedure := '{{schema}}.enqueue_flow(jsonb, bigint, jsonb)'::regprocedure;
  v_new CONSTANT regprocedure := '{{schema}}.enqueue_flow_steps(text[], text[], text[], integer[], integer[], text, timestamptz[], float8[], timestamptz[], text[], text[], integer[], integer[], bigint[], text[], bigint, jsonb)'::regprocedure;
  v_acl aclitem[];
  g record;
BEGIN
  SELECT p.proacl INTO v_acl FROM pg_catalog.pg_proc p WHERE p.oid = v_old;
  IF v_acl IS NOT NULL THEN
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_new);
    FOR g IN SELECT a.grantee, a.is_grantable FROM pg_catalog.aclexplode(v_acl) a
              WHERE a.privilege_type = 'EXECUTE' LOOP
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_new,
        CASE WHEN g.grantee = 0 THEN 'PUBLIC'
             ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
        CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
  END IF;
END
$$;

-- complete_jobs (13 arguments, 0016) with the hand-off in the statement that queues the
-- dependents: a dependent this batch makes ready and that this worker may take is updated once,
-- from waiting to running (0016 queued it, then claimed it in a second statement: two row
-- versions, and their index entries, per handed job; a layered DAG hands whole layers). Which to
-- hand is decided on the statement's snapshot, where the dependents still wait: those that
-- become ready, in a queue and of a task the worker offers, by the claim rule (the ready rule
-- as it will hold once queued, no limits row on their key, the queue not paused), per queue up
-- to its slots and all up to p_hand_total, in claim order, and only when no job already queued
-- that this worker could take comes first. The update itself re-reads each row (another
-- batch's outcome may have counted it down meanwhile): a dependent becomes running only if it
-- is ready and was chosen, and has no cancel request. The result is 0016's: the outcomes' rows,
-- then one row per handed job in state 'running' whose `claimed` holds the claim's columns.
CREATE OR REPLACE FUNCTION {{schema}}.complete_jobs(
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
  -- Per offered queue, the first job already queued in claim order that this worker could
  -- take: a dependent is handed only ahead of it (a flow does not jump the queue). In this
  -- statement's snapshot the dependents it queues still wait, so none of them is found here.
  firsts AS MATERIALIZED (
    SELECT q.name, q.n, f.priority
      FROM unnest(p_hand_queues, p_hand_slots) AS q(name, n)
      LEFT JOIN LATERAL (
        SELECT a.priority FROM {{schema}}.jobs a
         WHERE a.state = 'queued' AND a.queue = q.name AND a.run_at <= now()
           AND a.cancel_requested_at IS NULL
           AND (a.expires_at IS NULL OR a.expires_at > now())
           AND a.task = ANY (p_hand_tasks)
           AND (a.limit_key IS NULL
                OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = a.limit_key))
         ORDER BY a.priority DESC, a.run_at, a.id
         LIMIT 1) AS f ON true
     WHERE p_hand_total > 0),
  -- The dependents to hand: ready once counted down, claimable by the claim rule as they will
  -- be once queued (run_at as the update below sets it), per queue up to its slots.
  handing AS (
    SELECT r.id FROM (
      SELECT x.id, x.n,
             row_number() OVER (PARTITION BY x.queue ORDER BY x.priority DESC, x.run_at, x.id)
               AS rn,
             row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS total
        FROM (
          SELECT c.id, c.queue, c.priority, greatest(c.run_at, now()) AS run_at, q.n
            FROM counted k
            JOIN {{schema}}.jobs c ON c.id = k.job_id
            JOIN firsts q ON q.name = c.queue
           WHERE p_hand_total > 0 -- nothing offered: a one-time filter, nothing read
             AND c.state = 'waiting' AND c.pending_deps <= k.n
             AND c.run_at <= now()
             AND c.cancel_requested_at IS NULL
             AND (c.expires_at IS NULL OR c.expires_at > now())
             AND c.task = ANY (p_hand_tasks)
             AND (c.limit_key IS NULL
                  OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = c.limit_key))
             AND NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = q.name)
             AND (q.priority IS NULL OR c.priority > q.priority)) x) r
     WHERE r.rn <= r.n AND r.total <= p_hand_total),
  promoted AS (
    UPDATE {{schema}}.jobs j SET
      pending_deps = j.pending_deps - k.n,
      state = CASE WHEN j.pending_deps > k.n THEN 'waiting'
                   WHEN h.id IS NOT NULL AND j.cancel_requested_at IS NULL THEN v_running
                   ELSE 'queued' END,
      run_at = CASE WHEN j.pending_deps <= k.n
                    THEN greatest(j.run_at, now()) ELSE j.run_at END,
      -- The claim's SET, for a handed dependent only.
      run_count = j.run_count
        + (h.id IS NOT NULL AND j.pending_deps <= k.n AND j.cancel_requested_at IS NULL)::int,
      worker_id = CASE WHEN h.id IS NOT NULL AND j.pending_deps <= k.n
                            AND j.cancel_requested_at IS NULL
                       THEN p_worker ELSE j.worker_id END,
      started_at = CASE WHEN h.id IS NOT NULL AND j.pending_deps <= k.n
                             AND j.cancel_requested_at IS NULL
                        THEN now() ELSE j.started_at END
      FROM counted k LEFT JOIN handing h ON h.id = k.job_id
     WHERE j.id = k.job_id AND j.state = 'waiting'
    RETURNING j.state AS new_state,
              j.id::text AS id, j.task::text AS task, j.queue::text AS queue,
              j.priority AS priority, j.attempt AS attempt, j.run_count AS run_count,
              j.max_attempts AS max_attempts, j.snoozes AS snoozes,
              date_part('epoch', j.run_at) * 1000 AS run_at,
              date_part('epoch', j.expires_at) * 1000 AS expires_at,
              j.unique_key::text AS unique_key, j.limit_key::text AS limit_key,
              date_part('epoch', j.created_at) * 1000 AS created_at,
              date_part('epoch', j.started_at) * 1000 AS started_at, j.args::jsonb AS args),
  -- Always evaluated: the outer query reads it once, whatever the batch holds.
  announced AS (
    SELECT count(pg_notify(v_channel, q.queue)) AS n
      FROM (SELECT DISTINCT p.queue FROM promoted p WHERE p.new_state = 'queued') q)
  SELECT d.id::text, d.state, d.attempt, date_part('epoch', d.run_at) * 1000, d.has_dependents,
         NULL::jsonb
    FROM announced a, done d WHERE a.n >= 0
  UNION ALL
  SELECT h.id, v_running, h.attempt, h.run_at, NULL::boolean, to_jsonb(h) - 'new_state'
    FROM promoted h WHERE h.new_state = v_running;
  PERFORM set_config('akadze.outcome_settles', '', true);
END
$$;
