//! A validating single-pass JSON scanner that finds the byte spans of an object's top-level
//! members without building any value.
//!
//! The relay forwards the bytes it received, so it needs to know *where* `id` and `seq` sit in
//! the original body to rewrite them, and that the whole body is valid JSON before it fans it
//! out. This scanner does both in one pass. It is the hot path for every mod frame: long string
//! bodies are skipped with memchr and a vectorised control-byte check, everything else is
//! checked byte by byte against RFC 8259. It expects UTF-8 to have been checked already (`str::from_utf8` is far
//! faster at that than any byte loop here), and it limits nesting depth so hostile input cannot
//! make it recurse without bound (it does not recurse at all: it keeps an explicit stack).
//!
//! simd-json was measured slower than this on GABP-sized frames (its fixed per-document cost
//! dominates below ~8 KiB; see BENCHMARKS.md), so it serves the strict bridge boundary, where its
//! tape drives the duplicate-key and parameter checks, and this scanner serves the mod.

use std::ops::Range;

/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 128;

/// One top-level member: the raw key (between the quotes) and the raw value span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Bytes of the key between its quotes, escapes not decoded.
    pub key: Range<usize>,
    /// Bytes of the value; for strings this includes the quotes.
    pub value: Range<usize>,
}

#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Whether any byte is a control character (below 0x20), written so it vectorises.
#[inline]
fn any_control(seg: &[u8]) -> bool {
    seg.iter().fold(false, |acc, &c| acc | (c < 0x20))
}

/// Given `b[i] == '"'`, the index just past the closing quote; `None` if the string is invalid.
#[inline]
pub fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        // Short strings (keys, ids, channel names) are done byte by byte; long ones (payload
        // text) jump to the next quote or backslash with memchr and check the skipped bytes for
        // control characters in one vectorised pass.
        let short_end = (j + 16).min(b.len());
        let mut k = j;
        while k < short_end && !matches!(b[k], b'"' | b'\\' | 0..=0x1f) {
            k += 1;
        }
        if k == short_end && k < b.len() {
            let stop = memchr::memchr2(b'"', b'\\', &b[k..])? + k;
            if any_control(&b[k..stop]) {
                return None;
            }
            k = stop;
        }
        match *b.get(k)? {
            b'"' => return Some(k + 1),
            b'\\' => match *b.get(k + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j = k + 2,
                b'u' => {
                    let hex = b.get(k + 2..k + 6)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    j = k + 6;
                }
                _ => return None,
            },
            _ => return None, // a control character
        }
    }
}

/// Validates a number starting at `i`; returns the index just past it.
fn skip_number(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |b: &[u8], mut i: usize| {
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        (i > s).then_some(i)
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i)?,
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Some(i)
}

/// Validates the value starting at `i` (no leading whitespace); returns the index past it.
pub fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => skip_container(b, i),
        b't' => b.get(i..i + 4).filter(|s| *s == b"true").map(|_| i + 4),
        b'f' => b.get(i..i + 5).filter(|s| *s == b"false").map(|_| i + 5),
        b'n' => b.get(i..i + 4).filter(|s| *s == b"null").map(|_| i + 4),
        _ => skip_number(b, i),
    }
}

/// Validates an object or array with an explicit stack (no recursion).
fn skip_container(b: &[u8], i: usize) -> Option<usize> {
    // Each stack entry says whether that level is an object.
    let mut stack = [false; MAX_DEPTH];
    let mut depth = 0usize;
    let mut j = i;
    // Open the first container, then loop: at each step we are just after an opening bracket
    // or a comma (expecting a member/element) or just after a value.
    let open =
        |b: &[u8], j: usize, stack: &mut [bool; MAX_DEPTH], depth: &mut usize| -> Option<usize> {
            if *depth == MAX_DEPTH {
                return None;
            }
            stack[*depth] = b[j] == b'{';
            *depth += 1;
            Some(j + 1)
        };
    j = open(b, j, &mut stack, &mut depth)?;
    let mut expect_item = true;
    let mut first = true;
    loop {
        j = skip_ws(b, j);
        let in_object = stack[depth - 1];
        if expect_item {
            let c = *b.get(j)?;
            if first && c == if in_object { b'}' } else { b']' } {
                // Empty container.
                depth -= 1;
                j += 1;
                if depth == 0 {
                    return Some(j);
                }
                expect_item = false;
                first = false;
                continue;
            }
            if in_object {
                if c != b'"' {
                    return None;
                }
                j = skip_ws(b, skip_string(b, j)?);
                if b.get(j) != Some(&b':') {
                    return None;
                }
                j = skip_ws(b, j + 1);
            }
            match *b.get(j)? {
                b'{' | b'[' => {
                    j = open(b, j, &mut stack, &mut depth)?;
                    first = true;
                    continue;
                }
                _ => j = skip_value(b, j)?,
            }
            expect_item = false;
            first = false;
        } else {
            match *b.get(j)? {
                b',' => {
                    j += 1;
                    expect_item = true;
                    first = false;
                }
                c if c == if in_object { b'}' } else { b']' } => {
                    depth -= 1;
                    j += 1;
                    if depth == 0 {
                        return Some(j);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// Appends the top-level members of the object in `b` to `out`, validating the whole input as
/// JSON (UTF-8 must already be checked). `None` if `b` is not exactly one valid JSON object.
pub fn members(b: &[u8], out: &mut Vec<Member>) -> Option<()> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(());
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = skip_string(b, i)?;
        let key = i + 1..key_end - 1;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let value_end = skip_value(b, i)?;
        out.push(Member {
            key,
            value: i..value_end,
        });
        i = skip_ws(b, value_end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return (skip_ws(b, i + 1) == b.len()).then_some(()),
            _ => return None,
        }
    }
}

/// Whether `b` is exactly one valid JSON value (UTF-8 must already be checked).
pub fn is_valid_json(b: &[u8]) -> bool {
    let i = skip_ws(b, 0);
    skip_value(b, i).is_some_and(|end| skip_ws(b, end) == b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_spans_around_nested_values_and_escapes() {
        let b = br#" { "id" : "a\"}b", "p":{"x":[1,{"y":"}"}]}, "seq":42 ,"z":null}"#;
        let mut m = Vec::new();
        members(b, &mut m).expect("object");
        let keys: Vec<&[u8]> = m.iter().map(|x| &b[x.key.clone()]).collect();
        assert_eq!(keys, vec![&b"id"[..], b"p", b"seq", b"z"]);
        assert_eq!(&b[m[0].value.clone()], br#""a\"}b""#);
        assert_eq!(&b[m[1].value.clone()], br#"{"x":[1,{"y":"}"}]}"#);
        assert_eq!(&b[m[2].value.clone()], b"42");
        assert_eq!(&b[m[3].value.clone()], b"null");
    }

    #[test]
    fn rejects_invalid_json() {
        for bad in [
            &b"[1]"[..],
            b"{\"a\":",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{\"a\":01}",
            b"{\"a\":1.}",
            b"{\"a\":-}",
            b"{\"a\":tru}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\\u12g4\"}",
            b"{\"a\":[1 2]}",
            b"{\"a\":{\"b\"}}",
            b"{\"a\":1} x",
            b"{\"a\":NaN}",
            b"{\"a\":Infinity}",
            b"{\"a\":[}",
            b"{\"a\":]}",
            b"{\"a\":{]}",
            b"{\"a\":\"unterminated}",
        ] {
            assert!(
                members(bad, &mut Vec::new()).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(members(b"{}", &mut Vec::new()).is_some());
        assert!(members(b" {\"a\" : [ ] , \"b\":{ } } ", &mut Vec::new()).is_some());
    }

    #[test]
    fn depth_is_bounded() {
        let deep = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(members(deep.as_bytes(), &mut Vec::new()).is_none());
        let ok = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(members(ok.as_bytes(), &mut Vec::new()).is_some());
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            (-1e6f64..1e6).prop_map(|f| serde_json::json!(f)),
            ".{0,24}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Agrees with serde_json on what is valid JSON, for generated values and for their
        /// byte-level mutations.
        #[test]
        fn agrees_with_serde_json(v in json_value(), cut in any::<prop::sample::Index>(), flip in any::<u8>(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_string_pretty(&v) } else { serde_json::to_string(&v) }.expect("serializes");
            prop_assert!(is_valid_json(text.as_bytes()));
            let mut bytes = text.into_bytes();
            let at = cut.index(bytes.len());
            bytes[at] = flip;
            if let Ok(s) = std::str::from_utf8(&bytes) {
                match serde_json::from_str::<serde::de::IgnoredAny>(s) {
                    // Grammatically valid but beyond f64: serde refuses, JSON allows; not our call.
                    Err(e) if e.to_string().contains("out of range") => {}
                    theirs => prop_assert_eq!(is_valid_json(s.as_bytes()), theirs.is_ok(), "{}", s),
                }
            }
        }
    }
}
