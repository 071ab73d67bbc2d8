//! The vendored GABP 1.0 JSON Schemas (`schemas/gabp/SCHEMA/1.0`, built into the binary) and a
//! validator for the part of draft-07 they use: `type`, `const`, `enum`, `properties`,
//! `required`, `additionalProperties`, `patternProperties`, `items`, `minItems`,
//! `uniqueItems`, `minLength`, `minimum`, `pattern`, `format` (`uuid`, `date-time`, `uri`),
//! `oneOf`, `anyOf`, `allOf`, `not` and `$ref` (within a file and between files).
//!
//! A violation says where it is and whether it is only an extra member: GABP 1.x allows
//! additive changes (§7.2), so the checks treat extra members as deviations a peer tolerates
//! and everything else as a failure. This module judges nothing itself.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

/// Each vendored schema: its path under `SCHEMA/1.0` and its text.
const FILES: &[(&str, &str)] = &[
    (
        "common/attention.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/common/attention.schema.json"),
    ),
    (
        "common/capabilities.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/common/capabilities.schema.json"),
    ),
    (
        "common/error.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/common/error.schema.json"),
    ),
    (
        "common/tool.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/common/tool.schema.json"),
    ),
    (
        "envelope.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/envelope.schema.json"),
    ),
    (
        "events/attention.payload.schema.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/events/attention.payload.schema.json"),
    ),
    (
        "events/event.message.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/events/event.message.json"),
    ),
    (
        "methods/attention.ack.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/attention.ack.request.json"),
    ),
    (
        "methods/attention.ack.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/attention.ack.response.json"),
    ),
    (
        "methods/attention.current.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/attention.current.request.json"),
    ),
    (
        "methods/attention.current.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/attention.current.response.json"),
    ),
    (
        "methods/events.subscribe.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/events.subscribe.request.json"),
    ),
    (
        "methods/events.unsubscribe.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/events.unsubscribe.request.json"),
    ),
    (
        "methods/resources.list.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/resources.list.request.json"),
    ),
    (
        "methods/resources.list.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/resources.list.response.json"),
    ),
    (
        "methods/resources.read.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/resources.read.request.json"),
    ),
    (
        "methods/resources.read.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/resources.read.response.json"),
    ),
    (
        "methods/session.hello.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/session.hello.request.json"),
    ),
    (
        "methods/session.welcome.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/session.welcome.response.json"),
    ),
    (
        "methods/state.get.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/state.get.request.json"),
    ),
    (
        "methods/state.get.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/state.get.response.json"),
    ),
    (
        "methods/state.set.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/state.set.request.json"),
    ),
    (
        "methods/state.set.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/state.set.response.json"),
    ),
    (
        "methods/tools.call.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/tools.call.request.json"),
    ),
    (
        "methods/tools.call.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/tools.call.response.json"),
    ),
    (
        "methods/tools.list.request.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/tools.list.request.json"),
    ),
    (
        "methods/tools.list.response.json",
        include_str!("../../schemas/gabp/SCHEMA/1.0/methods/tools.list.response.json"),
    ),
];

/// What is wrong at one place of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where, as a JSON pointer into the message (`/result/tools/0/parameters`).
    pub path: String,
    /// Whether it is only a member the schema does not name.
    pub extra: bool,
    /// What the schema wanted.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{at}: {}", self.what)
    }
}

/// The vendored schemas, parsed once.
fn docs() -> &'static HashMap<&'static str, Value> {
    static DOCS: OnceLock<HashMap<&'static str, Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        FILES
            .iter()
            .map(|(name, text)| {
                let v = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("vendored schema {name} is not JSON: {e}"));
                (*name, v)
            })
            .collect()
    })
}

/// `value` checked against the schema file `file` (a path under `SCHEMA/1.0`), optionally at a
/// JSON pointer into it (`#/$defs/response`). Violations in document order.
pub fn validate(file: &str, pointer: &str, value: &Value) -> Vec<Violation> {
    let Some((file, root)) = docs().get_key_value(file) else {
        panic!("no vendored schema {file}");
    };
    let schema = resolve_pointer(root, pointer.trim_start_matches('#'))
        .unwrap_or_else(|| panic!("no {pointer} in {file}"));
    let mut out = Vec::new();
    walk(file, schema, value, "", &mut out);
    out
}

fn resolve_pointer<'a>(root: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

/// The file a `$ref` from `file` names (`../common/tool.schema.json` from
/// `methods/x.json` is `common/tool.schema.json`).
fn ref_file(file: &str, target: &str) -> String {
    let mut parts: Vec<&str> = file.split('/').collect();
    parts.pop();
    for piece in target.split('/') {
        match piece {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            p => parts.push(p),
        }
    }
    parts.join("/")
}

fn walk(file: &'static str, schema: &Value, value: &Value, path: &str, out: &mut Vec<Violation>) {
    let Some(s) = schema.as_object() else {
        return;
    };
    if let Some(Value::String(r)) = s.get("$ref") {
        let (target, pointer) = r.split_once('#').unwrap_or((r, ""));
        let file = if target.is_empty() {
            file
        } else {
            let name = ref_file(file, target);
            match docs().get_key_value(name.as_str()) {
                Some((k, _)) => *k,
                None => {
                    return fail(
                        out,
                        path,
                        format!("the schema names {r}, which is not vendored"),
                    )
                }
            }
        };
        let Some(sub) = resolve_pointer(&docs()[file], pointer) else {
            return fail(
                out,
                path,
                format!("the schema names {r}, which does not exist"),
            );
        };
        return walk(file, sub, value, path, out);
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.is_empty() && !types.iter().any(|t| is_type(value, t)) {
            // A value of the wrong type has nothing more to check.
            return fail(
                out,
                path,
                format!("expected {}, got {}", types.join(" or "), kind(value)),
            );
        }
    }
    if let Some(c) = s.get("const") {
        if c != value {
            fail(out, path, format!("expected {c}, got {}", shown(value)));
        }
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.contains(value) {
            let options: Vec<String> = options.iter().map(Value::to_string).collect();
            fail(
                out,
                path,
                format!(
                    "expected one of {}, got {}",
                    options.join(", "),
                    shown(value)
                ),
            );
        }
    }
    if let Value::String(text) = value {
        if let Some(n) = s.get("minLength").and_then(Value::as_u64) {
            if (text.chars().count() as u64) < n {
                fail(out, path, format!("expected at least {n} characters"));
            }
        }
        if let Some(Value::String(p)) = s.get("pattern") {
            if !matches(p, text) {
                fail(out, path, format!("{} does not match {p}", shown(value)));
            }
        }
        if let Some(Value::String(f)) = s.get("format") {
            if !format_ok(f, text) {
                fail(out, path, format!("{} is not a {f}", shown(value)));
            }
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), value.as_f64()) {
        if n < min {
            fail(out, path, format!("expected at least {min}, got {n}"));
        }
    }
    if let Value::Array(items) = value {
        if let Some(n) = s.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < n {
                fail(out, path, format!("expected at least {n} items"));
            }
        }
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            let repeated = items
                .iter()
                .enumerate()
                .any(|(i, a)| items[..i].contains(a));
            if repeated {
                fail(out, path, "expected unique items".into());
            }
        }
        if let Some(item) = s.get("items").filter(|i| i.is_object()) {
            for (i, v) in items.iter().enumerate() {
                walk(file, item, v, &format!("{path}/{i}"), out);
            }
        }
    }
    if let Value::Object(members) = value {
        let props = s.get("properties").and_then(Value::as_object);
        let patterns = s.get("patternProperties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = s.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !members.contains_key(name) {
                    out.push(Violation {
                        path: path.to_string(),
                        extra: false,
                        what: format!("missing required member {name:?}"),
                    });
                }
            }
        }
        for (name, v) in members {
            let at = format!("{path}/{}", pointer_escape(name));
            let mut named = false;
            if let Some(sub) = props.and_then(|p| p.get(name)) {
                named = true;
                walk(file, sub, v, &at, out);
            }
            for (pattern, sub) in patterns.into_iter().flatten() {
                if matches(pattern, name) {
                    named = true;
                    walk(file, sub, v, &at, out);
                }
            }
            if named {
                continue;
            }
            match s.get("additionalProperties") {
                Some(Value::Bool(false)) => out.push(Violation {
                    path: at,
                    extra: true,
                    what: "a member the schema does not name".into(),
                }),
                Some(sub @ Value::Object(_)) => walk(file, sub, v, &at, out),
                _ => {}
            }
        }
    }
    let valid = |sub: &Value| {
        let mut scratch = Vec::new();
        walk(file, sub, value, path, &mut scratch);
        scratch
    };
    if let Some(Value::Array(all)) = s.get("allOf") {
        for sub in all {
            out.extend(valid(sub));
        }
    }
    if let Some(Value::Array(any)) = s.get("anyOf") {
        if !any.iter().any(|sub| valid(sub).is_empty()) {
            fail(out, path, "matches none of the alternatives (anyOf)".into());
        }
    }
    if let Some(Value::Array(one)) = s.get("oneOf") {
        let results: Vec<Vec<Violation>> = one.iter().map(valid).collect();
        match results.iter().filter(|r| r.is_empty()).count() {
            1 => {}
            0 => {
                // The alternative with the fewest problems is the one meant: say those.
                if let Some(best) = results.into_iter().min_by_key(Vec::len) {
                    out.extend(best);
                }
            }
            n => fail(
                out,
                path,
                format!("matches {n} alternatives, not exactly one (oneOf)"),
            ),
        }
    }
    if let Some(sub) = s.get("not") {
        if valid(sub).is_empty() {
            let what = match sub.get("required") {
                Some(Value::Array(names)) => {
                    let names: Vec<String> = names.iter().map(Value::to_string).collect();
                    format!("must not have all of {}", names.join(", "))
                }
                _ => "matches a schema it must not (not)".into(),
            };
            fail(out, path, what);
        }
    }
}

fn fail(out: &mut Vec<Violation>, path: &str, what: String) {
    out.push(Violation {
        path: path.to_string(),
        extra: false,
        what,
    });
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value as said in a violation: short.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(60).collect::<String>())
    } else {
        text
    }
}

fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// Whether `text` matches the schema's regular expression (unanchored, as JSON Schema's are).
fn matches(pattern: &str, text: &str) -> bool {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<regex::Regex>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let re = cache
        .entry(pattern.to_string())
        .or_insert_with(|| regex::Regex::new(pattern).ok());
    // A pattern this engine cannot read constrains nothing here.
    re.as_ref().is_none_or(|re| re.is_match(text))
}

/// A UUID in its hyphenated form, any version: 8-4-4-4-12 hexadecimal digits.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "uuid" => is_uuid(s),
        "date-time" => matches(
            r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$",
            s,
        ),
        "uri" => matches(r"^[A-Za-z][A-Za-z0-9+.\-]*:", s),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(v: &[Violation]) -> Vec<(String, bool)> {
        v.iter().map(|v| (v.path.clone(), v.extra)).collect()
    }

    /// Which schema judges each vendored fixture beside the envelope's: (file name prefix,
    /// schema, the member it applies to).
    const JUDGES: &[(&str, &str, &str)] = &[
        ("valid/001", "methods/session.hello.request.json", ""),
        ("valid/002", "methods/session.welcome.response.json", ""),
        ("valid/003", "methods/tools.call.request.json", ""),
        ("valid/004", "events/event.message.json", ""),
        ("valid/006", "methods/tools.list.response.json", ""),
        ("valid/007", "methods/attention.current.response.json", ""),
        (
            "valid/008",
            "events/attention.payload.schema.json",
            "/payload",
        ),
        ("valid/009", "methods/attention.ack.response.json", ""),
        ("invalid/006", "methods/tools.call.request.json", ""),
        ("invalid/007", "methods/attention.ack.request.json", ""),
        (
            "invalid/008",
            "events/attention.payload.schema.json",
            "/payload",
        ),
    ];

    #[test]
    fn every_vendored_conformance_fixture_gets_the_verdict_it_names() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../schemas/gabp/CONFORMANCE/1.0");
        let mut judged = 0;
        for dir in ["valid", "invalid"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("fixtures") {
                let path = entry.expect("entry").path();
                let name = format!(
                    "{dir}/{}",
                    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
                );
                let v: Value =
                    serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
                let mut found = validate("envelope.schema.json", "", &v);
                for (_, file, member) in JUDGES.iter().filter(|(p, ..)| name.starts_with(p)) {
                    found.extend(validate(file, "", v.pointer(member).expect("member")));
                }
                judged += 1;
                assert_eq!(found.is_empty(), dir == "valid", "{name}: {found:?}");
            }
        }
        assert_eq!(judged, 17);
    }

    #[test]
    fn extra_members_are_told_apart_from_other_violations() {
        let welcome = json!({"v": "gabp/1", "id": "550e8400-e29b-41d4-a716-446655440000",
            "type": "response", "result": {"agentId": "a", "app": {"name": "G", "version": "1"},
            "capabilities": {"methods": ["tools/list"], "x-sim": {}}, "schemaVersion": "1.0",
            "x-unknown": true}});
        let v = validate("methods/session.welcome.response.json", "", &welcome);
        assert_eq!(
            paths(&v),
            [
                ("/result/capabilities/x-sim".to_string(), true),
                ("/result/x-unknown".to_string(), true)
            ]
        );
        let tools = json!({"v": "gabp/1", "id": "550e8400-e29b-41d4-a716-446655440000",
            "type": "response", "result": {"tools": [{"name": "Bad Name", "title": "t",
            "description": "d", "inputSchema": {}, "parameters": {}}]}});
        let v = validate("methods/tools.list.response.json", "", &tools);
        assert_eq!(
            paths(&v),
            [
                ("/result/tools/0".to_string(), false),
                ("/result/tools/0/name".to_string(), false),
                ("/result/tools/0/parameters".to_string(), true)
            ],
            "{v:?}"
        );
        assert!(v[0].what.contains("outputSchema"), "{v:?}");
    }

    #[test]
    fn both_result_and_error_and_neither_are_violations() {
        let base = json!({"v": "gabp/1", "id": "550e8400-e29b-41d4-a716-446655440000", "type": "response"});
        let mut both = base.clone();
        both["result"] = json!(1);
        both["error"] = json!({"code": 1, "message": "m"});
        let v = validate("envelope.schema.json", "#/$defs/response", &both);
        assert!(
            v.iter().any(|v| v.what.contains("must not have all")),
            "{v:?}"
        );
        let v = validate("envelope.schema.json", "#/$defs/response", &base);
        assert!(v.iter().any(|v| v.what.contains("anyOf")), "{v:?}");
        assert!(is_uuid("550e8400-e29b-41d4-a716-446655440000"));
        assert!(!is_uuid("550e8400e29b41d4a716446655440000"));
    }
}
