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
//! One rule with the strict bridge boundary and serde_json: a number that overflows a double
//! (`1e999`) and a `\u` escape naming a lone surrogate (`"\ud800"`) are refused, because every
//! peer downstream that decodes the frame would refuse it. [`diagnose`] says which of the two
//! made an otherwise well-formed body invalid.
//!
//! It serves both sides of the relay. For the strict bridge boundary it also shows every
//! object's keys to a [`KeyCheck`] as it walks them, so repeated keys are found in the same
//! pass. simd-json's tape was measured slower than this at every frame size and shape tried
//! (BENCHMARKS.md, "Parsing").

use std::ops::Range;

mod lexeme;
mod loose;

pub(crate) use lexeme::skip_ws;
use lexeme::{skip_str, skip_str_noting_escapes, skip_val};
pub use lexeme::{skip_string, skip_value, Key, KeyCheck};
pub use loose::{LooseScan, LOOSE_MAX};

/// Deepest nesting accepted, a frame's own object counting as one level: serde_json's default
/// limit (it refuses a 128th level), so every frame the relay forwards decodes there too.
pub const MAX_DEPTH: usize = 127;

/// One top-level member: the raw key (between the quotes) and the raw value span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Bytes of the key between its quotes, escapes not decoded.
    pub key: Range<usize>,
    /// Bytes of the value; for strings this includes the quotes.
    pub value: Range<usize>,
    /// Whether the value is a string holding a backslash escape (one without is its bytes).
    pub escaped: bool,
}

impl Member {
    /// Whether this member's key, escapes decoded, is `name` (`b` is the scanned object).
    pub fn key_is(&self, b: &[u8], name: &str) -> bool {
        let raw = &b[self.key.clone()];
        if !raw.contains(&b'\\') {
            return raw == name.as_bytes();
        }
        serde_json::from_slice::<String>(&b[self.key.start - 1..self.key.end + 1])
            .is_ok_and(|k| k == name)
    }
}

/// The value span of the last top-level member named `name` of the object in `b` (as JSON
/// readers that keep the last of a repeated key see it); `None` if there is none or `b` is not
/// one valid JSON object.
pub fn member_value(b: &[u8], name: &str) -> Option<Range<usize>> {
    let mut m = Vec::new();
    members(b, &mut m)?;
    m.iter()
        .rev()
        .find(|m| m.key_is(b, name))
        .map(|m| m.value.clone())
}

/// Appends the top-level members of the object in `b` to `out`, validating the whole input as
/// JSON (UTF-8 must already be checked). `None` if `b` is not exactly one valid JSON object.
pub fn members(b: &[u8], out: &mut Vec<Member>) -> Option<()> {
    members_with::<true, true, false>(b, out, None)
}

/// [`members`], showing the keys of every object nested in a member's value to `keys` (the
/// top-level keys are the members').
pub fn members_showing_keys(
    b: &[u8],
    out: &mut Vec<Member>,
    keys: &mut KeyCheck<'_>,
) -> Option<()> {
    members_with::<true, true, true>(b, out, Some(keys))
}

fn members_with<const FINITE: bool, const PAIRS: bool, const KEYS: bool>(
    b: &[u8],
    out: &mut Vec<Member>,
    mut keys: Option<&mut KeyCheck<'_>>,
) -> Option<()> {
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
        let key_end = skip_str::<PAIRS>(b, i)?;
        let key = i + 1..key_end - 1;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        // The object these members are in is the first level.
        let (value_end, escaped) = if b.get(i) == Some(&b'"') {
            skip_str_noting_escapes::<PAIRS>(b, i)?
        } else {
            (
                skip_val::<FINITE, PAIRS, KEYS>(b, i, MAX_DEPTH - 1, keys.as_deref_mut())?,
                false,
            )
        };
        out.push(Member {
            key,
            value: i..value_end,
            escaped,
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
    valid_with::<true, true>(b)
}

fn valid_with<const FINITE: bool, const PAIRS: bool>(b: &[u8]) -> bool {
    let i = skip_ws(b, 0);
    skip_val::<FINITE, PAIRS, false>(b, i, MAX_DEPTH, None)
        .is_some_and(|end| skip_ws(b, end) == b.len())
}

/// Why a body the scanner refused would otherwise be well-formed JSON: it holds a number that
/// overflows a double, or a lone surrogate escape. `None` when it is malformed anyway (or
/// valid). Only called on refusals, so it may scan again.
pub fn diagnose(b: &[u8]) -> Option<Refusal> {
    if deepest(b) > MAX_DEPTH {
        Some(Refusal::TooDeep)
    } else if is_valid_json(b) {
        None
    } else if valid_with::<true, false>(b) {
        Some(Refusal::LoneSurrogate)
    } else if valid_with::<false, true>(b) || valid_with::<false, false>(b) {
        Some(Refusal::NonFiniteNumber)
    } else {
        None
    }
}

/// The index of the quote closing the string opened at `b[open]`, following backslash escapes.
fn loose_string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut j = open + 1;
    loop {
        match *b.get(j)? {
            b'"' => return Some(j),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The two ways a grammatical JSON text breaks the relay's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A number beyond the range of a double.
    NonFiniteNumber,
    /// A `\u` escape naming half of a surrogate pair on its own.
    LoneSurrogate,
    /// Arrays and objects nested deeper than [`MAX_DEPTH`] (valid or not otherwise).
    TooDeep,
}

/// How deep arrays and objects nest, read loosely (strings skipped, nothing validated).
fn deepest(b: &[u8]) -> usize {
    let (mut depth, mut most, mut i) = (0usize, 0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'"' => match loose_string_end(b, i) {
                Some(end) => i = end,
                None => break,
            },
            b'{' | b'[' => {
                depth += 1;
                most = most.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    most
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
        let escaped: Vec<bool> = m.iter().map(|x| x.escaped).collect();
        assert_eq!(
            escaped,
            vec![true, false, false, false],
            "only the id has an escape"
        );
        let mut m = Vec::new();
        members(
            br#"{"a":"plain","b":"\u00e9","c":"x\/y","d":"\"\\"}"#,
            &mut m,
        )
        .expect("object");
        let escaped: Vec<bool> = m.iter().map(|x| x.escaped).collect();
        assert_eq!(escaped, vec![false, true, true, true]);
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
    fn depth_is_bounded_exactly_where_serde_json_stops() {
        // `levels` levels in all, the outer object the first.
        let nested = |levels: usize| {
            format!(
                "{{\"a\":{}{}}}",
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        let ok = nested(MAX_DEPTH);
        assert!(members(ok.as_bytes(), &mut Vec::new()).is_some());
        assert!(is_valid_json(ok.as_bytes()));
        assert!(serde_json::from_str::<serde_json::Value>(&ok).is_ok());
        assert_eq!(diagnose(ok.as_bytes()), None);
        let deep = nested(MAX_DEPTH + 1);
        assert!(members(deep.as_bytes(), &mut Vec::new()).is_none());
        assert!(!is_valid_json(deep.as_bytes()));
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        assert_eq!(diagnose(deep.as_bytes()), Some(Refusal::TooDeep));
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

    #[test]
    fn non_finite_numbers_and_lone_surrogates_are_refused_and_diagnosed() {
        for (bad, why) in [
            (&br#"{"a":1e999}"#[..], Refusal::NonFiniteNumber),
            (br#"{"a":[-1E+400]}"#, Refusal::NonFiniteNumber),
            (br#"{"a":{"b":2.5e308}}"#, Refusal::NonFiniteNumber),
            (br#"{"a":"\ud800"}"#, Refusal::LoneSurrogate),
            (br#"{"a":"x\udc00y"}"#, Refusal::LoneSurrogate),
            (br#"{"\ud800":1}"#, Refusal::LoneSurrogate),
            (br#"{"a":"\ud800\u0041"}"#, Refusal::LoneSurrogate),
            (br#"{"a":["\ud800\n"]}"#, Refusal::LoneSurrogate),
        ] {
            let text = String::from_utf8_lossy(bad);
            assert!(members(bad, &mut Vec::new()).is_none(), "{text}");
            assert!(!is_valid_json(bad), "{text}");
            assert_eq!(diagnose(bad), Some(why), "{text}");
        }
        let huge = format!("{{\"a\":1{}}}", "0".repeat(400));
        assert_eq!(diagnose(huge.as_bytes()), Some(Refusal::NonFiniteNumber));
        for good in [
            &br#"{"a":1e308,"b":1e-999,"c":-0.0}"#[..],
            br#"{"a":"\ud83d\ude00","b":"\u00e9\uFFFF"}"#,
        ] {
            assert!(members(good, &mut Vec::new()).is_some());
            assert_eq!(diagnose(good), None);
        }
        assert_eq!(diagnose(b"{\"a\":1e999"), None, "malformed anyway");
    }

    /// Text that serde_json's `Value` (the parser bridges use) accepts; the oracle refuses
    /// exactly what the scanner must refuse: bad grammar, numbers beyond a double, lone
    /// surrogates.
    fn serde_accepts(s: &str) -> bool {
        serde_json::from_str::<serde_json::Value>(s).is_ok()
    }

    /// Pieces that put numbers and escapes at the edges of the rule into generated text.
    fn edgy_fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r"\ud800".to_string()),
            Just(r"\udbff\udfff".to_string()),
            Just(r"\udc00".to_string()),
            Just(r"\ud83d\ude00".to_string()),
            Just(r"\u0041".to_string()),
            Just(r"\ud800\u0041".to_string()),
            "[a-z ]{0,4}".prop_map(String::from),
        ]
    }

    fn edgy_number() -> impl Strategy<Value = String> {
        prop_oneof![
            (any::<bool>(), 0u32..2, -400i32..400)
                .prop_map(|(neg, m, e)| format!("{}{m}.5e{e}", if neg { "-" } else { "" })),
            (1usize..330).prop_map(|n| format!("9{}", "9".repeat(n))),
            Just("1e308".to_string()),
            Just("1.7976931348623157e308".to_string()),
            Just("1e309".to_string()),
        ]
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
                prop_assert_eq!(is_valid_json(s.as_bytes()), serde_accepts(s), "{}", s);
            }
        }

        /// Agrees with serde_json on numbers near the range of a double and on surrogate
        /// escapes, alone, paired and mispaired, as values and as keys.
        #[test]
        fn agrees_on_numbers_and_surrogates(parts in prop::collection::vec(edgy_fragment(), 0..4), n in edgy_number(), as_key in any::<bool>()) {
            let s = parts.concat();
            let text = if as_key { format!(r#"{{"{s}":{n}}}"#) } else { format!(r#"{{"k":["{s}",{n}]}}"#) };
            let ours = members(text.as_bytes(), &mut Vec::new()).is_some();
            prop_assert_eq!(ours, serde_accepts(&text), "{}", text);
            prop_assert_eq!(ours, is_valid_json(text.as_bytes()));
        }
    }
}
