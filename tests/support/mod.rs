//! Integration-test harness for outbox-relay.
//!
//! Used as `mod support;` from an integration-test binary. It starts, lazily and once per
//! test-binary run, one PostgreSQL 15 cluster ([`pg()`]) and one tansu Kafka-protocol broker
//! ([`kafka()`]), each on free loopback ports in a temp dir, and stops them when the process
//! exits (a `libc::atexit` handler). Leftovers of an earlier run that died without running its
//! exit handler (SIGKILL, Ctrl-C) are cleaned up when the next run starts.
//!
//! Everything here is safe to use from many `#[tokio::test]`s running in parallel threads,
//! each with its own tokio runtime: process-global state is runtime-independent and sits
//! behind `std::sync::OnceLock`; no tokio object is shared between runtimes.
//!
//! Every wait has a deadline and panics with a message naming what it waited for.
//!
//! Environment overrides: `TANSU_BIN` (path to the tansu binary), `PG_BINDIR` (directory with
//! initdb/pg_ctl/psql, default `/usr/lib/postgresql/15/bin`), `OUTBOX_IT_KEEP=1` (keep the run
//! directory with data and logs after exit; its path is printed at start-up).
#![allow(dead_code, unused_imports)]

pub mod http;
pub mod kafka;
pub mod nats;
pub mod pg;
pub mod rabbitmq;
pub mod redis;
pub mod relay;
mod run;
pub mod server;
pub mod tls_front;
pub mod webhook;

pub use http::{http_get, metric_sum, metric_value, scrape_metrics};
pub use kafka::{consume, consume_with, kafka, Broker, Consumed};
pub use pg::{parse_lsn, pg, Auth, PgCluster, TestDb, PASSWORD, QUERY_DEADLINE};
pub use relay::Relay;
pub use run::{free_port, run_within, CmdOutput};

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Returns a fresh name `<prefix>_<suffix>` that is unique within this process (and random
/// across processes), lowercase, at most 63 bytes and made of `[a-z0-9_]` only, so it is usable
/// as a database, replication slot, publication, role or topic name (e.g. `t_roundtrip_13f9a`).
/// Characters of `prefix` outside `[a-z0-9_]` are lowercased or replaced by `_`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // 16 pseudo-random bits from pid, time and the counter (splitmix64 finaliser).
    let mut x = nanos ^ ((std::process::id() as u64) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    // The counter is written first and the random part has a fixed width, so suffixes of one
    // process never collide.
    let suffix = format!("{:x}{:04x}", n, x & 0xffff);
    let mut p: String = prefix
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if p.is_empty() || p.starts_with(|c: char| c.is_ascii_digit()) {
        p.insert(0, 't');
    }
    p.truncate(63 - 1 - suffix.len());
    format!("{p}_{suffix}")
}

/// Polls `f` every 100 ms until it returns `Some`, and returns that value. Panics with `what`
/// once `deadline` (measured from the call) has passed, also when a single call of `f` is
/// still running at the deadline.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let end = start + deadline;
    loop {
        let remaining = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, f()).await {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(_) => panic!(
                "timed out after {:?} waiting for {what} (the last check was still running)",
                start.elapsed()
            ),
        }
        if Instant::now() >= end {
            panic!("timed out after {:?} waiting for {what}", start.elapsed());
        }
        let nap = Duration::from_millis(100).min(end.saturating_duration_since(Instant::now()));
        tokio::time::sleep(nap).await;
    }
}

/// Like [`wait_for`] for a blocking check outside async code: polls `f` every 100 ms until it
/// returns `Some`, panicking with `what` after `deadline`.
pub fn wait_for_blocking<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() >= deadline {
            panic!("timed out after {:?} waiting for {what}", start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `fut` to completion with a deadline, panicking with `what` if it takes longer.
pub async fn within<T>(what: &str, deadline: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(deadline, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}

/// The last `n` lines of `text` (all of it if it has fewer).
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..].join("\n")
}
