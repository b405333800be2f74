-- The outbox table for the polling source (source_kind = "polling", mark = "status"), for
-- databases without logical replication. The columns are those of the polling relays teams
-- run today (status / published_at / retry_count / next_retry_at); names are configurable in
-- [pipelines.polling] and [pipelines.columns].
--
-- Services insert one row per event in the same transaction as their business change:
--   INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
--   VALUES ('Order', '42', 'OrderCreated', '{"total": 12.50}');
-- The relay selects pending rows FOR UPDATE SKIP LOCKED, publishes them, and sets
-- status = 'PUBLISHED', published_at = now() once Kafka acknowledged them. A delivery that
-- keeps failing ends as status = 'FAILED' (retry_count attempts; see docs/how-to/polling.md).

CREATE TABLE IF NOT EXISTS outbox (
  id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb,
  headers        jsonb       NOT NULL DEFAULT '{}',
  -- clock_timestamp(), not now(): the time of the insert, not of the transaction's start, so
  -- that an aggregate's events (written under its row lock) sort in commit order.
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  status         text        NOT NULL DEFAULT 'PENDING'
                 CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED')),
  published_at   timestamptz,
  retry_count    integer     NOT NULL DEFAULT 0,
  next_retry_at  timestamptz
);

-- What a poll reads: pending rows in (created_at, id) order. Small, since published rows
-- leave it.
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (created_at, id) WHERE status = 'PENDING';
-- The order check: earlier pending or failed rows of the same aggregate.
CREATE INDEX IF NOT EXISTS outbox_unpublished_by_aggregate
  ON outbox (aggregate_id, aggregate_type, created_at, id) WHERE status IN ('PENDING', 'FAILED');
-- Rows held back: FAILED ones and those waiting for a retry, which a poll looks for before
-- each earlier row of their aggregate (small: only rows that failed at least once).
CREATE INDEX IF NOT EXISTS outbox_stuck_by_aggregate
  ON outbox (aggregate_id, aggregate_type, created_at, id)
  WHERE status = 'FAILED' OR (status = 'PENDING' AND next_retry_at IS NOT NULL);
-- The retention purge (purge_published_after_secs).
CREATE INDEX IF NOT EXISTS outbox_published_at ON outbox (published_at) WHERE status = 'PUBLISHED';

-- Optional: wake the relay on commit instead of waiting for its next poll
-- ([pipelines.polling] notify_channel = "outbox_relay"). One notification per statement;
-- PostgreSQL delivers it at commit and folds duplicates within a transaction.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('outbox_relay', '');
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- The relay's role needs no REPLICATION: only to read and mark the rows.
--   CREATE ROLE outbox_relay LOGIN PASSWORD '...';
--   GRANT USAGE ON SCHEMA public TO outbox_relay;
--   GRANT SELECT, UPDATE ON outbox TO outbox_relay;   -- and DELETE for the retention purge
--                                                     -- or mark = "delete"
--
-- Other schemas:
--   mark = "flag":   a boolean column `published boolean NOT NULL DEFAULT false`, with
--                    CREATE INDEX ON outbox (created_at, id) WHERE NOT published;
--                    CREATE INDEX ON outbox (aggregate_id, aggregate_type, created_at, id)
--                      WHERE NOT published;
--   mark = "delete": no extra column; every row is pending until the relay deletes it.
-- Failed rows are listed by
--   SELECT id, aggregate_type, aggregate_id, retry_count FROM outbox WHERE status = 'FAILED';
-- and published again, after the cause is fixed, by
--   UPDATE outbox SET status = 'PENDING', retry_count = 0, next_retry_at = NULL WHERE id = ...;
