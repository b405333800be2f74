-- For teams that keep outbox rows (for audit or replays): delete old ones regularly. The
-- relay never needs rows after their INSERT is in the WAL, so any retention is safe for it.
-- Run from cron or pg_cron, e.g. SELECT cron.schedule('outbox-purge', '17 * * * *', $$CALL purge_outbox('7 days')$$);
CREATE OR REPLACE PROCEDURE purge_outbox(older_than interval, batch integer DEFAULT 10000)
LANGUAGE plpgsql AS $$
DECLARE
  deleted integer;
BEGIN
  LOOP
    DELETE FROM outbox
    WHERE id IN (SELECT id FROM outbox WHERE created_at < now() - older_than LIMIT batch);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    COMMIT;  -- short transactions: no long lock, no bloat spike
    EXIT WHEN deleted < batch;
  END LOOP;
END
$$;
