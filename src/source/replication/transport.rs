//! The socket under a walsender connection: TCP with keepalives or a Unix-domain socket, the
//! connect timeout, and TLS as libpq negotiates it (PostgreSQL docs 55.2.10 "SSL Session
//! Encryption"), with the channel-binding data SCRAM needs.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::Socket;
use crate::source::target::Endpoint;
use crate::source::tls::SslMode;
use crate::source::SourceError;

/// Runs `attempt` (one host's connection, start-up included) within `config`'s
/// `connect_timeout` (default 30 s).
///
/// Returns a transient `TimedOut` error when it takes longer.
pub(crate) async fn within_connect_timeout<T>(
    config: &tokio_postgres::Config,
    attempt: impl std::future::Future<Output = Result<T, SourceError>>,
) -> Result<T, SourceError> {
    let connect_timeout = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(30));
    tokio::time::timeout(connect_timeout, attempt)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
}

/// Opens a TCP (with the keepalives of [`set_keepalive`]) or Unix-domain connection to
/// `endpoint`, without TLS.
///
/// `hostaddr` (libpq) gives the IP address to connect to for the host at the same position,
/// which still names the server for TLS verification.
///
/// Returns an error if the connection fails.
pub(crate) async fn open_stream(
    config: &tokio_postgres::Config,
    endpoint: &Endpoint,
) -> Result<Box<dyn Socket>, SourceError> {
    Ok(open_stream_pinned(config, endpoint).await?.0)
}

/// Like [`open_stream`], and returns `endpoint` pinned to the address it reached (a host
/// name resolves to that address again), so that another connection reaches the same server.
pub(super) async fn open_stream_pinned(
    config: &tokio_postgres::Config,
    endpoint: &Endpoint,
) -> Result<(Box<dyn Socket>, Endpoint), SourceError> {
    let failed = |source: io::Error| {
        let host = endpoint.tls_name();
        let shown = endpoint.to_string();
        SourceError::Connect {
            // `u:p@ss@db` parses as host `ss@db`: what precedes the last '@' may be password.
            endpoint: match shown.rfind('@') {
                Some(at) => format!("***{}", &shown[at..]),
                None => shown,
            },
            // `postgres://u:p@ss@host/db` parses as user `u`, host `ss@host`.
            hint: if host.contains(['@', '#', '/']) && endpoint.addr.is_none() {
                " (a host name cannot hold '@', '#' or '/': is it part of a password? Percent-encode it in the URL, or give it in source_password)"
            } else {
                ""
            },
            source,
        }
    };
    if let Some(path) = endpoint.socket_path() {
        let stream = UnixStream::connect(path).await.map_err(failed)?;
        return Ok((Box::new(stream), endpoint.clone()));
    }
    let stream = match endpoint.addr {
        Some(addr) => TcpStream::connect((addr, endpoint.port)).await,
        None => TcpStream::connect((endpoint.tls_name().as_str(), endpoint.port)).await,
    }
    .map_err(failed)?;
    stream.set_nodelay(true)?;
    set_keepalive(&stream, config)?;
    let pinned = Endpoint {
        addr: Some(stream.peer_addr()?.ip()),
        ..endpoint.clone()
    };
    Ok((Box::new(stream), pinned))
}

/// Detects a dead server or network without relying on the walsender's own messages: a
/// walsender can be silent for minutes while it decodes a large transaction or skips WAL of
/// other tables, so silence is not death. TCP keepalives probe an idle connection, and
/// `TCP_USER_TIMEOUT` fails a write (the status updates sent every second) that the peer does
/// not acknowledge. libpq's `keepalives*` and `tcp_user_timeout` settings apply when given.
fn set_keepalive(stream: &TcpStream, config: &tokio_postgres::Config) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    if !config.get_keepalives() {
        return Ok(());
    }
    // tokio-postgres reports 2 h when keepalives_idle is not set: far too long to notice a
    // lost server, so the relay's default is 30 s.
    let idle = match config.get_keepalives_idle() {
        d if d == Duration::from_secs(2 * 60 * 60) => Duration::from_secs(30),
        d => d,
    };
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(
            config
                .get_keepalives_interval()
                .unwrap_or(Duration::from_secs(10)),
        )
        .with_retries(config.get_keepalives_retries().unwrap_or(3));
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    socket.set_tcp_user_timeout(Some(
        config
            .get_tcp_user_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(60)),
    ))?;
    Ok(())
}

/// Sends SSLRequest and, if the server agrees, runs the TLS handshake for `host` (docs
/// 55.2.10 "SSL Session Encryption").
///
/// Returns the socket and, for a TLS session (`None` without: `prefer` and a server that
/// refuses it), the `tls-server-end-point` channel binding data (RFC 5929: the hash of the
/// server certificate), `None` when the certificate's signature algorithm names no usable
/// hash (e.g. Ed25519).
pub(super) async fn negotiate_tls(
    mut stream: Box<dyn Socket>,
    host: &str,
    config: Arc<rustls::ClientConfig>,
    mode: SslMode,
) -> Result<(Box<dyn Socket>, Option<Option<Vec<u8>>>), SourceError> {
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    stream.write_all(&buf).await?;
    match stream.read_u8().await? {
        b'S' => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| SourceError::Tls(format!("host {host:?}: {e}")))?;
            match tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
            {
                Ok(tls) => {
                    let end_point = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|cert| tls_server_end_point(cert));
                    Ok((Box::new(tls), Some(end_point)))
                }
                Err(e) => match e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                {
                    Some(rustls_error) => Err(SourceError::Tls(format!(
                        "handshake with {host}: {rustls_error}"
                    ))),
                    None => Err(e.into()),
                },
            }
        }
        b'N' if mode >= SslMode::Require => Err(SourceError::Tls(format!(
            "{host} does not accept TLS connections and sslmode requires TLS"
        ))),
        b'N' => Ok((stream, None)),
        other => Err(SourceError::Protocol(format!(
            "unexpected answer 0x{other:02x} to SSLRequest"
        ))),
    }
}

/// RFC 5929 `tls-server-end-point` data: the server certificate hashed with the hash of its
/// signature algorithm, SHA-256 for MD5 and SHA-1 (RFC 5929 section 4.1). `None` for
/// algorithms without one (Ed25519) or a certificate that does not parse.
fn tls_server_end_point(cert_der: &[u8]) -> Option<Vec<u8>> {
    use sha2::{Digest, Sha256, Sha384, Sha512};
    use x509_cert::der::oid::db::rfc5912::{
        ECDSA_WITH_SHA_256, ECDSA_WITH_SHA_384, ECDSA_WITH_SHA_512, ID_SHA_1, ID_SHA_256,
        ID_SHA_384, ID_SHA_512, MD_5_WITH_RSA_ENCRYPTION, SHA_1_WITH_RSA_ENCRYPTION,
        SHA_256_WITH_RSA_ENCRYPTION, SHA_384_WITH_RSA_ENCRYPTION, SHA_512_WITH_RSA_ENCRYPTION,
    };
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(cert_der).ok()?;
    match cert.signature_algorithm.oid {
        ID_SHA_1
        | ID_SHA_256
        | MD_5_WITH_RSA_ENCRYPTION
        | SHA_1_WITH_RSA_ENCRYPTION
        | SHA_256_WITH_RSA_ENCRYPTION
        | ECDSA_WITH_SHA_256 => Some(Sha256::digest(cert_der).to_vec()),
        ID_SHA_384 | SHA_384_WITH_RSA_ENCRYPTION | ECDSA_WITH_SHA_384 => {
            Some(Sha384::digest(cert_der).to_vec())
        }
        ID_SHA_512 | SHA_512_WITH_RSA_ENCRYPTION | ECDSA_WITH_SHA_512 => {
            Some(Sha512::digest(cert_der).to_vec())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection error names the host and port tried, and a host that looks like the
    /// rest of a password with an '@' says so.
    #[tokio::test]
    async fn a_connection_error_names_the_host_and_port_it_tried() {
        let config = tokio_postgres::Config::new();
        let endpoint = |host: &str| Endpoint {
            host: Some(tokio_postgres::config::Host::Tcp(host.into())),
            addr: None,
            port: 1,
        };
        let error = open_stream(&config, &endpoint("127.0.0.1"))
            .await
            .err()
            .unwrap();
        let text = crate::error::chain(&error);
        assert!(
            text.starts_with("cannot connect to PostgreSQL at 127.0.0.1:1: "),
            "{text}"
        );
        assert!(!text.contains("password"), "{text}");
        let error = open_stream(&config, &endpoint("ss@127.0.0.1"))
            .await
            .err()
            .unwrap();
        let text = crate::error::chain(&error);
        assert!(
            text.contains("at ***@127.0.0.1:1 (")
                && text.contains("source_password")
                && !text.contains("ss@"),
            "{text}"
        );
    }
}
