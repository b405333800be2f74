//! The command line's own errors, as a user meets them: without a source, with a bad value in
//! an environment variable, with misspelt keys in a config file, with no database listening.
//! No server is needed.

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

/// The librdkafka properties of `--kafka-properties-file` (or its variable) reach the
/// producer's settings and their checks: a file that turns idempotence off is refused like the
/// flag would be, and one that cannot be parsed is named by line, never shown.
#[test]
fn a_kafka_properties_file_is_read_and_checked_like_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka.properties");
    let base = [
        "run",
        "--source-url",
        "postgres://relay@127.0.0.1:1/app",
        "--bootstrap-servers",
        "127.0.0.1:1",
    ];
    std::fs::write(&file, "sasl.password=hunter2\nenable.idempotence=false\n").unwrap();
    let path = file.display().to_string();
    for output in [
        relay(
            &[&base[..], &["--kafka-properties-file", &path]].concat(),
            &[],
        ),
        relay(&base, &[("OUTBOX_RELAY_KAFKA_PROPERTIES_FILE", &path)]),
    ] {
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(3), "{text}");
        assert!(text.contains("enable.idempotence"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    // A command that never reaches Kafka ignores the variable, as every variable of a flag it
    // does not read: the file may be mounted only where `run` runs.
    let absent = dir.path().join("absent.properties").display().to_string();
    let output = relay(
        &["setup", "--source-url", "postgres://relay@127.0.0.1:1/app"],
        &[("OUTBOX_RELAY_KAFKA_PROPERTIES_FILE", &absent)],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(!text.contains("properties_file"), "{text}");
    std::fs::write(&file, "sasl.password hunter2\n").unwrap();
    let output = relay(
        &[&base[..], &["--kafka-properties-file", &path]].concat(),
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{text}");
    assert!(
        text.contains("kafka.properties_file") && text.contains("line 1: expected key=value"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

/// A one-shot command's output piped into a reader that goes away (`| head`) ends the command
/// quietly by SIGPIPE, as other command-line tools do, instead of a panic and exit code 101.
#[test]
fn output_into_a_closed_pipe_ends_the_command_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "setup",
            "--print-sql",
            "--source-url",
            "postgres://relay@127.0.0.1:1/app",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running outbox-relay");
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {}",
        output.status,
        stderr(&output)
    );
}

/// The start's one-line summary of the settings that differ from their defaults, from `run`
/// with `env` (the database and broker unreachable: it is read, then the relay is stopped).
fn run_summary(env: &[(&str, &str)]) -> String {
    use std::io::{BufRead, BufReader};
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    command
        .args([
            "run",
            "--source-url",
            "postgres://relay@127.0.0.1:1/app",
            "--bootstrap-servers",
            "127.0.0.1:1",
        ])
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOX_RELAY_") {
            command.env_remove(key);
        }
    }
    let mut child = command.spawn().expect("running outbox-relay");
    let stderr = child.stderr.take().unwrap();
    let (lines, found) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("starting pipeline") {
                let _ = lines.send(line);
                return;
            }
        }
    });
    let line = found.recv_timeout(std::time::Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    line.expect("no 'starting pipeline' line within 20 s")
}

/// A boolean flag's variable takes the usual spellings (1/0, yes/no, on/off, true/false), as
/// an operator writes them in a unit file or a pod spec.
#[test]
fn boolean_variables_take_1_yes_on_and_their_opposites() {
    for on in ["1", "yes", "on", "true"] {
        let summary = run_summary(&[("OUTBOX_RELAY_NO_CREATE_SLOT", on)]);
        assert!(summary.contains("\"create_slot\":false"), "{on}: {summary}");
    }
    for off in ["0", "no", "off", "false"] {
        let summary = run_summary(&[("OUTBOX_RELAY_NO_CREATE_SLOT", off)]);
        assert!(!summary.contains("\"create_slot\""), "{off}: {summary}");
    }
    let output = relay(
        &[
            "setup",
            "--print-sql",
            "--source-url",
            "postgres://relay@127.0.0.1:1/app",
        ],
        &[("OUTBOX_RELAY_NO_CREATE_SLOT", "maybe")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("OUTBOX_RELAY_NO_CREATE_SLOT"), "{text}");
}

/// A one-shot command meeting a database that is not up yet (a Kubernetes Job started before
/// PostgreSQL) exits 1, which a Job or a script retries, never one of the codes that say
/// retrying cannot help (3 to 5).
#[test]
fn setup_status_and_teardown_exit_1_when_the_database_is_unreachable() {
    // Port 1 on the loopback: nothing listens, the connection is refused at once.
    let url = "postgres://relay@127.0.0.1:1/app?connect_timeout=5";
    for command in [
        &["setup", "--source-url", url][..],
        &["status", "--source-url", url],
        &["teardown", "--source-url", url, "--yes"],
    ] {
        let output = relay(command, &[]);
        // `status` prints each pipeline's error in its table, on stdout.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            stderr(&output)
        );
        assert_eq!(output.status.code(), Some(1), "{command:?}: {text}");
        assert!(text.contains("127.0.0.1:1"), "{command:?}: {text}");
    }
}

/// `setup`, `check`, `status` and `teardown` refuse, on the command line, a flag of `run` they
/// do not read, naming it and the commands that read it; its environment variable is left
/// alone, so that one environment serves every command.
#[test]
fn a_flag_of_run_is_refused_by_the_commands_that_do_not_read_it_but_not_its_variable() {
    let url = "postgres://relay@127.0.0.1:1/app?connect_timeout=5";
    for command in ["setup", "check", "status", "teardown"] {
        let output = relay(
            &[
                command,
                "--source-url",
                url,
                "--metrics-listen",
                "0.0.0.0:9187",
            ],
            &[],
        );
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{command}: {text}");
        assert!(
            text.starts_with(&format!(
                "error: --metrics-listen is a flag of run; {command} does not read it"
            )),
            "{command}: {text}"
        );
    }
    let output = relay(
        &[
            "setup",
            "--source-url",
            url,
            "--bootstrap-servers",
            "k:9092",
        ],
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("--bootstrap-servers is a flag of run and check; setup does not read it"),
        "{text}"
    );

    let environment = [
        ("OUTBOX_RELAY_SOURCE_URL", url),
        ("OUTBOX_RELAY_METRICS_LISTEN", "0.0.0.0:9187"),
        ("OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", "5"),
        ("OUTBOX_RELAY_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
    ];
    let output = relay(&["setup", "--print-sql"], &environment);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("CREATE PUBLICATION"),
        "{text}"
    );
    // The others reach for the database, which does not answer: exit 1, not a usage error.
    for command in [&["status"][..], &["teardown", "--yes"]] {
        let output = relay(command, &environment);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{command:?}: {text}");
        assert!(!text.contains("does not read"), "{command:?}: {text}");
    }
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

/// A single-database flag set by its variable conflicts with `--config` as the flag would;
/// the error names the variable, since the flag is nowhere on the command line.
#[test]
fn a_variable_that_conflicts_with_config_is_named() {
    let output = relay(
        &["status", "--config", "relay.toml"],
        &[("OUTBOX_RELAY_SLOT", "orders")],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains(
            "cannot be used with '--slot <NAME>' (environment variable OUTBOX_RELAY_SLOT)"
        ),
        "{text}"
    );
}

/// `--pipeline` picks pipelines of a config file: without `--config` it is refused, naming
/// what to give.
#[test]
fn pipeline_without_a_config_file_is_refused() {
    for command in ["run", "status", "check", "setup", "teardown"] {
        let output = relay(
            &[
                command,
                "--source-url",
                "postgres://u@127.0.0.1:1/db",
                "--pipeline",
                "orders",
            ],
            &[],
        );
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{command}: {text}");
        assert!(
            text.contains("--pipeline chooses pipelines of a config file"),
            "{command}: {text}"
        );
    }
}

/// Given by flags, a configuration problem names the flag as well as the key.
#[test]
fn a_problem_with_the_flags_names_the_flag() {
    let output = relay(&["run", "--source-url", "postgres://u@h/db"], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{text}");
    assert!(
        text.contains("kafka.bootstrap_servers (--bootstrap-servers): must not be empty"),
        "{text}"
    );
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

const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";

/// A connector with `value_converter`, a key converter that writes what the relay writes and
/// the Event Router options `router`, written to a file in `dir`.
fn connector(
    dir: &std::path::Path,
    value_converter: &str,
    router: &[(&str, &str)],
) -> std::path::PathBuf {
    let mut config = serde_json::json!({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "db",
        "database.dbname": "orders",
        "plugin.name": "pgoutput",
        "table.include.list": "public.outboxevent",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": value_converter,
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
    });
    for (key, value) in router {
        config[format!("transforms.outbox.{key}")] = (*value).into();
    }
    let path = dir.join("connector.json");
    let body = serde_json::json!({"name": "orders", "config": config});
    std::fs::write(&path, body.to_string()).unwrap();
    path
}

#[test]
fn import_debezium_refuses_values_debezium_refuses_naming_the_option_and_accepted_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = connector(
        dir.path(),
        STRING_CONVERTER,
        &[
            ("table.op.invalid.behavior", "loud"),
            ("table.fields.additional.placement", ""),
        ],
    );
    let output = relay(&["import-debezium", path.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(output.stdout.is_empty(), "no config printed");
    assert!(
        text.contains("error: transforms.outbox.table.op.invalid.behavior: \"loud\"")
            && text.contains("warn, error and fatal"),
        "{text}"
    );
    assert!(
        text.contains("error: transforms.outbox.table.fields.additional.placement: \"\" is empty"),
        "{text}"
    );
    // Errors are listed before the other notes.
    let first_info = text.find("info: ").expect("info notes too");
    assert!(
        text.rfind("error: transforms").unwrap() < first_info,
        "{text}"
    );
}

#[test]
fn import_debezium_prints_no_config_for_differences_unless_they_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = connector(dir.path(), "io.confluent.connect.avro.AvroConverter", &[]);
    let output = relay(&["import-debezium", path.to_str().unwrap()], &[]);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(output.stdout.is_empty(), "no config printed");
    assert!(
        text.contains(
            "difference: value.converter: io.confluent.connect.avro.AvroConverter: not supported"
        ) && text.contains("--accept-differences"),
        "{text}"
    );
    let output = relay(
        &[
            "import-debezium",
            "--accept-differences",
            path.to_str().unwrap(),
        ],
        &[],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("[[pipelines]]"),
        "{text}"
    );
    // Without differences the config is printed and the exit code is 0.
    let path = connector(dir.path(), STRING_CONVERTER, &[]);
    let output = relay(&["import-debezium", path.to_str().unwrap()], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// Help is wrapped to the terminal's width: in a 100-column terminal (COLUMNS) no line of any
/// command's `--help` runs past the edge.
#[test]
fn every_commands_help_is_wrapped_to_100_columns() {
    for command in [
        "",
        "run",
        "setup",
        "check",
        "teardown",
        "status",
        "probe",
        "import-debezium",
    ] {
        let args: Vec<&str> = [command, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let output = relay(&args, &[("COLUMNS", "100")]);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let help = String::from_utf8_lossy(&output.stdout);
        let long: Vec<&str> = help.lines().filter(|l| l.chars().count() > 100).collect();
        assert!(
            long.is_empty(),
            "{args:?} has lines over 100 columns:\n{}",
            long.join("\n")
        );
    }
}
