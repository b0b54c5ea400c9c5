-- akadze schema, version 0005: every function resolves names in pg_catalog only. "{{schema}}" is
-- replaced by the quoted schema name.
--
-- Without a fixed search_path a function body resolves its operators and functions (`=`, now(),
-- pg_notify, ...) through the caller's search_path: a schema listed first, or an overload that
-- fits better placed in public (anyone may create there on PostgreSQL 13 and 14), would run in
-- place of the builtin. The functions that are not inlined get search_path = pg_catalog,
-- pg_temp. outcome_state is inlined into the outcome write and the rescuer, and a SET clause
-- would stop that: it names every operator instead, and has no SET.
ALTER FUNCTION {{schema}}.claim_one(
  pg_catalog.text, pg_catalog.text[], pg_catalog.int4, pg_catalog.int8[], pg_catalog.text)
  SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.claim_one_floor(
  pg_catalog.text, pg_catalog.text[], pg_catalog.int4, pg_catalog.int8[], pg_catalog.text,
  pg_catalog.int2[], pg_catalog.float8[])
  SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.complete_jobs(
  pg_catalog.int8[], pg_catalog.int4[], pg_catalog.text[], pg_catalog.text[], pg_catalog.text[],
  pg_catalog.float8[])
  SET search_path = pg_catalog, pg_temp;
-- Not inlinable (a FROM clause), so a SET clause costs it nothing it had.
ALTER FUNCTION {{schema}}.append_error(pg_catalog.jsonb, pg_catalog.jsonb)
  SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.enqueue_many(
  pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.int4, pg_catalog.timestamptz,
  pg_catalog.int4, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.text)
  SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.enqueue(
  pg_catalog.text, pg_catalog.jsonb, pg_catalog.text, pg_catalog.int4, pg_catalog.timestamptz,
  pg_catalog.int4, pg_catalog.text, pg_catalog.text, pg_catalog.timestamptz, pg_catalog.text)
  SET search_path = pg_catalog, pg_temp;

-- As in 0001, every operator named (parenthesised: OPERATOR(...) forms share one precedence).
CREATE OR REPLACE FUNCTION {{schema}}.outcome_state(
  p_cancel_requested pg_catalog.bool, p_kind pg_catalog.text, p_attempt pg_catalog.int4,
  p_max_attempts pg_catalog.int4)
RETURNS pg_catalog.text
LANGUAGE sql IMMUTABLE
AS $$
  SELECT CASE WHEN p_cancel_requested THEN 'cancelled'::pg_catalog.text
              WHEN p_kind OPERATOR(pg_catalog.=) 'succeeded' THEN 'succeeded'
              WHEN p_kind OPERATOR(pg_catalog.=) 'retry'
                   AND ((p_attempt OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.<) p_max_attempts)
                THEN 'queued'
              WHEN p_kind OPERATOR(pg_catalog.=) ANY ('{retry,fail}'::pg_catalog.text[])
                THEN 'failed'
              WHEN p_kind OPERATOR(pg_catalog.=) ANY ('{snooze,release}'::pg_catalog.text[])
                THEN 'queued'
              ELSE 'cancelled' END
$$;
