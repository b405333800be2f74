//! The flags tables of `docs/reference/cli.md`, generated from clap's definitions (checked by
//! `tests/reference.rs`).

use clap::{Arg, ArgAction, CommandFactory};

use super::Cli;

/// One flag (or positional argument) and the commands that take it.
struct Flag<'a> {
    arg: &'a Arg,
    commands: Vec<String>,
}

/// Markdown: one table per help heading ("Source database", "Kafka", ...), a row per flag in
/// the order clap defines them: the flag and its value, its environment variable, its default,
/// the commands that take it, and its help's first paragraph.
pub fn reference_markdown() -> String {
    markdown(&Cli::command())
}

/// The tables of `docs/reference/configuration.md`: every key of the config file, with the
/// flag of `run` that sets it in the single-database form.
pub fn configuration_markdown() -> String {
    crate::config::reference::reference_markdown(&flag_of_key)
}

/// A flag of `run` whose config key is not its own name (in `[[pipelines]]` unless it starts
/// with a table of the file's top level).
const FLAG_KEYS: &[(&str, &str)] = &[
    ("pipeline_name", "pipelines.name"),
    ("no_create_slot", "pipelines.create_slot"),
    ("no_slot_record", "pipelines.slot_record"),
    ("topic_template", "pipelines.route.topic_template"),
    ("route_by_field", "pipelines.route.by_field"),
    ("topic_case", "pipelines.route.topic_case"),
    ("bootstrap_servers", "kafka.bootstrap_servers"),
    ("kafka_properties", "kafka.properties"),
    ("kafka_properties_file", "kafka.properties_file"),
    ("metrics_listen", "metrics.listen"),
    ("on_pipeline_failure", "on_pipeline_failure"),
    ("log_level", "log.level"),
    ("log_format", "log.format"),
];

/// Flags of `run` that set no key of the file.
const NOT_KEYS: &[&str] = &["config", "pipelines", "help", "version"];

/// The config key `run`'s flag `id` sets.
fn key_of_flag(id: &str) -> String {
    FLAG_KEYS
        .iter()
        .find(|(flag, _)| *flag == id)
        .map_or_else(|| format!("pipelines.{id}"), |(_, key)| (*key).to_owned())
}

/// `` `--slot` `` for `pipelines.slot`; the `[kafka]` flags for a pipeline's `kafka` table too.
fn flag_of_key(key: &str) -> Option<String> {
    flag_or_variable_of_key(key).map(|flag| format!("`{flag}`"))
}

/// `--slot` for `pipelines.slot` (a hidden flag's variable instead: `OUTBOX_RELAY_SOURCE_PASSWORD`);
/// the `[kafka]` flags for a pipeline's `kafka` table too. `None` for a key no flag sets.
pub(super) fn flag_or_variable_of_key(key: &str) -> Option<String> {
    let mut cli = Cli::command();
    cli.build();
    let run = cli.find_subcommand("run")?;
    let key = key
        .strip_prefix("pipelines.kafka.")
        .map_or(key.to_owned(), |k| format!("kafka.{k}"));
    let flag = run
        .get_arguments()
        .filter(|a| !NOT_KEYS.contains(&a.get_id().as_str()))
        .find(|a| key_of_flag(a.get_id().as_str()) == key)
        .and_then(|a| match (a.get_long(), a.get_env(), a.is_hide_set()) {
            (_, Some(env), true) => Some(env.to_string_lossy().into_owned()),
            (Some(long), _, _) => Some(format!("--{long}")),
            _ => None,
        });
    flag
}

fn markdown<'a>(cli: &'a clap::Command) -> String {
    let mut flags: Vec<Flag<'a>> = Vec::new();
    let mut add = |arg: &'a Arg, command: &str| {
        if arg.is_hide_set() || matches!(arg.get_id().as_str(), "help" | "version") {
            return;
        }
        match flags.iter_mut().find(|f| same(f.arg, arg)) {
            Some(flag) => flag.commands.push(command.to_owned()),
            None => flags.push(Flag {
                arg,
                commands: vec![command.to_owned()],
            }),
        }
    };
    for arg in cli.get_arguments() {
        add(arg, "all");
    }
    for command in cli.get_subcommands() {
        for arg in command.get_arguments() {
            if !arg.is_global_set() {
                add(arg, command.get_name());
            }
        }
    }
    let mut headings: Vec<&str> = Vec::new();
    for flag in &flags {
        let heading = heading(flag.arg);
        if !headings.contains(&heading) {
            headings.push(heading);
        }
    }
    let mut out = String::new();
    for heading in headings {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "### {heading}\n\n| flag | variable | default | commands | what it sets |\n|---|---|---|---|---|\n"
        ));
        for flag in flags.iter().filter(|f| heading_of(f) == heading) {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                usage(flag.arg),
                flag.arg
                    .get_env()
                    .map(|v| format!("`{}`", v.to_string_lossy()))
                    .unwrap_or_default(),
                default(flag.arg),
                flag.commands.join(", "),
                cell(&first_paragraph(flag.arg)),
            ));
        }
    }
    out
}

/// Two commands' copies of one flattened flag are the same flag.
fn same(a: &Arg, b: &Arg) -> bool {
    a.get_id() == b.get_id() && a.get_long() == b.get_long() && a.get_help() == b.get_help()
}

fn heading(arg: &Arg) -> &str {
    arg.get_help_heading().unwrap_or("Each command's own")
}

fn heading_of<'a>(flag: &Flag<'a>) -> &'a str {
    heading(flag.arg)
}

/// `` `--slot NAME` ``, `` `--topic-case preserve\|lower\|upper` ``, `` `--yes` ``, `CONNECTOR`.
fn usage(arg: &Arg) -> String {
    let takes_value = !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    let value = if !takes_value {
        String::new()
    } else {
        let possible: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_owned())
            .collect();
        if possible.is_empty() {
            arg.get_value_names()
                .map(|names| {
                    names
                        .iter()
                        .map(|n| n.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
        } else {
            possible.join("\\|")
        }
    };
    let repeat = if matches!(arg.get_action(), ArgAction::Append) {
        " (repeatable)"
    } else {
        ""
    };
    match arg.get_long() {
        Some(long) if value.is_empty() => format!("`--{long}`"),
        Some(long) => format!("`--{long} {value}`{repeat}"),
        None => format!("`{value}`"),
    }
}

fn default(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    if values.is_empty() || !takes_value {
        String::new()
    } else {
        format!("`{}`", values.join(","))
    }
}

/// The help's first paragraph, on one line.
fn first_paragraph(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    help.split("\n\n")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_run_sets_a_key_of_the_file() {
        let keys = crate::config::reference::schema().to_string();
        let mut cli = Cli::command();
        cli.build();
        let run = cli.find_subcommand("run").expect("run");
        let page = configuration_markdown();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if NOT_KEYS.contains(&id) {
                continue;
            }
            let key = key_of_flag(id);
            let last = key.rsplit('.').next().expect("a key");
            assert!(
                keys.contains(&format!("\"{last}\"")),
                "--{id}: no key {key} in the schema"
            );
            let shown = arg.get_long().map(|l| format!("`--{l}`"));
            let shown = shown.filter(|_| !arg.is_hide_set()).unwrap_or_else(|| {
                format!("`{}`", arg.get_env().expect("a variable").to_string_lossy())
            });
            assert!(
                page.contains(&shown),
                "the configuration page does not show {shown} for {key}"
            );
        }
    }

    #[test]
    fn a_flag_of_several_commands_is_one_row_naming_them() {
        let page = reference_markdown();
        let slot = page
            .lines()
            .find(|l| l.starts_with("| `--slot NAME`") || l.starts_with("| `--slot SLOT`"))
            .unwrap_or_else(|| panic!("no --slot row in\n{page}"));
        assert!(slot.contains("`OUTBOX_RELAY_SLOT`"), "{slot}");
        assert!(slot.contains("`outbox_relay`"), "{slot}");
        assert!(slot.contains("run, setup, check"), "{slot}");
        assert_eq!(page.matches("| `--slot ").count(), 1, "{page}");
    }

    #[test]
    fn the_global_flags_are_listed_once_for_all_commands() {
        let page = reference_markdown();
        let level = page
            .lines()
            .find(|l| l.starts_with("| `--log-level"))
            .unwrap_or_else(|| panic!("no --log-level row in\n{page}"));
        assert!(level.contains("| all |"), "{level}");
        assert_eq!(page.matches("| `--log-level").count(), 1);
    }
}
