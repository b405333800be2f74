//! Which authentication requests of a server the relay answers, on both connections.
//!
//! libpq's `require_auth` (PostgreSQL 16) lists the methods a server may ask for (`password`,
//! `md5`, `gss`, `sspi`, `scram-sha-256`, `none`), or with `!` the methods it must not ask
//! for; `none` is a server that asks for nothing. Without `require_auth` libpq answers any
//! request. The relay does too, with one exception: it never sends the password in cleartext
//! (AuthenticationCleartextPassword) over TCP unless the server's certificate was verified
//! (`verify-ca`, `verify-full`, or `require` with a CA file). Over an unverified channel, TLS
//! or not, whoever answers in the server's place receives the password itself and can log in
//! as the role; `require_auth=password` (or a list naming `password`) says the operator wants
//! that anyway. Unix sockets are local and exempt. `channel_binding=require` refuses every
//! request but SCRAM-SHA-256-PLUS, whatever `require_auth` says.
//!
//! The first authentication request decides: the replication client checks it itself, the
//! SQL connection reads the server through [`AuthGuard`], which fails the read that completes
//! a refused request before tokio-postgres sees it.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An authentication method as `require_auth` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Password,
    Md5,
    Gss,
    Sspi,
    ScramSha256,
    /// The server asks for nothing (AuthenticationOk at once).
    None,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Password => "password",
            Method::Md5 => "md5",
            Method::Gss => "gss",
            Method::Sspi => "sspi",
            Method::ScramSha256 => "scram-sha-256",
            Method::None => "none",
        }
    }

    /// The method of an Authentication message's request code (docs 55.7), `None` for codes
    /// that continue an exchange or that no method names.
    pub fn of_request(code: i32) -> Option<Method> {
        Some(match code {
            0 => Method::None,
            3 => Method::Password,
            5 => Method::Md5,
            7 | 8 => Method::Gss,
            9 => Method::Sspi,
            10 => Method::ScramSha256,
            _ => return None,
        })
    }
}

/// libpq's `require_auth`: the methods allowed, or (`negated`) those refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequireAuth {
    negated: bool,
    methods: Vec<Method>,
}

impl std::str::FromStr for RequireAuth {
    type Err = String;

    /// Parses a comma-separated list as libpq does.
    ///
    /// Returns an error naming `require_auth` if a method is unknown or given twice, or
    /// negated and plain methods are mixed.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut negated = None;
        let mut methods = Vec::new();
        for word in s.split(',') {
            let (neg, name) = match word.strip_prefix('!') {
                Some(name) => (true, name),
                None => (false, word),
            };
            if *negated.get_or_insert(neg) != neg {
                return Err(format!(
                    "require_auth {s:?} mixes negated and non-negated methods"
                ));
            }
            let method = [
                Method::Password,
                Method::Md5,
                Method::Gss,
                Method::Sspi,
                Method::ScramSha256,
                Method::None,
            ]
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                format!("require_auth method {name:?} is not one of password, md5, gss, sspi, scram-sha-256, none")
            })?;
            if methods.contains(&method) {
                return Err(format!(
                    "require_auth method {name:?} is given more than once"
                ));
            }
            methods.push(method);
        }
        Ok(RequireAuth {
            negated: negated.unwrap_or(false),
            methods,
        })
    }
}

impl fmt::Display for RequireAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bang = if self.negated { "!" } else { "" };
        let list: Vec<String> = self
            .methods
            .iter()
            .map(|m| format!("{bang}{}", m.name()))
            .collect();
        write!(f, "{}", list.join(","))
    }
}

impl RequireAuth {
    /// Whether the list lets the server use `method`.
    pub fn allows(&self, method: Method) -> bool {
        self.methods.contains(&method) != self.negated
    }
}

/// What a connection to one server accepts of its authentication requests.
#[derive(Debug, Clone)]
pub struct AuthPolicy {
    /// `require_auth` of the source URL (else `PGREQUIREAUTH`), if given.
    pub require_auth: Option<RequireAuth>,
    /// The server's certificate was verified, or the connection is a Unix socket.
    pub trusted_channel: bool,
    /// `channel_binding=require`: only SASL (for SCRAM-SHA-256-PLUS) is answered.
    pub channel_binding_required: bool,
    /// The server, for errors: `host:port`.
    pub server: String,
}

impl AuthPolicy {
    /// Checks the server's first authentication request, of request code `code`.
    ///
    /// Returns an error naming the server and the setting if `channel_binding=require` and
    /// the request is not SASL, `require_auth` refuses the method, or it is a cleartext
    /// password over a channel that is not trusted and `require_auth` does not allow
    /// `password`.
    pub fn check(&self, code: i32) -> Result<(), String> {
        let Some(method) = Method::of_request(code) else {
            return Ok(());
        };
        let server = &self.server;
        if self.channel_binding_required && method != Method::ScramSha256 {
            return Err(match method {
                Method::None => format!(
                    "{server} did not ask for authentication, and channel_binding=require needs SCRAM-SHA-256-PLUS"
                ),
                _ => format!(
                    "{server} asks for {} authentication, and channel_binding=require needs SCRAM-SHA-256-PLUS",
                    method.name()
                ),
            });
        }
        match &self.require_auth {
            Some(list) if !list.allows(method) => Err(match method {
                Method::None => format!(
                    "{server} did not ask for authentication, and require_auth={list} asks for it"
                ),
                _ => format!(
                    "{server} asks for {} authentication, which require_auth={list} does not allow",
                    method.name()
                ),
            }),
            Some(_) => Ok(()),
            None if method == Method::Password && !self.trusted_channel => Err(format!(
                "{server} asks for the password in cleartext over a connection that does not verify the server's certificate; use sslmode=verify-full with sslrootcert (or allow it with require_auth=password)"
            )),
            None => Ok(()),
        }
    }
}

/// The error an [`AuthGuard`] fails a read with, inside an `io::Error`.
#[derive(Debug)]
pub struct AuthRefused(pub String);

impl fmt::Display for AuthRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AuthRefused {}

/// Whether `error` (a tokio-postgres connect error, say) comes from an [`AuthGuard`].
pub fn is_refusal(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause.is::<AuthRefused>() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<AuthRefused>()) {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

/// Where an [`AuthGuard`] is in the server's byte stream.
#[derive(Debug)]
enum GuardState {
    /// The next byte answers an SSLRequest: `S` hands the stream to TLS (whose own guard
    /// checks the messages), `N` continues in plaintext.
    SslAnswer,
    /// Collecting the first message's tag, length and request code.
    Header { bytes: [u8; 9], have: usize },
    /// Passing everything through.
    Done,
}

/// A stream that checks the server's first message against an [`AuthPolicy`]: a read that
/// completes a refused authentication request fails with [`AuthRefused`], so the client never
/// answers it. Writes pass through.
pub struct AuthGuard<S> {
    inner: S,
    policy: Option<AuthPolicy>,
    state: GuardState,
}

impl<S> AuthGuard<S> {
    /// Guards the plaintext protocol on `inner`, from its first message; with `ssl_request`,
    /// the first byte is the answer to an SSLRequest.
    pub fn new(inner: S, policy: AuthPolicy, ssl_request: bool) -> Self {
        AuthGuard {
            inner,
            policy: Some(policy),
            state: match ssl_request {
                true => GuardState::SslAnswer,
                false => GuardState::Header {
                    bytes: [0; 9],
                    have: 0,
                },
            },
        }
    }

    /// The guarded stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Looks at `read`, bytes the server sent next; returns the refusal, if any.
    fn inspect(&mut self, mut read: &[u8]) -> Result<(), String> {
        while let Some((&first, rest)) = read.split_first() {
            match &mut self.state {
                GuardState::Done => return Ok(()),
                GuardState::SslAnswer => {
                    self.state = match first {
                        b'N' => GuardState::Header {
                            bytes: [0; 9],
                            have: 0,
                        },
                        _ => GuardState::Done,
                    };
                    read = rest;
                }
                GuardState::Header { bytes, have } => {
                    let take = read.len().min(9 - *have);
                    bytes[*have..*have + take].copy_from_slice(&read[..take]);
                    *have += take;
                    read = &read[take..];
                    if bytes[0] != b'R' {
                        self.state = GuardState::Done;
                    } else if *have == 9 {
                        let code = i32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
                        self.state = GuardState::Done;
                        if let Some(policy) = self.policy.take() {
                            policy.check(code)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = buf.filled()[before..].to_vec();
                match self.inspect(&fresh) {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err(refusal) => {
                        // A failed read yields no bytes.
                        buf.set_filled(before);
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            AuthRefused(refusal),
                        )))
                    }
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: tokio_postgres::tls::TlsStream + Unpin> tokio_postgres::tls::TlsStream for AuthGuard<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        self.inner.channel_binding()
    }
}

/// A tokio-postgres TLS connector whose sessions are read through an [`AuthGuard`] (the guard
/// under TLS sees only encrypted bytes).
pub struct GuardedTls<T> {
    pub inner: T,
    pub policy: AuthPolicy,
}

impl<S, T> tokio_postgres::tls::TlsConnect<S> for GuardedTls<T>
where
    T: tokio_postgres::tls::TlsConnect<S>,
    T::Future: Send + 'static,
{
    type Stream = AuthGuard<T::Stream>;
    type Error = T::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<AuthGuard<T::Stream>, T::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let policy = self.policy;
        let handshake = self.inner.connect(stream);
        Box::pin(async move { Ok(AuthGuard::new(handshake.await?, policy, false)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn policy(require_auth: Option<&str>, trusted_channel: bool) -> AuthPolicy {
        AuthPolicy {
            require_auth: require_auth.map(|s| s.parse().unwrap()),
            trusted_channel,
            channel_binding_required: false,
            server: "db.example:5432".into(),
        }
    }

    #[test]
    fn parses_require_auth_as_libpq() {
        let list: RequireAuth = "scram-sha-256,none".parse().unwrap();
        assert!(list.allows(Method::ScramSha256) && list.allows(Method::None));
        assert!(!list.allows(Method::Password));
        let negated: RequireAuth = "!password,!md5".parse().unwrap();
        assert!(!negated.allows(Method::Password) && !negated.allows(Method::Md5));
        assert!(negated.allows(Method::ScramSha256) && negated.allows(Method::None));
        assert_eq!(negated.to_string(), "!password,!md5");
        for bad in ["password,!md5", "scram", "md5,md5", "", "password,"] {
            let error = bad.parse::<RequireAuth>().unwrap_err();
            assert!(error.contains("require_auth"), "{bad}: {error}");
        }
    }

    #[test]
    fn cleartext_passwords_need_a_verified_server_or_require_auth() {
        let error = policy(None, false).check(3).unwrap_err();
        assert!(
            error.contains("db.example:5432")
                && error.contains("cleartext")
                && error.contains("require_auth=password"),
            "{error}"
        );
        policy(None, true).check(3).unwrap();
        policy(Some("password"), false).check(3).unwrap();
        let binding = AuthPolicy {
            channel_binding_required: true,
            ..policy(None, true)
        };
        for code in [0, 3, 5] {
            let error = binding.check(code).unwrap_err();
            assert!(
                error.contains("db.example:5432") && error.contains("channel_binding=require"),
                "{error}"
            );
        }
        binding.check(10).unwrap();
        policy(Some("password,scram-sha-256"), false)
            .check(3)
            .unwrap();
        // Everything else passes without require_auth.
        for code in [0, 5, 10, 11, 12] {
            policy(None, false).check(code).unwrap();
        }
    }

    #[test]
    fn require_auth_refuses_what_it_does_not_list() {
        let error = policy(Some("scram-sha-256"), true).check(5).unwrap_err();
        assert!(
            error.contains("db.example:5432") && error.contains("require_auth=scram-sha-256"),
            "{error}"
        );
        let error = policy(Some("scram-sha-256"), true).check(0).unwrap_err();
        assert!(error.contains("did not ask"), "{error}");
        policy(Some("scram-sha-256"), true).check(10).unwrap();
        assert!(policy(Some("!password"), true).check(3).is_err());
        policy(Some("!password"), false).check(5).unwrap();
        assert!(policy(Some("!none"), true).check(0).is_err());
    }

    /// The message a server sends for request `code` (no payload).
    fn request(code: i32) -> Vec<u8> {
        let mut message = vec![b'R'];
        message.extend_from_slice(&8i32.to_be_bytes());
        message.extend_from_slice(&code.to_be_bytes());
        message
    }

    async fn read_through(bytes: Vec<u8>, ssl_request: bool, chunk: usize) -> io::Result<Vec<u8>> {
        let (mut server, client) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for part in bytes.chunks(chunk) {
                if server.write_all(part).await.is_err() {
                    return;
                }
                server.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let mut guard = AuthGuard::new(client, policy(None, false), ssl_request);
        let mut out = Vec::new();
        let result = guard.read_to_end(&mut out).await.map(|_| out);
        writer.abort();
        result
    }

    #[tokio::test]
    async fn the_guard_fails_the_read_of_a_refused_request_in_any_split() {
        for chunk in [1, 2, 5, 9, 64] {
            let error = read_through(request(3), false, chunk).await.unwrap_err();
            assert!(is_refusal(&error), "{chunk}: {error}");
            assert!(error.to_string().contains("cleartext"), "{error}");
            // After a refused TLS offer, the plaintext request.
            let mut bytes = vec![b'N'];
            bytes.extend(request(3));
            assert!(read_through(bytes, true, chunk).await.is_err(), "{chunk}");
        }
        // SCRAM (the mechanism list follows), and TLS accepted: passed through untouched.
        let mut scram = request(10);
        scram.extend_from_slice(b"SCRAM-SHA-256\0\0");
        assert_eq!(read_through(scram.clone(), false, 3).await.unwrap(), scram);
        let mut tls = vec![b'S'];
        tls.extend(request(3));
        assert_eq!(read_through(tls.clone(), true, 1).await.unwrap(), tls);
        // An error first is the server's to report.
        let error = b"E\0\0\0\x05x".to_vec();
        assert_eq!(read_through(error.clone(), false, 2).await.unwrap(), error);
    }
}
