//! A webhook receiver of the test run: an axum server on a loopback port of its own, in a
//! runtime of its own (so it outlives each test's runtime, and stopping it is dropping that
//! runtime: connections cut, as when a receiver's process dies). It records every request it
//! acknowledges, answers a chosen status per path instead (a refusal, a 503), and starts again
//! on the same port keeping what it recorded. With a certificate it serves `https`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::runtime::Runtime;

/// How long a stopped receiver's port may take to be free again.
const REBIND_DEADLINE: Duration = Duration::from_secs(10);

/// A request the receiver acknowledged (answered 200).
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    /// The path, percent-decoded.
    pub path: String,
    /// In arrival order, names in lower case.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

#[derive(Default)]
struct Recorded {
    received: Mutex<Vec<Received>>,
    /// Per path: the status answered instead of 200 (nothing recorded then).
    statuses: Mutex<HashMap<String, (StatusCode, Option<u64>)>>,
    /// Per path: requests answered with a status of `statuses`.
    refused: Mutex<HashMap<String, usize>>,
    /// Per path: how long the receiver takes to answer.
    delays: Mutex<HashMap<String, Duration>>,
}

/// The receiver (see the module docs).
pub struct WebhookServer {
    pub port: u16,
    recorded: Arc<Recorded>,
    runtime: Mutex<Option<Runtime>>,
    /// `https` with this server configuration; `None`: plain `http`.
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// A TLS listener for axum: each accepted connection's handshake done before it is served (a
/// failed one, such as a client that does not trust the certificate, is dropped).
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl WebhookServer {
    /// Starts a receiver on `port`.
    pub fn spawn(port: u16) -> WebhookServer {
        let server = WebhookServer {
            port,
            recorded: Arc::default(),
            runtime: Mutex::new(None),
            tls: None,
        };
        server.start();
        server
    }

    /// Starts an `https` receiver on `port` with the certificate `cert` (PEM chain) and its
    /// key `key` (PEM).
    pub fn spawn_tls(port: u16, cert: &Path, key: &Path) -> WebhookServer {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .unwrap_or_else(|e| panic!("reading {}: {e}", cert.display()));
        let key = PrivateKeyDer::from_pem_file(key)
            .unwrap_or_else(|e| panic!("reading {}: {e}", key.display()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("a server certificate and its key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server = WebhookServer {
            port,
            recorded: Arc::default(),
            runtime: Mutex::new(None),
            tls: Some(Arc::new(config)),
        };
        server.start();
        server
    }

    /// `http://127.0.0.1:<port>` (`https://localhost:<port>` with TLS: the test certificate
    /// is for that name).
    pub fn base_url(&self) -> String {
        match self.tls {
            None => format!("http://127.0.0.1:{}", self.port),
            Some(_) => format!("https://localhost:{}", self.port),
        }
    }

    /// Starts it again (after [`WebhookServer::stop`]); a no-op while it runs. Panics if the
    /// port is not free within 10 s.
    pub fn start(&self) {
        let mut slot = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return;
        }
        let start = Instant::now();
        let listener = loop {
            match std::net::TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(listener) => break listener,
                Err(e) if start.elapsed() < REBIND_DEADLINE => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("binding the webhook receiver to port {}: {e}", self.port),
            }
        };
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the webhook receiver");
        let recorded = Arc::clone(&self.recorded);
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let recorded = Arc::clone(&recorded);
                async move {
                    let delay = recorded.delays.lock().unwrap().get(&decoded(&uri)).copied();
                    if let Some(delay) = delay {
                        tokio::time::sleep(delay).await;
                    }
                    answer(&recorded, method, uri, headers, body)
                }
            },
        );
        let _entered = runtime.enter();
        let tcp = tokio::net::TcpListener::from_std(listener).unwrap();
        match self.tls.clone() {
            None => runtime.spawn(async move {
                let _ = axum::serve(tcp, app).await;
            }),
            Some(config) => runtime.spawn(async move {
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                let _ = axum::serve(TlsListener { tcp, acceptor }, app).await;
            }),
        };
        *slot = Some(runtime);
    }

    /// Stops it: its listener closed and its connections cut at once.
    pub fn stop(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(runtime) = runtime {
            runtime.shutdown_background();
        }
    }

    /// Answers `status` to every request for `path` from now on (with `Retry-After:
    /// <retry_after>` when given), recording none of them; `None`: 200 again.
    pub fn answer(&self, path: &str, status: Option<(u16, Option<u64>)>) {
        let mut statuses = self.recorded.statuses.lock().unwrap();
        match status {
            Some((code, retry_after)) => statuses.insert(
                path.to_owned(),
                (StatusCode::from_u16(code).unwrap(), retry_after),
            ),
            None => statuses.remove(path),
        };
    }

    /// Takes `delay` to answer each request for `path` from now on (a slow receiver).
    pub fn delay(&self, path: &str, delay: Duration) {
        self.recorded
            .delays
            .lock()
            .unwrap()
            .insert(path.to_owned(), delay);
    }

    /// Every acknowledged request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.recorded.received.lock().unwrap().clone()
    }

    /// How many requests for `path` were answered with the status [`WebhookServer::answer`]
    /// set.
    pub fn refused(&self, path: &str) -> usize {
        self.recorded
            .refused
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The request's path, percent-decoded.
fn decoded(uri: &Uri) -> String {
    percent_encoding::percent_decode_str(uri.path())
        .decode_utf8_lossy()
        .into_owned()
}

fn answer(
    recorded: &Recorded,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap) {
    let path = decoded(&uri);
    let mut reply = HeaderMap::new();
    if let Some((status, retry_after)) = recorded.statuses.lock().unwrap().get(&path).copied() {
        *recorded.refused.lock().unwrap().entry(path).or_default() += 1;
        if let Some(secs) = retry_after {
            reply.insert("retry-after", secs.into());
        }
        return (status, reply);
    }
    let headers = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    recorded.received.lock().unwrap().push(Received {
        method,
        path,
        headers,
        body: body.to_vec(),
    });
    (StatusCode::OK, reply)
}
