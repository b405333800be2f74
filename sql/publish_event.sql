-- publish_event(): the one call a service makes, inside its own transaction, to emit an
-- event through the outbox. Returns the event id (the Kafka header `id`).
--
--   BEGIN;
--   UPDATE orders SET state = 'PAID' WHERE id = '42';
--   SELECT publish_event('Order', '42', 'OrderPaid', '{"paidAt": "2026-11-29T12:00:00Z"}');
--   COMMIT;
--
-- The row may be deleted right away (publish_event(..., keep => false)): the relay reads the
-- WAL, not the table, so the event is published all the same and the table stays empty.

CREATE OR REPLACE FUNCTION publish_event(
  aggregate_type text,
  aggregate_id   text,
  event_type     text,
  payload        jsonb,
  headers        jsonb   DEFAULT '{}',
  keep           boolean DEFAULT true
) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
  event_id uuid;
BEGIN
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
  VALUES (publish_event.aggregate_type, publish_event.aggregate_id, publish_event.event_type,
          publish_event.payload, publish_event.headers)
  RETURNING id INTO event_id;
  IF NOT keep THEN
    DELETE FROM outbox WHERE id = event_id;
  END IF;
  RETURN event_id;
END
$$;
