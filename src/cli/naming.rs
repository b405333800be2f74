//! Command-line errors that name the environment variable behind a flag they name.

/// A command-line error about a flag whose value came from an environment variable says so:
/// clap names the flag only (`invalid value 'abc' for '--max-in-flight-events'`, `the
/// argument '--config <FILE>' cannot be used with '--slot <NAME>'`), and the flag is nowhere on
/// the command line.
pub trait NamingVariable {
    fn exit_naming_variable(self) -> !;
}

impl NamingVariable for clap::Error {
    fn exit_naming_variable(self) -> ! {
        use clap::error::{ContextKind, ContextValue};
        let flags: Vec<String> = [ContextKind::InvalidArg, ContextKind::PriorArg]
            .into_iter()
            .flat_map(|kind| match self.get(kind) {
                Some(ContextValue::String(flag)) => vec![flag.clone()],
                Some(ContextValue::Strings(flags)) => flags.clone(),
                _ => Vec::new(),
            })
            .collect();
        let text = self.to_string();
        let mut message = text
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_owned();
        let mut named = false;
        for flag in flags {
            if let Some(variable) = variable_behind(&flag) {
                let quoted = format!("'{flag}'");
                message = message.replacen(
                    &quoted,
                    &format!("{quoted} (environment variable {variable})"),
                    1,
                );
                named = true;
            }
        }
        if !named {
            self.exit()
        }
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}

/// The environment variable `flag` (as clap shows it, `--slot <NAME>`) took its value from:
/// `None` when the flag is on the command line, has no variable, or its variable is unset.
fn variable_behind(flag: &str) -> Option<String> {
    let long = flag
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches("--");
    let on_command_line = std::env::args().any(|a| {
        a.strip_prefix("--")
            .is_some_and(|a| a.split('=').next() == Some(long))
    });
    if on_command_line {
        return None;
    }
    let command = <super::Cli as clap::CommandFactory>::command();
    let variable = command
        .get_subcommands()
        .chain(std::iter::once(&command))
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())?;
    std::env::var_os(&variable).is_some().then_some(variable)
}
