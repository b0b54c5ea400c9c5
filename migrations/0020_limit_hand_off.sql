-- akadze schema, version 0020: the hand-off of a limit key's room, and the one-queue claim with
-- its check for a limit key in one call. "{{schema}}" is replaced by the quoted schema name.
--
-- A key at its maxRunning has room again only once the outcome of one of its runs commits, and
-- then a claim had to find it: a limited claim (a transaction of several statements) per freed
-- place, while the key's limits row is held. complete_jobs(14 arguments) is 0016's outcome
-- write and hand-off (the 13-argument function, called as is), plus p_hand_keys: when true,
-- the write also claims for the calling worker, in the slots it offered and the dependents left
-- free, the next ready jobs of the limit keys whose runs it ended, at most as many per key as
-- it ended and as the key has room for: the room freed goes to the worker whose slot is free
-- already, in the same transaction. Each such key's limits row is locked first, SKIP LOCKED (a
-- key another claimer holds is left to the claims, which never wait either), and the room is
-- counted after the lock by a statement of its own (a fresh snapshot), as the limited claim
-- counts; starts of keys with maxStarts are marked in limit_starts. A keyed job is handed only
-- when no ready job this worker could take from its queue without a limits row comes before it
-- in claim order (the limited claim would have taken that one first): two short index ranges
-- (higher priorities; the same priority before it), not a scan of the key's queued jobs. The
-- handed jobs come back as 0016's do (state 'running', the claim's columns in `claimed`, and
-- `limited`: true, so the worker keeps their slots for the next hand-off). The
-- 13-argument function, which workers of earlier versions call while a deploy rolls, is
-- unchanged. Creating a function takes no lock on the jobs table.
CREATE FUNCTION {{schema}}.complete_jobs(
  p_ids bigint[], p_run_counts integer[], p_kinds text[], p_results text[], p_errors text[],
  p_delays_ms float8[], p_dead_tasks text[], p_dead_queues text[], p_worker text,
  p_hand_queues text[], p_hand_slots integer[], p_hand_total integer, p_hand_tasks text[],
  p_hand_keys boolean)
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
  v_running CONSTANT text := 'running';
  v_never CONSTANT bigint := 2147483647;
  v_done bigint[] := '{}';
  v_handed text[] := '{}';
  v_total integer;
  v_keys text[];
  v_freed integer[];
  -- How long the hand-off waits for a key's limits row (see below).
  v_hand_wait CONSTANT text := '50ms';
  v_lock_timeout text;
BEGIN
  -- The outcomes and the dependents' hand-off (0016); the written jobs' ids are kept, and the
  -- queues of the jobs it handed (their slots are taken).
  FOR id, state, attempt, run_at_ms, has_dependents, claimed IN
    SELECT w.id, w.state, w.attempt, w.run_at_ms, w.has_dependents, w.claimed
      FROM {{schema}}.complete_jobs(p_ids, p_run_counts, p_kinds, p_results, p_errors,
                                    p_delays_ms, p_dead_tasks, p_dead_queues, p_worker,
                                    p_hand_queues, p_hand_slots, p_hand_total, p_hand_tasks) w
  LOOP
    IF claimed IS NULL THEN
      v_done := v_done || id::bigint;
    ELSE
      v_handed := v_handed || (claimed ->> 'queue');
    END IF;
    RETURN NEXT;
  END LOOP;
  v_total := p_hand_total - cardinality(v_handed);
  IF NOT coalesce(p_hand_keys, false) OR v_total <= 0 OR cardinality(v_done) = 0 THEN
    RETURN;
  END IF;
  -- The keys with a limits row whose runs this write ended, and how many each: their rows
  -- locked, in key order. Waited for a little, under a lock_timeout of its own: another
  -- worker's hand-off of the same key holds the row for a statement (skipping it there lost
  -- that worker its key's places, one write after another); a limited claim holds it for a
  -- transaction of several round trips, and a setLimit for the caller's transaction, so past
  -- the timeout the keys held are skipped instead (never a long wait, nor a deadlock: the
  -- timeout comes before the deadlock check).
  v_lock_timeout := current_setting('lock_timeout');
  BEGIN
    PERFORM set_config('lock_timeout', v_hand_wait, true);
    SELECT array_agg(k.key), array_agg(k.n) INTO v_keys, v_freed
      FROM (SELECT l.key, f.n
              FROM (SELECT e.limit_key AS key, count(*)::integer AS n FROM {{schema}}.jobs e
                     WHERE e.id = ANY (v_done) AND e.limit_key IS NOT NULL
                     GROUP BY e.limit_key) f
              JOIN {{schema}}.limits l ON l.key = f.key
             ORDER BY l.key
               FOR UPDATE OF l) k;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
  EXCEPTION WHEN lock_not_available THEN
    -- The block's changes are undone, lock_timeout's too.
    SELECT array_agg(k.key), array_agg(k.n) INTO v_keys, v_freed
      FROM (SELECT l.key, f.n
              FROM (SELECT e.limit_key AS key, count(*)::integer AS n FROM {{schema}}.jobs e
                     WHERE e.id = ANY (v_done) AND e.limit_key IS NOT NULL
                     GROUP BY e.limit_key) f
              JOIN {{schema}}.limits l ON l.key = f.key
             ORDER BY l.key
               FOR UPDATE OF l SKIP LOCKED) k;
  END;
  IF v_keys IS NULL THEN
    RETURN;
  END IF;
  -- Counted now, under the locks: what runs is what this statement sees running.
  RETURN QUERY
  WITH room AS (
    SELECT l.key, l.max_starts,
           least(k.n,
                 coalesce(l.max_running - (SELECT count(*) FROM {{schema}}.jobs r
                                            WHERE r.state = 'running' AND r.limit_key = l.key),
                          v_never),
                 coalesce(l.max_starts - (SELECT count(*) FROM {{schema}}.limit_starts m
                                           WHERE m.key = l.key
                                             AND m.started_at > now() - l."window"),
                          v_never)) AS n
      FROM unnest(v_keys, v_freed) AS k(key, n)
      JOIN {{schema}}.limits l ON l.key = k.key),
  -- The offered queues, not paused, with the slots the dependents left.
  oq AS (
    SELECT q.name, q.n - (SELECT count(*) FROM unnest(v_handed) AS h(queue)
                           WHERE h.queue = q.name)::integer AS n
      FROM unnest(p_hand_queues, p_hand_slots) AS q(name, n)
     WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = q.name)),
  keyed AS (
    SELECT x.* FROM room CROSS JOIN LATERAL (
      SELECT c.ctid, c.id, c.queue, c.priority, c.run_at FROM {{schema}}.jobs c
       WHERE c.limit_key = room.key
         AND c.queue = ANY (ARRAY (SELECT o.name FROM oq o WHERE o.n > 0))
         AND c.state = 'queued' AND c.run_at <= now()
         AND c.cancel_requested_at IS NULL
         AND (c.expires_at IS NULL OR c.expires_at > now())
         AND c.task = ANY (p_hand_tasks)
       ORDER BY c.priority DESC, c.run_at, c.id
       LIMIT greatest(room.n, 0)
         FOR UPDATE OF c SKIP LOCKED) x),
  candidates AS (
    SELECT r.ctid FROM (
      SELECT x.ctid, o.n,
             row_number() OVER (PARTITION BY x.queue ORDER BY x.priority DESC, x.run_at, x.id)
               AS rn,
             row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS total
        FROM keyed x JOIN oq o ON o.name = x.queue
       -- No ready job this worker could take without a limits row comes first in claim
       -- order: none of a higher priority, none of its priority and an earlier run_at. Each an
       -- index range of jobs_claim_idx that ends before x, in a scalar subquery, so that it is
       -- looked up per candidate (an anti join was planned as a merge over the whole queue).
       -- A tie on run_at (jobs of one enqueue transaction) is not ordered by id here: a range
       -- "same run_at, lower id" was planned on the primary key, every older job, and a row
       -- comparison beside the run_at bound does not end the range (PostgreSQL 15).
       WHERE (SELECT true FROM {{schema}}.jobs a
               WHERE a.state = 'queued' AND a.queue = x.queue AND a.run_at <= now()
                 AND a.cancel_requested_at IS NULL
                 AND (a.expires_at IS NULL OR a.expires_at > now())
                 AND a.task = ANY (p_hand_tasks)
                 AND (a.limit_key IS NULL
                      OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l
                                      WHERE l.key = a.limit_key))
                 AND a.priority > x.priority
               LIMIT 1) IS NULL
         AND (SELECT true FROM {{schema}}.jobs b
               WHERE b.state = 'queued' AND b.queue = x.queue AND b.run_at <= now()
                 AND b.cancel_requested_at IS NULL
                 AND (b.expires_at IS NULL OR b.expires_at > now())
                 AND b.task = ANY (p_hand_tasks)
                 AND (b.limit_key IS NULL
                      OR NOT EXISTS (SELECT 1 FROM {{schema}}.limits l
                                      WHERE l.key = b.limit_key))
                 AND b.priority = x.priority AND b.run_at < x.run_at
               LIMIT 1) IS NULL) r
     WHERE r.rn <= r.n AND r.total <= v_total),
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
              date_part('epoch', j.started_at) * 1000 AS started_at, j.args::jsonb AS args),
  marks AS (
    INSERT INTO {{schema}}.limit_starts (key, job_id)
    SELECT h.limit_key, h.id::bigint FROM handed h
      JOIN room ON room.key = h.limit_key
     WHERE room.max_starts IS NOT NULL)
  -- Marked `limited`: the worker keeps the slot of its success for this hand-off again.
  SELECT h.id, v_running, h.attempt, h.run_at, NULL::boolean,
         to_jsonb(h) || jsonb_build_object('limited', true)
    FROM handed h;
END
$$;

-- claim_one_checked: the one-queue claim of a worker whose last limited claim found no key to
-- serve (src/worker/claimer.ts), with the check it runs first in the same call: whether a limit
-- key has room and a ready job in the queue, found from the keys of queued jobs (at most 100
-- distinct keys, one descent of jobs_queued_key_idx each), as the claimer's own check does. Such
-- a key (or more keys than the walk looks at) comes back as one row with only `keyed` set
-- ('key', 'unknown'), and nothing is claimed: the worker then claims as limits say. Otherwise it
-- is claim_one (p_levels null) or claim_one_floor, whose rows it returns (`keyed` null). The
-- check and the claim were two calls (three round trips, the check unprepared), which held the
-- jobs without a key back while limits rows exist.
CREATE FUNCTION {{schema}}.claim_one_checked(
  p_queue text, p_tasks text[], p_limit integer, p_excluded bigint[], p_worker text,
  p_levels smallint[], p_floors float8[])
RETURNS TABLE (
  id text, task text, queue text, priority smallint, attempt integer, run_count integer,
  max_attempts integer, snoozes integer, run_at float8, expires_at float8, unique_key text,
  limit_key text, created_at float8, started_at float8, args jsonb, keyed text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  v_never CONSTANT bigint := 2147483647;
  v_walk CONSTANT integer := 100;
  v_complete boolean;
  v_key text;
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.queue_pauses p WHERE p.queue = p_queue) THEN
    RETURN;
  END IF;
  WITH RECURSIVE queued_keys(key, depth) AS (
    (SELECT min(c.limit_key)::text, 1 FROM {{schema}}.jobs c
      WHERE c.state = 'queued' AND c.limit_key IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(c.limit_key)::text FROM {{schema}}.jobs c
             WHERE c.state = 'queued' AND c.limit_key IS NOT NULL AND c.limit_key > q.key),
           q.depth + 1
      FROM queued_keys q WHERE q.key IS NOT NULL AND q.depth <= v_walk)
  SELECT EXISTS (SELECT 1 FROM queued_keys k WHERE k.key IS NULL),
         (SELECT q.key FROM queued_keys q
           CROSS JOIN LATERAL (
             SELECT l.key FROM {{schema}}.limits l
              WHERE l.key = q.key
                AND least(
                      coalesce(l.max_running - (SELECT count(*) FROM {{schema}}.jobs r
                                                 WHERE r.state = 'running'
                                                   AND r.limit_key = l.key), v_never),
                      coalesce(l.max_starts - (SELECT count(*) FROM {{schema}}.limit_starts m
                                                WHERE m.key = l.key
                                                  AND m.started_at > now() - l."window"),
                               v_never)) > 0
             OFFSET 0) l
           CROSS JOIN LATERAL (
             SELECT 1 FROM {{schema}}.jobs c
              WHERE c.limit_key = l.key
                AND c.state = 'queued' AND c.queue = p_queue AND c.run_at <= now()
                AND c.cancel_requested_at IS NULL
                AND (c.expires_at IS NULL OR c.expires_at > now())
                AND c.task = ANY (p_tasks)
                AND c.id <> ALL (p_excluded)
              LIMIT 1) best
          WHERE q.key IS NOT NULL
          LIMIT 1)
    INTO v_complete, v_key;
  IF v_key IS NOT NULL OR NOT v_complete THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::smallint, NULL::integer,
      NULL::integer, NULL::integer, NULL::integer, NULL::float8, NULL::float8, NULL::text,
      NULL::text, NULL::float8, NULL::float8, NULL::jsonb,
      CASE WHEN v_key IS NOT NULL THEN 'key' ELSE 'unknown' END;
    RETURN;
  END IF;
  IF p_levels IS NULL THEN
    RETURN QUERY SELECT c.*, NULL::text
      FROM {{schema}}.claim_one(p_queue, p_tasks, p_limit, p_excluded, p_worker) c;
  ELSE
    RETURN QUERY SELECT c.*, NULL::text
      FROM {{schema}}.claim_one_floor(p_queue, p_tasks, p_limit, p_excluded, p_worker, p_levels,
                                      p_floors) c;
  END IF;
END
$$;
