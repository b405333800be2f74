//! The tables of `docs/reference/configuration.md`, generated from the config file's schema
//! (the serde types of [`super::file::FileConfig`], through `schemars`): every key with its
//! type, default, flag and meaning. `tests/reference.rs` checks the page against it.
//!
//! Fields whose serialisation leaves out a default (`skip_serializing_if`) carry
//! `#[schemars(!skip_serializing_if)]`, so that the schema, and the page, still show it.

use serde_json::{Map, Value};

/// The JSON schema (draft 2020-12) of the config file.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(super::file::FileConfig)).expect("a schema")
}

/// Markdown: a table per TOML table of the file (`[kafka]`, `[[pipelines]]`,
/// `[pipelines.route]`, each sink kind, ...), a row per key: its type (or its values), its
/// default, the flag that sets it (`flag_of` gets the key's dotted path, e.g.
/// `pipelines.route.topic_template`), and the first paragraph of its documentation.
pub fn reference_markdown(flag_of: &dyn Fn(&str) -> Option<String>) -> String {
    let schema = schema();
    let mut page = Page {
        defs: schema["$defs"].as_object().cloned().unwrap_or_default(),
        flag_of,
        out: String::new(),
        written: Vec::new(),
    };
    page.table("The file's top level", "", &schema);
    page.out
}

struct Page<'a> {
    defs: Map<String, Value>,
    flag_of: &'a dyn Fn(&str) -> Option<String>,
    out: String,
    /// The named types already given a section, with its title: a second use refers to it.
    written: Vec<(String, String)>,
}

impl Page<'_> {
    /// `schema` with `$ref` followed, and the name it was defined under.
    fn resolve<'s>(&'s self, schema: &'s Value) -> (&'s Value, Option<&'s str>) {
        if let Some(name) = schema["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            return (&self.defs[name], Some(name));
        }
        // `Option<T>`: anyOf [T, null].
        if let Some(any) = schema["anyOf"].as_array() {
            if let Some(some) = any.iter().find(|s| s["type"] != "null") {
                return self.resolve(some);
            }
        }
        (schema, None)
    }

    /// One section: the keys of the object `schema` at `path`, then a section for each of its
    /// tables.
    fn table(&mut self, title: &str, path: &str, schema: &Value) {
        let Some(properties) = schema["properties"].as_object() else {
            return;
        };
        let mut rows = String::new();
        let mut nested: Vec<(String, String, Value)> = Vec::new();
        for (key, field) in properties {
            let key_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let (resolved, name) = self.resolve(field);
            let resolved = resolved.clone();
            let name = name.map(str::to_owned);
            let items = self.resolve(&resolved["items"]).0.clone();
            let kind = if resolved["properties"].is_object() {
                Some(format!("[{key_path}]"))
            } else if items["properties"].is_object() {
                Some(format!("[[{key_path}]]"))
            } else if resolved["oneOf"]
                .as_array()
                .is_some_and(|v| v.iter().all(|v| v["properties"].is_object()))
            {
                Some(format!("[{key_path}] kind"))
            } else {
                None
            };
            let (type_text, values) = match &kind {
                Some(section) => {
                    let inner = if items["properties"].is_object() {
                        items.clone()
                    } else {
                        resolved.clone()
                    };
                    let type_name = name.clone().or_else(|| {
                        resolved["items"]["$ref"]
                            .as_str()
                            .map(|r| r.trim_start_matches("#/$defs/").to_owned())
                    });
                    let title = match self
                        .written
                        .iter()
                        .find(|(n, _)| Some(n) == type_name.as_ref())
                    {
                        Some((_, earlier)) => format!("table: the keys of `{earlier}`"),
                        None => {
                            let title = section.trim_end_matches(" kind").to_owned();
                            if let Some(type_name) = &type_name {
                                self.written.push((type_name.clone(), title.clone()));
                            }
                            let first_kind =
                                inner["oneOf"][0]["properties"]["kind"]["const"].as_str();
                            let heading = match first_kind {
                                Some(kind) => format!("`{title}` kind = \"{kind}\""),
                                None => format!("`{title}`"),
                            };
                            nested.push((title.clone(), key_path.replace("[]", ""), inner));
                            format!("table: [`{title}`](#{})", anchor(&heading))
                        }
                    };
                    (title, String::new())
                }
                None => type_of(&resolved),
            };
            let doc = description(field)
                .or_else(|| description(&resolved))
                .unwrap_or_default();
            let doc = [doc, values]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            rows.push_str(&format!(
                "| `{key}` | {type_text} | {} | {} | {} |\n",
                default_of(field),
                (self.flag_of)(&key_path).unwrap_or_default(),
                cell(&doc),
            ));
        }
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        let intro = description(schema).unwrap_or_default();
        self.out.push_str(&format!("### {title}\n\n"));
        if !intro.is_empty() && !path.is_empty() {
            self.out.push_str(&format!("{intro}\n\n"));
        }
        self.out
            .push_str("| key | type | default | flag | meaning |\n|---|---|---|---|---|\n");
        self.out.push_str(&rows);
        for (title, path, inner) in nested {
            if let Some(variants) = inner["oneOf"].as_array() {
                for variant in variants.clone() {
                    let kind = variant["properties"]["kind"]["const"]
                        .as_str()
                        .unwrap_or("?");
                    self.table(&format!("`{title}` kind = \"{kind}\""), &path, &variant);
                }
            } else {
                self.table(&format!("`{title}`"), &path, &inner);
            }
        }
    }
}

/// The type column, and for an enumeration its values with what each means.
fn type_of(schema: &Value) -> (String, String) {
    if let Some(variants) = schema["oneOf"].as_array().or(schema["enum"].as_array()) {
        let mut names = Vec::new();
        let mut meanings = Vec::new();
        for v in variants {
            let listed: Vec<&str> = match v["enum"].as_array() {
                Some(values) => values.iter().filter_map(Value::as_str).collect(),
                None => v["const"].as_str().or(v.as_str()).into_iter().collect(),
            };
            for name in listed {
                names.push(format!("`\"{name}\"`"));
                if let Some(meaning) = description(v) {
                    meanings.push(format!("`\"{name}\"`: {meaning}"));
                }
            }
        }
        return (names.join(", "), meanings.join(" "));
    }
    if let Some(constant) = schema["const"].as_str() {
        return (format!("`\"{constant}\"`"), String::new());
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let text = match types.iter().find(|t| **t != "null") {
        Some(&"array") => {
            let (inner, _) = type_of(&schema["items"]);
            format!("array of {inner}")
        }
        Some(&"object") if schema["additionalProperties"].is_object() => {
            "table of strings".to_owned()
        }
        Some(t) => (*t).to_owned(),
        None => String::new(),
    };
    (text, String::new())
}

/// The default, as TOML would write it; empty for none, an empty table or an empty list.
fn default_of(field: &Value) -> String {
    match &field["default"] {
        Value::Null => String::new(),
        Value::String(s) if s.is_empty() => String::new(),
        Value::String(s) => format!("`\"{s}\"`"),
        Value::Array(a) if a.is_empty() => String::new(),
        Value::Object(_) | Value::Array(_) => String::new(),
        other => format!("`{other}`"),
    }
}

/// The first paragraph of a doc comment, on one line, in a user's words: rustdoc links become
/// code, a bare link to a `DEFAULT_*` constant (the default column gives it) goes.
fn description(schema: &Value) -> Option<String> {
    let text = schema["description"].as_str()?;
    let first = text
        .split("\n\n")
        .next()?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = String::new();
    let mut rest = first.as_str();
    while let Some(at) = rest.find("[`") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        match after.find("`]") {
            Some(end) => {
                let name = &after[1..end];
                let name = name.rsplit("::").next().unwrap_or(name);
                let name = name.trim_end_matches("()");
                if !name.starts_with("DEFAULT_") {
                    out.push_str(&format!("`{name}`"));
                }
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("[`");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    // A link to a `DEFAULT_*` constant in parentheses leaves them empty.
    let out = out
        .replace(" ()", "")
        .replace("`None`", "unset")
        .replace(". unset", ". Unset")
        .replace(": .", ".");
    let out = out
        .trim()
        .trim_start_matches(": ")
        .trim_start_matches(". ")
        .trim_end();
    match out {
        "" | "." => None,
        text if text.ends_with(['.', '!', '?']) => Some(text.to_owned()),
        text => Some(format!("{text}.")),
    }
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(title: &str) -> String {
    title
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> String {
        reference_markdown(&|key| (key == "pipelines.slot").then(|| "`--slot`".to_owned()))
    }

    fn row<'a>(page: &'a str, section: &str, key: &str) -> &'a str {
        let start = page
            .find(&format!("### {section}\n"))
            .unwrap_or_else(|| panic!("no section {section} in\n{page}"));
        let body = &page[start..];
        let body = &body[..body[4..].find("\n### ").map_or(body.len(), |e| e + 4)];
        body.lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("no key {key} in section {section}:\n{body}"))
    }

    #[test]
    fn a_key_shows_its_default_flag_and_meaning() {
        let page = page();
        let slot = row(&page, "`[[pipelines]]`", "slot");
        assert!(slot.contains("`--slot`"), "{slot}");
        let schema = row(&page, "`[[pipelines]]`", "slot_record_schema");
        assert!(schema.contains("`\"outbox_relay\"`"), "{schema}");
        let create = row(&page, "`[[pipelines]]`", "create_slot");
        assert!(create.contains("| boolean | `true` |"), "{create}");
    }

    #[test]
    fn an_enumeration_lists_its_values_and_what_each_means() {
        let page = page();
        let bad = row(&page, "`[[pipelines]]`", "on_bad_event");
        assert!(bad.contains("`\"halt\"`, `\"dead_letter\"`"), "{bad}");
        assert!(bad.contains("| `\"halt\"` |"), "the default: {bad}");
        assert!(bad.contains("`\"dead_letter\"`: "), "{bad}");
    }

    #[test]
    fn nested_tables_and_sink_kinds_get_sections_of_their_own() {
        let page = page();
        row(&page, "`[pipelines.route]`", "topic_template");
        row(&page, "`[pipelines.sink]` kind = \"nats\"", "url");
        row(&page, "`[kafka]`", "bootstrap_servers");
        let kafka = row(&page, "`[[pipelines]]`", "kafka");
        assert!(kafka.contains("the keys of `[kafka]`"), "{kafka}");
    }

    #[test]
    fn the_page_names_no_rust_item_or_source_file() {
        let page = page();
        for developer_only in ["::", ".rs`", "`None`", "`Some"] {
            assert!(
                !page.contains(developer_only),
                "{developer_only:?} in\n{page}"
            );
        }
        // A rustdoc link: `]` after code, not followed by a Markdown link's target.
        for (at, _) in page.match_indices("`]") {
            assert!(
                page[at + 2..].starts_with('('),
                "a rustdoc link: {}",
                &page[at.saturating_sub(60)..at + 2]
            );
        }
        assert!(
            page.contains("clock_timestamp()"),
            "SQL keeps its parentheses:\n{page}"
        );
    }

    #[test]
    fn descriptions_read_as_prose_without_rustdoc_links() {
        assert_eq!(
            description(&serde_json::json!({
                "description": "Create it ([`DEFAULT_CREATE_SLOT`]).\n\nMore."
            })),
            Some("Create it.".to_owned())
        );
        assert_eq!(
            description(&serde_json::json!({"description": "[`DEFAULT_X`]."})),
            None
        );
        assert_eq!(
            description(&serde_json::json!({
                "description": "See [`crate::x::Y`]; `None`: never."
            })),
            Some("See `Y`; unset: never.".to_owned())
        );
    }
}
