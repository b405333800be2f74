//! Text logs that untrusted input cannot forge: an event id, a destination or a server's error
//! text comes from rows and networks the relay does not control, and a line break in one would
//! start a line of the attacker's choosing in a log file or journal. [`EscapingWriter`] writes
//! each log line with its control characters escaped (`\n`, `\r`, `\x07`), but the line's own
//! final newline, tabs and, when the formatter colours its output, the escape character of its
//! colours (tracing-subscriber escapes that character in field values itself). JSON logs need
//! none of this: JSON escapes them.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written (`--log-format`, `OUTBOX_RELAY_LOG_FORMAT`, `[log] format`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Deserialize,
    schemars::JsonSchema,
    Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line per event, control characters from rows and servers escaped.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process's log subscriber on standard error: `RUST_LOG` when set (tracing's
/// filter syntax), else `level` (`--log-level`, `OUTBOX_RELAY_LOG_LEVEL` or `[log] level`:
/// `error`, `warn`, `info`, `debug`, `trace`, or the same filter syntax), else `info`.
///
/// Returns an error naming the setting if `level` is no valid filter.
pub fn init(format: LogFormat, level: Option<&str>) -> Result<(), String> {
    let filter = match (EnvFilter::try_from_default_env(), level) {
        (Ok(filter), _) => filter,
        (Err(_), Some(level)) => check_level(level)
            .and_then(|()| EnvFilter::try_new(level).map_err(|e| e.to_string()))
            .map_err(|e| {
                format!(
                    "log level {level:?} (--log-level, OUTBOX_RELAY_LOG_LEVEL or [log] level): {e}"
                )
            })?,
        (Err(_), None) => EnvFilter::new("info"),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        // Control characters from rows and servers escaped: no forged log lines.
        LogFormat::Text => subscriber.with_writer(EscapingStderr { ansi }).init(),
        LogFormat::Json => subscriber.with_writer(std::io::stderr).json().init(),
    }
    Ok(())
}

/// Refuses a directive of `level` that is a bare word but no level: tracing's filter would take
/// `verbose` for a target name and show nothing else, silencing the log.
fn check_level(level: &str) -> Result<(), String> {
    const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];
    for directive in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !directive.contains(['=', '['])
            && !LEVELS.iter().any(|l| directive.eq_ignore_ascii_case(l))
        {
            return Err(format!(
                "{directive:?} is no level: give one of off, error, warn, info, debug, trace, or target=level (outbox_relay=debug,info)"
            ));
        }
    }
    Ok(())
}

/// Standard error through an [`EscapingWriter`]; `ansi` as the formatter's `with_ansi`.
#[derive(Clone, Copy, Debug)]
pub struct EscapingStderr {
    pub ansi: bool,
}

impl<'a> MakeWriter<'a> for EscapingStderr {
    type Writer = EscapingWriter<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter {
            inner: io::stderr(),
            ansi: self.ansi,
        }
    }
}

/// Writes each buffer (tracing-subscriber writes one log line per call) with its control
/// characters escaped, but a final newline, tabs, and with `ansi` the escape character.
pub struct EscapingWriter<W> {
    inner: W,
    ansi: bool,
}

impl<W> EscapingWriter<W> {
    /// A writer over `inner`.
    pub fn new(inner: W, ansi: bool) -> Self {
        EscapingWriter { inner, ansi }
    }
}

impl<W: Write> Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        let kept = |b: u8| b >= 0x20 && b != 0x7f || b == b'\t' || (self.ansi && b == 0x1b);
        if body.iter().all(|&b| kept(b)) {
            self.inner.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                _ if kept(b) => out.push(b),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            }
        }
        if body.len() < buf.len() {
            out.push(b'\n');
        }
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_bare_word_that_is_no_level_is_refused_and_levels_and_targets_pass() {
        for good in [
            "info",
            "DEBUG",
            "outbox_relay=debug,info",
            "warn, rdkafka=error",
            "off",
        ] {
            assert_eq!(check_level(good), Ok(()), "{good}");
        }
        for bad in ["verbose", "info,loud"] {
            let error = check_level(bad).unwrap_err();
            assert!(error.contains("is no level"), "{bad}: {error}");
        }
    }

    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// An event id with a line break and a terminal escape, logged as the relay logs: one line,
    /// the forged one escaped inside it.
    #[test]
    fn a_line_break_or_escape_in_a_field_cannot_start_a_line() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || EscapingWriter::new(writer.clone(), false))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let event_id = "e-1\nERROR forged line\r\x1b[2J\x07";
            tracing::warn!(event_id = %event_id, "delivery failed\tonce");
            tracing::info!("next");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text:?}");
        assert!(lines[0].contains("e-1\\nERROR forged line\\r"), "{text:?}");
        assert!(
            !lines[0].contains('\x1b') && !lines[0].contains('\x07'),
            "{text:?}"
        );
        assert!(
            lines[0].contains("delivery failed\tonce"),
            "a tab stays: {text:?}"
        );
    }

    #[test]
    fn colours_pass_when_the_formatter_makes_them() {
        let captured = Captured::default();
        let mut writer = EscapingWriter::new(captured.clone(), true);
        writer.write_all(b"\x1b[33mWARN\x1b[0m a\nb\n").unwrap();
        assert_eq!(&*captured.0.lock().unwrap(), b"\x1b[33mWARN\x1b[0m a\\nb\n");
    }
}
