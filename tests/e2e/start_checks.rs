//! `run` diagnoses like `check`: what retrying cannot fix in the database (a role without
//! REPLICATION, a publication that leaves the outbox out or does not publish inserts, a table
//! without a mapped column) stops the pipeline at its start with the sentence `check` prints,
//! fix included, and the documented exit code.

use std::time::Duration;

use crate::support::{self, kafka, unique_name, within, Auth, Relay, QUERY_DEADLINE};
use crate::Setup;

/// Runs `args` as `run` and as `check`; returns run's exit code and log, and check's log.
fn run_and_check(args: &[String]) -> (Option<i32>, String, String) {
    let mut relay = Relay::spawn(args);
    let status = relay.wait(Duration::from_secs(60));
    let mut check_args = args.to_vec();
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    assert!(
        !check.wait(Duration::from_secs(60)).success(),
        "check passed:\n{}",
        check.log()
    );
    (status.code(), relay.log(), check.log())
}

/// The relay's `run` arguments for `setup`, connecting as `role` (no password: trust).
fn args_as(setup: &Setup, role: &str) -> Vec<String> {
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    args[2] = format!(
        "postgres://{role}@127.0.0.1:{}/{}",
        setup.db.port(),
        setup.db.name
    );
    args
}

/// Asserts that run exited with `code` and that both run and check print `sentence`.
fn both_say(args: &[String], code: i32, sentence: &str) {
    let (status, run, check) = run_and_check(args);
    assert_eq!(status, Some(code), "run exited with {status:?}:\n{run}");
    assert!(
        run.contains(sentence),
        "run does not say {sentence:?}:\n{run}"
    );
    assert!(
        check.contains(sentence),
        "check does not say {sentence:?}:\n{check}"
    );
}

/// Runs `args` as `run` and as `check`; asserts that run exited with `code` and that its log
/// carries, whole, the sentence of check's FAIL line for `finding`. Returns that sentence.
pub(crate) fn run_stops_with_checks_sentence(args: &[String], finding: &str, code: i32) -> String {
    let (status, run, check) = run_and_check(args);
    let sentence = check
        .lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix("FAIL")?.trim_start();
            Some(rest.strip_prefix(finding)?.trim_start().to_owned())
        })
        .unwrap_or_else(|| panic!("check does not fail {finding:?}:\n{check}"));
    assert_eq!(status, Some(code), "run exited with {status:?}:\n{run}");
    assert!(
        run.contains(&sentence),
        "run does not stop with check's {finding:?} sentence {sentence:?}:\n{run}"
    );
    sentence
}

/// With `op_invalid_behavior = "warn"`, `setup` creates the publication with updates and
/// deletes (the pipeline reads them), and `run` then streams instead of refusing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_a_publication_with_what_op_invalid_behavior_reads() {
    let setup = Setup::new("setup_ops", &["Order"], 1).await;
    let publication = format!("{}_pub", setup.db.name);
    let mut args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let at = args.iter().position(|a| a == "--publication").unwrap() + 1;
    args[at] = publication.clone();
    args.extend(["--op-invalid-behavior".into(), "warn".into()]);
    let mut setup_args = args.clone();
    setup_args = crate::as_command(&setup_args, "setup");
    let mut command = Relay::spawn(&setup_args);
    let status = command.wait(Duration::from_secs(60));
    assert!(status.success(), "setup failed:\n{}", command.log());
    let row = setup
        .db
        .client
        .query_one(
            "SELECT pubinsert, pubupdate, pubdelete FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .unwrap();
    let ops: (bool, bool, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(ops, (true, true, true), "the publication setup created");
    let _relay = Relay::spawn(&args);
    setup.wait_streaming().await;
}

/// `setup` run as a role that does not own the outbox table cannot create the publication:
/// it stops with exit code 4, naming the role, the publication and the table, and says who may
/// (the table's owner) and how a DBA gets the statements (`setup --print-sql`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_as_a_role_that_does_not_own_the_table_names_who_may_create_the_publication() {
    let setup = Setup::new("setup_not_owner", &["Order"], 1).await;
    let role = format!("{}_notown", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN REPLICATION; GRANT CREATE ON DATABASE {} TO {role}",
            setup.db.name
        ))
        .await
        .unwrap();
    let mut args = args_as(&setup, &role);
    let at = args.iter().position(|a| a == "--publication").unwrap() + 1;
    args[at] = format!("{}_new_pub", setup.db.name);
    args.push("--no-slot-record".into());
    let mut command = Relay::spawn(&crate::as_command(&args, "setup"));
    let status = command.wait(Duration::from_secs(60));
    let log = command.log();
    assert_eq!(status.code(), Some(4), "setup exited with {status}:\n{log}");
    for says in [
        format!("role \"{role}\" may not create publication"),
        "\"public\".\"outbox\"".to_string(),
        "owner".to_string(),
        "setup --print-sql".to_string(),
    ] {
        assert!(log.contains(&says), "setup does not say {says:?}:\n{log}");
    }
}

/// Log tailing needs no SELECT on the outbox table (the walsender decodes without it): a
/// role with REPLICATION and no grant streams, and `check` warns about the grant instead of
/// failing the pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_role_without_select_streams_and_check_only_warns() {
    let setup = Setup::new("no_select", &["Order"], 1).await;
    let role = format!("{}_nosel", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!("CREATE ROLE {role} LOGIN REPLICATION"))
        .await
        .unwrap();
    let mut args = args_as(&setup, &role);
    args.push("--no-slot-record".into());
    let mut check_args = args.clone();
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    let passed = check.wait(Duration::from_secs(60)).success();
    let log = check.log();
    let line = log
        .lines()
        .find(|l| l.contains("outbox table"))
        .unwrap_or_else(|| panic!("no outbox table finding:\n{log}"));
    assert!(
        line.contains("WARN") && line.contains("GRANT SELECT"),
        "check's outbox table line: {line}\n{log}"
    );
    assert!(passed, "check failed:\n{log}");

    let _relay = Relay::spawn(&args);
    setup.wait_streaming().await;
    setup.one_event_flows().await;
}

/// A role without REPLICATION: the walsender refuses it; run stops with exit code 4 and
/// check's `ALTER ROLE ... REPLICATION`, not the server's bare refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_replication_stops_run_with_checks_fix_and_exit_code_4() {
    let setup = Setup::new("no_repl", &["Order"], 1).await;
    let role = format!("{}_norepl", setup.db.name);
    setup
        .db
        .client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT SELECT ON public.outbox TO {role}"
        ))
        .await
        .unwrap();
    let args = args_as(&setup, &role);
    both_say(
        &args,
        4,
        &format!("role \"{role}\" may not stream (it has neither REPLICATION nor SUPERUSER): ALTER ROLE \"{role}\" REPLICATION"),
    );
}

/// A publication without the outbox table, then one that does not publish inserts: run stops
/// with exit code 3 and the fix check prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_that_leaves_the_outbox_out_stops_run_with_checks_fix() {
    let setup = Setup::new("pub_parity", &["Order"], 1).await;
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let c = &setup.db.client;
    c.batch_execute("ALTER PUBLICATION outbox_pub DROP TABLE public.outbox")
        .await
        .unwrap();
    both_say(
        &args,
        3,
        "table public.outbox is not in publication \"outbox_pub\": ALTER PUBLICATION \"outbox_pub\" ADD TABLE \"public\".\"outbox\"",
    );
    c.batch_execute(
        "ALTER PUBLICATION outbox_pub ADD TABLE public.outbox; ALTER PUBLICATION outbox_pub SET (publish = 'update')",
    )
    .await
    .unwrap();
    both_say(
        &args,
        3,
        "publication \"outbox_pub\" does not publish inserts: ALTER PUBLICATION \"outbox_pub\" SET (publish = 'insert')",
    );
    // op_invalid_behavior = error wants updates and deletes, which an insert-only publication
    // never sends: the start refuses instead of passing them over unseen.
    c.batch_execute("ALTER PUBLICATION outbox_pub SET (publish = 'insert')")
        .await
        .unwrap();
    let mut strict = args.clone();
    strict.extend(["--op-invalid-behavior".to_owned(), "error".to_owned()]);
    both_say(
        &strict,
        3,
        "publication \"outbox_pub\" does not publish updates and deletes, which op_invalid_behavior = warn or error needs to see",
    );
}

/// A table without a mapped column: run stops at its start with exit code 3 and check's
/// sentence, instead of streaming until the first insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_table_without_a_mapped_column_stops_run_at_its_start() {
    let setup = Setup::new("no_column", &["Order"], 1).await;
    setup
        .db
        .client
        .batch_execute("ALTER TABLE public.outbox RENAME COLUMN event_type TO kind")
        .await
        .unwrap();
    both_say(
        &setup.relay_args(&kafka().bootstrap(), Auth::Trust),
        3,
        "missing \"event_type\" (columns.event_type) in the outbox table public.outbox",
    );
}

/// Every replication slot of the server taken: not a stop, since dropping a slot resolves it.
/// The start retries with the sentence `check` prints (instead of a bare "sql connection
/// error"), and streams once a slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_free_replication_slot_is_retried_with_checks_sentence_until_one_is_freed() {
    let cluster = support::PgCluster::start_private(&unique_name("full_slots"));
    cluster.psql("postgres", "ALTER SYSTEM SET max_replication_slots = 1");
    cluster.restart("fast");
    let setup = Setup::new_on(&cluster, "full_slots", &["Order"], 1).await;
    let c = &setup.db.client;
    c.batch_execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
        .await
        .unwrap();
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let sentence = format!(
        "no replication slot is free for slot \"{}\": raise max_replication_slots",
        setup.slot
    );
    let mut check_args = args.clone();
    check_args = crate::as_command(&check_args, "check");
    let mut check = Relay::spawn(&check_args);
    assert!(!check.wait(Duration::from_secs(60)).success());
    assert!(check.log().contains(&sentence), "{}", check.log());
    let mut relay = Relay::spawn(&args);
    // The log quotes the error as a field: its quotes are escaped.
    relay
        .wait_for_log(&sentence.replace('"', "\\\""), Duration::from_secs(30))
        .await;
    assert!(relay.is_running(), "stopped:\n{}", relay.log());
    c.batch_execute("SELECT pg_drop_replication_slot('taken')")
        .await
        .unwrap();
    setup.wait_streaming().await;
}

/// A slot of the pipeline's name that is no logical pgoutput slot of this database (here a
/// physical one) stops run with check's sentence, which says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_of_another_kind_stops_run_with_checks_sentence() {
    let setup = Setup::new("foreign_slot", &["Order"], 1).await;
    within(
        "creating a physical slot",
        QUERY_DEADLINE,
        setup.db.client.execute(
            "SELECT pg_catalog.pg_create_physical_replication_slot($1)",
            &[&setup.slot],
        ),
    )
    .await
    .unwrap();
    let args = setup.relay_args(&kafka().bootstrap(), Auth::Trust);
    let sentence = run_stops_with_checks_sentence(&args, "slot", 3);
    assert!(
        sentence.contains("is a physical slot") && sentence.contains("slot name of its own"),
        "{sentence}"
    );
    setup.db.drop_slot(&setup.slot).await;
}
