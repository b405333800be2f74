//! Configuration of the polling source (`source_kind = "polling"`, `[pipelines.polling]`).
//!
//! The polling source reads the outbox table with `SELECT ... FOR UPDATE SKIP LOCKED`
//! instead of the WAL, for databases where logical replication is not available. See
//! [`crate::source::polling`] for the cycle and its guarantees.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Rows per poll: large enough to amortise the round trips, small enough that a transaction
/// holds few row locks for a short time.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// First wait after a poll that found nothing to publish.
pub const DEFAULT_MIN_INTERVAL_MS: u64 = 10;
/// Longest wait between polls of an idle outbox: the idle latency without NOTIFY.
pub const DEFAULT_MAX_INTERVAL_MS: u64 = 1_000;
/// Delivery attempts of an event before it is marked FAILED.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// First retry delay; doubles with each attempt.
pub const DEFAULT_RETRY_MIN_MS: u64 = 1_000;
/// Cap of the retry delay: five minutes.
pub const DEFAULT_RETRY_MAX_MS: u64 = 300_000;
/// Rows deleted per purge statement: short transactions, no long lock.
pub const DEFAULT_PURGE_BATCH_SIZE: usize = 1_000;
/// How often the purge runs when `purge_published_after_secs` is set.
pub const DEFAULT_PURGE_INTERVAL_SECS: u64 = 60;
/// How often the pending and failed gauges are refreshed (two counting queries).
pub const DEFAULT_STATS_INTERVAL_MS: u64 = 5_000;

/// Where a pipeline reads outbox events from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A logical replication slot (pgoutput): commit order, milliseconds, no table reads.
    #[default]
    LogTailing,
    /// `SELECT ... FOR UPDATE SKIP LOCKED` on the outbox table, marking rows once published.
    Polling,
}

/// How a published row is marked, and so which rows are pending.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MarkMode {
    /// `status = 'PUBLISHED', published_at = now()`; pending is `status = 'PENDING'`.
    /// Failed deliveries count in `retry_count`, wait until `next_retry_at`, and end as
    /// `status = 'FAILED'`.
    #[default]
    Status,
    /// `published = true`; pending is `NOT published`. No retry bookkeeping.
    Flag,
    /// The row is deleted; every row is pending. No retry bookkeeping.
    Delete,
}

/// Options of the polling source. Column names are those of `sql/outbox_polling.sql`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PollingConfig {
    /// Rows locked and published per cycle.
    pub batch_size: usize,
    /// First wait after a cycle that published nothing; doubles up to `max_interval_ms`.
    pub min_interval_ms: u64,
    /// Longest wait between polls that find nothing, ms.
    pub max_interval_ms: u64,
    /// LISTEN on this channel and poll at once on a notification (the trigger of
    /// `sql/outbox_polling.sql` notifies `outbox_relay`); `None`: timer only.
    pub notify_channel: Option<String>,
    /// How a published row is marked, and so which rows are pending.
    pub mark: MarkMode,
    /// Orders the rows (with the id as tie-breaker); `DEFAULT clock_timestamp()` gives
    /// insert order.
    pub created_at_column: String,
    /// The text column of `mark = "status"`: `PENDING`, `PUBLISHED` or `FAILED`.
    pub status_column: String,
    /// Set to the time of publishing with `mark = "status"`.
    pub published_at_column: String,
    /// Failed attempts of the row so far (`mark = "status"`).
    pub retry_count_column: String,
    /// When a failed row is tried again (`mark = "status"`).
    pub next_retry_at_column: String,
    /// The boolean column of `mark = "flag"`.
    pub published_column: String,
    /// Attempts before a retryable failure marks the row FAILED (`mark = "status"`).
    pub max_attempts: u32,
    /// A failed row waits `retry_min_ms * 2^retry_count` ms before its next attempt, at most
    /// `retry_max_ms`.
    pub retry_min_ms: u64,
    /// The longest wait before a failed row's next attempt, ms.
    pub retry_max_ms: u64,
    /// Later events of an aggregate wait behind its FAILED event (per-key order); `false`
    /// lets them pass it.
    pub failed_blocks_aggregate: bool,
    /// Delete published rows older than this (by `published_at`, or the created_at column
    /// with `mark = "flag"`); `None`: keep them.
    pub purge_published_after_secs: Option<u64>,
    /// Rows deleted per statement of the purge.
    pub purge_batch_size: usize,
    /// Seconds between purges.
    pub purge_interval_secs: u64,
    /// How often the pending, oldest pending and FAILED row metrics are read, ms.
    pub stats_interval_ms: u64,
}

impl Default for PollingConfig {
    fn default() -> Self {
        PollingConfig {
            batch_size: DEFAULT_BATCH_SIZE,
            min_interval_ms: DEFAULT_MIN_INTERVAL_MS,
            max_interval_ms: DEFAULT_MAX_INTERVAL_MS,
            notify_channel: None,
            mark: MarkMode::Status,
            created_at_column: "created_at".into(),
            status_column: "status".into(),
            published_at_column: "published_at".into(),
            retry_count_column: "retry_count".into(),
            next_retry_at_column: "next_retry_at".into(),
            published_column: "published".into(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry_min_ms: DEFAULT_RETRY_MIN_MS,
            retry_max_ms: DEFAULT_RETRY_MAX_MS,
            failed_blocks_aggregate: true,
            purge_published_after_secs: None,
            purge_batch_size: DEFAULT_PURGE_BATCH_SIZE,
            purge_interval_secs: DEFAULT_PURGE_INTERVAL_SECS,
            stats_interval_ms: DEFAULT_STATS_INTERVAL_MS,
        }
    }
}

impl PollingConfig {
    /// Checks the options; every problem names its field under `polling.`.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: &str| {
            problems.push(ConfigError::new(&format!("polling.{field}"), text))
        };
        for (field, value) in [
            ("batch_size", self.batch_size as u64),
            ("min_interval_ms", self.min_interval_ms),
            ("max_attempts", u64::from(self.max_attempts)),
            ("retry_min_ms", self.retry_min_ms),
            ("purge_batch_size", self.purge_batch_size as u64),
            ("purge_interval_secs", self.purge_interval_secs),
            ("stats_interval_ms", self.stats_interval_ms),
        ] {
            if value == 0 {
                problem(field, "must be greater than 0");
            }
        }
        if self.max_interval_ms < self.min_interval_ms {
            problem("max_interval_ms", "must be at least min_interval_ms");
        }
        if self.retry_max_ms < self.retry_min_ms {
            problem("retry_max_ms", "must be at least retry_min_ms");
        }
        for (field, value) in [
            ("created_at_column", &self.created_at_column),
            ("status_column", &self.status_column),
            ("published_at_column", &self.published_at_column),
            ("retry_count_column", &self.retry_count_column),
            ("next_retry_at_column", &self.next_retry_at_column),
            ("published_column", &self.published_column),
        ] {
            if value.is_empty() {
                problem(field, "must not be empty");
            }
        }
        if let Some(channel) = &self.notify_channel {
            if channel.is_empty() || channel.len() > 63 {
                problem("notify_channel", "must be 1-63 characters");
            }
        }
        if self.purge_published_after_secs.is_some() && self.mark == MarkMode::Delete {
            problem(
                "purge_published_after_secs",
                "has nothing to purge with mark = \"delete\"",
            );
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        assert!(PollingConfig::default().problems().is_empty());
        let cases: Vec<(&str, PollingConfig)> = vec![
            (
                "polling.batch_size",
                PollingConfig {
                    batch_size: 0,
                    ..PollingConfig::default()
                },
            ),
            (
                "polling.max_interval_ms",
                PollingConfig {
                    min_interval_ms: 50,
                    max_interval_ms: 10,
                    ..PollingConfig::default()
                },
            ),
            (
                "polling.retry_max_ms",
                PollingConfig {
                    retry_max_ms: 1,
                    ..PollingConfig::default()
                },
            ),
            (
                "polling.status_column",
                PollingConfig {
                    status_column: String::new(),
                    ..PollingConfig::default()
                },
            ),
            (
                "polling.max_attempts",
                PollingConfig {
                    max_attempts: 0,
                    ..PollingConfig::default()
                },
            ),
            (
                "polling.purge_published_after_secs",
                PollingConfig {
                    mark: MarkMode::Delete,
                    purge_published_after_secs: Some(60),
                    ..PollingConfig::default()
                },
            ),
        ];
        for (field, config) in cases {
            let problems = config.problems();
            assert!(
                problems.iter().any(|p| p.field == field),
                "{field}: {problems:?}"
            );
        }
    }
}
