-- The outbox table and its publication, as outbox-relay expects them by default.
--
-- Services insert one row per event in the same transaction as their business change:
--   INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
--   VALUES ('Order', '42', 'OrderCreated', '{"total": 12.50}');
-- outbox-relay publishes it to topic "Order.events" with key "42", value = payload::text
-- byte for byte, headers id (the row's id) and event_type.
--
-- The relay reads the WAL, not the table: rows may be deleted right after the insert (even
-- in the same transaction) or purged later; UPDATE and DELETE are not published.

CREATE TABLE IF NOT EXISTS outbox (
  id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb,
  headers        jsonb       NOT NULL DEFAULT '{}',
  created_at     timestamptz NOT NULL DEFAULT now()
);

-- Only inserts: updates and deletes of outbox rows never reach the relay. Created unless it
-- exists (this file may run again).
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = 'outbox_pub') THEN
    CREATE PUBLICATION outbox_pub FOR TABLE outbox WITH (publish = 'insert');
  END IF;
END
$$;

-- The relay's role needs REPLICATION (for the walsender) and to see the publication's table:
--   CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD '...';
--   GRANT SELECT ON outbox TO outbox_relay;
-- It creates its slot on first start (pgoutput), or create it yourself:
--   SELECT pg_create_logical_replication_slot('outbox_relay', 'pgoutput');
