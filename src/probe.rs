//! `outbox-relay probe`: an HTTP GET for container health checks (the runtime image has no
//! curl). Plain `http://` only, which is all the relay's own endpoint serves.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The status line is all that is read; a longer first line is not HTTP.
const MAX_STATUS_LINE: usize = 8 * 1024;

/// Why a probe got no HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0:?} is not an http://host[:port][/path] URL")]
    Url(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach {url}")]
    Io {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url} did not answer with an HTTP status line")]
    NotHttp { url: String },
}

/// Sends `GET` to `url` (`http://host[:port][/path]`, port 80 by default) and returns the
/// response's status code, all within `timeout`.
///
/// Returns an error if the URL is not a plain http URL, the connection fails, or no status
/// line arrives within `timeout`.
pub async fn get_status(url: &str, timeout: Duration) -> Result<u16, ProbeError> {
    let (host, port, path) = parse_url(url)?;
    tokio::time::timeout(timeout, async {
        let io = |source| ProbeError::Io {
            url: url.to_owned(),
            source,
        };
        let mut stream = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(io)?;
        let host_header = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .map_err(io)?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < MAX_STATUS_LINE {
            let n = stream.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        parse_status_line(&head).ok_or_else(|| ProbeError::NotHttp {
            url: url.to_owned(),
        })
    })
    .await
    .map_err(|_| ProbeError::Timeout(timeout))?
}

/// Splits `http://host[:port][/path]` into host (brackets of an IPv6 literal removed), port and
/// path (`/` when absent).
fn parse_url(url: &str) -> Result<(String, u16, String), ProbeError> {
    let bad = || ProbeError::Url(url.to_owned());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port.parse().map_err(|_| bad())?,
        None => 80,
    };
    if host.is_empty() || authority.contains('@') {
        return Err(bad());
    }
    Ok((host.to_owned(), port, path.to_owned()))
}

/// The code of an `HTTP/1.x NNN reason` status line at the start of `head`.
fn parse_status_line(head: &[u8]) -> Option<u16> {
    let end = head.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&head[..end]).ok()?;
    let mut parts = line.split(' ');
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Serves one connection with `response` and returns the URL to reach it.
    async fn serve_once(response: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(response).await;
        });
        format!("http://{addr}/readyz")
    }

    #[tokio::test]
    async fn returns_the_status_code() {
        let url = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n").await;
        assert_eq!(get_status(&url, Duration::from_secs(2)).await.unwrap(), 200);
        let url = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").await;
        assert_eq!(get_status(&url, Duration::from_secs(2)).await.unwrap(), 503);
    }

    #[tokio::test]
    async fn fails_on_a_closed_port_garbage_or_silence() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = format!("http://{}/", listener.local_addr().unwrap());
        drop(listener);
        assert!(matches!(
            get_status(&closed, Duration::from_secs(2)).await,
            Err(ProbeError::Io { .. })
        ));
        let url = serve_once(b"SSH-2.0-OpenSSH\r\n").await;
        assert!(matches!(
            get_status(&url, Duration::from_secs(2)).await,
            Err(ProbeError::NotHttp { .. })
        ));
        // Accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", silent.local_addr().unwrap());
        assert!(matches!(
            get_status(&url, Duration::from_millis(300)).await,
            Err(ProbeError::Timeout(_))
        ));
    }

    #[test]
    fn parses_urls() {
        let parse = |url| parse_url(url).map_err(|e| e.to_string());
        assert_eq!(
            parse("http://127.0.0.1:9187/readyz").unwrap(),
            ("127.0.0.1".into(), 9187, "/readyz".into())
        );
        assert_eq!(
            parse("http://localhost").unwrap(),
            ("localhost".into(), 80, "/".into())
        );
        assert_eq!(
            parse("http://[::1]:9187/healthz").unwrap(),
            ("::1".into(), 9187, "/healthz".into())
        );
        for bad in [
            "https://h/",
            "h:9187/readyz",
            "http://:9187/",
            "http://h:port/",
            "http://u@h/",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
