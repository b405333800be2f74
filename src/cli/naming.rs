//! Command-line errors that name the environment variable a bad value came from.

/// A command-line error whose value came from an environment variable says so: clap names
/// the flag only (`invalid value 'abc' for '--max-in-flight-events'`), and the flag is nowhere
/// on the command line.
pub trait NamingVariable {
    fn exit_naming_variable(self) -> !;
}

impl NamingVariable for clap::Error {
    fn exit_naming_variable(self) -> ! {
        use clap::error::{ContextKind, ContextValue};
        let flag = match self.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(flag)) => flag.clone(),
            _ => self.exit(),
        };
        let long = flag
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_start_matches("--")
            .to_owned();
        let on_command_line = std::env::args().any(|a| {
            a.strip_prefix("--")
                .is_some_and(|a| a.split('=').next() == Some(long.as_str()))
        });
        let command = <super::Cli as clap::CommandFactory>::command();
        let variable = command
            .get_subcommands()
            .chain(std::iter::once(&command))
            .flat_map(|c| c.get_arguments())
            .find(|a| a.get_long() == Some(long.as_str()))
            .and_then(|a| a.get_env())
            .map(|v| v.to_string_lossy().into_owned());
        match variable {
            Some(variable) if !on_command_line && std::env::var_os(&variable).is_some() => {
                let reason = self.to_string();
                let reason = reason
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                eprintln!("error: environment variable {variable}: {reason}");
                std::process::exit(2);
            }
            _ => self.exit(),
        }
    }
}
