//! Adding members to an object received from a peer without re-serializing it: the relay's
//! welcome to a bridge is the mod's welcome, byte for byte, with the relay's own extensions set
//! under `capabilities.extensions`. Numbers of any size, key order, escapes and spacing reach the
//! bridge as the mod wrote them.

use crate::scan::{self, Member};

/// The object `welcome` with each `(name, json)` of `extensions` set as
/// `capabilities.extensions.<name>`: an existing member of that name (every one of them, if the
/// mod repeated it) gets the new value, a missing one is added at the end of its object, and a
/// `capabilities` or `extensions` that is missing or not an object becomes one. A `welcome` that
/// is not a JSON object is replaced by one holding only the extensions. Each `json` must be one
/// valid JSON value.
pub fn set_extensions(welcome: &[u8], extensions: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        welcome.len()
            + extensions
                .iter()
                .map(|(n, v)| n.len() + v.len() + 8)
                .sum::<usize>()
            + 32,
    );
    if object_members(welcome).is_none() {
        out.extend_from_slice(b"{\"capabilities\":{\"extensions\":");
        new_object(extensions, &mut out);
        out.extend_from_slice(b"}}");
        return out;
    }
    set_path(
        welcome,
        &["capabilities", "extensions"],
        extensions,
        &mut out,
    );
    out
}

/// Writes `obj` (a valid object) to `out` with `extensions` set at `path` below it.
fn set_path(obj: &[u8], path: &[&str], extensions: &[(&str, &[u8])], out: &mut Vec<u8>) {
    let members = object_members(obj).expect("checked by the caller");
    // (span to replace, what to write there), in order.
    let mut edits: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::new();
    let close = obj.iter().rposition(|&b| b == b'}').expect("an object");
    let mut appended = Vec::new();
    let mut add = |name: &str, write: &dyn Fn(&mut Vec<u8>)| {
        appended.push(b',');
        append_key(name, &mut appended);
        write(&mut appended);
    };
    match path.split_first() {
        None => {
            for (name, json) in extensions {
                let same: Vec<&Member> = members.iter().filter(|m| m.key_is(obj, name)).collect();
                if same.is_empty() {
                    add(name, &|o: &mut Vec<u8>| o.extend_from_slice(json));
                }
                for m in same {
                    edits.push((m.value.clone(), json.to_vec()));
                }
            }
        }
        Some((first, rest)) => {
            let same: Vec<&Member> = members.iter().filter(|m| m.key_is(obj, first)).collect();
            if same.is_empty() {
                add(first, &|o: &mut Vec<u8>| nested(rest, extensions, o));
            }
            for m in same {
                let value = &obj[m.value.clone()];
                let mut v = Vec::new();
                if object_members(value).is_some() {
                    set_path(value, rest, extensions, &mut v);
                } else {
                    nested(rest, extensions, &mut v);
                }
                edits.push((m.value.clone(), v));
            }
        }
    }
    edits.sort_by_key(|(span, _)| span.start);
    let mut at = 0;
    for (span, new) in edits {
        out.extend_from_slice(&obj[at..span.start]);
        out.extend_from_slice(&new);
        at = span.end;
    }
    out.extend_from_slice(&obj[at..close]);
    // The first added member needs no comma when the object was empty.
    let skip = usize::from(members.is_empty() && !appended.is_empty());
    out.extend_from_slice(&appended[skip..]);
    out.extend_from_slice(&obj[close..]);
}

/// A new object holding `path` down to the extensions.
fn nested(path: &[&str], extensions: &[(&str, &[u8])], out: &mut Vec<u8>) {
    match path.split_first() {
        None => new_object(extensions, out),
        Some((first, rest)) => {
            out.push(b'{');
            append_key(first, out);
            nested(rest, extensions, out);
            out.push(b'}');
        }
    }
}

fn new_object(members: &[(&str, &[u8])], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (name, json)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        append_key(name, out);
        out.extend_from_slice(json);
    }
    out.push(b'}');
}

fn append_key(name: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(
        serde_json::to_string(name)
            .expect("a string serializes")
            .as_bytes(),
    );
    out.push(b':');
}

fn object_members(b: &[u8]) -> Option<Vec<Member>> {
    let mut m = Vec::new();
    scan::members(b, &mut m)?;
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const RELAY: (&str, &[u8]) = ("relay", br#"{"name":"gabp-relay"}"#);

    fn set(w: &str) -> String {
        String::from_utf8(set_extensions(w.as_bytes(), &[RELAY])).expect("utf-8")
    }

    #[test]
    fn the_mods_bytes_stay_as_they_were_around_the_extension() {
        let w = r#"{ "app" : {"name":"G\u00e4me"}, "big": 123456789012345678901234567890, "f": 1.50e2,
            "capabilities": {"events": ["a/b"], "extensions": {"mod": {"x": 18446744073709551617}}} , "z":1 }"#;
        let out = set(w);
        let expect = w.replace(
            r#"{"mod": {"x": 18446744073709551617}}"#,
            r#"{"mod": {"x": 18446744073709551617},"relay":{"name":"gabp-relay"}}"#,
        );
        assert_eq!(out, expect);
    }

    #[test]
    fn missing_or_wrong_levels_are_made() {
        for (w, want) in [
            (
                "{}",
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                r#"{"a":1}"#,
                json!({"a": 1, "capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                r#"{"capabilities":7}"#,
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                r#"{"capabilities":{}}"#,
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                r#"{"capabilities":{"extensions":null,"e":1}}"#,
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}, "e": 1}}),
            ),
            (
                r#"{"capabilities":{"extensions":{"relay":"forged"}}}"#,
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                "null",
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
            (
                "[1]",
                json!({"capabilities": {"extensions": {"relay": {"name": "gabp-relay"}}}}),
            ),
        ] {
            let out = set(w);
            let v: Value =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("{w} -> {out}: {e}"));
            assert_eq!(v, want, "{w} -> {out}");
        }
    }

    #[test]
    fn repeated_and_escaped_names_are_all_set() {
        // Every reader of duplicates, first-wins or last-wins, sees the relay's extension.
        let out = set(r#"{"capabilities":{"extensions":{"relay":1,"rel\u0061y":2}}}"#);
        assert_eq!(
            out,
            r#"{"capabilities":{"extensions":{"relay":{"name":"gabp-relay"},"rel\u0061y":{"name":"gabp-relay"}}}}"#
        );
        let out = set(r#"{"capabilities":{"a":1},"capabilities":{"b":2}}"#);
        assert_eq!(
            out,
            r#"{"capabilities":{"a":1,"extensions":{"relay":{"name":"gabp-relay"}}},"capabilities":{"b":2,"extensions":{"relay":{"name":"gabp-relay"}}}}"#
        );
    }

    #[test]
    fn several_extensions_at_once() {
        let out = set_extensions(
            br#"{"capabilities":{"extensions":{"replay":0}}}"#,
            &[RELAY, ("replay", b"{\"sessionId\":\"s\"}")],
        );
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            v["capabilities"]["extensions"]["relay"]["name"],
            "gabp-relay"
        );
        assert_eq!(v["capabilities"]["extensions"]["replay"]["sessionId"], "s");
    }
}
