-- The outbox table as Debezium's Outbox Event Router expects it by default, for teams
-- switching from Debezium without changing their services. Map the columns in the relay's
-- config:
--   [pipelines.columns]
--   id = "id"
--   aggregate_type = "aggregatetype"
--   aggregate_id = "aggregateid"
--   event_type = "type"
--   payload = "payload"
CREATE TABLE IF NOT EXISTS outboxevent (
  id            uuid         PRIMARY KEY,
  aggregatetype varchar(255) NOT NULL,
  aggregateid   varchar(255) NOT NULL,
  type          varchar(255) NOT NULL,
  payload       jsonb
);
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_publication WHERE pubname = 'outboxevent_pub') THEN
    CREATE PUBLICATION outboxevent_pub FOR TABLE outboxevent WITH (publish = 'insert');
  END IF;
END
$$;
