-- akadze schema, version 0007: awaiting outcomes and progress. "{{schema}}" is replaced by the
-- quoted schema name.
--
-- `awaited` is set by app.waitForJob (src/wait.ts) before it reads the job. The trigger
-- below notifies the channel "<schema>_done" with the job id when an awaited job reaches a
-- terminal state or reports progress, whichever statement makes that change (the outcome
-- write, completeTx, the rescuer, the cancel pass, an admin cancel). The waiter's UPDATE and
-- the state change serialise on the row lock: either the state change runs on the version
-- that has `awaited`, and notifies, or it committed before the waiter's next read, which sees
-- it. A job nobody awaits only pays for the trigger's WHEN test, evaluated in memory.
-- Both columns are added without a rewrite (a constant default, a NULL).
ALTER TABLE {{schema}}.jobs ADD COLUMN awaited boolean NOT NULL DEFAULT false;
-- The last value a run reported with ctx.progress (a number or small JSON), or NULL.
ALTER TABLE {{schema}}.jobs ADD COLUMN progress jsonb;

CREATE FUNCTION {{schema}}.notify_awaited()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM pg_catalog.pg_notify(TG_TABLE_SCHEMA || '_done', NEW.id::text);
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_awaited
  AFTER UPDATE OF state, progress ON {{schema}}.jobs
  FOR EACH ROW
  WHEN (NEW.awaited AND (NEW.state IN ('succeeded', 'failed', 'cancelled')
                         OR NEW.progress IS DISTINCT FROM OLD.progress))
  EXECUTE FUNCTION {{schema}}.notify_awaited();
