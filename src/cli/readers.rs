//! Which of `run`'s flags each other command reads ([`READERS`]): the command's `--help`
//! shows those only, and its command line refuses the others, naming them and the commands
//! that read them. Their environment variables stay accepted and ignored, so that one
//! environment serves every command.

/// Headings of `run`'s flags that matter to `run` alone: what the process serves and how it
/// delivers.
const RUN_ONLY: &[&str] = &["Process", "Delivery"];

/// Headings of the flags that `setup`, `status` and `teardown` may read: they reach the
/// database only.
const DATABASE: &[&str] = &["Config file", "Source database"];

/// Source database flags about streaming, which none of `setup`, `status` and `teardown` reads.
const STREAMING: &[&str] = &[
    "no_create_slot",
    "status_interval_ms",
    "terminate_stale_walsender_after_secs",
];

/// Whether a command reads a flag of `run`.
type Reads = fn(&clap::Arg) -> bool;

/// The commands that flatten [`RunArgs`](super::RunArgs) besides `run` (which reads every one
/// of its flags), each with the test of the flags it reads: the one source of what each
/// command's `--help` shows ([`hide_unread`]) and of what its command line takes
/// ([`refuse_unread`]).
const READERS: &[(&str, Reads)] = &[
    ("setup", setup_reads),
    ("check", check_reads),
    ("status", status_reads),
    ("teardown", teardown_reads),
];

/// `check` reads all of `run`'s flags but the process's and delivery's.
fn check_reads(arg: &clap::Arg) -> bool {
    !arg.get_help_heading()
        .is_some_and(|h| RUN_ONLY.contains(&h))
}

/// Whether `arg` is a database flag (a heading of [`DATABASE`]) that is not [`STREAMING`] nor
/// in `unread`, or not one of `run`'s (the command's own, `--help`, the global flags).
fn database_flags_but(arg: &clap::Arg, unread: &[&str]) -> bool {
    let id = arg.get_id().as_str();
    let Some(heading) = arg.get_help_heading() else {
        return true;
    };
    heading == "Logging"
        || DATABASE.contains(&heading) && !STREAMING.contains(&id) && !unread.contains(&id)
}

/// `setup` also reads `--message-prefix` (for `--print-sql`), `--failover`, and
/// `--op-invalid-behavior` (whether the publication it creates publishes updates and deletes).
fn setup_reads(arg: &clap::Arg) -> bool {
    database_flags_but(arg, &["standby_url"]) || arg.get_id() == "op_invalid_behavior"
}

/// `status` reads `--standby-url` for the slot's copy there.
fn status_reads(arg: &clap::Arg) -> bool {
    database_flags_but(arg, &["message_prefix", "failover"])
}

/// `teardown` reads the slot's, the publication's and the slot record's flags only.
fn teardown_reads(arg: &clap::Arg) -> bool {
    database_flags_but(arg, &["message_prefix", "failover", "standby_url"])
}

/// Hides `arg` from `command`'s `--help` unless `command` reads it ([`READERS`]).
fn hide_unread(command: &str, arg: clap::Arg) -> clap::Arg {
    let reads = READERS
        .iter()
        .find(|(name, _)| *name == command)
        .is_none_or(|(_, reads)| reads(&arg));
    let hide = arg.is_hide_set() || !reads;
    arg.hide(hide)
}

pub(super) fn check_flags(arg: clap::Arg) -> clap::Arg {
    hide_unread("check", arg)
}

pub(super) fn setup_flags(arg: clap::Arg) -> clap::Arg {
    hide_unread("setup", arg)
}

pub(super) fn status_flags(arg: clap::Arg) -> clap::Arg {
    hide_unread("status", arg)
}

pub(super) fn teardown_flags(arg: clap::Arg) -> clap::Arg {
    hide_unread("teardown", arg)
}

/// Refuses a flag of `run` given on the command line to a command that does not read it
/// ([`READERS`]): `--metrics-listen is a flag of run; setup does not read it`. Its
/// environment variable is not refused but ignored (a malformed value still fails its
/// parser), so that one environment serves every command.
///
/// Returns a usage error (exit code 2) naming each such flag and the commands that read it.
pub(super) fn refuse_unread(
    cli: &clap::Command,
    matches: &clap::ArgMatches,
) -> Result<(), clap::Error> {
    let Some((name, given)) = matches.subcommand() else {
        return Ok(());
    };
    let Some((_, reads)) = READERS.iter().find(|(n, _)| *n == name) else {
        return Ok(());
    };
    let Some(command) = cli.find_subcommand(name) else {
        return Ok(());
    };
    let refused: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|arg| !reads(arg))
        .filter(|arg| {
            given.value_source(arg.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        })
        .collect();
    let flags: Vec<String> = refused
        .iter()
        .enumerate()
        .map(|(i, arg)| {
            let readers: Vec<&str> = std::iter::once("run")
                .chain(READERS.iter().filter(|(_, r)| r(arg)).map(|(n, _)| *n))
                .collect();
            let readers = match readers.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
                _ => "run".to_owned(),
            };
            let long = arg.get_long().unwrap_or(arg.get_id().as_str());
            let is = if i == 0 { " is" } else { "" };
            format!("--{long}{is} a flag of {readers}")
        })
        .collect();
    let message = match refused.as_slice() {
        [] => return Ok(()),
        [arg] => {
            let variable = arg.get_env().map(|v| {
                format!(
                    "; {} may stay in the environment, {name} ignores it",
                    v.to_string_lossy()
                )
            });
            format!(
                "{}; {name} does not read it\n\n  tip: drop it from {name}'s command line{}",
                flags[0],
                variable.unwrap_or_default()
            )
        }
        _ => format!(
            "{}; {name} does not read them\n\n  tip: drop them from {name}'s command line; their OUTBOX_RELAY_* variables may stay in the environment, {name} ignores them",
            flags.join(", ")
        ),
    };
    // Formatted with the command's own usage line (`Usage: outbox-relay setup [OPTIONS]`).
    let mut command = command.clone();
    Err(clap::Error::raw(clap::error::ErrorKind::UnknownArgument, message).format(&mut command))
}

/// Refuses `--pipeline` without `--config` (or `OUTBOX_RELAY_CONFIG`): it picks pipelines of a
/// config file, and the single-database flags make one pipeline of their own, which it would
/// pick nothing of. (clap's `requires` is not enforced for it: `--config` conflicts with flags
/// that have defaults.)
pub(super) fn refuse_pipeline_without_config(
    cli: &clap::Command,
    matches: &clap::ArgMatches,
) -> Result<(), clap::Error> {
    let Some((name, given)) = matches.subcommand() else {
        return Ok(());
    };
    let has = |id: &str| given.try_contains_id(id).unwrap_or(false);
    if !has("pipelines") || has("config") {
        return Ok(());
    }
    let Some(command) = cli.find_subcommand(name) else {
        return Ok(());
    };
    let message = "--pipeline chooses pipelines of a config file: give the file with --config \
                   (or OUTBOX_RELAY_CONFIG), or leave --pipeline out for the single-database \
                   flags";
    let mut command = command.clone();
    Err(
        clap::Error::raw(clap::error::ErrorKind::MissingRequiredArgument, message)
            .format(&mut command),
    )
}
