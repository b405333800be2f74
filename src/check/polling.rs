//! `check`'s findings for a polling pipeline: the table and its columns, the role's
//! privileges (the sentence the start stops with), the rows waiting, the notify trigger.

use tokio_postgres::Client;

use super::replication::connection_finding;
use super::{finding, Finding, Verdict};
use crate::config::PipelineConfig;
use crate::error::chain;
use crate::source::privileges;

/// What a polling pipeline needs: the table with its columns (as the relay checks them at
/// start), SELECT and UPDATE (DELETE with `mark = "delete"` or the purge), and for
/// `notify_channel` a trigger. No REPLICATION, `wal_level` or slot.
pub(super) async fn check(
    config: &PipelineConfig,
    client: &Client,
    out: &mut Vec<Finding>,
) -> Result<(), tokio_postgres::Error> {
    out.push(connection_finding(client).await?);
    out.push(finding(
        "source",
        Verdict::Ok,
        "polling: needs no REPLICATION, wal_level = logical or slot",
    ));
    let stats = match crate::source::polling::check_table(client, config).await {
        Ok(stats) => stats,
        Err(e) => {
            out.push(finding("outbox table", Verdict::Fail, chain(&e)));
            return Ok(());
        }
    };
    let table = config.table.quoted();
    let polling = &config.polling;
    out.push(match privileges::polling_missing(client, config).await? {
        None => finding(
            "outbox table",
            Verdict::Ok,
            format!(
                "{} has the columns of mark = {:?}; the role may read and mark rows",
                config.table, polling.mark
            ),
        ),
        Some(missing) => finding("outbox table", Verdict::Fail, missing),
    });
    let row = client.query_one(&stats, &[]).await?;
    let (pending, age, failed): (i64, f64, i64) = (row.get(0), row.get(1), row.get(2));
    out.push(finding(
        "outbox rows",
        if failed > 0 {
            Verdict::Warn
        } else {
            Verdict::Ok
        },
        format!("{pending} pending (oldest {age:.0} s), {failed} FAILED"),
    ));
    if let Some(channel) = &polling.notify_channel {
        let triggers: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal",
                &[&table],
            )
            .await?
            .get(0);
        out.push(if triggers > 0 {
            finding(
                "notify",
                Verdict::Ok,
                format!("LISTEN {channel}; {table} has a trigger (sql/outbox_polling.sql's notifies outbox_relay)"),
            )
        } else {
            finding(
                "notify",
                Verdict::Warn,
                format!("notify_channel = {channel:?} but {table} has no trigger: idle latency is max_interval_ms (sql/outbox_polling.sql has the trigger)"),
            )
        });
    }
    Ok(())
}
