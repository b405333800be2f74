//! Topic templates (`route.topic_template`) and the anchored `route.topic_regex`.

use regex::Regex;

/// A `${...}` placeholder or literal text of a topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part<C> {
    Literal(String),
    RoutedBy,
    /// A numbered capture group of `route.topic_regex`.
    Index(usize),
    /// A named capture group of `route.topic_regex`.
    Name(String),
    /// A column: its name when parsed, its index in [`crate::source::outbox::OutboxEvent::columns`] once resolved.
    Column(C),
}

/// A parsed `route.topic_template`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub(super) parts: Vec<Part<String>>,
}

impl Template {
    /// Parses `${routedByValue}`, `${<digits>}`, `${<name>}` and `${column:<name>}`
    /// placeholders; any other text is literal.
    ///
    /// Returns an error if a `${` is not closed or a placeholder is none of these.
    pub fn parse(template: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(Part::Literal(rest[..start].to_owned()));
            }
            let after = &rest[start + 2..];
            let end = after.find('}').ok_or_else(|| {
                format!(
                    "unclosed ${{ at byte {}",
                    template.len() - rest.len() + start
                )
            })?;
            let name = &after[..end];
            parts.push(if name == "routedByValue" {
                Part::RoutedBy
            } else if let Some(column) = name.strip_prefix("column:") {
                if column.is_empty() {
                    return Err("${column:} needs a column name".into());
                }
                Part::Column(column.to_owned())
            } else if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
                Part::Index(name.parse().map_err(|_| format!("group number {name} is too large"))?)
            } else if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                Part::Name(name.to_owned())
            } else {
                return Err(format!(
                    "unknown placeholder ${{{name}}}: use ${{routedByValue}}, ${{column:<name>}}, or a route.topic_regex group as ${{<name>}} or ${{<number>}}"
                ));
            });
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(Template { parts })
    }

    /// Names of the columns the template uses, in order (repeats included).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Column(c) => Some(c.as_str()),
            _ => None,
        })
    }

    /// Checks that every group placeholder names a group of `regex`.
    ///
    /// Returns an error naming the first group that is not there (or that there is no regex).
    pub fn check_groups(&self, regex: Option<&Regex>, regex_given: bool) -> Result<(), String> {
        for part in &self.parts {
            let (found, shown) = match (part, regex) {
                (Part::Index(n), Some(r)) => (*n < r.captures_len(), n.to_string()),
                (Part::Name(name), Some(r)) => {
                    (r.capture_names().any(|c| c == Some(name)), name.clone())
                }
                (Part::Index(n), None) => (false, n.to_string()),
                (Part::Name(name), None) => (false, name.clone()),
                _ => continue,
            };
            if !found {
                return Err(if regex_given || regex.is_some() {
                    format!("${{{shown}}} is not a group of route.topic_regex")
                } else {
                    format!("${{{shown}}} needs route.topic_regex with that group")
                });
            }
        }
        Ok(())
    }

    /// The topic with `x` for every placeholder, to check the literal parts.
    pub fn sample(&self) -> String {
        self.sample_with("x")
    }

    /// The topic with `placeholder` for every placeholder: what is known of every event's
    /// topic before any event.
    pub fn sample_with(&self, placeholder: &str) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(text) => text.as_str(),
                _ => placeholder,
            })
            .collect()
    }
}

/// The `route.topic_regex` group that `${routedByValue}` stands for when the regex has it.
pub(super) const ROUTED_BY_GROUP: &str = "routedByValue";

/// Compiles `route.topic_regex` anchored at both ends: the whole value must match.
///
/// Returns an error with the regex crate's explanation if it does not compile.
pub fn compile_topic_regex(regex: &str) -> Result<Regex, String> {
    Regex::new(&format!("^(?:{regex})$")).map_err(|e| e.to_string())
}
