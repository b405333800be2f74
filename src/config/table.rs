//! Schema-qualified table names as the config writes them, and SQL identifier quoting.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Quotes an SQL identifier (`"Outbox-Events"`, a `"` inside doubled), as PostgreSQL's
/// `quote_ident` does for every name.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// A schema-qualified table name: `schema.table`, or `table` for `public.table`.
///
/// Each part is either double-quoted with PostgreSQL's rules (`"Billing-Prod"."Outbox"`, `""`
/// for a quote inside, dots allowed) or unquoted, which is taken as written: no case folding
/// (`Billing.Outbox` names the schema `Billing`, unlike in SQL), and no `.`, `"` or
/// whitespace. [`TableName::quoted`] gives the SQL form; `Display` the config form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableName {
    /// The schema as PostgreSQL stores it (`pg_namespace.nspname`), without quotes.
    pub schema: String,
    /// The table as PostgreSQL stores it (`pg_class.relname`), without quotes.
    pub name: String,
}

/// PostgreSQL keeps the first 63 bytes of an identifier (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

impl TableName {
    /// The name for SQL text: both parts double-quoted (`"Billing-Prod"."Outbox"`).
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

/// Reads one identifier from the start of `s`; returns it and the rest of `s`.
fn parse_identifier(s: &str) -> Result<(String, &str), String> {
    if let Some(mut rest) = s.strip_prefix('"') {
        let mut ident = String::new();
        loop {
            let Some(end) = rest.find('"') else {
                return Err("a quoted name is not closed".into());
            };
            ident.push_str(&rest[..end]);
            rest = &rest[end + 1..];
            match rest.strip_prefix('"') {
                // `""` is a quote inside the name.
                Some(after) => {
                    ident.push('"');
                    rest = after;
                }
                None => break,
            }
        }
        if ident.is_empty() {
            return Err("a quoted name is empty".into());
        }
        return Ok((ident, rest));
    }
    let end = s.find(['.', '"']).unwrap_or(s.len());
    let ident = &s[..end];
    if ident.is_empty() {
        return Err("a name is empty".into());
    }
    if ident.contains(char::is_whitespace) {
        return Err(format!(
            "{ident:?} contains whitespace: double-quote the name"
        ));
    }
    if s[end..].starts_with('"') {
        return Err(format!(
            "a quote after {ident:?}: double-quote the whole name"
        ));
    }
    Ok((ident.to_owned(), &s[end..]))
}

impl FromStr for TableName {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |problem: String| {
            ConfigError::new(
                "table",
                format!(
                    "{s:?}: {problem} (write schema.table; double-quote a name as in SQL, e.g. \"Billing-Prod\".\"Outbox\")"
                ),
            )
        };
        let (first, rest) = parse_identifier(s).map_err(invalid)?;
        let (schema, name) = match rest.strip_prefix('.') {
            None if rest.is_empty() => ("public".to_owned(), first),
            None => return Err(invalid(format!("unexpected {rest:?} after the name"))),
            Some(rest) => {
                let (second, rest) = parse_identifier(rest).map_err(invalid)?;
                if !rest.is_empty() {
                    return Err(invalid(format!("unexpected {rest:?} after schema.table")));
                }
                (first, second)
            }
        };
        for part in [&schema, &name] {
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(invalid(format!(
                    "{part:?} is longer than {MAX_IDENTIFIER_BYTES} bytes, and PostgreSQL shortens such names"
                )));
            }
        }
        Ok(TableName { schema, name })
    }
}

impl TryFrom<String> for TableName {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// The config form: a part is double-quoted unless it is a plain lower-case identifier, so
/// the text parses back to the same name and reads the same in SQL.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |ident: &str| {
            let plain = ident.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && ident
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if plain {
                ident.to_owned()
            } else {
                quote_ident(ident)
            }
        };
        write!(f, "{}.{}", part(&self.schema), part(&self.name))
    }
}

impl From<TableName> for String {
    fn from(table: TableName) -> String {
        table.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_table_names() {
        let table = |s: &str| s.parse::<TableName>().ok().map(|t| (t.schema, t.name));
        let pair = |a: &str, b: &str| Some((a.to_owned(), b.to_owned()));
        assert_eq!(table("outbox"), pair("public", "outbox"));
        assert_eq!(table("app.events"), pair("app", "events"));
        // Quoted parts follow PostgreSQL's rules; unquoted ones are taken as written.
        assert_eq!(
            table(r#""Billing-Prod"."Outbox""#),
            pair("Billing-Prod", "Outbox")
        );
        assert_eq!(table("Billing-Prod.Outbox"), pair("Billing-Prod", "Outbox"));
        assert_eq!(table(r#""Outbox""#), pair("public", "Outbox"));
        assert_eq!(table(r#"app."my.table""#), pair("app", "my.table"));
        assert_eq!(table(r#""say ""hi"""."x""#), pair(r#"say "hi""#, "x"));
        for bad in [
            "a.b.c",
            ".x",
            "x.",
            "",
            r#""""#,
            r#""open"#,
            r#""a"b"#,
            r#"a"b""#,
            "my table",
            r#""a".b.c"#,
            r#""a"."#,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("public.{}", "x".repeat(64))])
        {
            let err = bad.parse::<TableName>().unwrap_err();
            assert_eq!(err.field, "table", "{bad:?}: {err}");
        }
    }

    #[test]
    fn table_names_print_as_they_parse() {
        for (text, display, quoted) in [
            ("outbox", "public.outbox", r#""public"."outbox""#),
            (
                r#""Billing-Prod"."Outbox""#,
                r#""Billing-Prod"."Outbox""#,
                r#""Billing-Prod"."Outbox""#,
            ),
            (r#"app."a""b""#, r#"app."a""b""#, r#""app"."a""b""#),
        ] {
            let table: TableName = text.parse().unwrap();
            assert_eq!(table.to_string(), display);
            assert_eq!(table.quoted(), quoted);
            assert_eq!(display.parse::<TableName>().unwrap(), table);
        }
    }

    proptest::proptest! {
        /// Any name PostgreSQL can store prints (`Display`) as text that parses back to it.
        #[test]
        fn table_names_round_trip(
            // At most 15 characters of at most 4 bytes: within PostgreSQL's 63 bytes.
            schema in "[^\\x00]{1,15}",
            name in "[^\\x00]{1,15}",
        ) {
            let table = TableName { schema, name };
            let text = table.to_string();
            proptest::prop_assert_eq!(text.parse::<TableName>().ok(), Some(table), "{}", text);
        }
    }
}
