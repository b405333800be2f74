//! A TLS front for a broker that has no TLS listener (tansu): on one port it terminates TLS
//! with the test certificate (`localhost`, signed by the test cluster's CA) and passes
//! plaintext connections through as they are, both to the broker's plaintext port. The broker
//! advertises the front's address ([`super::kafka::Broker::start_advertising`]), so a client
//! set for TLS speaks TLS all the way and the harness's plaintext helpers still work.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

/// The first byte of a TLS record carrying a handshake message (a ClientHello, first).
const TLS_HANDSHAKE: u8 = 0x16;

/// A running front: how many TLS connections completed their handshake (the client trusted
/// the certificate) and how many came in plaintext.
pub struct TlsFront {
    pub port: u16,
    tls: Arc<AtomicUsize>,
    plaintext: Arc<AtomicUsize>,
}

impl TlsFront {
    /// Listens on 127.0.0.1:`port` (on the current tokio runtime) with `cert` (PEM chain)
    /// and `key` (PEM) in front of 127.0.0.1:`broker`.
    pub async fn start(port: u16, broker: u16, cert: &Path, key: &Path) -> TlsFront {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .unwrap_or_else(|e| panic!("reading {}: {e}", cert.display()));
        let key = PrivateKeyDer::from_pem_file(key)
            .unwrap_or_else(|e| panic!("reading {}: {e}", key.display()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("a server certificate and its key");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("binding the TLS front on port {port}: {e}"));
        let (tls, plaintext) = (Arc::default(), Arc::default());
        let counts = (Arc::clone(&tls), Arc::clone(&plaintext));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (acceptor, counts) = (acceptor.clone(), counts.clone());
                tokio::spawn(async move {
                    let _ = pass_on(client, broker, acceptor, counts).await;
                });
            }
        });
        TlsFront {
            port,
            tls,
            plaintext,
        }
    }

    /// TLS connections whose handshake completed so far.
    pub fn tls_connections(&self) -> usize {
        self.tls.load(Ordering::SeqCst)
    }

    /// Plaintext connections so far.
    pub fn plaintext_connections(&self) -> usize {
        self.plaintext.load(Ordering::SeqCst)
    }
}

/// One client connection: TLS or not by its first byte, then copied both ways to the broker.
async fn pass_on(
    client: TcpStream,
    broker: u16,
    acceptor: tokio_rustls::TlsAcceptor,
    (tls, plaintext): (Arc<AtomicUsize>, Arc<AtomicUsize>),
) -> std::io::Result<()> {
    let mut first = [0u8; 1];
    if client.peek(&mut first).await? == 0 {
        return Ok(());
    }
    let mut upstream = TcpStream::connect(("127.0.0.1", broker)).await?;
    if first[0] == TLS_HANDSHAKE {
        let mut client = acceptor.accept(client).await?;
        tls.fetch_add(1, Ordering::SeqCst);
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    } else {
        plaintext.fetch_add(1, Ordering::SeqCst);
        let mut client = client;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    }
    Ok(())
}
