//! The `outbox-relay` binary: parses the command line, sets up logging and runs the command
//! ([`outbox_relay::cli`]).

use outbox_relay::cli::{Cli, NamingVariable};
use outbox_relay::config;
use outbox_relay::error::chain;
use outbox_relay::logging::LogFormat;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse_command_line(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => e.exit_naming_variable(),
    };
    if !matches!(cli.command, outbox_relay::cli::Command::Run(_)) {
        // A one-shot command's output piped into `head` ends quietly when the reader goes,
        // as other command-line tools do, instead of panicking on the broken pipe. `run` keeps
        // Rust's default (SIGPIPE ignored): a closed socket is an error it handles.
        // SAFETY: setting a signal's disposition is process-wide and nothing else in the
        // process sets SIGPIPE's (Rust's runtime set it to ignored before `main`).
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let file_log = cli
        .command
        .config_path()
        .map(config::file::log_section)
        .unwrap_or_default();
    let format = cli.log_format.or(file_log.format).unwrap_or_default();
    let level = cli.log_level.or(file_log.level);
    if let Err(e) = outbox_relay::logging::init(format, level.as_deref()) {
        eprintln!("outbox-relay: {e}");
        return std::process::ExitCode::from(outbox_relay::error::EXIT_CONFIG);
    }
    match outbox_relay::cli::run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let code = outbox_relay::cli::exit_code(&e);
            if format == LogFormat::Text && e.downcast_ref::<config::ConfigErrors>().is_some() {
                // The file's or the flags' problems, one per line, as a terminal shows them.
                eprintln!("outbox-relay: {}", chain(e.as_ref()));
            } else {
                tracing::error!(error = %chain(e.as_ref()), exit_code = code, "outbox-relay failed");
            }
            std::process::ExitCode::from(code)
        }
    }
}
