//! Dates and times as PostgreSQL prints them (`DateStyle = ISO`, `TimeZone = UTC`), read into
//! the forms Debezium's PostgreSQL connector gives them by default
//! (`time.precision.mode = adaptive`):
//!
//! - timestamptz: `io.debezium.time.ZonedTimestamp`, an ISO 8601 string in UTC with as many
//!   fractional digits as the column's precision (`2026-11-29T22:24:30.500000Z`);
//! - timestamp: `MicroTimestamp`, microseconds since 1970, or `Timestamp`, milliseconds, for a
//!   precision of 3 or less (the wall-clock time read as UTC);
//! - date: `Date`, days since 1970;
//! - time: `MicroTime`, microseconds since midnight, or `Time`, milliseconds, for a precision
//!   of 3 or less.
//!
//! Each returns `None` for a value without such a form (`infinity`) or that it cannot read.

use chrono::{Datelike, NaiveDate, NaiveDateTime, TimeDelta, Timelike};

/// Precisions up to this one count in milliseconds, above it in microseconds.
const MILLISECOND_PRECISION: u8 = 3;

/// Parses a timestamptz or timestamp as PostgreSQL prints it with `DateStyle = ISO`
/// (`2026-11-29 23:24:30.123456+00`, offsets like `+05:30`, `-03` or `+05:53:28`, ` BC` after
/// years before 1; a `T` separator is accepted too) into the UTC date and time; a value
/// without an offset is UTC.
pub(crate) fn parse_utc(text: &[u8]) -> Option<NaiveDateTime> {
    let text = std::str::from_utf8(text).ok()?.trim();
    let (text, bc) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let split = text.find([' ', 'T'])?;
    let (date, time) = (&text[..split], &text[split + 1..]);
    let (time, offset_seconds) = match time.find(['+', '-']) {
        Some(at) => (&time[..at], offset(&time[at..])?),
        None => (time, 0),
    };
    let local =
        NaiveDateTime::parse_from_str(&format!("{date} {time}"), "%Y-%m-%d %H:%M:%S%.f").ok()?;
    let local = if bc {
        local.with_year(1 - local.year())?
    } else {
        local
    };
    local.checked_sub_signed(TimeDelta::try_seconds(offset_seconds)?)
}

/// Seconds east of UTC of an offset `+HH`, `+HH:MM` or `+HH:MM:SS` (or `-`).
fn offset(text: &str) -> Option<i64> {
    let sign = if text.starts_with('-') { -1 } else { 1 };
    let mut seconds = 0;
    let mut parts = 0;
    for (part, unit) in text[1..].split(':').zip([3600, 60, 1]) {
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        seconds += part.parse::<i64>().ok()? * unit;
        parts += 1;
    }
    (parts == text[1..].split(':').count()).then_some(sign * seconds)
}

/// Debezium's `ZonedTimestamp` of a timestamptz with `precision` fractional digits.
pub(super) fn zoned_timestamp(text: &[u8], precision: u8) -> Option<String> {
    if matches!(text, b"infinity" | b"-infinity") {
        return Some(String::from_utf8_lossy(text).into_owned());
    }
    let utc = parse_utc(text)?;
    let mut out = utc.format("%Y-%m-%dT%H:%M:%S").to_string();
    let nanos = format!("{:09}", utc.nanosecond());
    let fraction = match usize::from(precision) {
        // Java's ISO_OFFSET_DATE_TIME: only the digits needed, none for a whole second.
        0 => nanos.trim_end_matches('0'),
        width => nanos.get(..width).unwrap_or(&nanos),
    };
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(fraction);
    }
    out.push('Z');
    Some(out)
}

/// Debezium's `MicroTimestamp` (or `Timestamp`, for `precision` up to 3) of a timestamp.
pub(super) fn epoch_timestamp(text: &[u8], precision: u8) -> Option<i64> {
    let utc = parse_utc(text)?.and_utc();
    Some(if precision <= MILLISECOND_PRECISION {
        utc.timestamp_millis()
    } else {
        utc.timestamp_micros()
    })
}

/// Debezium's `Date` of a date: days since 1970-01-01.
pub(super) fn epoch_day(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let (text, bc) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    let date = if bc {
        date.with_year(1 - date.year())?
    } else {
        date
    };
    Some((date - NaiveDate::from_ymd_opt(1970, 1, 1)?).num_days())
}

/// Debezium's `MicroTime` (or `Time`, for `precision` up to 3) of a time: `HH:MM:SS[.f]`, up
/// to PostgreSQL's `24:00:00`.
pub(super) fn time_of_day(text: &[u8], precision: u8) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut seconds: i64 = 0;
    let mut parts = whole.split(':');
    for limit in [24, 59, 59] {
        let part = parts.next()?;
        let n: i64 = part.parse().ok().filter(|n| (0..=limit).contains(n))?;
        if part.len() != 2 {
            return None;
        }
        seconds = seconds * 60 + n;
    }
    if parts.next().is_some() || fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let micros = seconds * 1_000_000 + format!("{fraction:0<6}").parse::<i64>().ok()?;
    Some(if precision <= MILLISECOND_PRECISION {
        micros / 1_000
    } else {
        micros
    })
}
