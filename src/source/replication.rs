//! Opens a walsender connection and runs the logical replication CopyBoth stream.
//!
//! tokio-postgres has no replication API, so this is a small client of its own on
//! `postgres-protocol`'s message codecs and SCRAM implementation. It follows the PostgreSQL
//! docs, 55.2 "Message Flow" (startup, authentication, simple query) and 55.4 "Streaming
//! Replication Protocol" (`IDENTIFY_SYSTEM`, `START_REPLICATION`, XLogData, primary keepalive
//! and standby status update messages).
//!
//! The stream is read through a framed reader so [`ReplicationStream::recv`] is cancel-safe
//! and can sit in a `select!` beside the status timer and the broker's delivery reports;
//! writes (status updates) go to the other half of the socket and never wait for a read.
//!
//! `replication/messages.rs` encodes and parses the CopyData messages; `replication/transport.rs`
//! opens the socket (TCP, Unix-domain, TLS) under the connection.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use futures::StreamExt;
use postgres_protocol::authentication::{self, sasl};
use postgres_protocol::message::backend::{ErrorResponseBody, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio_util::codec::{Decoder, FramedRead};

use super::auth::AuthPolicy;
use super::conninfo::ConnInfo;
use super::target::{self, Candidate, Endpoint, ServerState};
use super::tls::{SslMode, Verification};
use super::SourceError;
use crate::lsn::Lsn;

mod messages;
mod transport;

pub use messages::{
    parse_copy_data, pg_timestamp_us, quote_ident, quote_literal, standby_status_update,
    start_replication_command, ReplicationMessage, PG_EPOCH_OFFSET_SECS,
};
use transport::{negotiate_tls, open_stream_pinned};
pub(crate) use transport::{open_stream, within_connect_timeout};

const COPY_BOTH_RESPONSE_TAG: u8 = b'W';
/// PostgreSQL never sends a message over 1 GiB (plus headers); a larger length is corrupt
/// input, refused before anything is allocated for it.
const MAX_MESSAGE_LEN: usize = (1 << 30) + 64;
/// The read buffer's allocation kept after a message at least this large was read: the
/// buffer moves to a fresh allocation instead, so that a large row's WAL message is freed once
/// its event is, rather than kept as the connection's buffer (its pages resident) for good.
const READ_BUFFER_KEPT_BYTES: usize = 1 << 20;

/// A connection's byte stream: TCP, Unix-domain, or TLS over TCP.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// What the backend codec yields: postgres-protocol's messages plus CopyBothResponse, which
/// postgres-protocol does not parse.
enum Backend {
    Message(Message),
    CopyBothResponse,
}

struct BackendCodec;

impl Decoder for BackendCodec {
    type Item = Backend;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<Backend>> {
        if src.first() == Some(&COPY_BOTH_RESPONSE_TAG) {
            let Some(len) = src.get(1..5) else {
                return Ok(None);
            };
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            let len = usize::try_from(len)
                .ok()
                .filter(|len| (4..=MAX_MESSAGE_LEN).contains(len))
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "invalid message length")
                })?;
            if src.len() < 1 + len {
                src.reserve(1 + len - src.len());
                return Ok(None);
            }
            src.advance(1 + len);
            return Ok(Some(Backend::CopyBothResponse));
        }
        if let Some(len) = src.get(1..5) {
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            if usize::try_from(len).map_or(true, |len| len > MAX_MESSAGE_LEN) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("message length {len} exceeds PostgreSQL's 1 GiB limit"),
                ));
            }
        }
        Message::parse(src).map(|m| m.map(Backend::Message))
    }
}

/// A walsender connection in `replication=database` mode, before streaming.
pub struct ReplicationClient {
    reader: FramedRead<ReadHalf<Box<dyn Socket>>, BackendCodec>,
    writer: WriteHalf<Box<dyn Socket>>,
    server_params: HashMap<String, String>,
    /// The host connected to, pinned to the address reached.
    server: Endpoint,
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone)]
pub struct SystemIdentity {
    pub system_id: String,
    pub timeline: u32,
    /// The current WAL flush location.
    pub xlogpos: Lsn,
    pub dbname: Option<String>,
}

impl ReplicationClient {
    /// Connects and authenticates as a logical walsender (`replication=database`) to the
    /// first host of `info` that fits its `target_session_attrs` (see [`target`]).
    ///
    /// Session settings the relay relies on are fixed in the startup packet
    /// (`client_encoding=UTF8`, `DateStyle=ISO`, `TimeZone=UTC`), so role or database defaults
    /// cannot change how values are printed. `connect_timeout` (default 30 s) bounds each
    /// host's attempt, start-up included.
    ///
    /// TCP connections negotiate TLS as `info.tls` says (docs 55.2.10 "SSL Session
    /// Encryption"); Unix sockets never use it.
    ///
    /// Returns an error if no host is reachable and fits ([`SourceError::NoHostFits`], or the
    /// one host's error), TLS is required and refused or the server's certificate fails
    /// verification, authentication fails, the server asks for an authentication method
    /// other than trust, password, MD5 or SCRAM-SHA-256, or for one that `require_auth`,
    /// `channel_binding=require` or the cleartext rule refuses (see [`super::auth`]).
    pub async fn connect(info: &ConnInfo) -> Result<Self, SourceError> {
        let tls_config = match info.tls.mode {
            SslMode::Disable => None,
            _ => Some(Arc::new(
                info.tls.client_config().map_err(SourceError::Tls)?,
            )),
        };
        let connector = WalsenderConnector { info, tls_config };
        target::select(info.target, &target::endpoints(&info.pg), &connector).await
    }

    /// Connects to one host and starts a walsender session there.
    async fn connect_to(
        config: &tokio_postgres::Config,
        info: &ConnInfo,
        tls_config: Option<Arc<rustls::ClientConfig>>,
        endpoint: Endpoint,
    ) -> Result<Self, SourceError> {
        let tls = &info.tls;
        let (stream, server) = open_stream_pinned(config, &endpoint).await?;
        let (socket, tls_session) = match (tls_config, endpoint.socket_path()) {
            (Some(tls_config), None) => {
                negotiate_tls(stream, &endpoint.tls_name(), tls_config, tls.mode).await?
            }
            _ => (stream, None),
        };
        let policy = AuthPolicy {
            require_auth: info.require_auth.clone(),
            channel_binding_required: config.get_channel_binding()
                == tokio_postgres::config::ChannelBinding::Require,
            trusted_channel: endpoint.socket_path().is_some()
                || (tls_session.is_some() && tls.verification() >= Verification::Chain),
            server: endpoint.to_string(),
        };
        let tls_server_end_point = tls_session.flatten();
        let (read, write) = tokio::io::split(socket);
        let mut client = ReplicationClient {
            reader: FramedRead::new(read, BackendCodec),
            writer: write,
            server_params: HashMap::new(),
            server,
        };
        client
            .startup(config, &policy, tls_server_end_point.as_deref())
            .await?;
        Ok(client)
    }

    async fn startup(
        &mut self,
        config: &tokio_postgres::Config,
        policy: &AuthPolicy,
        tls_server_end_point: Option<&[u8]>,
    ) -> Result<(), SourceError> {
        let user = config
            .get_user()
            .ok_or_else(|| SourceError::Config("source url: user is required".into()))?;
        let mut params = vec![
            ("user", user),
            ("database", config.get_dbname().unwrap_or(user)),
            ("replication", "database"),
            (
                "application_name",
                config.get_application_name().unwrap_or("outbox-relay"),
            ),
            ("client_encoding", "UTF8"),
        ];
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        let mut buf = BytesMut::new();
        frontend::startup_message(params.iter().copied(), &mut buf)?;
        self.write(&buf).await?;
        self.authenticate(user, config, policy, tls_server_end_point)
            .await?;
        loop {
            match self.read().await? {
                Message::ParameterStatus(body) => {
                    self.server_params
                        .insert(body.name()?.to_owned(), body.value()?.to_owned());
                }
                Message::BackendKeyData(_) | Message::NoticeResponse(_) => {}
                Message::ReadyForQuery(_) => return Ok(()),
                Message::ErrorResponse(body) => return Err(server_error(&body)),
                _ => return Err(unexpected("startup")),
            }
        }
    }

    /// Answers the server's authentication request (docs 55.2.1 "Start-up", 55.3 "SASL
    /// Authentication"). SCRAM uses channel binding (`SCRAM-SHA-256-PLUS`, RFC 5929
    /// `tls-server-end-point`) when the session is TLS and the server offers it, as libpq does;
    /// `channel_binding=require` in the source URL makes a session without it an error,
    /// `channel_binding=disable` never uses it. `auth` decides which requests are answered at
    /// all (`require_auth`, cleartext passwords: see [`super::auth`]).
    async fn authenticate(
        &mut self,
        user: &str,
        config: &tokio_postgres::Config,
        auth: &AuthPolicy,
        tls_server_end_point: Option<&[u8]>,
    ) -> Result<(), SourceError> {
        use tokio_postgres::config::ChannelBinding as Policy;
        let password = config.get_password();
        let policy = config.get_channel_binding();
        let server = &auth.server;
        let require_binding = || {
            SourceError::Auth(format!(
                "{server} did not ask for SCRAM-SHA-256-PLUS over TLS, and channel_binding=require (use sslmode=verify-full and a role with a SCRAM password)"
            ))
        };
        let need_password = || {
            SourceError::Auth(format!(
                "{server} asks for a password and the source url has none"
            ))
        };
        let mut buf = BytesMut::new();
        let request = self.read().await?;
        let code = match &request {
            Message::AuthenticationOk => Some(0),
            Message::AuthenticationCleartextPassword => Some(3),
            Message::AuthenticationMd5Password(_) => Some(5),
            Message::AuthenticationGss => Some(7),
            Message::AuthenticationSspi => Some(9),
            Message::AuthenticationSasl(_) => Some(10),
            _ => None,
        };
        if let Some(code) = code {
            auth.check(code).map_err(SourceError::Auth)?;
        }
        match request {
            Message::AuthenticationOk if policy == Policy::Require => return Err(require_binding()),
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword | Message::AuthenticationMd5Password(_)
                if policy == Policy::Require =>
            {
                return Err(require_binding())
            }
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password.ok_or_else(need_password)?, &mut buf)?;
                self.write(&buf).await?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = authentication::md5_hash(
                    user.as_bytes(),
                    password.ok_or_else(need_password)?,
                    body.salt(),
                );
                frontend::password_message(hash.as_bytes(), &mut buf)?;
                self.write(&buf).await?;
            }
            Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let (mut plain, mut plus) = (false, false);
                while let Some(mechanism) = mechanisms.next()? {
                    plain |= mechanism == sasl::SCRAM_SHA_256;
                    plus |= mechanism == sasl::SCRAM_SHA_256_PLUS;
                }
                let end_point = tls_server_end_point.filter(|_| policy != Policy::Disable);
                let (mechanism, binding) = match end_point {
                    Some(end_point) if plus => (
                        sasl::SCRAM_SHA_256_PLUS,
                        sasl::ChannelBinding::tls_server_end_point(end_point.to_vec()),
                    ),
                    _ if policy == Policy::Require => return Err(require_binding()),
                    // "y": this client could bind, the server did not offer it.
                    Some(_) if plain => (sasl::SCRAM_SHA_256, sasl::ChannelBinding::unrequested()),
                    None if plain => (sasl::SCRAM_SHA_256, sasl::ChannelBinding::unsupported()),
                    _ => {
                        return Err(SourceError::Auth(
                            "the server offers no SASL mechanism this client supports (SCRAM-SHA-256, SCRAM-SHA-256-PLUS)".into(),
                        ))
                    }
                };
                let password = password.ok_or_else(need_password)?;
                let mut scram = sasl::ScramSha256::new(password, binding);
                frontend::sasl_initial_response(mechanism, scram.message(), &mut buf)?;
                self.write(&buf).await?;
                match self.read().await? {
                    Message::AuthenticationSaslContinue(body) => scram.update(body.data())?,
                    Message::ErrorResponse(body) => return Err(server_error(&body)),
                    _ => return Err(unexpected("SCRAM exchange")),
                }
                buf.clear();
                frontend::sasl_response(scram.message(), &mut buf)?;
                self.write(&buf).await?;
                match self.read().await? {
                    Message::AuthenticationSaslFinal(body) => scram.finish(body.data())?,
                    Message::ErrorResponse(body) => return Err(server_error(&body)),
                    _ => return Err(unexpected("SCRAM exchange")),
                }
            }
            Message::ErrorResponse(body) => return Err(server_error(&body)),
            _ => {
                return Err(SourceError::Auth(
                    "the server asks for an authentication method this client does not support (trust, password, md5 and scram-sha-256 are)".into(),
                ))
            }
        }
        match self.read().await? {
            Message::AuthenticationOk => Ok(()),
            Message::ErrorResponse(body) => Err(server_error(&body)),
            _ => Err(unexpected("authentication")),
        }
    }

    /// The host this connection reached, pinned to its address: where the pipeline's SQL
    /// connection must go too ([`crate::source::slot::connect_to`]).
    pub fn server(&self) -> &Endpoint {
        &self.server
    }

    /// A server parameter reported at startup (`server_version`, ...).
    pub fn server_param(&self, name: &str) -> Option<&str> {
        self.server_params.get(name).map(String::as_str)
    }

    /// Whether the database's encoding is `SQL_ASCII`, which stores text as any bytes. If it
    /// is, the walsender is told to send text as stored (`client_encoding` `SQL_ASCII`):
    /// with `UTF8` it would check each value and end the stream at the first that is not
    /// UTF-8, naming neither the row nor the column, on every reconnect. The relay checks
    /// the outbox's values itself then ([`super::outbox::OutboxDecoder::with_utf8_check`]).
    ///
    /// Returns an error if the server refuses the setting.
    pub async fn text_as_stored(&mut self) -> Result<bool, SourceError> {
        if self.server_param("server_encoding") != Some("SQL_ASCII") {
            return Ok(false);
        }
        self.simple_query("SET client_encoding = 'SQL_ASCII'")
            .await?;
        Ok(true)
    }

    /// Runs a replication command or query with the simple query protocol and returns the
    /// rows of its result as text.
    ///
    /// Returns an error if the server reports one (keeping its SQLSTATE).
    pub async fn simple_query(
        &mut self,
        query: &str,
    ) -> Result<Vec<Vec<Option<String>>>, SourceError> {
        let mut buf = BytesMut::new();
        frontend::query(query, &mut buf)?;
        self.write(&buf).await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.read().await? {
                Message::DataRow(body) => {
                    let buf = body.buffer();
                    let row = body
                        .ranges()
                        .map(|range| {
                            Ok(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()))
                        })
                        .collect()?;
                    rows.push(row);
                }
                Message::ErrorResponse(body) => error = Some(server_error(&body)),
                Message::ReadyForQuery(_) => break,
                _ => {}
            }
        }
        match error {
            Some(error) => Err(error),
            None => Ok(rows),
        }
    }

    /// Runs `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<SystemIdentity, SourceError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .filter(|row| row.len() >= 4)
            .ok_or_else(|| SourceError::Protocol("IDENTIFY_SYSTEM returned no row".into()))?;
        let field = |i: usize| row[i].clone().unwrap_or_default();
        Ok(SystemIdentity {
            system_id: field(0),
            timeline: field(1)
                .parse()
                .map_err(|_| SourceError::Protocol("IDENTIFY_SYSTEM timeline".into()))?,
            xlogpos: field(2)
                .parse()
                .map_err(|_| SourceError::Protocol("IDENTIFY_SYSTEM xlogpos".into()))?,
            dbname: row[3].clone(),
        })
    }

    /// Sends `START_REPLICATION` for `slot` from `start` (`0/0`: the slot's
    /// `confirmed_flush_lsn`) with pgoutput protocol version 1 and logical messages, and
    /// returns the stream once the server answered CopyBothResponse.
    ///
    /// Returns an error if the server refuses, e.g. SQLSTATE 55006 when another process holds
    /// the slot.
    pub async fn start_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
    ) -> Result<ReplicationStream, SourceError> {
        let mut buf = BytesMut::new();
        frontend::query(
            &start_replication_command(slot, start, publication),
            &mut buf,
        )?;
        self.write(&buf).await?;
        loop {
            match self.reader.next().await.transpose()? {
                Some(Backend::CopyBothResponse) => break,
                Some(Backend::Message(Message::NoticeResponse(_))) => {}
                Some(Backend::Message(Message::ErrorResponse(body))) => {
                    return Err(server_error(&body))
                }
                Some(Backend::Message(_)) => return Err(unexpected("START_REPLICATION")),
                None => return Err(SourceError::Closed),
            }
        }
        Ok(ReplicationStream { client: self })
    }

    /// Moves what is left to read to a fresh buffer: the one a large message was read into
    /// shares its allocation, and would otherwise reuse all of it for the messages after.
    fn release_read_buffer(&mut self) {
        let buffer = self.reader.read_buffer_mut();
        let rest = buffer.split();
        let mut fresh = BytesMut::with_capacity(rest.len().max(8 * 1024));
        fresh.extend_from_slice(&rest);
        *buffer = fresh;
    }

    async fn read(&mut self) -> Result<Message, SourceError> {
        match self.reader.next().await.transpose()? {
            Some(Backend::Message(message)) => Ok(message),
            Some(Backend::CopyBothResponse) => Err(unexpected("a query")),
            None => Err(SourceError::Closed),
        }
    }

    async fn write(&mut self, buf: &[u8]) -> Result<(), SourceError> {
        self.writer.write_all(buf).await?;
        self.writer.flush().await?;
        Ok(())
    }
}

/// Opens walsender connections for [`target::select`].
struct WalsenderConnector<'a> {
    info: &'a ConnInfo,
    tls_config: Option<Arc<rustls::ClientConfig>>,
}

impl target::Connector for WalsenderConnector<'_> {
    type Connection = ReplicationClient;

    async fn connect(&self, endpoint: Endpoint) -> Result<ReplicationClient, SourceError> {
        // The password file's line for this host, as libpq looks it up per host.
        let config = self.info.config_for(&endpoint);
        let attempt =
            ReplicationClient::connect_to(&config, self.info, self.tls_config.clone(), endpoint);
        within_connect_timeout(&self.info.pg, attempt).await
    }
}

impl Candidate for ReplicationClient {
    fn reported(&self) -> ServerState {
        ServerState::reported(|name| self.server_param(name).map(str::to_owned))
    }

    async fn ask(&mut self, sql: &'static str) -> Result<String, SourceError> {
        let rows = self.simple_query(sql).await?;
        rows.into_iter()
            .next()
            .and_then(|row| row.into_iter().next().flatten())
            .ok_or_else(|| SourceError::Protocol(format!("{sql} returned no value")))
    }
}

/// The walsender's side of a running logical replication stream, as
/// [`super::logical::LogicalSource`] uses it: [`ReplicationStream`] over a connection, or a
/// fake server in the session simulation (`src/session/simulation/`).
pub trait WalStream: Send {
    /// Receives the next XLogData or keepalive; `Ok(None)` when the server ended the stream.
    ///
    /// Cancel-safe. Returns an error if the server reports one or the connection breaks.
    fn recv(
        &mut self,
    ) -> impl Future<Output = Result<Option<ReplicationMessage>, SourceError>> + Send;

    /// Sends a standby status update with `write` (last received), `flush` and `apply` (both
    /// the confirmed LSN).
    ///
    /// Not cancel-safe. Returns an error if the connection broke.
    fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Ends streaming within `timeout`; the server has processed every status update sent
    /// before when this returns `Ok`.
    fn stop(self, timeout: Duration) -> impl Future<Output = Result<(), SourceError>> + Send;
}

impl WalStream for ReplicationStream {
    async fn recv(&mut self) -> Result<Option<ReplicationMessage>, SourceError> {
        ReplicationStream::recv(self).await
    }

    async fn send_status(&mut self, write: Lsn, flush: Lsn) -> Result<(), SourceError> {
        ReplicationStream::send_status(self, write, flush).await
    }

    async fn stop(self, timeout: Duration) -> Result<(), SourceError> {
        ReplicationStream::stop(self, timeout).await
    }
}

/// A running logical replication stream (CopyBoth mode).
pub struct ReplicationStream {
    client: ReplicationClient,
}

impl ReplicationStream {
    /// Receives the next XLogData or keepalive; `Ok(None)` when the server ended the stream.
    ///
    /// Cancel-safe: a message partly read when the future is dropped is kept for the next call.
    /// Returns an error if the server reports one or the connection breaks.
    pub async fn recv(&mut self) -> Result<Option<ReplicationMessage>, SourceError> {
        loop {
            match self.client.reader.next().await.transpose()? {
                Some(Backend::Message(Message::CopyData(body))) => {
                    let body = body.into_bytes();
                    if body.len() >= READ_BUFFER_KEPT_BYTES {
                        self.client.release_read_buffer();
                    }
                    return parse_copy_data(body).map(Some);
                }
                Some(Backend::Message(Message::CopyDone)) => return Ok(None),
                Some(Backend::Message(Message::ErrorResponse(body))) => {
                    return Err(server_error(&body))
                }
                Some(Backend::Message(
                    Message::NoticeResponse(_) | Message::ParameterStatus(_),
                )) => {}
                Some(_) => return Err(unexpected("replication stream")),
                None => return Err(SourceError::Closed),
            }
        }
    }

    /// Sends a standby status update with `write` (last received), `flush` and `apply` (both
    /// the confirmed LSN).
    ///
    /// Not cancel-safe: call it from a `select!` arm's body, not as a branch future.
    pub async fn send_status(&mut self, write: Lsn, flush: Lsn) -> Result<(), SourceError> {
        let update = standby_status_update(write, flush, flush, pg_timestamp_us(SystemTime::now()));
        let mut buf = BytesMut::new();
        frontend::CopyData::new(update)?.write(&mut buf);
        self.client.write(&buf).await
    }

    /// Ends streaming: sends CopyDone, waits (up to `timeout`) for the server to finish the
    /// command, discarding WAL still in flight, then terminates the session. The server has
    /// processed every status update sent before when this returns `Ok`.
    pub async fn stop(mut self, timeout: Duration) -> Result<(), SourceError> {
        let mut buf = BytesMut::new();
        frontend::copy_done(&mut buf);
        self.client.write(&buf).await?;
        let drain = async {
            loop {
                match self.client.reader.next().await.transpose()? {
                    Some(Backend::Message(Message::ReadyForQuery(_))) => return Ok(()),
                    Some(Backend::Message(Message::ErrorResponse(body))) => {
                        return Err(server_error(&body))
                    }
                    Some(_) => {}
                    None => return Err(SourceError::Closed),
                }
            }
        };
        tokio::time::timeout(timeout, drain).await.map_err(|_| {
            SourceError::Protocol("timed out waiting for the walsender to end the stream".into())
        })??;
        buf.clear();
        frontend::terminate(&mut buf);
        self.client.write(&buf).await?;
        Ok(())
    }
}

/// Turns an ErrorResponse into an error keeping SQLSTATE and message.
fn server_error(body: &ErrorResponseBody) -> SourceError {
    let mut code = String::new();
    let mut message = String::new();
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            _ => {}
        }
    }
    SourceError::Server { code, message }
}

fn unexpected(during: &str) -> SourceError {
    SourceError::Protocol(format!("unexpected message during {during}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CopyData message of `data` as the walsender frames it.
    fn copy_data(data: &[u8]) -> Vec<u8> {
        let mut frame = vec![b'd'];
        frame.extend_from_slice(&u32::try_from(data.len() + 4).unwrap().to_be_bytes());
        frame.extend_from_slice(data);
        frame
    }

    /// After a large message, the connection reads the next ones into a buffer of its own:
    /// the large message's allocation goes with its event, not kept for the connection.
    #[tokio::test]
    async fn a_large_message_s_buffer_is_not_kept_for_the_messages_after_it() {
        let (ours, mut server) = tokio::io::duplex(64 * 1024);
        let (read, write) = tokio::io::split(Box::new(ours) as Box<dyn Socket>);
        let mut stream = ReplicationStream {
            client: ReplicationClient {
                reader: FramedRead::new(read, BackendCodec),
                writer: write,
                server_params: HashMap::new(),
                server: Endpoint {
                    host: None,
                    addr: None,
                    port: 5432,
                },
            },
        };
        let message = |len: usize| {
            let mut data = vec![b'w'];
            data.extend_from_slice(&[0; 24]);
            data.resize(1 + 24 + len, b'x');
            copy_data(&data)
        };
        let large = 8 * READ_BUFFER_KEPT_BYTES;
        let sender = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            server.write_all(&message(large)).await.unwrap();
            for _ in 0..3 {
                server.write_all(&message(10)).await.unwrap();
            }
            server
        });
        let first = stream.recv().await.unwrap().unwrap();
        assert!(matches!(&first, ReplicationMessage::XLogData { data, .. } if data.len() == large));
        drop(first);
        for _ in 0..3 {
            stream.recv().await.unwrap().unwrap();
            let capacity = stream.client.reader.read_buffer().capacity();
            assert!(
                capacity < READ_BUFFER_KEPT_BYTES,
                "the read buffer kept {capacity} bytes"
            );
        }
        drop(sender.await.unwrap());
    }
}
