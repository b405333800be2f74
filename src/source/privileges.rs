//! What the relay's role may do on the source, as `run` checks it at a session's start and
//! `check` reports it, in one sentence each so the two cannot drift: REPLICATION for log
//! tailing, the outbox table's privileges for polling.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::replication::quote_ident;
use super::SourceError;
use crate::config::{MarkMode, PipelineConfig};

/// SQLSTATE of a walsender refused to a role without REPLICATION (`must be superuser or
/// replication role to start walsender`).
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Why `role` cannot stream, with the fix.
pub fn no_replication(role: &str) -> String {
    format!(
        "role {role:?} may not stream (it has neither REPLICATION nor SUPERUSER): ALTER ROLE {} REPLICATION, or use the polling source",
        quote_ident(role)
    )
}

/// The current role's name and whether it may stream (REPLICATION or SUPERUSER).
///
/// Returns an error if the query fails.
pub async fn replication_role(client: &Client) -> Result<(String, bool), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_user::text, rolreplication OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// After the walsender refused the replication connection with `refused`: the
/// [`no_replication`] sentence when the role lacks REPLICATION (read over an SQL connection of
/// `config`), else `refused` itself. A session stops on either.
pub async fn explain_walsender_refusal(
    config: &PipelineConfig,
    refused: SourceError,
) -> SourceError {
    let SourceError::Server { code, .. } = &refused else {
        return refused;
    };
    if code != INSUFFICIENT_PRIVILEGE {
        return refused;
    }
    let Ok((client, _connection)) = super::slot::connect(config).await else {
        return refused;
    };
    match replication_role(&client).await {
        Ok((role, false)) => SourceError::Privilege(no_replication(&role)),
        _ => refused,
    }
}

/// After `setup`'s `CREATE PUBLICATION` failed with `refused`: when the role lacked a
/// privilege (SQLSTATE 42501: it does not own the outbox table, or may not CREATE in the
/// database), a [`SourceError::Privilege`] naming the role, the publication, the table and who
/// may create it; any other error as it came.
pub async fn explain_publication_refusal(
    client: &Client,
    config: &PipelineConfig,
    refused: tokio_postgres::Error,
) -> SourceError {
    if refused.code() != Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return SourceError::Sql(refused);
    }
    let Ok(role) = client.query_one("SELECT current_user::text", &[]).await else {
        return SourceError::Sql(refused);
    };
    let role: String = role.get(0);
    let server_says = refused
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    SourceError::Privilege(format!(
        "role {role:?} may not create publication {:?} for table {} ({server_says}): \
         CREATE PUBLICATION needs the table's owner (or a superuser) with CREATE on the \
         database; run outbox-relay setup as that role, or have it run the statements \
         outbox-relay setup --print-sql prints",
        config.publication,
        config.table.quoted()
    ))
}

/// The privileges a polling pipeline needs on its outbox table: SELECT, UPDATE (DELETE with
/// `mark = "delete"`), and DELETE for `purge_published_after_secs`.
pub fn polling_needs(config: &PipelineConfig) -> Vec<&'static str> {
    let polling = &config.polling;
    let mut needed = vec!["SELECT"];
    match polling.mark {
        MarkMode::Status | MarkMode::Flag => needed.push("UPDATE"),
        MarkMode::Delete => needed.push("DELETE"),
    }
    if polling.purge_published_after_secs.is_some() && !needed.contains(&"DELETE") {
        needed.push("DELETE");
    }
    needed
}

/// What the current role lacks of [`polling_needs`] on the outbox table, with the fix; `None`
/// when it has them all. `run` stops with it and `check` prints it.
///
/// Returns an error if a query fails (the table must exist).
pub async fn polling_missing(
    client: &Client,
    config: &PipelineConfig,
) -> Result<Option<String>, tokio_postgres::Error> {
    let table = config.table.quoted();
    let role: String = client
        .query_one("SELECT current_user::text", &[])
        .await?
        .get(0);
    let mut missing = Vec::new();
    for privilege in polling_needs(config) {
        let granted: bool = client
            .query_one(
                "SELECT has_table_privilege(to_regclass($1), $2)",
                &[&table, &privilege],
            )
            .await?
            .get(0);
        if !granted {
            missing.push(privilege);
        }
    }
    Ok((!missing.is_empty()).then(|| {
        format!(
            "role {role:?} may not read and mark the rows of {} (mark = \"{}\"): GRANT {} ON {table} TO {}",
            config.table,
            format!("{:?}", config.polling.mark).to_lowercase(),
            missing.join(", "),
            quote_ident(&role)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_fix_quotes_the_role() {
        assert_eq!(
            no_replication("App User"),
            "role \"App User\" may not stream (it has neither REPLICATION nor SUPERUSER): ALTER ROLE \"App User\" REPLICATION, or use the polling source"
        );
    }
}
