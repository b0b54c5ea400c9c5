-- akadze schema, version 0001. "{{schema}}" is replaced by the quoted schema name.

-- Rules about one value are domains, not table CHECKs: PostgreSQL checks a domain only when
-- a value is written to the column, a table CHECK on every UPDATE of the row. The claim and
-- the outcome write touch none of these columns, and the regex and jsonb checks were a third
-- of their cost in PostgreSQL.
CREATE DOMAIN {{schema}}.task_name AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN {{schema}}.queue_name AS text CHECK (VALUE ~ '^[A-Za-z0-9_.:-]{1,64}$');
CREATE DOMAIN {{schema}}.job_args AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN {{schema}}.job_errors AS jsonb CHECK (jsonb_typeof(VALUE) = 'array');
CREATE DOMAIN {{schema}}.job_key AS text CHECK (length(VALUE) BETWEEN 1 AND 500);

CREATE TABLE {{schema}}.jobs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  task {{schema}}.task_name NOT NULL,
  queue {{schema}}.queue_name NOT NULL DEFAULT 'default',
  priority smallint NOT NULL DEFAULT 0,
  state text NOT NULL DEFAULT 'queued',
  args {{schema}}.job_args NOT NULL DEFAULT '{}'::jsonb,
  meta jsonb NOT NULL DEFAULT '{}'::jsonb,
  run_count integer NOT NULL DEFAULT 0,
  attempt integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 3,
  snoozes integer NOT NULL DEFAULT 0,
  run_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz,
  unique_key {{schema}}.job_key,
  limit_key {{schema}}.job_key,
  worker_id text,
  cancel_requested_at timestamptz,
  errors {{schema}}.job_errors NOT NULL DEFAULT '[]'::jsonb,
  result jsonb,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz,
  CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  CONSTRAINT jobs_counters_check
    CHECK (run_count >= 0 AND attempt >= 0 AND snoozes >= 0 AND max_attempts >= 1),
  CONSTRAINT jobs_attempt_check CHECK (attempt <= max_attempts),
  CONSTRAINT jobs_running_check CHECK (state <> 'running' OR worker_id IS NOT NULL),
  CONSTRAINT jobs_finished_check
    CHECK ((state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);

-- Shaped like the claim: ready rows of one queue in claim order.
CREATE INDEX jobs_claim_idx ON {{schema}}.jobs (queue, priority DESC, run_at, id)
  WHERE state = 'queued';
-- The claim pass cancels queued jobs with a cancel request or an expiry that has passed.
CREATE INDEX jobs_cancel_idx ON {{schema}}.jobs (queue)
  WHERE state = 'queued' AND (cancel_requested_at IS NOT NULL OR expires_at IS NOT NULL);
-- Rescue and shutdown find a worker's running jobs.
CREATE INDEX jobs_running_worker_idx ON {{schema}}.jobs (worker_id)
  WHERE state = 'running';
-- The claim finds limit keys with ready jobs (drives from the small limits table).
CREATE INDEX jobs_queued_limit_idx ON {{schema}}.jobs (limit_key)
  WHERE state = 'queued' AND limit_key IS NOT NULL;
-- maxRunning counts running jobs per limit key.
CREATE INDEX jobs_running_limit_idx ON {{schema}}.jobs (limit_key)
  WHERE state = 'running' AND limit_key IS NOT NULL;
-- At most one active job per unique key.
CREATE UNIQUE INDEX jobs_unique_key_idx ON {{schema}}.jobs (unique_key)
  WHERE state IN ('queued', 'running') AND unique_key IS NOT NULL;
-- The pruner deletes old terminal jobs. A B-tree, though every finished job enters it: a BRIN
-- index is cheaper to insert into, but the block ranges written since the last vacuum are not
-- summarized and each prune then reads all of them (17-28 ms per 100,000 recent rows, while
-- the worker's loop waits).
CREATE INDEX jobs_finished_idx ON {{schema}}.jobs (finished_at)
  WHERE state IN ('succeeded', 'failed', 'cancelled');

-- A queue table churns: vacuum early and often, leave room for updates in place.
ALTER TABLE {{schema}}.jobs SET (
  fillfactor = 90,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 500,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 1
);

CREATE TABLE {{schema}}.workers (
  id text PRIMARY KEY,
  hostname text NOT NULL,
  pid integer NOT NULL,
  queues text[] NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  -- The worker's own heartbeatTtl: others rescue its jobs once heartbeat_at is older.
  heartbeat_ttl_ms integer NOT NULL DEFAULT 30000 CHECK (heartbeat_ttl_ms > 0)
);

-- One row per schedule fire; job_id NULL means the fire was skipped (overlap: false).
CREATE TABLE {{schema}}.periodic_runs (
  name text NOT NULL,
  fire_at timestamptz NOT NULL,
  job_id bigint,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (name, fire_at)
);
CREATE INDEX periodic_runs_created_idx ON {{schema}}.periodic_runs (created_at);

CREATE TABLE {{schema}}.queue_pauses (
  queue text PRIMARY KEY,
  paused_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.limits (
  key text PRIMARY KEY,
  max_running integer,
  max_starts integer,
  "window" interval,
  updated_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT limits_max_running_check CHECK (max_running IS NULL OR max_running >= 1),
  CONSTRAINT limits_max_starts_check CHECK (max_starts IS NULL OR max_starts >= 1),
  CONSTRAINT limits_window_check CHECK ("window" IS NULL OR "window" > interval '0'),
  CONSTRAINT limits_rate_check CHECK ((max_starts IS NULL) = ("window" IS NULL))
);

-- One mark per successful claim of a job whose key has a maxStarts limit.
CREATE TABLE {{schema}}.limit_starts (
  key text NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  job_id bigint NOT NULL
);
CREATE INDEX limit_starts_key_idx ON {{schema}}.limit_starts (key, started_at);

-- The claim from one queue, the worker's most frequent statement (src/worker/claimer.ts
-- holds the other claim paths). A function, so that its plan is made once per connection
-- instead of on every claim: planning was half of a one-job claim's time in PostgreSQL.
-- The plan is generic (a custom plan per LIMIT value would be re-made every time) and
-- never JIT-compiled (a cached plan would be compiled again on every call once the queue
-- is large). Sequential scans are off for it: a plan made while the table is nearly empty
-- would otherwise find the claimed rows by scanning the table, and keep doing so, on every
-- claim, after the table has grown (tests/completer_test.ts). Ready rows in priority order,
-- pauses honoured, limits rows left to the limited claim, locked rows skipped; the UPDATE
-- goes by ctid, fixed by the row lock.
-- Timestamps come back as epoch milliseconds, cheaper to decode than text.
CREATE FUNCTION {{schema}}.claim_one(
  p_queue text, p_tasks text[], p_limit integer, p_excluded bigint[], p_worker text)
RETURNS TABLE (
  id text, task text, queue text, priority smallint, attempt integer, run_count integer,
  max_attempts integer, snoozes integer, run_at float8, expires_at float8, unique_key text,
  limit_key text, created_at float8, started_at float8, args jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH candidates AS (
    SELECT c.ctid FROM {{schema}}.jobs c
     WHERE c.state = 'queued' AND c.queue = p_queue AND c.run_at <= now()
       AND c.cancel_requested_at IS NULL
       AND (c.expires_at IS NULL OR c.expires_at > now())
       AND c.task = ANY (p_tasks)
       AND c.id <> ALL (p_excluded)
       AND (c.limit_key IS NULL
            OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = c.limit_key))
       AND NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = p_queue)
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT p_limit
     FOR UPDATE OF c SKIP LOCKED
  )
  UPDATE {{schema}}.jobs j
     SET state = 'running', run_count = j.run_count + 1, worker_id = p_worker,
         started_at = now()
   WHERE j.ctid = ANY (ARRAY (SELECT ctid FROM candidates))
  RETURNING j.id::text, j.task::text, j.queue::text, j.priority, j.attempt, j.run_count,
            j.max_attempts, j.snoozes, date_part('epoch', j.run_at) * 1000,
            date_part('epoch', j.expires_at) * 1000, j.unique_key::text, j.limit_key::text,
            date_part('epoch', j.created_at) * 1000, date_part('epoch', j.started_at) * 1000,
            j.args::jsonb;
END
$$;

-- A job's error history with `p_entry` appended, stamped with the database clock, keeping
-- the last 10 entries (the outcome write and the rescuer both append through it).
CREATE FUNCTION {{schema}}.append_error(p_errors jsonb, p_entry jsonb)
RETURNS {{schema}}.job_errors
LANGUAGE sql STABLE
AS $$
  SELECT coalesce(jsonb_agg(e ORDER BY i), '[]'::jsonb) FROM (
    SELECT e, i FROM jsonb_array_elements(
        p_errors || jsonb_build_array(p_entry || jsonb_build_object('at', now())))
      WITH ORDINALITY AS t(e, i)
     ORDER BY i DESC LIMIT 10) last
$$;

-- The state an outcome of `p_kind` leads to: a cancel request wins; a retry with no attempts
-- left fails. A one-expression SQL function, inlined where it is used (the outcome write, and
-- the rescuer, for which a lost run is a retry).
CREATE FUNCTION {{schema}}.outcome_state(
  p_cancel_requested boolean, p_kind text, p_attempt integer, p_max_attempts integer)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE WHEN p_cancel_requested THEN 'cancelled'
              WHEN p_kind = 'succeeded' THEN 'succeeded'
              WHEN p_kind = 'retry' AND p_attempt + 1 < p_max_attempts THEN 'queued'
              WHEN p_kind IN ('retry', 'fail') THEN 'failed'
              WHEN p_kind IN ('snooze', 'release') THEN 'queued'
              ELSE 'cancelled' END
$$;

-- The outcome write (src/worker/completer.ts): one UPDATE for a batch of outcomes, given as
-- parallel arrays, each fenced on the run_count it was claimed with and state 'running' (the
-- WHERE is re-checked on the latest row version when another transaction changed the row
-- meanwhile). A function for the reason claim_one is one: parsing and planning the
-- statement took ~0.7 ms per write, more than executing it for one job. Kinds:
-- succeeded (store the result), retry (spend an attempt, queue again after the delay, or
-- fail when none remain), fail, snooze (queue again without spending one), cancel, release
-- (back to queued as is). Returns only what the worker logs (a wider row costs more to
-- return than the function saves on a batch of hundreds). No sequential scans, as in
-- claim_one: a plan made on a nearly empty table must not scan it once it has grown.
CREATE FUNCTION {{schema}}.complete_jobs(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[])
RETURNS TABLE (id text, state text, attempt integer, run_at_ms float8)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
  -- The fence compares state with a variable, which the generic plan cannot match with
  -- jobs_running_worker_idx's predicate: from that index (chosen when statistics say few
  -- jobs run, as at the start of a drain) the join compares every running job with every
  -- outcome. This way each outcome finds its job by primary key.
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
                  ELSE {{schema}}.append_error(j.errors, o.error::jsonb) END,
    worker_id = NULL,
    finished_at = CASE WHEN {{schema}}.outcome_state(
                              j.cancel_requested_at IS NOT NULL, o.kind, j.attempt,
                              j.max_attempts) = 'queued'
                       THEN NULL ELSE now() END
  FROM unnest(p_ids, p_run_counts, p_kinds, p_results, p_errors, p_delays_ms)
         AS o(id, run_count, kind, result, error, delay_ms)
  WHERE j.id = o.id AND j.run_count = o.run_count AND j.state = v_running
  RETURNING j.id::text, j.state, j.attempt, date_part('epoch', j.run_at) * 1000;
END
$$;
