-- A least-privilege role for outbox-relay: REPLICATION for the walsender, SELECT on the
-- outbox only (the relay reads nothing else; `check` verifies both).
CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'CHANGE_ME';
GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT ON outbox TO outbox_relay;
-- The slot record (run sql/slot_record.sql first), so a lost slot is never re-created
-- silently; DELETE only for the role that runs `outbox-relay setup --accept-slot-loss`.
GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.streamed_slots TO outbox_relay;
-- `outbox-relay setup` creates the publication when missing, which needs ownership of the
-- table; create it as the owner instead (sql/outbox.sql) and the role needs nothing more.
-- Only with terminate_stale_walsender_after_secs: to see another walsender's reply_time and
-- end it. Replicas under the same role can already end each other's walsenders.
-- GRANT pg_read_all_stats, pg_signal_backend TO outbox_relay;
