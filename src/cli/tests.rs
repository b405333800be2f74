//! The command line's parsing: which flags apply together, and what they become.

use super::args::{Cli, Command, RunArgs};
use super::commands::pipelines;
use clap::error::ErrorKind;
use clap::CommandFactory;

/// Flags of `run` that apply with `--config` too; every other one is a single-database
/// flag, which `--config` must refuse rather than ignore.
const WITH_CONFIG: &[&str] = &[
    "config",
    "pipelines",
    "metrics_listen",
    "no_create_slot",
    "no_slot_record",
    "on_pipeline_failure",
    "log_format",
    "log_level",
    "help",
];

/// Held by every test that parses: one of them sets an `OUTBOX_RELAY_*` variable, which a
/// parse on another test thread would otherwise see.
static ENVIRONMENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn environment() -> std::sync::MutexGuard<'static, ()> {
    ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner())
}

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_command_line(std::iter::once("outbox-relay").chain(argv.iter().copied()))
}

fn run_args(argv: &[&str]) -> RunArgs {
    match parse(argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
        .command
    {
        Command::Run(args) => args,
        _ => unreachable!("not run"),
    }
}

#[test]
fn config_refuses_every_single_database_flag_and_its_variable() {
    let _environment = environment();
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("a run command");
    let mut refused = 0;
    for arg in run.get_arguments() {
        if WITH_CONFIG.contains(&arg.get_id().as_str()) {
            continue;
        }
        let flag = format!("--{}", arg.get_long().expect("every flag is long"));
        let mut argv = vec!["run", "--config", "relay.toml", flag.as_str()];
        let possible = arg.get_possible_values();
        if arg.get_action().takes_values() {
            argv.push(match flag.as_str() {
                _ if !possible.is_empty() => possible[0].get_name(),
                "--kafka-property" => "linger.ms=1",
                "--table" => "public.outbox",
                _ => "1",
            });
        }
        match parse(&argv) {
            Err(e) if e.kind() == ErrorKind::ArgumentConflict => refused += 1,
            Err(e) => panic!("{argv:?}: not refused as a conflict: {e}"),
            Ok(_) => panic!("{argv:?}: --config accepted {flag}, which it would ignore"),
        }
    }
    assert!(refused >= 20, "only {refused} single-database flags");
    // From the environment too: a variable left over from a single-database deployment
    // must not be ignored.
    std::env::set_var("OUTBOX_RELAY_EXACTLY_ONCE", "true");
    let from_env = parse(&["run", "--config", "relay.toml"]);
    std::env::remove_var("OUTBOX_RELAY_EXACTLY_ONCE");
    assert_eq!(
        from_env.err().map(|e| e.kind()),
        Some(ErrorKind::ArgumentConflict),
        "--config with OUTBOX_RELAY_EXACTLY_ONCE=true"
    );
}

#[test]
fn pipeline_no_create_slot_and_no_slot_record_apply_to_the_config_file() {
    let _environment = environment();
    let dir = std::env::temp_dir().join(format!("outbox-relay-main-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("relay.toml");
    std::fs::write(
        &path,
        r#"
        [kafka]
        bootstrap_servers = "k:9092"
        [[pipelines]]
        name = "orders"
        source_url = "postgres://u@h/orders"
        slot = "orders_slot"
        publication = "pub"
        table = "outbox"
        [[pipelines]]
        name = "billing"
        source_url = "postgres://u@h/billing"
        slot = "billing_slot"
        publication = "pub"
        table = "outbox"
        "#,
    )
    .unwrap();
    let file = path.to_str().unwrap();

    let (all, _) = pipelines(run_args(&["run", "--config", file]), true).unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|p| p.create_slot && p.slot_record));

    let (chosen, _) = pipelines(
        run_args(&[
            "run",
            "--config",
            file,
            "--pipeline",
            "billing",
            "--no-create-slot",
            "--no-slot-record",
        ]),
        true,
    )
    .unwrap();
    assert_eq!(
        chosen
            .iter()
            .map(|p| (p.name.as_str(), p.create_slot, p.slot_record))
            .collect::<Vec<_>>(),
        [("billing", false, false)]
    );

    let unknown = pipelines(
        run_args(&["run", "--config", file, "--pipeline", "payments"]),
        true,
    )
    .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains("--pipeline payments: no such pipeline in"),
        "{unknown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The long help of `command`, as `outbox-relay <command> --help` prints it.
fn help(command: &str) -> String {
    let mut cli = Cli::command();
    cli.build();
    cli.find_subcommand_mut(command)
        .expect("a command")
        .render_long_help()
        .to_string()
}

#[test]
fn setup_status_and_teardown_show_only_the_database_flags_they_read() {
    for command in ["setup", "status", "teardown"] {
        let help = help(command);
        for own in [
            "--config",
            "--source-url",
            "--slot",
            "--table",
            "--log-level",
        ] {
            assert!(help.contains(own), "{command} --help lacks {own}:\n{help}");
        }
        for other in [
            "--bootstrap-servers",
            "--metrics-listen",
            "--max-in-flight-events",
            "--topic-template",
            "--exactly-once",
            "--status-interval-ms",
        ] {
            assert!(
                !help.contains(other),
                "{command} --help shows {other}:\n{help}"
            );
        }
    }
    // setup --print-sql reads --message-prefix, and --op-invalid-behavior decides what its
    // publication publishes; status reads --standby-url; teardown none of them.
    assert!(help("setup").contains("--message-prefix"));
    assert!(help("setup").contains("--op-invalid-behavior"));
    assert!(help("status").contains("--standby-url"));
    let teardown = help("teardown");
    for unread in ["--message-prefix", "--failover", "--standby-url"] {
        assert!(
            !teardown.contains(unread),
            "teardown --help shows {unread}:\n{teardown}"
        );
    }
}

#[test]
fn check_shows_what_it_checks_but_not_the_process_or_delivery_flags() {
    let help = help("check");
    for shown in ["--bootstrap-servers", "--topic-template", "--exactly-once"] {
        assert!(help.contains(shown), "check --help lacks {shown}:\n{help}");
    }
    for hidden in [
        "--metrics-listen",
        "--max-in-flight-events",
        "--shutdown-timeout-secs",
    ] {
        assert!(
            !help.contains(hidden),
            "check --help shows {hidden}:\n{help}"
        );
    }
}

/// `argv`'s error, which must be a usage error (exit code 2).
fn refused(argv: &[&str]) -> String {
    match parse(argv) {
        Ok(_) => panic!("{argv:?}: accepted"),
        Err(e) => {
            assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
            e.to_string()
        }
    }
}

#[test]
fn a_command_refuses_a_flag_of_run_it_does_not_read() {
    let _environment = environment();
    let source = ["--source-url", "postgres://relay@db/app"];
    for command in ["setup", "check", "status", "teardown"] {
        let argv: Vec<&str> = [command]
            .into_iter()
            .chain(source)
            .chain(["--metrics-listen", "127.0.0.1:9187"])
            .collect();
        let error = refused(&argv);
        let sentence =
            format!("error: --metrics-listen is a flag of run; {command} does not read it");
        assert!(error.starts_with(&sentence), "{argv:?}: {error}");
        assert!(
            error.contains("OUTBOX_RELAY_METRICS_LISTEN may stay in the environment"),
            "{error}"
        );
    }
    // The sentence names every command that reads the flag.
    let error = refused(&[
        "setup",
        "--source-url",
        "u",
        "--bootstrap-servers",
        "k:9092",
    ]);
    assert!(
        error.contains("--bootstrap-servers is a flag of run and check; setup does not read it"),
        "{error}"
    );
    let error = refused(&["setup", "--source-url", "u", "--standby-url", "s"]);
    assert!(
        error.contains("--standby-url is a flag of run, check and status; setup does not read it"),
        "{error}"
    );
    let error = refused(&[
        "status",
        "--source-url",
        "u",
        "--max-in-flight-events",
        "5",
        "--topic-case",
        "lower",
    ]);
    assert!(
        error.contains("--topic-case is a flag of run and check, --max-in-flight-events a flag of run; status does not read them")
            || error.contains("--max-in-flight-events is a flag of run, --topic-case a flag of run and check; status does not read them"),
        "{error}"
    );
    // What a command reads stays accepted.
    for argv in [
        &[
            "check",
            "--source-url",
            "u",
            "--bootstrap-servers",
            "k:9092",
        ][..],
        &["status", "--source-url", "u", "--standby-url", "s"],
        &[
            "setup",
            "--source-url",
            "u",
            "--failover",
            "--message-prefix",
            "outbox",
        ],
        &[
            "setup",
            "--source-url",
            "u",
            "--op-invalid-behavior",
            "warn",
            "--print-sql",
        ],
        &["teardown", "--source-url", "u", "--slot", "old", "--yes"],
    ] {
        parse(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    }
}

#[test]
fn every_flag_hidden_from_a_commands_help_is_refused_on_its_command_line() {
    let _environment = environment();
    let mut cli = Cli::command();
    cli.build();
    let run: Vec<clap::Arg> = cli
        .find_subcommand("run")
        .expect("a run command")
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some())
        .cloned()
        .collect();
    let mut refused_flags = 0;
    for command in ["setup", "check", "status", "teardown"] {
        let hidden: Vec<&str> = cli
            .find_subcommand(command)
            .expect("a command")
            .get_arguments()
            .filter(|a| a.is_hide_set())
            .map(|a| a.get_id().as_str())
            .collect();
        for arg in run.iter().filter(|a| hidden.contains(&a.get_id().as_str())) {
            let long = arg.get_long().expect("a long flag");
            let flag = format!("--{long}");
            let mut argv = vec![command, "--source-url", "u", flag.as_str()];
            let possible = arg.get_possible_values();
            if arg.get_action().takes_values() {
                argv.push(match long {
                    _ if !possible.is_empty() => possible[0].get_name(),
                    "metrics-listen" => "127.0.0.1:9187",
                    "kafka-property" => "linger.ms=1",
                    _ => "1",
                });
            }
            if arg.get_help_heading() == Some("Exactly-once") && arg.get_id() != "exactly_once" {
                argv.push("--exactly-once");
            }
            let error = refused(&argv);
            assert!(
                error.starts_with("error: --")
                    && error.contains(&format!("{flag} "))
                    && error.contains(&format!("{command} does not read")),
                "{argv:?}: {error}"
            );
            refused_flags += 1;
        }
    }
    assert!(refused_flags >= 50, "only {refused_flags} refusals");
}

#[test]
fn the_variables_of_flags_a_command_does_not_read_are_accepted() {
    let _environment = environment();
    let variables = [
        ("OUTBOX_RELAY_METRICS_LISTEN", "127.0.0.1:9187"),
        ("OUTBOX_RELAY_BOOTSTRAP_SERVERS", "kafka:9092"),
        ("OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", "5"),
        ("OUTBOX_RELAY_STANDBY_URL", "postgres://relay@standby/app"),
    ];
    for (variable, value) in variables {
        std::env::set_var(variable, value);
    }
    let parsed: Vec<_> = ["setup", "check", "status", "teardown"]
        .into_iter()
        .map(|command| {
            (
                command,
                parse(&[command, "--source-url", "postgres://relay@db/app"]),
            )
        })
        .collect();
    for (variable, _) in variables {
        std::env::remove_var(variable);
    }
    for (command, parsed) in parsed {
        parsed.unwrap_or_else(|e| panic!("{command} with run's variables: {e}"));
    }
}

#[test]
fn max_event_bytes_comes_from_its_flag_or_variable_and_is_unset_without() {
    let _environment = environment();
    let base = ["run", "--source-url", "postgres://relay@db/app"];
    let with = |extra: &[&str]| {
        let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
        run_args(&argv).into_config().max_event_bytes
    };
    assert_eq!(with(&["--max-event-bytes", "2000"]), Some(2000));
    assert_eq!(with(&[]), None, "unset: the sink's own maximum");
    std::env::set_var("OUTBOX_RELAY_MAX_EVENT_BYTES", "3000");
    let from_env = with(&[]);
    std::env::remove_var("OUTBOX_RELAY_MAX_EVENT_BYTES");
    assert_eq!(from_env, Some(3000));
}

/// Other users of the host can read a process's arguments: no example command line of
/// `run --help` carries a password (`scheme://user:password@host`).
#[test]
fn run_help_puts_no_password_on_an_example_command_line() {
    let help = help("run");
    for line in help.lines().filter(|l| l.contains("outbox-relay ")) {
        let userinfo = line
            .split("://")
            .skip(1)
            .filter_map(|rest| rest.split(['/', ' ']).next())
            .filter_map(|authority| authority.rsplit_once('@').map(|(user, _)| user));
        for user in userinfo {
            assert!(
                !user.contains(':'),
                "a password on an example command line: {line}"
            );
        }
    }
    assert!(
        help.contains("OUTBOX_RELAY_SOURCE_URL"),
        "the example sets the source URL from the environment:\n{help}"
    );
}
