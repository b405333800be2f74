//! librdkafka's log lines and global errors, told once: with a broker down, librdkafka reports
//! the same failure every reconnect backoff, once as a log line (`FAIL ... Connection refused`)
//! and once as a global error (`BrokerTransportFailure`). Here each distinct line is logged at
//! its own severity the first time, then at most every [`SUMMARY_EVERY`] with how often it
//! came back meanwhile (`repeated=`); repeats in between go to DEBUG. A transport failure's
//! global error is the log line again, so it goes to DEBUG only.
//!
//! The pipeline's state (`degraded`, docs/operations/monitoring.md) and the supervisor's log
//! say when the broker is back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A line that recurs is logged again, with its count, at most this often.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);
/// Distinct lines remembered; past it the memory starts afresh (lines are then logged again).
const MAX_LINES: usize = 256;

/// What to do with a line now.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// First seen (or forgotten): log it.
    Log,
    /// Seen within [`SUMMARY_EVERY`] of its last logging: DEBUG only.
    Repeat,
    /// Seen again after [`SUMMARY_EVERY`]: log it with how many repeats there were since.
    Summary(u64),
}

/// The lines seen, by their shape ("after 3ms" and "after 7ms" are one line, two brokers'
/// failures two), with when each was last logged and how often it came since.
#[derive(Debug, Default)]
pub struct Repeats {
    lines: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Repeats {
    /// The verdict on `line` at `now`.
    pub fn see(&self, line: &str, now: Instant) -> Verdict {
        let key = shape(line);
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() >= MAX_LINES && !lines.contains_key(&key) {
            lines.clear();
        }
        match lines.get_mut(&key) {
            None => {
                lines.insert(key, (now, 0));
                Verdict::Log
            }
            Some((logged, repeats)) => {
                *repeats += 1;
                if now.duration_since(*logged) >= SUMMARY_EVERY {
                    let count = std::mem::take(repeats);
                    *logged = now;
                    Verdict::Summary(count)
                } else {
                    Verdict::Repeat
                }
            }
        }
    }

    /// A librdkafka log line, logged as [`Repeats::see`] decides, at its own severity.
    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let line = format!("{fac} {message}");
        let repeated = match self.see(&line, Instant::now()) {
            Verdict::Log => None,
            Verdict::Summary(count) => Some(count),
            Verdict::Repeat => {
                tracing::debug!(target: "librdkafka", "librdkafka: {line}");
                return;
            }
        };
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", repeated, "librdkafka: {line}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", repeated, "librdkafka: {line}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", repeated, "librdkafka: {line}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {line}"),
        }
    }

    /// A librdkafka global error: a transport failure (the log line said it) at DEBUG, any
    /// other at ERROR as [`Repeats::see`] decides.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerTransportFailure) {
            tracing::debug!(target: "librdkafka", %error, reason, "librdkafka error");
            return;
        }
        let line = format!("{error}: {reason}");
        match self.see(&line, Instant::now()) {
            Verdict::Log => {
                tracing::error!(target: "librdkafka", %error, reason, "librdkafka error")
            }
            Verdict::Summary(repeated) => {
                tracing::error!(target: "librdkafka", %error, reason, repeated, "librdkafka error")
            }
            Verdict::Repeat => {
                tracing::debug!(target: "librdkafka", %error, reason, "librdkafka error")
            }
        }
    }
}

/// `line` without the numbers that change between repeats of one failure (durations, counts
/// such as `1/1 brokers are down`): digits are dropped from every word but those that name
/// something, a word with `:` or an inner `.` (an address, `host:port`, a thread such as
/// `[thrd:kafka-1:9092/1]`).
fn shape(line: &str) -> String {
    line.split_inclusive(char::is_whitespace)
        .flat_map(|word| {
            let inner = word.trim_end_matches(|c: char| {
                c.is_whitespace() || matches!(c, '.' | ',' | ';' | ')' | ']')
            });
            let names = inner.contains([':', '.']);
            word.chars().filter(move |c| names || !c.is_ascii_digit())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAIL: &str = "FAIL [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)";

    #[test]
    fn a_line_is_logged_once_then_summarised_with_its_count_once_a_minute() {
        let repeats = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(repeats.see(FAIL, t0), Verdict::Log);
        // The same failure with other numbers, many times within the minute.
        for i in 1..=50u64 {
            let line = FAIL.replace("after 0ms", &format!("after {i}ms"));
            assert_eq!(
                repeats.see(&line, t0 + Duration::from_secs(i)),
                Verdict::Repeat
            );
        }
        assert_eq!(
            repeats.see(FAIL, t0 + Duration::from_secs(61)),
            Verdict::Summary(51)
        );
        assert_eq!(
            repeats.see(FAIL, t0 + Duration::from_secs(62)),
            Verdict::Repeat
        );
        // Another line is its own.
        assert_eq!(
            repeats.see("Disconnected", t0 + Duration::from_secs(62)),
            Verdict::Log
        );
    }

    #[test]
    fn two_brokers_failures_are_two_lines() {
        let repeats = Repeats::default();
        let t0 = Instant::now();
        let one = FAIL.replace("127.0.0.1:9", "kafka-1:9092");
        let two = FAIL.replace("127.0.0.1:9", "kafka-2:9092");
        assert_eq!(repeats.see(&one, t0), Verdict::Log);
        assert_eq!(
            repeats.see(&two, t0),
            Verdict::Log,
            "the second broker's failure"
        );
        assert_eq!(
            repeats.see(&two.replace("after 0ms", "after 12ms"), t0),
            Verdict::Repeat
        );
        // Counts are not names: librdkafka's "1/1 brokers are down" and "0/1 brokers are
        // down" are one line, as are durations at the end of a sentence.
        assert_eq!(repeats.see("1/1 brokers are down", t0), Verdict::Log);
        assert_eq!(repeats.see("0/1 brokers are down", t0), Verdict::Repeat);
        assert_eq!(repeats.see("timed out after 5ms.", t0), Verdict::Log);
        assert_eq!(repeats.see("timed out after 17ms.", t0), Verdict::Repeat);
    }

    #[test]
    fn memory_is_bounded() {
        let repeats = Repeats::default();
        let t0 = Instant::now();
        for i in 0..10 * MAX_LINES {
            repeats.see(&format!("line {}", "x".repeat(i % 1000)), t0);
        }
        assert!(repeats.lines.lock().unwrap().len() <= MAX_LINES);
    }
}
