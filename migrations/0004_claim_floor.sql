-- akadze schema, version 0004: the one-queue claim from floors. "{{schema}}" is replaced by the
-- quoted schema name.
--
-- While an old snapshot holds the database's MVCC horizon back (a long transaction, a
-- replication slot, a standby's feedback), the queued version of every claimed job stays in
-- jobs_claim_idx, dead but not removable, in front of the ready jobs: claim_one, which scans the
-- queue from the start of the index, visits every one of them on every claim (~0.2 ms per
-- thousand). claim_one_floor starts each priority level's scan at a floor on run_at (epoch ms), given
-- by the worker (src/worker/claimer.ts: a little before the latest run_at it claimed at that
-- level), so each level's scan starts near its ready jobs: `priority = level AND run_at >=
-- floor` positions the B-tree scan. Priorities between, above and below the given levels are
-- scanned whole, a range each (their dead entries are those of jobs other workers claimed).
-- What lies behind a floor (a job enqueued with a run_at in the past, a long enqueue
-- transaction that commits late) is the worker's full claim's (claim_one), which it runs at a
-- bounded interval. Same conditions, order, locking and result as claim_one.
CREATE FUNCTION {{schema}}.claim_one_floor(
  p_queue text, p_tasks text[], p_limit integer, p_excluded bigint[], p_worker text,
  p_levels smallint[], p_floors float8[])
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
  IF EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = p_queue) THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH known AS (
    SELECT x.* FROM unnest(p_levels, p_floors) AS f(level, floor_ms)
    CROSS JOIN LATERAL (
      SELECT c.ctid, c.priority, c.run_at, c.id FROM {{schema}}.jobs c
       WHERE c.state = 'queued' AND c.queue = p_queue AND c.priority = f.level
         AND c.run_at >= to_timestamp(f.floor_ms / 1000) AND c.run_at <= now()
         AND c.cancel_requested_at IS NULL
         AND (c.expires_at IS NULL OR c.expires_at > now())
         AND c.task = ANY (p_tasks)
         AND c.id <> ALL (p_excluded)
         AND (c.limit_key IS NULL
              OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = c.limit_key))
       ORDER BY c.run_at, c.id
       LIMIT p_limit
       FOR UPDATE OF c SKIP LOCKED) x
  ),
  -- The ranges of priorities between, above and below the given levels (all of them when
  -- none is given), exclusive bounds, each scanned whole.
  gaps AS (
    SELECT coalesce(lag(u.l) OVER (ORDER BY u.l DESC), 32768) AS hi, u.l AS lo
      FROM unnest(p_levels::integer[] || -32769) AS u(l)
  ),
  unknown AS (
    SELECT x.* FROM gaps g
    CROSS JOIN LATERAL (
      SELECT c.ctid, c.priority, c.run_at, c.id FROM {{schema}}.jobs c
       WHERE c.state = 'queued' AND c.queue = p_queue
         AND c.priority > g.lo AND c.priority < g.hi AND c.run_at <= now()
         AND c.cancel_requested_at IS NULL
         AND (c.expires_at IS NULL OR c.expires_at > now())
         AND c.task = ANY (p_tasks)
         AND c.id <> ALL (p_excluded)
         AND (c.limit_key IS NULL
              OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l WHERE l.key = c.limit_key))
       ORDER BY c.priority DESC, c.run_at, c.id
       LIMIT p_limit
       FOR UPDATE OF c SKIP LOCKED) x
  ),
  candidates AS (
    SELECT u.ctid FROM (SELECT * FROM unknown UNION ALL SELECT * FROM known) u
     ORDER BY u.priority DESC, u.run_at, u.id
     LIMIT p_limit
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
