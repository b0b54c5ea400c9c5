-- akadze schema, version 0008: flows, jobs that wait for other jobs. "{{schema}}" is replaced
-- by the quoted schema name.
--
-- A job with dependencies waits in state 'waiting' until each is terminal. The trigger below
-- settles the dependents of a job in the statement that writes its terminal state, whichever
-- statement that is (the outcome write, completeTx, the rescuer, the cancel pass, an admin
-- cancel): a success (or a failure its dependent ignores) counts down `pending_deps`, and
-- the dependent that reaches 0 is queued; a failure cancels the dependents that do not
-- ignore it, and theirs, in the same statement. Siblings finishing together serialise on the
-- dependent's row lock, so exactly one of them queues it. A job without dependents pays only
-- for the trigger's WHEN test (`has_dependents`, in memory). Every column is added without a
-- rewrite; the index that makes waiting jobs hold their unique key is built concurrently by
-- the next version.

ALTER TABLE {{schema}}.jobs
  -- Dependencies not yet terminal (meaningful while waiting).
  ADD COLUMN pending_deps integer NOT NULL DEFAULT 0,
  -- Whether some job depends on this one: the trigger's test.
  ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
  -- The flow the job belongs to: the id of the flow's first step (NULL outside flows).
  ADD COLUMN flow_id bigint,
  -- The step's name within its flow.
  ADD COLUMN step text,
  -- Never used.
  DROP COLUMN meta;

-- Widened to the new state. NOT VALID: validating would scan the table while this
-- transaction holds the lock that stops every claim; every row written from now on is
-- checked, and the rows already there hold one of the older states.
ALTER TABLE {{schema}}.jobs
  DROP CONSTRAINT jobs_state_check,
  ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'succeeded', 'failed', 'cancelled'))
    NOT VALID;

-- One row per dependency: `job_id` waits for `depends_on`. `on_failure` says what a failed or
-- cancelled dependency does to the job: 'cancel' it (and its dependents), 'ignore' it (the job
-- runs when the others are done, and sees the failure), or 'continue' (the job runs at once).
-- No foreign keys: they would cost every job's delete a lookup here; the pruner deletes a
-- job's rows with the job.
CREATE TABLE {{schema}}.job_dependencies (
  job_id bigint NOT NULL,
  depends_on bigint NOT NULL,
  on_failure text NOT NULL DEFAULT 'cancel'
    CONSTRAINT job_dependencies_on_failure_check
    CHECK (on_failure IN ('cancel', 'ignore', 'continue')),
  PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependencies_depends_on_idx ON {{schema}}.job_dependencies (depends_on);

-- What job `p_id` reaching terminal state `p_state` does to the jobs waiting for it (only to
-- `p_only`, when given: a flow enqueued after the job finished). Dependents queued here are
-- announced on the jobs channel.
CREATE FUNCTION {{schema}}.settle_dependents(
  p_id bigint, p_state text, p_only bigint[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_channel CONSTANT text := btrim('{{schema}}', '"') || '_jobs';
  v_failed CONSTANT boolean := p_state <> 'succeeded';
  v_label text;
  v_notified bigint;
BEGIN
  -- A success, or a failure the dependent ignores or continues after: count it down, queue
  -- the job whose last dependency this was (or, after a failure with 'continue', at once).
  WITH promoted AS (
       UPDATE {{schema}}.jobs j SET
         pending_deps = j.pending_deps - 1,
         state = CASE WHEN j.pending_deps <= 1
                        OR (v_failed AND d.on_failure = 'continue')
                      THEN 'queued' ELSE 'waiting' END,
         run_at = CASE WHEN j.pending_deps <= 1
                         OR (v_failed AND d.on_failure = 'continue')
                       THEN greatest(j.run_at, now()) ELSE j.run_at END
         FROM {{schema}}.job_dependencies d
        WHERE d.depends_on = p_id
          AND (NOT v_failed OR d.on_failure <> 'cancel')
          AND (p_only IS NULL OR d.job_id = ANY (p_only))
          AND j.id = d.job_id
          AND j.state = 'waiting'
       RETURNING j.queue::text AS queue, j.state)
  SELECT count(pg_notify(v_channel, q.queue)) INTO v_notified
    FROM (SELECT DISTINCT u.queue FROM promoted u
           WHERE u.state = 'queued') q;
  IF NOT v_failed THEN
    RETURN;
  END IF;
  -- A failure: cancel the waiting jobs that depend on it with 'cancel', and, transitively,
  -- the waiting jobs that depend so on those (one statement, however long the chain; their
  -- own dependents with 'ignore' or 'continue' are settled by this trigger as they change).
  SELECT coalesce('step ' || to_json(j.step)::text
                    || ' (job ' || j.id::text
                    || ')',
                  'job ' || j.id::text)
    INTO v_label FROM {{schema}}.jobs j WHERE j.id = p_id;
  WITH RECURSIVE doomed (id, cause) AS (
    SELECT d.job_id, p_id
      FROM {{schema}}.job_dependencies d JOIN {{schema}}.jobs w ON w.id = d.job_id
     WHERE d.depends_on = p_id
       AND d.on_failure = 'cancel'
       AND (p_only IS NULL OR d.job_id = ANY (p_only))
       AND w.state = 'waiting'
    UNION
    SELECT d.job_id, x.id
      FROM doomed x
      JOIN {{schema}}.job_dependencies d ON d.depends_on = x.id
      JOIN {{schema}}.jobs w ON w.id = d.job_id
     WHERE d.on_failure = 'cancel'
       AND w.state = 'waiting'
  ),
  first_cause AS (
    SELECT DISTINCT ON (x.id) x.id, x.cause FROM doomed x ORDER BY x.id, x.cause
  )
  UPDATE {{schema}}.jobs j SET
    state = 'cancelled',
    finished_at = now(),
    errors = {{schema}}.append_error(j.errors, jsonb_build_object(
      'error', 'DependencyFailed',
      'message', CASE WHEN f.cause = p_id
                      THEN 'cancelled because its dependency ' || v_label
                             || ' ' ||
                             CASE p_state WHEN 'failed' THEN 'failed' ELSE 'was cancelled' END
                      ELSE 'cancelled because its dependency job ' ||
                             f.cause::text || ' was cancelled (after '
                             || v_label || ' '
                             ||
                             CASE p_state WHEN 'failed' THEN 'failed' ELSE 'was cancelled' END
                             || ')' END,
      'dependency', f.cause::text))
    FROM first_cause f
   WHERE j.id = f.id AND j.state = 'waiting';
END
$$;

-- A requeued job (terminal again non-terminal, `jobs requeue`): the dependents it cancelled
-- wait again, and theirs, transitively, unless another failed dependency still cancels them.
CREATE FUNCTION {{schema}}.revive_dependents(p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  WITH RECURSIVE revived (id) AS (
    SELECT d.job_id
      FROM {{schema}}.job_dependencies d JOIN {{schema}}.jobs w ON w.id = d.job_id
     WHERE d.depends_on = p_id
       AND d.on_failure = 'cancel'
       AND w.state = 'cancelled'
       AND (w.errors -> -1 ->> 'error')
             = 'DependencyFailed'
       AND (w.errors -> -1 ->> 'dependency')
             = p_id::text
    UNION
    SELECT d.job_id
      FROM revived x
      JOIN {{schema}}.job_dependencies d ON d.depends_on = x.id
      JOIN {{schema}}.jobs w ON w.id = d.job_id
     WHERE d.on_failure = 'cancel'
       AND w.state = 'cancelled'
       AND (w.errors -> -1 ->> 'error')
             = 'DependencyFailed'
       AND (w.errors -> -1 ->> 'dependency')
             = x.id::text
  ),
  counted AS (
    -- Each revived job waits for its dependencies that are not terminal (the requeued job,
    -- the other revived ones) and is left cancelled when another one failed and cancels it.
    SELECT r.id,
           count(*) FILTER (
             WHERE dj.id = p_id
                OR dj.id = ANY (ARRAY (SELECT id FROM revived))
                OR dj.state = ANY ('{waiting,queued,running}'::text[]))
             AS pending,
           bool_or(dd.on_failure = 'cancel'
             AND dj.state = ANY ('{failed,cancelled}'::text[])
             AND dj.id <> p_id
             AND NOT dj.id = ANY (ARRAY (SELECT id FROM revived)))
             AS blocked
      FROM (SELECT DISTINCT id FROM revived) r
      JOIN {{schema}}.job_dependencies dd ON dd.job_id = r.id
      JOIN {{schema}}.jobs dj ON dj.id = dd.depends_on
     GROUP BY r.id
  )
  UPDATE {{schema}}.jobs j SET
    state = 'waiting', finished_at = NULL, pending_deps = c.pending::integer
    FROM counted c
   WHERE j.id = c.id AND NOT c.blocked
     AND j.state = 'cancelled';
END
$$;

CREATE FUNCTION {{schema}}.settle_dependents_trigger()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF NEW.state = ANY ('{succeeded,failed,cancelled}'::text[]) THEN
    PERFORM {{schema}}.settle_dependents(NEW.id, NEW.state);
  ELSE
    PERFORM {{schema}}.revive_dependents(NEW.id);
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_settle_dependents
  AFTER UPDATE OF state ON {{schema}}.jobs
  FOR EACH ROW
  WHEN (NEW.has_dependents AND OLD.state IS DISTINCT FROM NEW.state
        AND (NEW.state IN ('succeeded', 'failed', 'cancelled')
             OR OLD.state IN ('succeeded', 'failed', 'cancelled')))
  EXECUTE FUNCTION {{schema}}.settle_dependents_trigger();

-- Enqueue a flow: `steps`, a JSON array of step objects, each
--   {"name": "fetch", "task": "fetch-page", "args": {...}, "queue": ..., "priority": ...,
--    "max_attempts": ..., "run_at": ..., "delay_ms": ..., "expires_at": ...,
--    "unique_key": ..., "limit_key": ...,
--    "depends_on": ["other-step", {"step": "s", "on_failure": "ignore"}, {"job": 42}]}
-- inserted in one statement, with ids in dependency order (a step's id is larger than its
-- dependencies'); returns each step's name and id, in the order given. The flow's id is its
-- first step's, or `in_flow` (the steps then join that flow: a running job's children).
-- TypeScript's app.enqueueFlow calls this function after checking each step
-- against its task. Errors, with nothing inserted: 22023 (a malformed step, an unknown or
-- repeated step, a cycle), 23503 (a dependency on a job that does not exist), 54000
-- (arguments over akadze.max_args_bytes), AKDUP (a unique_key already held).
CREATE FUNCTION {{schema}}.enqueue_flow(steps jsonb, in_flow bigint DEFAULT NULL)
RETURNS TABLE (step text, id bigint)
LANGUAGE plpgsql
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
BEGIN
  IF jsonb_typeof(steps) IS DISTINCT FROM 'array'
     OR jsonb_array_length(steps) = 0 THEN
    RAISE EXCEPTION 'steps must be a non-empty JSON array of step objects'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_n := jsonb_array_length(steps);

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
  v_names := ARRAY (SELECT s.x ->> 'name'
                      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i)
                     ORDER BY s.i);
  SELECT n INTO v_problem FROM unnest(v_names) n GROUP BY n
  HAVING count(*) > 1 LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'this flow has two steps named %: step names must be unique',
        to_json(v_problem)::text
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Each step's position by name: a lookup in a JSON object (a binary search), not a scan of
  -- every name per dependency, which a fan-in of thousands would pay quadratically.
  v_index := (SELECT jsonb_object_agg(s.x ->> 'name', s.i)
                FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i));

  -- The dependencies: each a step of this flow (by name) or an existing job (by id).
  SELECT t.i, t.problem INTO v_i, v_problem FROM (
    SELECT s.i, CASE
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
        END AS problem
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i),
           jsonb_array_elements(
             coalesce(s.x -> 'depends_on', '[]'::jsonb)) AS d(x)) t
   WHERE t.problem IS NOT NULL ORDER BY t.i LIMIT 1;
  IF v_problem IS NOT NULL THEN
    RAISE EXCEPTION 'step % of this flow (%) %', v_i,
        to_json(v_names[v_i])::text, v_problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- One sort for the four arrays (each aggregates the ordered rows in the same order).
  SELECT array_agg(e.dependent), array_agg(e.dep), array_agg(e.job), array_agg(e.policy)
    INTO v_from, v_to, v_job, v_policy
    FROM (
      SELECT s.i::integer AS dependent, d.k,
             (v_index ->> coalesce(d.x ->> 'step',
               CASE WHEN jsonb_typeof(d.x) = 'string'
                    THEN d.x #>> '{}' END))::integer AS dep,
             (d.x ->> 'job')::bigint AS job,
             coalesce(d.x ->> 'on_failure', 'cancel') AS policy
        FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i),
             jsonb_array_elements(
               coalesce(s.x -> 'depends_on', '[]'::jsonb))
               WITH ORDINALITY AS d(x, k)
       ORDER BY s.i, d.k) e;
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
       state, pending_deps, has_dependents, flow_id, step)
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
           s.x ->> 'name'
      FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(x, i)
     ORDER BY v_rank[s.i]
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

-- Whether `p_value` is a JSON integer from `p_min` to `p_max`.
CREATE FUNCTION {{schema}}.json_integer_in(p_value jsonb, p_min numeric, p_max numeric)
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT jsonb_typeof(p_value) = 'number'
     AND (p_value #>> '{}')::numeric
           = trunc((p_value #>> '{}')::numeric)
     AND (p_value #>> '{}')::numeric BETWEEN p_min AND p_max
$$;

-- The position of each of `p_n` steps in dependency order, given the edges
-- `p_from[k]` depends on `p_to[k]` (step positions; NULL for an existing job): the identity
-- when every step comes after its dependencies, else Kahn's sort (stable: ready steps in the
-- order given). A step on a cycle, or after one, is left at 0.
CREATE FUNCTION {{schema}}.flow_order(p_n integer, p_from integer[], p_to integer[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_m CONSTANT integer := coalesce(cardinality(p_from), 0);
  v_indeg integer[] := array_fill(0, ARRAY[p_n]);
  v_start integer[] := array_fill(0, ARRAY[p_n + 1]);
  v_out integer[];
  v_queue integer[] := array_fill(0, ARRAY[p_n]);
  v_rank integer[] := array_fill(0, ARRAY[p_n]);
  v_head integer := 1;
  v_tail integer := 0;
  v_node integer;
  v_k integer;
  v_sorted boolean := true;
BEGIN
  v_sorted := coalesce((SELECT bool_and(e.t IS NULL OR e.t < e.f)
                         FROM unnest(p_from, p_to) AS e(f, t)), true);
  IF v_sorted THEN
    RETURN ARRAY (SELECT generate_series(1, p_n));
  END IF;
  -- Edges grouped by dependency: v_out[v_start[i] + 1 .. v_start[i + 1]] depend on step i.
  v_out := ARRAY (SELECT e.f FROM unnest(p_from, p_to) WITH ORDINALITY AS e(f, t, k)
                   WHERE e.t IS NOT NULL ORDER BY e.t, e.k);
  FOR v_k IN 1 .. v_m LOOP
    IF p_to[v_k] IS NOT NULL THEN
      v_indeg[p_from[v_k]] := v_indeg[p_from[v_k]] + 1;
      v_start[p_to[v_k] + 1] := v_start[p_to[v_k] + 1] + 1;
    END IF;
  END LOOP;
  FOR v_k IN 2 .. p_n + 1 LOOP
    v_start[v_k] := v_start[v_k] + v_start[v_k - 1];
  END LOOP;
  FOR v_k IN 1 .. p_n LOOP
    IF v_indeg[v_k] = 0 THEN
      v_tail := v_tail + 1;
      v_queue[v_tail] := v_k;
    END IF;
  END LOOP;
  WHILE v_head <= v_tail LOOP
    v_node := v_queue[v_head];
    v_rank[v_node] := v_head;
    v_head := v_head + 1;
    FOR v_k IN v_start[v_node] + 1 .. v_start[v_node + 1] LOOP
      v_indeg[v_out[v_k]] := v_indeg[v_out[v_k]] - 1;
      IF v_indeg[v_out[v_k]] = 0 THEN
        v_tail := v_tail + 1;
        v_queue[v_tail] := v_out[v_k];
      END IF;
    END LOOP;
  END LOOP;
  RETURN v_rank;
END
$$;
