//! The "catching up" line: when it is due and what it says.

use super::*;

const MIB: u64 = 1 << 20;

fn snapshot(at: Instant, flush: u64) -> Progress {
    Progress {
        at,
        published: 0,
        flush: Lsn(flush),
    }
}

#[test]
fn catching_up_waits_for_the_interval_and_keeps_counting() {
    let start = Instant::now();
    let mut progress = snapshot(start, 0);
    progress.published = 500;
    let early = start + PROGRESS_INTERVAL - Duration::from_millis(1);
    assert_eq!(progress.tick(early, Lsn(100 * MIB), 200 * MIB), None);
    assert_eq!(
        progress.at, start,
        "a tick before the interval must not restart the snapshot"
    );
    assert_eq!(progress.published, 500);
    assert_eq!(progress.flush, Lsn(0));
}

#[test]
fn catching_up_gives_rate_lag_and_eta() {
    let start = Instant::now();
    let mut progress = snapshot(start, 10 * MIB);
    progress.published = 40_000;
    let now = start + Duration::from_secs(20);
    // 200 MiB confirmed in 20 s is 10 MiB/s; 300 MiB behind is 30 s more.
    let line = progress
        .tick(now, Lsn(210 * MIB), 300 * MIB)
        .expect("300 MiB behind after 20 s logs a line");
    assert_eq!(
        line,
        CatchUp {
            events_per_sec: 2_000.0,
            lag_bytes: 300 * MIB,
            eta: Some(Duration::from_secs(30)),
        }
    );
    assert_eq!(progress.at, now, "the line starts a new snapshot");
    assert_eq!(progress.published, 0);
    assert_eq!(progress.flush, Lsn(210 * MIB));
}

#[test]
fn catching_up_is_quiet_when_close_but_still_restarts_the_snapshot() {
    let start = Instant::now();
    let mut progress = snapshot(start, 0);
    progress.published = 7;
    let now = start + PROGRESS_INTERVAL;
    assert_eq!(progress.tick(now, Lsn(MIB), PROGRESS_MIN_LAG_BYTES), None);
    assert_eq!(progress.at, now);
    assert_eq!(progress.published, 0);
    let later = now + PROGRESS_INTERVAL;
    assert!(progress
        .tick(later, Lsn(2 * MIB), PROGRESS_MIN_LAG_BYTES + 1)
        .is_some());
}

#[test]
fn catching_up_without_progress_has_no_eta() {
    let start = Instant::now();
    let mut progress = snapshot(start, 5 * MIB);
    let line = progress
        .tick(start + PROGRESS_INTERVAL, Lsn(5 * MIB), 64 * MIB)
        .expect("64 MiB behind logs a line");
    assert_eq!(line.eta, None, "a flush LSN that did not move gives no ETA");
    assert_eq!(line.events_per_sec, 0.0);
    // One byte in a very long time: the ETA does not fit a Duration, and must not panic.
    let mut stalled = snapshot(start, 0);
    let line = stalled
        .tick(start + Duration::from_secs(1_000_000), Lsn(1), u64::MAX)
        .expect("far behind logs a line");
    assert_eq!(line.eta, None);
}
