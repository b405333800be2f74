-- Consumer side: an inbox table to process each event once. outbox-relay delivers at least
-- once (duplicates after a crash or a broker failure, of events after the last confirmed
-- LSN); every record carries the event id in its `id` header. Record the id in the same
-- transaction as the consumer's own change, and skip ids already there:
--
--   BEGIN;
--   INSERT INTO inbox (event_id, topic) VALUES ($1, $2) ON CONFLICT DO NOTHING;
--   -- 0 rows inserted: a duplicate, commit and skip; 1 row: apply the event, then
--   COMMIT;
CREATE TABLE IF NOT EXISTS inbox (
  event_id     text        PRIMARY KEY,
  topic        text        NOT NULL,
  processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
-- Ids older than the longest possible redelivery window can go:
--   DELETE FROM inbox WHERE processed_at < now() - interval '30 days';
