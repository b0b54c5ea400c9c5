-- akadze schema, version 0009: the indexes of flows. "{{schema}}" is replaced by the quoted
-- schema name. Built and dropped concurrently (outside a transaction, src/migrate.ts): the
-- jobs table stays writable meanwhile, and each statement can run again after a failure.

-- A waiting job holds its unique key too: the key index of 0001 widened to 'waiting'. An
-- enqueue of 0001's kind (ON CONFLICT for queued and running jobs) still finds this index.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_active_unique_key_idx
  ON {{schema}}.jobs (unique_key)
  WHERE state IN ('waiting', 'queued', 'running') AND unique_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.jobs_unique_key_idx;
-- A flow's steps (jobs show, cancel and requeue by flow, retention by flow).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_flow_idx ON {{schema}}.jobs (flow_id)
  WHERE flow_id IS NOT NULL;
