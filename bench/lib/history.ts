// Not what akadze does, measured beside it by bench/profile.ts and bench/storage.ts: finished
// jobs kept in a history table (same columns, primary key and finished_at index) instead of
// in `jobs`, a succeeded job moved there by one DELETE ... RETURNING into INSERT per batch.

/** Creates `akadze.history` and `akadze.move_succeeded(ids, run_counts)` in a migrated database. */
export const HISTORY_DDL: readonly string[] = [
  "create table akadze.history (like akadze.jobs including defaults including constraints)",
  "alter table akadze.history add primary key (id)",
  "create index on akadze.history (finished_at)",
  // Written like complete_jobs: a kept generic plan that finds each job by primary key.
  `create function akadze.move_succeeded(p_ids bigint[], p_run_counts integer[])
   returns table (id text, state text) language plpgsql
   set plan_cache_mode = force_generic_plan set jit = off set enable_seqscan = off as $$
   #variable_conflict use_column
   declare v_running constant text := 'running';
   begin
     return query
     with d as (
       delete from akadze.jobs j using unnest(p_ids, p_run_counts) as o(id, run_count)
        where j.id = o.id and j.run_count = o.run_count and j.state = v_running
          and j.cancel_requested_at is null
       returning j.*)
     insert into akadze.history (id, task, queue, priority, state, args, run_count, attempt,
            max_attempts, snoozes, run_at, expires_at, unique_key, limit_key, worker_id,
            cancel_requested_at, errors, result, created_at, started_at, finished_at)
     select d.id, d.task, d.queue, d.priority, 'succeeded', d.args, d.run_count,
            d.attempt, d.max_attempts, d.snoozes, d.run_at, d.expires_at, d.unique_key,
            d.limit_key, null, d.cancel_requested_at, d.errors, null, d.created_at,
            d.started_at, now()
       from d
     returning history.id::text, history.state;
   end $$`,
];

/** Moves a batch of running jobs, fenced like the outcome write; returns id and state. */
export const MOVE_SUCCEEDED = "select id, state from akadze.move_succeeded($1, $2)";
