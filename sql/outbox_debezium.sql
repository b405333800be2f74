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
CREATE PUBLICATION outboxevent_pub FOR TABLE outboxevent WITH (publish = 'insert');
