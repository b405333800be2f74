//! The command line's own errors, as a user meets them: without a source, with a bad value in
//! an environment variable, with misspelt keys in a config file. No server is needed.

use std::process::{Command, Output};

fn relay(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    command.args(args).env_remove("RUST_LOG");
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOX_RELAY_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("running outbox-relay")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn run_without_a_source_says_how_to_give_one() {
    let output = relay(&["run"], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{text}");
    assert!(
        text.contains("--config FILE") && text.contains("--source-url URL"),
        "{text}"
    );
}

#[test]
fn a_bad_value_from_an_environment_variable_names_the_variable() {
    let output = relay(
        &[
            "run",
            "--source-url",
            "postgres://h/db",
            "--bootstrap-servers",
            "k:1",
        ],
        &[("OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", "abc")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("environment variable OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS"),
        "{text}"
    );
    // Given as a flag, the flag is named as clap names it.
    let output = relay(&["run", "--max-in-flight-events", "abc"], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(!text.contains("environment variable"), "{text}");
}

#[test]
fn misspelt_keys_in_a_config_file_come_all_at_once_one_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "[[pipelines]]\nname = \"p\"\ntable = \"public.outbox\"\nslott = \"s\"\nsource_urll = \"x\"\n",
    )
    .unwrap();
    let output = relay(&["run", "--config", path.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("unknown key")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        text.contains("  - pipelines[0].slott: unknown key; did you mean `slot`?"),
        "{text}"
    );
}
