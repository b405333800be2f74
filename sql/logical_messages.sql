-- Only for pipelines with `message_prefix` (outbox events as logical decoding messages, no
-- table). PostgreSQL lets every role (PUBLIC) call pg_logical_emit_message(), so any role
-- that can connect to the database could publish an event under the prefix, with any id,
-- key and headers. This revokes EXECUTE from PUBLIC and grants it to the roles that write
-- events; `outbox-relay check` warns while PUBLIC still holds it.
--
-- Run as a superuser (the functions belong to pg_catalog), in each database the relay reads,
-- after replacing the writer roles below. Idempotent. Covers every signature of the function
-- (PostgreSQL 17 added a `flush` argument). A superuser can always call it.
DO $$
DECLARE
  writer_roles text[] := ARRAY['orders_service'];  -- the roles that publish events
  fn regprocedure;
  writer text;
BEGIN
  FOR fn IN
    SELECT p.oid::regprocedure FROM pg_proc p
    WHERE p.proname = 'pg_logical_emit_message'
      AND p.pronamespace = 'pg_catalog'::regnamespace
  LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    FOREACH writer IN ARRAY writer_roles LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, writer);
    END LOOP;
  END LOOP;
END
$$;
