//! A sink server process of the test run (redis-server, nats-server, rabbitmq-server): started
//! on a loopback port of its own with its data in the run directory, stopped and started again
//! by outage tests, killed at exit like every child of the harness.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::run::{self, run_dir, wait_tcp};

/// A server that [`ServerProcess::start`] runs from a command line it can repeat.
pub struct ServerProcess {
    /// For messages: `redis-server`, `nats-server`, ...
    pub name: &'static str,
    pub port: u16,
    /// Builds the command (the same one at every start, so data and port are kept).
    command: Box<dyn Fn() -> Command + Send + Sync>,
    /// How long the server may take to accept connections.
    start_deadline: Duration,
    child: Mutex<Option<Child>>,
    pub log: PathBuf,
}

impl ServerProcess {
    /// Starts `command()` and waits until `port` accepts connections (panics after
    /// `start_deadline` with the log's tail).
    pub fn spawn(
        name: &'static str,
        port: u16,
        start_deadline: Duration,
        command: impl Fn() -> Command + Send + Sync + 'static,
    ) -> ServerProcess {
        let server = ServerProcess {
            name,
            port,
            command: Box::new(command),
            start_deadline,
            child: Mutex::new(None),
            log: run_dir().join(format!("{name}-{port}.log")),
        };
        server.start();
        server
    }

    /// A directory for the server's data, created on first use: `<run dir>/<name>-<port>`.
    pub fn data_dir(name: &str, port: u16) -> PathBuf {
        let dir = run_dir().join(format!("{name}-{port}"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    }

    /// Starts the server again (after [`ServerProcess::stop`]); a no-op while it runs.
    pub fn start(&self) {
        let mut slot = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return;
        }
        let t0 = Instant::now();
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        let err = out.try_clone().expect("cloning a log file handle");
        let mut cmd = (self.command)();
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e} (run tests/setup-deps.sh)", self.name));
        run::register_child(child.id(), &PathBuf::from(self.name));
        let mut exited = None;
        let up = wait_tcp(self.port, self.start_deadline, || {
            exited = child.try_wait().ok().flatten();
            exited.is_some()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            run::unregister_child(child.id());
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            panic!(
                "{} on 127.0.0.1:{} did not accept connections within {:?} (exit status {:?})\n--- {}:\n{}",
                self.name,
                self.port,
                self.start_deadline,
                exited,
                self.log.display(),
                super::tail_lines(&text, 40)
            );
        }
        eprintln!(
            "[support] {} on 127.0.0.1:{} up in {:?} (log {})",
            self.name,
            self.port,
            t0.elapsed(),
            self.log.display()
        );
        *slot = Some(child);
    }

    /// Stops the server with SIGTERM (it saves what it persists) and waits up to 30 s for it
    /// to exit, then SIGKILL.
    pub fn stop(&self) {
        let mut slot = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut child) = slot.take() else {
            return;
        };
        // SAFETY: kill(2) on a child process this harness owns.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        run::unregister_child(child.id());
    }
}
