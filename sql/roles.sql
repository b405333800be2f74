-- A least-privilege role for outbox-relay: REPLICATION for the walsender, SELECT on the
-- outbox only (log tailing decodes without it; it lets the role read the rows it publishes,
-- and a polling role needs it; `check` verifies both). Run it after
-- sql/outbox.sql and sql/slot_record.sql, as the database owner; it may run again.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'outbox_relay') THEN
    -- Set the password afterwards: ALTER ROLE outbox_relay PASSWORD '...' (or \password).
    CREATE ROLE outbox_relay LOGIN REPLICATION;
  END IF;
END
$$;
GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT ON outbox TO outbox_relay;
-- The slot record, so a lost slot is never re-created silently: read and written while the
-- relay streams. DELETE only for the role that runs `outbox-relay setup --accept-slot-loss`
-- or `outbox-relay teardown` (an administrator), not the relay's:
--   GRANT DELETE ON outbox_relay.streamed_slots TO <that role>;
GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay;
GRANT SELECT, INSERT, UPDATE ON outbox_relay.streamed_slots TO outbox_relay;
-- `outbox-relay setup` creates the publication when missing, which needs ownership of the
-- table; create it as the owner instead (sql/outbox.sql) and the role needs nothing more.
-- Only with terminate_stale_walsender_after_secs: to see another walsender's reply_time and
-- end it. Replicas under the same role can already end each other's walsenders.
-- GRANT pg_read_all_stats, pg_signal_backend TO outbox_relay;
