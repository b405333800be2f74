//! TLS for both PostgreSQL connections (rustls), with libpq's `sslmode` semantics.
//!
//! | sslmode | TLS | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (default) | if the server offers it | no |
//! | `require` | always | the chain when a CA file is there (`sslrootcert`, else `~/.postgresql/root.crt`), else no |
//! | `verify-ca` | always | the chain, against the CA file |
//! | `verify-full` | always | the chain and the host name |
//!
//! `sslrootcert` is a PEM file or `system` (the OS trust store); without it every mode from
//! `require` up uses `~/.postgresql/root.crt` of `HOME` when that file exists, and the verify
//! modes fail without one. `require` with a CA file is `verify-ca`, as libpq says: "if a root
//! CA file exists, the behavior of sslmode=require will be the same as that of verify-ca".
//! Only `verify-ca` and `verify-full` authenticate the server whatever files are there, and
//! only `verify-full` tells it from another server with a certificate of the same CA.
//!
//! Two departures from libpq, both refusing what libpq would let through: an `sslrootcert`
//! file that does not exist is an error in every mode (libpq then skips verification under
//! `require`), and `prefer` verifies nothing even with a CA file (libpq verifies, and on a
//! failure connects again without TLS, which protects nothing either).
//!
//! `sslcert` and `sslkey` give a client certificate. These parameters are taken out of the
//! URL before tokio-postgres parses the rest (it knows only disable/prefer/require).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl std::str::FromStr for SslMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                "sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }
}

/// What a connection checks of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verification {
    /// Nothing: encryption (if any) without authentication of the server.
    None,
    /// The chain leads to a trusted CA (`verify-ca`, `require` with a CA file).
    Chain,
    /// The chain and the host name (`verify-full`).
    ChainAndHostName,
}

/// libpq's default CA file, `~/.postgresql/root.crt` of `HOME`, when it exists.
pub fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".postgresql/root.crt")).filter(|path| path.exists())
}

/// The TLS parameters of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// Whether the connection string set `sslmode` (else `PGSSLMODE` may).
    pub mode_given: bool,
    pub root_cert: Option<String>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Takes the TLS parameters out of a libpq URL (`postgres://...?sslmode=verify-full`) or
/// key=value string, returning the rest for tokio-postgres and the settings.
///
/// Returns an error naming the parameter if `sslmode` has an unknown value.
pub fn split_url(url: &str) -> Result<(String, TlsSettings), String> {
    let mut settings = TlsSettings::default();
    let (rest, taken) = split_params(url, &TLS_PARAMS);
    for (key, value) in taken {
        match key {
            "sslmode" => {
                settings.mode = value.parse()?;
                settings.mode_given = true;
            }
            "sslrootcert" => settings.root_cert = Some(value),
            "sslcert" => settings.client_cert = Some(value.into()),
            _ => settings.client_key = Some(value.into()),
        }
    }
    if settings.root_cert.as_deref() == Some("system") {
        // The OS trust store vouches for any host with a public certificate: only a check of
        // the host name makes it mean anything (libpq 16 has the same rule).
        if !settings.mode_given {
            settings.mode = SslMode::VerifyFull;
        } else if settings.mode != SslMode::VerifyFull {
            return Err("sslrootcert=system requires sslmode=verify-full".into());
        }
    }
    Ok((rest, settings))
}

/// Takes the parameters named in `keys` out of a libpq URL (query parameters, decoded) or
/// key=value string (unquoted), for those tokio-postgres does not know or handles otherwise
/// than libpq. Returns the rest of the connection string and the taken `(key, value)` pairs in
/// order (a key given twice appears twice: the last one wins, as in libpq).
pub fn split_params<'k>(url: &str, keys: &[&'k str]) -> (String, Vec<(&'k str, String)>) {
    let known = |key: &str| keys.iter().copied().find(|k| *k == key);
    let mut taken = Vec::new();
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), taken);
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=').and_then(|(k, v)| Some((known(k)?, v))) {
                Some((key, value)) => taken.push((key, percent_decode(value))),
                None => kept.push(pair),
            }
        }
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        let mut kept = Vec::new();
        for part in url.split_whitespace() {
            match part.split_once('=').and_then(|(k, v)| Some((known(k)?, v))) {
                Some((key, value)) => taken.push((key, value.trim_matches('\'').to_owned())),
                None => kept.push(part),
            }
        }
        kept.join(" ")
    };
    (rest, taken)
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl TlsSettings {
    /// The sslmode tokio-postgres should use for the SQL connection (it verifies nothing
    /// itself; the rustls config from [`TlsSettings::client_config`] does).
    pub fn tokio_postgres_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    /// What a TLS session of these settings checks of the server's certificate, with the
    /// default CA file ([`default_root_cert`]) as it is now.
    pub fn verification(&self) -> Verification {
        self.verification_with(default_root_cert().as_deref())
    }

    /// Like [`TlsSettings::verification`], with `default_root` as the default CA file
    /// (`None`: there is none).
    pub fn verification_with(&self, default_root: Option<&Path>) -> Verification {
        match self.mode {
            SslMode::Disable | SslMode::Prefer => Verification::None,
            SslMode::Require if self.root_cert.is_none() && default_root.is_none() => {
                Verification::None
            }
            SslMode::Require | SslMode::VerifyCa => Verification::Chain,
            SslMode::VerifyFull => Verification::ChainAndHostName,
        }
    }

    /// Builds the rustls client config for this mode, with the default CA file
    /// ([`default_root_cert`]) as it is now.
    ///
    /// Returns an error if a certificate or key file cannot be read or parsed, or a verify
    /// mode has no CA file.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        self.client_config_with(default_root_cert().as_deref())
    }

    /// Like [`TlsSettings::client_config`], with `default_root` as the default CA file
    /// (`None`: there is none).
    pub fn client_config_with(&self, default_root: Option<&Path>) -> Result<ClientConfig, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let chain = match self.verification_with(default_root) {
            Verification::None => None,
            _ => {
                let roots = Arc::new(self.root_store(default_root)?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| format!("sslrootcert: {e}"))?;
                Some(webpki)
            }
        };
        let builder = match chain {
            Some(webpki) if self.mode == SslMode::VerifyFull => {
                builder.with_webpki_verifier(webpki)
            }
            chain => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(WithoutHostName { chain, provider })),
        };
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let certs = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("sslcert {}: {e}", cert.display()))?;
                crate::config::secret_file::warn_if_exposed(key, "sslkey");
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("sslkey {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| format!("sslcert/sslkey: {e}"))
            }
            (None, None) => Ok(builder.with_no_client_auth()),
            _ => Err("sslcert and sslkey must be given together".into()),
        }
    }

    fn root_store(&self, default_root: Option<&Path>) -> Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match self.root_cert.as_deref() {
            Some("system") => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
            Some(path) => add_pem(&mut roots, Path::new(path))?,
            None => match default_root {
                Some(path) => add_pem(&mut roots, path)?,
                None => {
                    return Err("sslrootcert: verify-ca and verify-full need a CA certificate file (or sslrootcert=system)".into())
                }
            },
        }
        if roots.is_empty() {
            return Err("sslrootcert: no CA certificate found".into());
        }
        Ok(roots)
    }
}

fn add_pem(roots: &mut RootCertStore, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("sslrootcert {}: {e}", path.display());
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| err(&e))? {
        roots.add(cert.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    Ok(())
}

/// The verifier of the modes that do not check the host name: `verify-ca` (`chain`: the
/// chain must lead to a trusted root; `require` with a CA file too) and `prefer`, or
/// `require` without a CA file
/// (`chain` is `None`: encryption without authentication of the server, as libpq does).
/// Handshake signatures are checked in every mode; `verify-full` uses rustls' own verifier.
#[derive(Debug)]
struct WithoutHostName {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for WithoutHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tls_parameters_out_of_urls() {
        let (rest, tls) = split_url("postgres://u:p@h:5432/db?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem").unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            split_url("postgres://u@h/db?sslrootcert=system")
                .unwrap()
                .1
                .mode,
            SslMode::VerifyFull
        );
        assert!(split_url("postgres://u@h/db?sslrootcert=system&sslmode=require").is_err());
        let (rest, tls) = split_url("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(tls.mode, SslMode::Require);
        let (rest, tls) =
            split_url("host=h user=u sslmode=verify-ca sslcert=/c sslkey=/k dbname=d").unwrap();
        assert_eq!(rest, "host=h user=u dbname=d");
        assert_eq!(
            (tls.mode, tls.client_cert.as_deref()),
            (SslMode::VerifyCa, Some(std::path::Path::new("/c")))
        );
        assert_eq!(
            split_url("postgres://u@h/db").unwrap().1.mode,
            SslMode::Prefer
        );
        assert!(split_url("postgres://u@h/db?sslmode=sometimes")
            .unwrap_err()
            .contains("sslmode"));
    }

    #[test]
    fn verify_modes_need_a_root_certificate() {
        let tls = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.pem".into()),
            ..TlsSettings::default()
        };
        assert!(tls.client_config().unwrap_err().contains("sslrootcert"));
        let tls = TlsSettings {
            mode: SslMode::Require,
            ..TlsSettings::default()
        };
        tls.client_config_with(None).unwrap();
    }

    /// libpq: "if a root CA file exists, the behavior of sslmode=require will be the same as
    /// that of verify-ca". The default file counts as much as `sslrootcert`.
    #[test]
    fn require_verifies_the_chain_when_a_ca_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root.crt");
        std::fs::write(&root, "not a certificate\n").unwrap();
        let require = TlsSettings {
            mode: SslMode::Require,
            ..TlsSettings::default()
        };
        assert_eq!(require.verification_with(None), Verification::None);
        require.client_config_with(None).unwrap();
        assert_eq!(require.verification_with(Some(&root)), Verification::Chain);
        // The file is read (and here refused) instead of ignored.
        let error = require.client_config_with(Some(&root)).unwrap_err();
        assert!(error.contains("sslrootcert"), "{error}");
        let given = TlsSettings {
            root_cert: Some(root.display().to_string()),
            ..require.clone()
        };
        assert_eq!(given.verification_with(None), Verification::Chain);
        assert!(given.client_config_with(None).is_err());
        // prefer never verifies; the verify modes do whatever files there are.
        let mode = |mode| TlsSettings {
            mode,
            ..TlsSettings::default()
        };
        assert_eq!(
            mode(SslMode::Prefer).verification_with(Some(&root)),
            Verification::None
        );
        assert_eq!(
            mode(SslMode::VerifyCa).verification_with(None),
            Verification::Chain
        );
        assert_eq!(
            mode(SslMode::VerifyFull).verification_with(None),
            Verification::ChainAndHostName
        );
        assert!(mode(SslMode::VerifyCa)
            .client_config_with(None)
            .unwrap_err()
            .contains("sslrootcert"));
    }
}
