//! A redis-server of the run (append-only file on, so a stopped server comes back with its
//! streams) and a reader of its streams.

use std::process::Command;
use std::time::Duration;

use super::kafka::Consumed;
use super::server::ServerProcess;
use super::within;

/// Starts a Redis server on `port`, its data in the run directory.
pub fn start(port: u16) -> ServerProcess {
    let dir = ServerProcess::data_dir("redis", port);
    ServerProcess::spawn("redis-server", port, Duration::from_secs(30), move || {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", &dir.display().to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(["--protected-mode", "no", "--daemonize", "no"]);
        cmd
    })
}

/// `redis://127.0.0.1:<port>`.
pub fn redis_url(server: &ServerProcess) -> String {
    format!("redis://127.0.0.1:{}", server.port)
}

/// Every entry of `streams` as a [`Consumed`] (topic = stream, offset = position in it; `key`
/// and `payload` fields as key and value, every other field a header, in field order).
/// Panics if Redis does not answer within 30 s.
pub async fn read_streams(server: &ServerProcess, streams: &[String]) -> Vec<Consumed> {
    let client = redis::Client::open(redis_url(server)).unwrap();
    let mut connection = within(
        "connecting to redis-server",
        Duration::from_secs(30),
        client.get_multiplexed_async_connection(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    for stream in streams {
        let entries: Vec<(String, Vec<Vec<u8>>)> = within(
            &format!("XRANGE {stream} - +"),
            Duration::from_secs(30),
            redis::cmd("XRANGE")
                .arg(stream)
                .arg("-")
                .arg("+")
                .query_async(&mut connection),
        )
        .await
        .unwrap();
        for (offset, (_id, fields)) in entries.into_iter().enumerate() {
            let mut record = Consumed {
                topic: stream.clone(),
                partition: 0,
                offset: offset as i64,
                key: None,
                value: None,
                headers: Vec::new(),
                timestamp_ms: None,
            };
            for pair in fields.chunks(2) {
                let [field, value] = pair else {
                    panic!("XRANGE {stream}: a field without a value");
                };
                let field = String::from_utf8_lossy(field).into_owned();
                match field.as_str() {
                    "key" => record.key = Some(value.clone()),
                    "payload" => record.value = Some(value.clone()),
                    _ => record.headers.push((field, Some(value.clone()))),
                }
            }
            out.push(record);
        }
    }
    out
}

/// Starts a Redis server that speaks TLS only, on `port`, with the certificate in `certs`
/// (`server.crt` for the name `localhost`, `server.key`, and the `ca.crt` that signed it:
/// the test PostgreSQL cluster's, [`super::PgCluster::ca_cert`]).
pub fn start_tls(port: u16, certs: &std::path::Path) -> ServerProcess {
    let dir = ServerProcess::data_dir("redis-tls", port);
    let certs = certs.to_path_buf();
    ServerProcess::spawn("redis-server", port, Duration::from_secs(30), move || {
        let file = |name: &str| certs.join(name).display().to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &file("server.crt"),
            "--tls-key-file",
            &file("server.key"),
        ])
        .args([
            "--tls-ca-cert-file",
            &file("ca.crt"),
            "--tls-auth-clients",
            "no",
        ])
        .args(["--dir", &dir.display().to_string(), "--save", ""])
        .args(["--protected-mode", "no", "--daemonize", "no"]);
        cmd
    })
}
