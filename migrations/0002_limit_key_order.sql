-- akadze schema, version 0002. "{{schema}}" is replaced by the quoted schema name.

-- While limits exist, each claim picks the limit keys with room whose best ready job comes
-- first (src/worker/claimer.ts). This index gives each key's queued jobs in claim order, so
-- that is one short index scan per key, not a read and sort of every queued job of every
-- key on every claim. It serves the lookups by limit_key alone too, so it replaces that
-- index. Built and dropped concurrently (outside a transaction, src/migrate.ts): the jobs
-- table stays writable meanwhile, and each statement can run again after a failure.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_queued_key_idx
  ON {{schema}}.jobs (limit_key, priority DESC, run_at, id)
  WHERE state = 'queued' AND limit_key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.jobs_queued_limit_idx;
