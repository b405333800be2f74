//! The relay's HTTP endpoints (`/metrics`, `/readyz`) as a test sees them: a GET with a
//! deadline, and lookups in a Prometheus text page.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one GET may take once connected: the relay answers from memory, so a response
/// that takes longer is a hang, not a slow machine.
const RESPONSE_DEADLINE: Duration = Duration::from_secs(20);

/// A plain HTTP/1.1 GET of `path` from `addr` (`host:port`); returns the status code and body.
///
/// Returns `None` if nothing accepts the connection or the response is not HTTP (e.g. the
/// relay is not listening yet). Panics if a connection is accepted but the full response has
/// not arrived within 20 s.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let exchange = async {
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some(response)
    };
    let response = tokio::time::timeout(RESPONSE_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| {
            panic!("GET {path} from {addr}: no full response within {RESPONSE_DEADLINE:?}")
        })?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// The Prometheus text page of the relay serving metrics on `addr` (`host:port`).
///
/// Panics if nothing answers within 10 s.
pub async fn scrape_metrics(addr: &str) -> String {
    let (_, text) = super::within(
        "GET /metrics",
        Duration::from_secs(10),
        http_get(addr, "/metrics"),
    )
    .await
    .expect("GET /metrics");
    text
}

/// The value of the series `series` (name and labels as rendered) in a Prometheus text page.
///
/// Panics if the page has no such series.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

/// The sum of every series of metric `name` (e.g. one per topic) in a Prometheus text page;
/// `None` if it has none.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}
