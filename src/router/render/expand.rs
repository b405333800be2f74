//! A JSON payload as Debezium's Outbox Event Router expands it (`table.expand.json.payload =
//! true`, with the default `table.json.payload.null.behavior = ignore` and
//! `table.json.payload.empty.array.behavior = ignore`) and Kafka Connect's `JsonConverter`
//! writes the result with `schemas.enable = false`.
//!
//! Debezium parses the payload with Jackson, infers a Kafka Connect schema from it
//! (`JsonSchemaData`), builds a struct against that schema, and the converter writes the struct
//! back. So the output is the schema's fields, not the document's:
//!
//! - Compact JSON (no blanks), fields in the document's order, strings escaped as Jackson
//!   escapes them (`\"`, `\\`, `\b \f \n \r \t`, other control characters `\u00XX`).
//! - In every object, at any depth, a field whose value is `null` or an empty array is not in
//!   the schema, so it is left out; an object left without fields stays as `{}`.
//! - Numbers: an integer in 32 or 64 bits as written (`-0` as `0`); any number with a fraction
//!   or exponent as Java's `Double.toString` prints the double (`1.0`, `100.0`, `1.0E10`).
//! - An array takes its element schema from its first non-null element (every non-null element
//!   must be of that JSON type and, for numbers, of the same kind: 32-bit, 64-bit or double);
//!   `null` elements stay `null`. Elements that are objects share one schema, the union of
//!   their fields (the first schema's fields, then those the next ones add): an element lacking
//!   a field gets `null` for it, and a nested object takes the first schema's fields. Debezium
//!   takes the objects' schemas in a Java `HashSet`'s order, which follows identity hash codes
//!   and may change between JVM runs; the relay takes them in array order, one of the orders
//!   Debezium gives.
//!
//! Where Debezium's expansion fails (a payload that is not a JSON object starting at its first
//! byte, an array of mixed types, of nothing but nulls or starting with an empty array, an
//! integer beyond 64 bits, values that do not fit the inferred schema), Debezium logs a warning
//! and the converter writes the unexpanded text as a JSON string; the relay returns an error
//! instead, which `on_bad_event` handles.

/// Jackson's default nesting limit (`StreamReadConstraints`).
const MAX_DEPTH: usize = 1000;

/// `text` (a payload's text) as Debezium's expansion and `JsonConverter` write it.
///
/// Returns an error saying why Debezium's expansion would fail on it (see the module docs).
pub(crate) fn debezium_expanded(text: &[u8]) -> Result<Vec<u8>, String> {
    if text.first() != Some(&b'{') {
        return Err("the payload is not a JSON object starting at its first byte".into());
    }
    let mut parser = Parser { text, at: 0 };
    // Jackson stops after the first value: what follows it is not read.
    let document = parser.value(0)?;
    let schema = infer(&document)?.ok_or("the payload has no schema")?;
    let value = convert(&document, &schema)?;
    let mut out = Vec::with_capacity(text.len());
    write(&mut out, &value);
    Ok(out)
}

/// A parsed JSON value, numbers as Jackson reads them.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    /// An integer beyond 64 bits.
    BigInteger,
    Double(f64),
    String(String),
    Array(Vec<Node>),
    /// Fields in first-seen order; a repeated name keeps its first place and its last value.
    Object(Vec<(String, Node)>),
}

/// A Kafka Connect schema (every one optional).
#[derive(Debug, Clone, PartialEq)]
enum Schema {
    Boolean,
    Int32,
    Int64,
    Float64,
    String,
    Array(Box<Schema>),
    Struct(Vec<(String, Schema)>),
}

/// A Kafka Connect value built against a [`Schema`].
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    Integer(i64),
    Double(f64),
    String(String),
    List(Vec<Value>),
    Struct(Vec<(String, Value)>),
}

/// The schema Debezium infers for `node`; `None` for what it leaves out (null, an empty array).
fn infer(node: &Node) -> Result<Option<Schema>, String> {
    Ok(Some(match node {
        Node::Null => return Ok(None),
        Node::Bool(_) => Schema::Boolean,
        Node::String(_) => Schema::String,
        Node::Int(_) => Schema::Int32,
        Node::Long(_) => Schema::Int64,
        Node::BigInteger | Node::Double(_) => Schema::Float64,
        Node::Array(elements) if elements.is_empty() => return Ok(None),
        Node::Array(elements) => Schema::Array(Box::new(element_schema(elements)?)),
        Node::Object(fields) => {
            let mut schema: Vec<(String, Schema)> = Vec::with_capacity(fields.len());
            for (name, value) in fields {
                if let Some(field) = infer(value)? {
                    schema.push((name.clone(), field));
                }
            }
            Schema::Struct(schema)
        }
    }))
}

/// The JSON type of a non-null node, for the homogeneity check.
fn json_type(node: &Node) -> u8 {
    match node {
        Node::Null => 0,
        Node::Bool(_) => 1,
        Node::Int(_) | Node::Long(_) | Node::BigInteger | Node::Double(_) => 2,
        Node::String(_) => 3,
        Node::Array(_) => 4,
        Node::Object(_) => 5,
    }
}

/// The element schema of a non-empty array.
fn element_schema(elements: &[Node]) -> Result<Schema, String> {
    let mut sample: Option<&Node> = None;
    for element in elements.iter().filter(|e| **e != Node::Null) {
        let first = *sample.get_or_insert(element);
        let same = json_type(first) == json_type(element)
            && (json_type(first) != 2 || infer(first)? == infer(element)?);
        if !same {
            return Err("an array's elements are not all of one type".into());
        }
    }
    let Some(sample) = sample else {
        return Err("an array holds nothing but nulls".into());
    };
    if !matches!(sample, Node::Object(_)) {
        return infer(sample)?.ok_or_else(|| "an array starts with an empty array".into());
    }
    let mut distinct: Vec<Schema> = Vec::new();
    for element in elements.iter().filter(|e| matches!(e, Node::Object(_))) {
        let schema = infer(element)?.ok_or("an object has no schema")?;
        if !distinct.contains(&schema) {
            distinct.push(schema);
        }
    }
    // Debezium merges the distinct schemas in a Java `HashSet`'s order, which follows identity
    // hash codes and so may change from one JVM run to the next: array order is one of the
    // orders Debezium can give.
    distinct
        .into_iter()
        .reduce(merge)
        .ok_or_else(|| "an array of objects has no schema".into())
}

/// Debezium's `mergeSchema`: `left`'s fields, then those of `right` it lacks.
fn merge(left: Schema, right: Schema) -> Schema {
    let (Schema::Struct(mut fields), Schema::Struct(more)) = (left, right) else {
        unreachable!("only object schemas are merged")
    };
    for (name, schema) in more {
        if !fields.iter().any(|(n, _)| *n == name) {
            fields.push((name, schema));
        }
    }
    Schema::Struct(fields)
}

/// `node` as a value of `schema`, as Debezium builds it and Kafka Connect validates it.
fn convert(node: &Node, schema: &Schema) -> Result<Value, String> {
    let mismatch = || {
        Err("a value does not fit the schema Debezium infers from the payload (an array of objects whose fields differ in type?)".to_owned())
    };
    Ok(match (node, schema) {
        (Node::Null, _) => Value::Null,
        (Node::Bool(b), Schema::Boolean) => Value::Bool(*b),
        (Node::String(s), Schema::String) => Value::String(s.clone()),
        (Node::Int(n), Schema::Int32) => Value::Integer(i64::from(*n)),
        (Node::Long(n), Schema::Int64) => Value::Integer(*n),
        (Node::Double(d), Schema::Float64) => Value::Double(*d),
        (Node::BigInteger, _) => {
            return Err("an integer beyond 64 bits, which Debezium's expansion refuses".into())
        }
        (Node::Array(elements), Schema::Array(element)) => Value::List(
            elements
                .iter()
                .map(|e| convert(e, element))
                .collect::<Result<_, _>>()?,
        ),
        (Node::Object(fields), Schema::Struct(schema)) => Value::Struct(
            schema
                .iter()
                .map(|(name, field)| {
                    let value = match fields.iter().find(|(n, _)| n == name) {
                        Some((_, node)) => convert(node, field)?,
                        None => Value::Null,
                    };
                    Ok((name.clone(), value))
                })
                .collect::<Result<_, String>>()?,
        ),
        _ => return mismatch(),
    })
}

/// Writes `value` as Jackson writes the converter's JSON tree.
fn write(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(n) => out.extend_from_slice(n.to_string().as_bytes()),
        // Jackson quotes NaN and the infinities (`QUOTE_NON_NUMERIC_NUMBERS`).
        Value::Double(d) if !d.is_finite() => {
            write_string(out, &super::float::java_double(*d));
        }
        Value::Double(d) => out.extend_from_slice(super::float::java_double(*d).as_bytes()),
        Value::String(s) => write_string(out, s),
        Value::List(elements) => {
            out.push(b'[');
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, element);
            }
            out.push(b']');
        }
        Value::Struct(fields) => {
            out.push(b'{');
            for (i, (name, field)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, name);
                out.push(b':');
                write(out, field);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string as Jackson escapes it: short escapes where JSON has them, other control
/// characters as `\u00XX` with upper-case hex, everything else (`/`, non-ASCII) as it is.
fn write_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push(b'"');
    for &b in text.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// A strict JSON reader (RFC 8259, as Jackson's defaults accept it) that keeps the field
/// order and the integer kinds.
struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("the payload is not JSON: {what} at byte {}", self.at)
    }

    fn blanks(&mut self) {
        while matches!(self.text.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.blanks();
        let found = self.text.get(self.at) == Some(&byte);
        if found {
            self.at += 1;
        }
        found
    }

    fn literal(&mut self, word: &[u8], node: Node) -> Result<Node, String> {
        match self.text.get(self.at..self.at + word.len()) {
            Some(found) if found == word => {
                self.at += word.len();
                Ok(node)
            }
            _ => Err(self.error("an unknown token")),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, String> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting deeper than 1000"));
        }
        self.blanks();
        match self.text.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut fields: Vec<(String, Node)> = Vec::new();
                if self.eat(b'}') {
                    return Ok(Node::Object(fields));
                }
                loop {
                    self.blanks();
                    if self.text.get(self.at) != Some(&b'"') {
                        return Err(self.error("a field name expected"));
                    }
                    let name = self.string()?;
                    if !self.eat(b':') {
                        return Err(self.error("':' expected"));
                    }
                    let value = self.value(depth + 1)?;
                    match fields.iter_mut().find(|(n, _)| *n == name) {
                        Some(field) => field.1 = value,
                        None => fields.push((name, value)),
                    }
                    if self.eat(b'}') {
                        return Ok(Node::Object(fields));
                    }
                    if !self.eat(b',') {
                        return Err(self.error("',' or '}' expected"));
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut elements = Vec::new();
                if self.eat(b']') {
                    return Ok(Node::Array(elements));
                }
                loop {
                    elements.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Ok(Node::Array(elements));
                    }
                    if !self.eat(b',') {
                        return Err(self.error("',' or ']' expected"));
                    }
                }
            }
            Some(b'"') => self.string().map(Node::String),
            Some(b't') => self.literal(b"true", Node::Bool(true)),
            Some(b'f') => self.literal(b"false", Node::Bool(false)),
            Some(b'n') => self.literal(b"null", Node::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("an unexpected character")),
            None => Err(self.error("the end of the text")),
        }
    }

    fn number(&mut self) -> Result<Node, String> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while p.text.get(p.at).is_some_and(u8::is_ascii_digit) {
                p.at += 1;
            }
            p.at - from
        };
        if self.text.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        let integer_start = self.at;
        match digits(self) {
            0 => return Err(self.error("a digit expected")),
            n if n > 1 && self.text[integer_start] == b'0' => {
                return Err(self.error("a leading zero"))
            }
            _ => {}
        }
        let mut integer = true;
        if self.text.get(self.at) == Some(&b'.') {
            self.at += 1;
            integer = false;
            if digits(self) == 0 {
                return Err(self.error("a digit expected after '.'"));
            }
        }
        if matches!(self.text.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            integer = false;
            if matches!(self.text.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(self.error("a digit expected in the exponent"));
            }
        }
        let text = std::str::from_utf8(&self.text[start..self.at])
            .map_err(|_| self.error("a number that is not ASCII"))?;
        Ok(match integer {
            true => match text.parse::<i64>() {
                Ok(n) => i32::try_from(n).map_or(Node::Long(n), Node::Int),
                Err(_) => Node::BigInteger,
            },
            false => Node::Double(
                text.parse::<f64>()
                    .map_err(|_| self.error("a number Java does not read"))?,
            ),
        })
    }

    /// A string starting at the opening quote.
    fn string(&mut self) -> Result<String, String> {
        self.at += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.text.get(self.at) else {
                return Err(self.error("an unterminated string"));
            };
            self.at += 1;
            match b {
                b'"' => break,
                0..=0x1f => return Err(self.error("a control character in a string")),
                b'\\' => {
                    let escape = self.text.get(self.at).copied();
                    self.at += 1;
                    let c = match escape {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => self.unicode_escape()?,
                        _ => return Err(self.error("an unknown escape")),
                    };
                    let mut buffer = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
                }
                _ => out.push(b),
            }
        }
        String::from_utf8(out).map_err(|_| self.error("a string that is not UTF-8"))
    }

    /// The character of `\uXXXX` (after the `u`), a surrogate pair taking two escapes.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let high = self.hex4()?;
        let code = if (0xd800..0xdc00).contains(&high) {
            if self.text.get(self.at..self.at + 2) != Some(b"\\u") {
                return Err(self.error("a lone surrogate"));
            }
            self.at += 2;
            let low = self.hex4()?;
            if !(0xdc00..0xe000).contains(&low) {
                return Err(self.error("a lone surrogate"));
            }
            0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)
        } else {
            high
        };
        char::from_u32(code).ok_or_else(|| self.error("a lone surrogate"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .text
            .get(self.at..self.at + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error("four hex digits expected"))?;
        self.at += 4;
        u32::from_str_radix(digits, 16).map_err(|_| self.error("four hex digits expected"))
    }
}

#[cfg(test)]
mod tests {
    use super::debezium_expanded;

    fn expanded(text: &str) -> Result<String, String> {
        debezium_expanded(text.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn null_fields_and_empty_arrays_are_left_out_at_every_depth_and_empty_objects_kept() {
        assert_eq!(
            expanded(r#"{"a": null, "b": [], "c": {"d": null, "e": []}, "f": {}, "g": 1}"#)
                .unwrap(),
            r#"{"c":{},"f":{},"g":1}"#
        );
        assert_eq!(expanded("{}").unwrap(), "{}");
        assert_eq!(expanded(r#"{"a": null}"#).unwrap(), "{}");
    }

    #[test]
    fn numbers_are_written_as_jackson_writes_ints_longs_and_doubles() {
        assert_eq!(
            expanded(
                r#"{"i": -0, "l": 3000000000, "d": 1.50, "e": 1e2, "big": 1E10, "small": 0.0001}"#
            )
            .unwrap(),
            r#"{"i":0,"l":3000000000,"d":1.5,"e":100.0,"big":1.0E10,"small":1.0E-4}"#
        );
        assert_eq!(
            expanded(r#"{"inf": 1e400}"#).unwrap(),
            r#"{"inf":"Infinity"}"#
        );
        assert!(expanded(r#"{"huge": 123456789012345678901234}"#)
            .unwrap_err()
            .contains("beyond 64 bits"));
    }

    #[test]
    fn strings_are_escaped_as_jackson_escapes_them() {
        assert_eq!(
            expanded(r#"{"s": "q\" b\\ \/ \u0001 \n \u00e9 \ud83d\ude00"}"#).unwrap(),
            "{\"s\":\"q\\\" b\\\\ / \\u0001 \\n \u{e9} \u{1f600}\"}"
        );
    }

    #[test]
    fn arrays_keep_their_nulls_and_objects_in_them_share_the_union_of_fields() {
        assert_eq!(
            expanded(
                r#"{"a": [1, null, 2], "o": [{"x": 1, "y": null}, {"x": 2, "y": "b"}, null]}"#
            )
            .unwrap(),
            r#"{"a":[1,null,2],"o":[{"x":1,"y":null},{"x":2,"y":"b"},null]}"#
        );
        assert_eq!(
            expanded(r#"{"o": [{"x": 1}, {"x": 2, "y": 3}]}"#).unwrap(),
            r#"{"o":[{"x":1,"y":null},{"x":2,"y":3}]}"#
        );
        // An empty array inside an array (not the first element) is a value of the element schema.
        assert_eq!(
            expanded(r#"{"n": [[1], []]}"#).unwrap(),
            r#"{"n":[[1],[]]}"#
        );
        // Repeated names: the first place, the last value.
        assert_eq!(
            expanded(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap(),
            r#"{"a":3,"b":2}"#
        );
    }

    #[test]
    fn what_debeziums_expansion_refuses_is_an_error_saying_why() {
        for (payload, why) in [
            (r#"[1, 2]"#, "not a JSON object"),
            (r#" {"a": 1}"#, "not a JSON object"),
            ("hello", "not a JSON object"),
            (r#"{"a": }"#, "not JSON"),
            (r#"{"a": [1, "x"]}"#, "not all of one type"),
            (r#"{"a": [1, 3000000000]}"#, "not all of one type"),
            (r#"{"a": [1, 1.5]}"#, "not all of one type"),
            (r#"{"a": [null]}"#, "nothing but nulls"),
            (r#"{"a": [[], [1]]}"#, "empty array"),
            (r#"{"a": [[1], ["x"]]}"#, "does not fit"),
            (r#"{"a": [{"x": 1}, {"x": "s"}]}"#, "does not fit"),
        ] {
            let err = expanded(payload).unwrap_err();
            assert!(err.contains(why), "{payload}: {err}");
        }
    }

    #[test]
    fn an_empty_array_is_kept_where_another_element_of_its_array_gives_it_a_schema() {
        // Debezium's own cases: a first element's empty array takes its schema from the
        // second element; a null first element of an array of numbers stays null.
        assert_eq!(
            expanded(r#"{"name": "Ann", "pets": [{"type": "dog", "colors": []}, {"type": "cat", "colors": [{"name": "white"}]}], "n": [null, 2, 3]}"#)
                .unwrap(),
            r#"{"name":"Ann","pets":[{"type":"dog","colors":[]},{"type":"cat","colors":[{"name":"white"}]}],"n":[null,2,3]}"#
        );
    }

    #[test]
    fn objects_in_an_array_take_the_union_of_their_fields_in_array_order() {
        assert_eq!(
            expanded(r#"{"a": [{"x": 1, "y": 2}, {"x": 3}]}"#).unwrap(),
            r#"{"a":[{"x":1,"y":2},{"x":3,"y":null}]}"#
        );
        assert_eq!(
            expanded(r#"{"a": [{"y": null, "x": 1}, {"x": 2, "y": 3}]}"#).unwrap(),
            r#"{"a":[{"x":1,"y":null},{"x":2,"y":3}]}"#
        );
        // A nested object takes the first element's fields.
        assert_eq!(
            expanded(r#"{"a": [{"o": {"p": 1}}, {"o": {"q": 2}}]}"#).unwrap(),
            r#"{"a":[{"o":{"p":1}},{"o":{"p":null}}]}"#
        );
    }
}
