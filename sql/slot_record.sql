-- The slot record: which replication slots outbox-relay streamed from, so that a relay that
-- finds its slot gone (dropped, or lost in a failover) refuses to create it again instead of
-- silently starting after the events it missed (docs/concepts/guarantees.md,
-- "A slot is never silently replaced").
--
-- The relay and `outbox-relay setup` create it on first start when the role may (CREATE on
-- the database); otherwise run this file once as the database owner, then grant the relay's
-- role what it needs (sql/roles.sql does for the role `outbox_relay`):
--   GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay;
--   GRANT SELECT, INSERT, UPDATE ON outbox_relay.streamed_slots TO outbox_relay;
--   -- and DELETE for the role that runs `outbox-relay setup --accept-slot-loss`.
-- Another schema (slot_record_schema in the config, --slot-record-schema): replace
-- outbox_relay below. No record at all: slot_record = false (--no-slot-record).
--
-- One row per slot, written when the relay starts streaming from it and then at most every
-- few seconds from the slot's confirmed position (never past the slot's confirmed_flush_lsn).
-- A physical standby replicates it with the rest of the database.

CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.streamed_slots (
  slot_name         text        PRIMARY KEY,
  pipeline          text        NOT NULL,
  system_identifier text        NOT NULL,
  timeline          bigint      NOT NULL,
  confirmed_lsn     pg_lsn      NOT NULL,
  confirmed_at      timestamptz NOT NULL,
  first_streamed_at timestamptz NOT NULL
);
