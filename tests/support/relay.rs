//! The relay binary (or any program) as a child process with its output in a log file.

use super::run::{self, run_dir};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process (normally the relay binary) whose stdout and stderr go to one log file in
/// the run directory. On drop it is killed if still running, and if the drop happens during a
/// panic the last ~200 lines of its log are printed to stderr.
pub struct Relay {
    child: Child,
    status: Option<ExitStatus>,
    log: PathBuf,
    program: PathBuf,
}

/// `RUST_LOG` for the relay unless the test overrides it.
const RELAY_RUST_LOG: &str = "outbox_relay=debug,info";

impl Relay {
    /// Spawns the relay binary (`CARGO_BIN_EXE_outbox-relay`) with `args` (e.g. `["run",
    /// "--source-url", ..]`) and `RUST_LOG=outbox_relay=debug,info`.
    pub fn spawn(args: &[String]) -> Relay {
        Self::spawn_with_env(args, &[])
    }

    /// Like [`Relay::spawn`], with extra environment variables (which may override `RUST_LOG`).
    pub fn spawn_with_env(args: &[String], env: &[(&str, &str)]) -> Relay {
        // option_env!, not env!: the harness also compiles in crates without that binary.
        let exe = option_env!("CARGO_BIN_EXE_outbox-relay").unwrap_or_else(|| {
            panic!("CARGO_BIN_EXE_outbox-relay is not set: Relay::spawn works only in the outbox-relay crate's integration tests")
        });
        Self::spawn_program_with_env(Path::new(exe), args, env)
    }

    /// Spawns any program `path` with `args` the same way (log file, `RUST_LOG`, kill on drop).
    pub fn spawn_program(path: &Path, args: &[String]) -> Relay {
        Self::spawn_program_with_env(path, args, &[])
    }

    /// Spawns any program with extra environment variables (applied after `RUST_LOG`).
    pub fn spawn_program_with_env(path: &Path, args: &[String], env: &[(&str, &str)]) -> Relay {
        let stem = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = run_dir().join(format!("{}.log", super::unique_name(&stem)));
        let out =
            fs::File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let err = out.try_clone().expect("cloning log file handle");
        let mut cmd = Command::new(path);
        cmd.args(args)
            .env("RUST_LOG", RELAY_RUST_LOG)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {} {args:?}: {e}", path.display()));
        run::register_child(child.id(), path);
        Relay {
            child,
            status: None,
            log,
            program: path.to_path_buf(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (graceful shutdown). Does not wait.
    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends signal `sig` (no-op once the process has been reaped).
    pub fn signal(&self, sig: i32) {
        if self.status.is_none() {
            unsafe {
                libc::kill(self.child.id() as i32, sig);
            }
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.reap_blocking();
        }
    }

    fn reap_blocking(&mut self) {
        if let Ok(s) = self.child.wait() {
            self.set_status(s);
        }
    }

    fn set_status(&mut self, s: ExitStatus) {
        if self.status.is_none() {
            self.status = Some(s);
            run::unregister_child(self.child.id());
        }
    }

    /// The exit status if the process has exited (reaps it), else None.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.set_status(s);
            }
        }
        self.status
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.try_status().is_none()
    }

    /// Waits for the process to exit, up to `deadline`, and returns its exit status. Panics
    /// (with the log's tail) on timeout; the process is then killed by drop.
    pub fn wait(&mut self, deadline: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.try_status() {
                return s;
            }
            if start.elapsed() >= deadline {
                panic!(
                    "timed out after {deadline:?} waiting for {} (pid {}) to exit",
                    self.program.display(),
                    self.child.id()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process wrote so far (stdout and stderr, interleaved).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Path of the log file.
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Waits until the log contains `needle`, panicking after `deadline` (with the log tail).
    /// Also panics early if the process exits first.
    pub async fn wait_for_log(&mut self, needle: &str, deadline: Duration) {
        let start = Instant::now();
        loop {
            if self.log().contains(needle) {
                return;
            }
            if let Some(s) = self.try_status() {
                if self.log().contains(needle) {
                    return;
                }
                panic!(
                    "{} exited ({s}) before its log contained {needle:?}",
                    self.program.display()
                );
            }
            if start.elapsed() >= deadline {
                panic!(
                    "timed out after {deadline:?} waiting for the log of {} to contain {needle:?}",
                    self.program.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let was_running = self.try_status().is_none();
        if was_running {
            let _ = self.child.kill();
            self.reap_blocking();
        }
        if std::thread::panicking() {
            let text = self.log();
            eprintln!(
                "----- {} (pid {}, {}) log {} — last 200 lines -----\n{}\n----- end of log -----",
                self.program.display(),
                self.child.id(),
                match (was_running, self.status) {
                    (true, _) => "killed by drop".to_string(),
                    (false, Some(s)) => format!("exited: {s}"),
                    (false, None) => "exit status unknown".to_string(),
                },
                self.log.display(),
                super::tail_lines(&text, 200)
            );
        }
    }
}
