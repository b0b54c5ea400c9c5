-- akadze schema, version 0011: retention of flows. "{{schema}}" is replaced by the quoted
-- schema name.
--
-- The pruner deletes jobs outside flows that no job depends on with its plain statement
-- (src/old_jobs.ts), as before flows. The rest is deleted by the function below, so that a
-- flow goes as a whole and no job that a live job still needs is deleted.

-- Delete, up to about `p_limit` jobs (a whole flow may take it past), the jobs in state
-- `p_states` (terminal states) finished more than `p_older_than_ms` milliseconds ago that
-- are in a flow or that another job depends on:
-- - a job that some job depends on, outside flows, once no waiting, queued or running job
--   depends on it;
-- - a flow, once every job of it is in `p_states` and finished before the cutoff and no
--   waiting, queued or running job depends on one of them: all its jobs at once, or none
--   when another session holds one of them locked (skipped, never waited for).
-- The job_dependencies rows of the deleted jobs go with them. A flow is found by its first
-- step (the job whose id is the flow's id). Each check runs after the rows are locked, on
-- what is committed then: a job that is requeued, or that a new flow starts to depend on,
-- meanwhile is either seen or waits for this transaction (and then finds the job gone).
-- Returns the number of jobs deleted.
CREATE FUNCTION {{schema}}.prune_linked_jobs(
  p_older_than_ms double precision, p_limit integer, p_states text[])
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- As claim_one: a plan made while the tables are nearly empty must not scan jobs once they
-- have grown (the worker prunes every minute, most jobs in no flow).
SET enable_seqscan = off
AS $$
DECLARE
  v_cutoff CONSTANT timestamptz := now() - p_older_than_ms * interval '1 millisecond';
  v_flow bigint;
  v_ids bigint[];
  v_n bigint;
  v_deleted integer := 0;
BEGIN
  -- Jobs outside flows that other jobs depend on (enqueue_flow's {"job": id}), found from
  -- job_dependencies: the jobs table is not scanned for them (most jobs are in no flow).
  v_ids := ARRAY (
    SELECT j.id FROM {{schema}}.jobs j
     WHERE j.id IN (SELECT d.depends_on FROM {{schema}}.job_dependencies d)
       AND j.state IN ('succeeded', 'failed', 'cancelled') AND j.state = ANY (p_states)
       AND j.finished_at < v_cutoff
       AND j.flow_id IS NULL AND j.has_dependents
       AND NOT EXISTS (
             SELECT 1 FROM {{schema}}.job_dependencies d
               JOIN {{schema}}.jobs w ON w.id = d.job_id
              WHERE d.depends_on = j.id
                AND w.state IN ('waiting', 'queued', 'running'))
     LIMIT p_limit
       FOR UPDATE OF j SKIP LOCKED);
  IF cardinality(v_ids) > 0 THEN
    -- Checked again with the rows locked: a dependent enqueued in between counts.
    v_ids := ARRAY (
      SELECT u.id FROM unnest(v_ids) AS u(id)
       WHERE NOT EXISTS (
               SELECT 1 FROM {{schema}}.job_dependencies d
                 JOIN {{schema}}.jobs w ON w.id = d.job_id
                WHERE d.depends_on = u.id
                  AND w.state IN ('waiting', 'queued', 'running')));
    DELETE FROM {{schema}}.job_dependencies d WHERE d.depends_on = ANY (v_ids);
    DELETE FROM {{schema}}.jobs j WHERE j.id = ANY (v_ids);
    v_deleted := cardinality(v_ids);
  END IF;

  -- Whole flows, oldest first step first (read lazily: the loop stops at the limit), from
  -- the index of flow jobs (jobs_flow_idx), not from every finished job.
  FOR v_flow IN
    SELECT r.id FROM {{schema}}.jobs r
     WHERE r.flow_id IS NOT NULL AND r.flow_id = r.id
       AND r.state IN ('succeeded', 'failed', 'cancelled') AND r.state = ANY (p_states)
       AND r.finished_at < v_cutoff
     ORDER BY r.finished_at
  LOOP
    EXIT WHEN v_deleted >= p_limit;
    -- A step still to finish, or finished too recently: the flow stays.
    CONTINUE WHEN EXISTS (
      SELECT 1 FROM {{schema}}.jobs x
       WHERE x.flow_id = v_flow
         AND (x.state = ANY (p_states) AND x.finished_at < v_cutoff) IS NOT TRUE);
    v_ids := ARRAY (
      SELECT x.id FROM {{schema}}.jobs x
       WHERE x.flow_id = v_flow
         AND x.state = ANY (p_states) AND x.finished_at < v_cutoff
         FOR UPDATE OF x SKIP LOCKED);
    SELECT count(*) INTO v_n FROM {{schema}}.jobs x WHERE x.flow_id = v_flow;
    -- A step locked by another session, requeued or added meanwhile: the flow stays.
    CONTINUE WHEN cardinality(v_ids) IS DISTINCT FROM v_n::integer;
    -- A step that a live job of another flow still needs: the flow stays.
    CONTINUE WHEN EXISTS (
      SELECT 1 FROM {{schema}}.job_dependencies d
        JOIN {{schema}}.jobs w ON w.id = d.job_id
       WHERE d.depends_on = ANY (v_ids)
         AND w.state IN ('waiting', 'queued', 'running'));
    DELETE FROM {{schema}}.job_dependencies d
     WHERE d.job_id = ANY (v_ids) OR d.depends_on = ANY (v_ids);
    DELETE FROM {{schema}}.jobs j WHERE j.id = ANY (v_ids);
    v_deleted := v_deleted + cardinality(v_ids);
  END LOOP;
  RETURN v_deleted;
END
$$;

-- A flow is enqueued with the owner's rights: the steps set columns (the state, the
-- dependency count, the flow and step) and rows (job_dependencies, the dependencies' mark)
-- that the enqueue role may not write directly (docs/production.md). The function checks its
-- input, inserts only new jobs in state waiting or queued, and marks only the jobs its steps
-- name; its search_path is pinned.
ALTER FUNCTION {{schema}}.enqueue_flow(jsonb, bigint) SECURITY DEFINER;
