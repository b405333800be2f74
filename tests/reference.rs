//! The reference pages against the code, so that neither drifts. The tables of metrics,
//! commands and flags, and configuration keys are generated from the code (the metrics'
//! registration, clap's definitions, the configuration's schema) between two marker lines of
//! their page; a page whose tables differ from what the code generates fails, naming the command
//! that rewrites them:
//!
//!     REGENERATE_REFERENCE=1 cargo test --test reference
//!
//! Text outside the markers is written by hand; the other tests check it names what it must.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const BEGIN: &str = "<!-- generated from the code by `REGENERATE_REFERENCE=1 cargo test --test reference`: edit the code, not this table -->\n";
const END: &str = "<!-- end of the generated reference -->\n";

/// Checks that the part of `path` between its markers is `generated`; with
/// `REGENERATE_REFERENCE=1`, writes it there instead.
fn check_generated(path: &str, generated: &str) {
    let page = read(path);
    let start = page
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{path}: no line {BEGIN:?}"))
        + BEGIN.len();
    let end = start
        + page[start..]
            .find(END)
            .unwrap_or_else(|| panic!("{path}: no line {END:?} after the first marker"));
    let current = &page[start..end];
    let wanted = format!("\n{generated}\n");
    if current == wanted {
        return;
    }
    if std::env::var_os("REGENERATE_REFERENCE").is_some_and(|v| v == "1") {
        let page = format!("{}{wanted}{}", &page[..start], &page[end..]);
        fs::write(Path::new(ROOT).join(path), page).unwrap_or_else(|e| panic!("{path}: {e}"));
        return;
    }
    let differs = current
        .lines()
        .zip(wanted.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(current.lines().count().min(wanted.lines().count()));
    panic!(
        "{path} is stale: its generated tables differ from the code's from line {} of the \
         table (code: {:?}, page: {:?}). Regenerate it with \
         `REGENERATE_REFERENCE=1 cargo test --test reference` and commit the page.",
        differs + 1,
        wanted.lines().nth(differs),
        current.lines().nth(differs),
    );
}

#[test]
fn the_metrics_reference_tables_are_generated_from_the_registered_metrics() {
    let metrics = outbox_relay::Metrics::new();
    check_generated(
        "docs/reference/metrics.md",
        &outbox_relay::metrics::reference_markdown(metrics.catalog()),
    );
}

#[test]
fn the_cli_reference_tables_are_generated_from_the_flags() {
    check_generated(
        "docs/reference/cli.md",
        &outbox_relay::cli::reference::reference_markdown(),
    );
}

#[test]
fn the_configuration_reference_tables_are_generated_from_the_schema() {
    check_generated(
        "docs/reference/configuration.md",
        &outbox_relay::cli::reference::configuration_markdown(),
    );
}

#[test]
fn every_metric_the_registry_serves_is_in_the_catalog() {
    let metrics = outbox_relay::Metrics::new();
    let catalog: BTreeSet<&str> = metrics.catalog().iter().map(|m| m.name).collect();
    let code: BTreeSet<String> = metric_names(&read("src/metrics.rs"))
        .into_iter()
        .filter(|n| n != "outbox_relay_")
        .collect();
    let code: BTreeSet<&str> = code.iter().map(String::as_str).collect();
    assert_eq!(
        catalog, code,
        "every metric is registered through the catalog's Registrar"
    );
}

/// Every `outbox_relay_<name>` in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outbox_relay_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
fn the_metrics_reference_lists_every_metric_and_no_other() {
    let mut code = metric_names(&read("src/metrics.rs"));
    code.retain(|n| n != "outbox_relay_");
    let doc = metric_names(&read("docs/reference/metrics.md"));
    let missing: Vec<_> = code.difference(&doc).collect();
    let unknown: Vec<_> = doc.difference(&code).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/reference/metrics.md lacks {missing:?} and names {unknown:?}, which src/metrics.rs does not register"
    );
}

#[test]
fn the_cli_reference_names_every_command_and_flag() {
    let doc = read("docs/reference/cli.md");
    let exe = env!("CARGO_BIN_EXE_outbox-relay");
    let help = |args: &[&str]| {
        let out = Command::new(exe).args(args).arg("--help").output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let commands: Vec<String> = help(&[])
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A command's line; its description's wrapped lines are indented further.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 6, "{commands:?}");
    let mut missing = Vec::new();
    for command in &commands {
        if !doc.contains(&format!("## {command}")) {
            missing.push(format!("section ## {command}"));
        }
        for line in help(&[command]).lines() {
            // A flag's own line, not a description that mentions one.
            if !line.trim_start().starts_with('-') {
                continue;
            }
            let Some(flag) = line.split_whitespace().find(|w| w.starts_with("--")) else {
                continue;
            };
            let flag = flag.trim_end_matches(',');
            if flag != "--help" && flag != "--version" && !doc.contains(flag) {
                missing.push(format!("{command} {flag}"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/reference/cli.md lacks {missing:?}"
    );
}

#[test]
fn the_configuration_reference_names_every_pipeline_key() {
    let source = read("src/config/mod.rs");
    let start = source
        .find("pub struct PipelineConfig {")
        .expect("PipelineConfig");
    let body = &source[start..start + source[start..].find("\n}\n").unwrap()];
    let keys: Vec<&str> = body
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split(':').next())
        .filter(|k| !k.contains(' '))
        .collect();
    assert!(keys.len() > 20, "{keys:?}");
    let doc = read("docs/reference/configuration.md");
    let missing: Vec<&&str> = keys
        .iter()
        .filter(|k| !doc.contains(&format!("`{k}")) && !doc.contains(&format!("{k} =")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/reference/configuration.md lacks {missing:?}"
    );
}
