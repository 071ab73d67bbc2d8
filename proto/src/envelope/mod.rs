//! The envelope view: one validating scan per frame into a small view borrowed from the body.
//!
//! The body that gets forwarded is never rewritten by parsing: the resulting [`EnvelopeView`]
//! holds only what routing needs (type, id, method, channel, seq and where the params, payload,
//! result and error sit in the body, found by [`crate::scan`]). Nothing is re-serialized.
//!
//! Two modes, one per side of the relay. [`Mode::Strict`] is for bridges (untrusted): the full envelope
//! schema, UUID ids, the method pattern, no duplicate keys anywhere, no unknown envelope fields,
//! no non-finite numbers, and the parameter checks of [`crate::params`]. [`Mode::Tolerant`] is
//! for the mod (trusted, quirky): `"result": null` / `"error": null` count as absent, extra fields
//! are allowed, and only what routing needs must be well formed.
//!
//! This module owns the view's types and the parse entry point; `fields` reads top-level
//! members, `repeats` refuses repeated keys at every depth, `object` reads a nested object's
//! values for `params`, and `view` applies the envelope rules.

use std::borrow::Cow;
use std::ops::Range;

use crate::error::EnvelopeError;
use crate::scan::{self, Key, LooseScan, Member};

mod fields;
mod object;
pub mod params;
mod repeats;
mod view;

use fields::{decode_str, truncate_key, Field, Known};
use view::{build_view, strict_view};

/// How strictly a frame is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bridge input: the whole schema, nothing extra.
    Strict,
    /// Mod input: routing fields must be sound; quirks are tolerated.
    Tolerant,
}

/// The three GABP message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgType {
    /// A method call.
    Request,
    /// The answer to a request.
    Response,
    /// A message on a channel.
    Event,
}

impl MsgType {
    /// The wire name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            MsgType::Request => "request",
            MsgType::Response => "response",
            MsgType::Event => "event",
        }
    }
}

/// What routing needs to know about one frame, borrowed from its body.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeView<'a> {
    /// Request, response or event.
    pub kind: MsgType,
    /// The message id, decoded.
    pub id: Option<Cow<'a, str>>,
    /// Span of the id value in the body, quotes included.
    pub id_span: Option<Range<usize>>,
    /// The method of a request.
    pub method: Option<Cow<'a, str>>,
    /// The channel of an event.
    pub channel: Option<Cow<'a, str>>,
    /// The sequence number of an event, when it is a non-negative integer.
    pub seq: Option<u64>,
    /// Span of the seq value in the body.
    pub seq_span: Option<Range<usize>>,
    /// Span of a request's params object.
    pub params: Option<Range<usize>>,
    /// Span of an event's payload.
    pub payload: Option<Range<usize>>,
    /// Span of a response's (non-null) result.
    pub result: Option<Range<usize>>,
    /// The code of a response's (non-null) error.
    pub error_code: Option<i64>,
    /// A member of a mod's response that counts as absent (`"error": null` beside a result,
    /// `"result": null` beside an error), with one adjacent comma: the bytes to cut before the
    /// response is forwarded, so a bridge sees exactly one of `result` and `error`. Tolerant
    /// mode only.
    pub absent_null: Option<Range<usize>>,
}

impl EnvelopeView<'_> {
    /// Whether this is an error response.
    pub fn is_error(&self) -> bool {
        self.error_code.is_some()
    }
}

/// A reusable parser; keep one per connection so its buffers are allocated once.
#[derive(Debug, Default)]
pub struct Parser {
    members: Vec<Member>,
    keys: Vec<Key>,
}

/// A canonical 8-4-4-4-12 hex UUID string.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
        && hex(0..8)
        && hex(9..13)
        && hex(14..18)
        && hex(19..23)
        && hex(24..36)
}

/// `^[a-z][a-z0-9_-]*(/[a-z][a-z0-9_-]*)+$`: the method and tool-name pattern of GABP 1.0.
pub fn is_method_name(s: &str) -> bool {
    let mut segments = 0;
    // Whether the next byte starts a segment (and so must be a lowercase letter).
    let mut starts = true;
    for &c in s.as_bytes() {
        match c {
            b'a'..=b'z' => {}
            b'0'..=b'9' | b'_' | b'-' if !starts => {}
            b'/' if !starts => {}
            _ => return false,
        }
        if starts {
            segments += 1;
        }
        starts = c == b'/';
    }
    !starts && segments >= 2
}

impl Parser {
    /// A parser with empty buffers.
    pub fn new() -> Self {
        Parser::default()
    }

    /// Validates `body` and returns its view. The view borrows `body`, never the parser.
    pub fn parse<'a>(
        &mut self,
        body: &'a [u8],
        mode: Mode,
    ) -> Result<EnvelopeView<'a>, EnvelopeError> {
        // Checked once here; every string below is a slice of this `str` at ASCII quote
        // boundaries, so slicing it never re-validates.
        let text = std::str::from_utf8(body).map_err(|_| EnvelopeError::InvalidUtf8)?;
        let view = self.view(text, mode);
        // A frame with a huge number of members or keys must not leave its scratch space held
        // by the connection for good.
        if self.members.capacity() > SCRATCH_KEPT {
            self.members = Vec::new();
        }
        if self.keys.capacity() > SCRATCH_KEPT {
            self.keys = Vec::new();
        }
        view
    }

    #[inline(always)]
    fn view<'a>(&mut self, text: &'a str, mode: Mode) -> Result<EnvelopeView<'a>, EnvelopeError> {
        let body = text.as_bytes();
        self.members.clear();
        match mode {
            Mode::Tolerant => {
                scan::members(body, &mut self.members)
                    .ok_or_else(|| not_object_or_invalid(body))?;
                let mut known = Known::default();
                read_known(text, &self.members, mode, &mut known)?;
                build_view(body, &mut known, mode)
            }
            Mode::Strict => strict_view(text, &mut self.members, &mut self.keys),
        }
    }
}

/// Entries of scratch space a parser keeps between frames (more is freed after the frame).
const SCRATCH_KEPT: usize = 4096;

/// The envelope fields among an object's top-level members, typed. A repeated envelope field
/// is refused; other members are skipped (tolerant) or the first is noted as unknown (strict).
/// Filled in place: the fields are too large to move around per frame.
#[inline(always)]
fn read_known<'a>(
    text: &'a str,
    members: &[Member],
    mode: Mode,
    known: &mut Known<'a>,
) -> Result<(), EnvelopeError> {
    for m in members {
        // Envelope names have no escapes: a raw key is decoded only when it is not one of them
        // as it stands (an escaped `"\u0069d"` still counts as `id`).
        let raw = &text[m.key.clone()];
        let decoded;
        let (index, name) = match Known::index(raw.as_bytes()) {
            Some(i) => (Some(i), raw),
            None if raw.contains('\\') => {
                decoded = decode_str(text, &(m.key.start - 1..m.key.end + 1))?;
                (Known::index(decoded.as_bytes()), &*decoded)
            }
            None => (None, raw),
        };
        let Some(index) = index else {
            // Extra fields are the mod's business; a bridge may send none.
            if mode == Mode::Strict && known.unknown.is_none() {
                known.unknown = Some(name.to_string());
            }
            continue;
        };
        let slot = known.slot_at(index);
        if slot.is_some() {
            return Err(EnvelopeError::DuplicateKey(truncate_key(name)));
        }
        *slot = Some(Field::from_raw(text, m)?);
    }
    Ok(())
}

/// The keys [`answer_id`] reads.
pub const ANSWER_KEYS: &[&str] = &["type", "id"];

/// The UUID a frame that could not be read (or was too large to hold whole) answers, from a
/// [`LooseScan`] of [`ANSWER_KEYS`]: its last top-level `id`, as JSON parsers keep the last of
/// duplicates; none if a readable `type` says it is not a response. Only ever used to tell a
/// waiting caller that its answer cannot be forwarded.
pub fn answer_id(scan: &LooseScan) -> Option<String> {
    if scan.values(0).last().is_some_and(|t| t != "response") {
        return None;
    }
    scan.values(1).last().filter(|id| is_uuid(id)).cloned()
}

/// Tells "valid JSON, but not an object" apart from "not JSON".
fn not_object_or_invalid(body: &[u8]) -> EnvelopeError {
    if scan::is_valid_json(body) {
        EnvelopeError::NotAnObject
    } else {
        invalid_json(body)
    }
}

/// "Not JSON", or the precise rule a grammatical body broke (non-finite number, lone surrogate).
fn invalid_json(body: &[u8]) -> EnvelopeError {
    match scan::diagnose(body) {
        Some(scan::Refusal::NonFiniteNumber) => EnvelopeError::NonFiniteNumber,
        Some(scan::Refusal::LoneSurrogate) => EnvelopeError::LoneSurrogate,
        Some(scan::Refusal::TooDeep) => EnvelopeError::TooDeep,
        None => EnvelopeError::InvalidJson,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &str = r#"{"v":"gabp/1","id":"550e8400-e29b-41d4-a716-446655440020","type":"event","channel":"test/event","seq":1,"payload":{"data":"x"}}"#;

    fn strict(s: &str) -> Result<EnvelopeView<'_>, EnvelopeError> {
        Parser::new().parse(s.as_bytes(), Mode::Strict)
    }
    fn tolerant(s: &str) -> Result<EnvelopeView<'_>, EnvelopeError> {
        Parser::new().parse(s.as_bytes(), Mode::Tolerant)
    }

    #[test]
    fn event_view_borrows_and_locates_fields() {
        let v = strict(EVENT).expect("valid");
        assert_eq!(v.kind, MsgType::Event);
        assert!(matches!(v.channel, Some(Cow::Borrowed("test/event"))));
        assert_eq!(v.seq, Some(1));
        assert_eq!(&EVENT[v.seq_span.expect("seq")], "1");
        assert_eq!(
            &EVENT[v.id_span.expect("id")],
            "\"550e8400-e29b-41d4-a716-446655440020\""
        );
        assert_eq!(&EVENT[v.payload.expect("payload")], r#"{"data":"x"}"#);
    }

    #[test]
    fn escaped_strings_are_decoded() {
        let s = r#"{"v":"gabp/1","id":"550e8400-e29b-41d4-a716-446655440020","type":"event","channel":"a\/b","seq":0,"payload":1}"#;
        assert_eq!(strict(s).expect("valid").channel.as_deref(), Some("a/b"));
        let t = tolerant(s).expect("valid");
        assert_eq!(t.channel.as_deref(), Some("a/b"));
        assert!(
            matches!(t.channel, Some(std::borrow::Cow::Owned(_))),
            "decoded"
        );
        assert!(
            matches!(t.id, Some(std::borrow::Cow::Borrowed(_))),
            "no escape: borrowed"
        );
    }

    #[test]
    fn tolerant_reads_escaped_envelope_keys_and_counts_them_as_repeats() {
        let id = "550e8400-e29b-41d4-a716-446655440020";
        let s = format!(
            r#"{{"v":"gabp/1","\u0069d":"{id}","typ\u0065":"event","channel":"a","seq":3,"payload":1,"extr\u0061":2}}"#
        );
        let v = tolerant(&s).expect("valid");
        assert_eq!(v.id.as_deref(), Some(id));
        assert_eq!(v.kind, MsgType::Event);
        let s = format!(
            r#"{{"v":"gabp/1","id":"{id}","\u0069d":"{id}","type":"event","channel":"a","payload":1}}"#
        );
        assert_eq!(tolerant(&s), Err(EnvelopeError::DuplicateKey("id".into())));
    }

    #[test]
    fn strict_accepts_integers_beyond_64_bits_as_valid_json() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        for n in [
            "18446744073709551616",
            "-18446744073709551616",
            "123456789012345678901234567890",
            "-9223372036854775809",
            "-18446744073709551615",
            "-1234567890123456789012345678901234567890",
        ] {
            let body = format!(
                r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":{n}}}}}"#
            );
            assert!(strict(&body).is_ok(), "{body}: {:?}", strict(&body));
            assert!(tolerant(&body).is_ok(), "{body}");
        }
        // Just past the 128-bit range, where some JSON readers stop, it is still a number.
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":-170141183460469231731687303715884105729}}}}"#
        );
        assert!(strict(&body).is_ok());
        assert!(tolerant(&body).is_ok());
        // Nesting past the scanner's bound is said as such, not as bad JSON.
        let deep = format!("{}1{}", "[".repeat(129), "]".repeat(129));
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":{deep}}}}}"#
        );
        assert_eq!(strict(&body), Err(EnvelopeError::TooDeep));
        assert_eq!(tolerant(&body), Err(EnvelopeError::TooDeep));
        // Past a double's range an integer is refused as what it is, not as bad JSON.
        let huge = "9".repeat(400);
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":{huge}}}}}"#
        );
        assert_eq!(strict(&body), Err(EnvelopeError::NonFiniteNumber));
        assert_eq!(tolerant(&body), Err(EnvelopeError::NonFiniteNumber));
    }

    #[test]
    fn strict_rejections() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        let cases = [
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","id":"{id}","type":"request","method":"a/b"}}"#
                ),
                EnvelopeError::DuplicateKey("id".into()),
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":1,"x":2}}}}"#
                ),
                EnvelopeError::DuplicateKey("x".into()),
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","extra":1}}"#
                ),
                EnvelopeError::UnknownField("extra".into()),
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":1e999}}}}"#
                ),
                EnvelopeError::NonFiniteNumber,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":"\ud800"}}}}"#
                ),
                EnvelopeError::LoneSurrogate,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":"\udc00"}}}}"#
                ),
                EnvelopeError::LoneSurrogate,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":{{"x":NaN}}}}"#
                ),
                EnvelopeError::InvalidJson,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"a/b","params":[]}}"#
                ),
                EnvelopeError::InvalidField("params"),
            ),
            (
                r#"{"v":"gabp/1","id":"not-a-uuid","type":"request","method":"a/b"}"#.to_string(),
                EnvelopeError::InvalidField("id"),
            ),
            (
                format!(r#"{{"v":"gabp/1","id":"{id}","type":"response"}}"#),
                EnvelopeError::ResultAndError,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"response","result":null,"error":null}}"#
                ),
                EnvelopeError::ResultAndError,
            ),
            (
                format!(r#"{{"v":"gabp/1","id":"{id}","type":"notice"}}"#),
                EnvelopeError::InvalidType,
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"event","channel":"c","seq":-1,"payload":1}}"#
                ),
                EnvelopeError::InvalidField("seq"),
            ),
            (
                format!(
                    r#"{{"v":"gabp/1","id":"{id}","type":"event","channel":"c","seq":1,"payload":1,"timestamp":5}}"#
                ),
                EnvelopeError::UnknownField("timestamp".into()),
            ),
            ("[1,2]".to_string(), EnvelopeError::NotAnObject),
            ("{".to_string(), EnvelopeError::InvalidJson),
        ];
        for (body, want) in cases {
            assert_eq!(strict(&body).expect_err(&body), want, "{body}");
        }
        assert_eq!(
            Parser::new()
                .parse(b"{\"v\":\"gabp/1\xff\"}", Mode::Strict)
                .expect_err("utf8"),
            EnvelopeError::InvalidUtf8
        );
    }

    #[test]
    fn a_null_counted_as_absent_is_cut_and_leaves_a_strict_response() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        let head = format!(r#""v":"gabp/1","id":"{id}","type":"response""#);
        let cases = [
            format!(r#"{{{head},"result":{{"a":1}},"error":null}}"#),
            format!(r#"{{"error":null,{head},"result":{{"a":1}}}}"#),
            format!(r#"{{ "error" : null , {head},"result":7 }}"#),
            format!("{{{head},\n  \"error\": null,\n  \"result\": [1]\n}}"),
            format!(r#"{{{head},"result":null,"error":null}}"#),
            format!(r#"{{"result":null,{head},"error":{{"code":-31000,"message":"bad"}}}}"#),
            format!(r#"{{{head},"error":{{"code":-31000,"message":"bad"}},"result":null}}"#),
        ];
        for body in &cases {
            let view = tolerant(body).expect(body);
            let cut = view.absent_null.clone().expect(body);
            let mut out = body.as_bytes()[..cut.start].to_vec();
            out.extend_from_slice(&body.as_bytes()[cut.end..]);
            let text = String::from_utf8(out).expect("utf-8");
            let forwarded = strict(&text).unwrap_or_else(|e| panic!("{body} -> {text}: {e}"));
            assert_eq!(forwarded.is_error(), view.is_error(), "{text}");
            assert_eq!(
                text.matches("null").count(),
                usize::from(text.contains("\"result\":null")),
                "{text}"
            );
        }
        // Nothing to cut: no null sibling, or a strict (bridge) body.
        let plain = format!(r#"{{{head},"result":1}}"#);
        assert_eq!(tolerant(&plain).expect("ok").absent_null, None);
        assert_eq!(strict(&plain).expect("ok").absent_null, None);
    }

    #[test]
    fn a_broken_answer_answers_its_last_uuid_id_unless_its_type_says_otherwise() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        let other = "550e8400-e29b-41d4-a716-446655440001";
        let cases: [(String, Option<&str>); 8] = [
            (
                format!(r#"{{"v":"gabp/1","id":"{id}","result":1}}"#),
                Some(id),
            ),
            (
                format!(r#"{{"a":,,"id":"{id}","type":"response"}}"#),
                Some(id),
            ),
            (format!(r#"{{"id":"{other}","id":"{id}"}}"#), Some(id)),
            (
                r#"{"id":"550e8400-e29b-41d4-a716-44665544000\u0030","type":"response"}"#
                    .to_string(),
                Some(id),
            ),
            (format!(r#"{{"id":"{id}","result":[1,"#), Some(id)),
            (
                format!(r#"{{"id":"{id}","payload":1e999,"type":"event"}}"#),
                None,
            ),
            (r#"{"id":7,"type":"response"}"#.to_string(), None),
            (r#"{"id":"abc"}"#.to_string(), None),
        ];
        for (body, want) in cases {
            let scan = LooseScan::of(ANSWER_KEYS, body.as_bytes());
            assert_eq!(answer_id(&scan).as_deref(), want, "{body}");
        }
    }

    #[test]
    fn tolerant_accepts_mod_quirks() {
        let id = "550e8400-e29b-41d4-a716-446655440000";
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"response","result":{{"a":1}},"error":null}}"#
        );
        let ok = tolerant(&body).expect("ok");
        assert!(ok.result.is_some() && !ok.is_error());
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"response","result":null,"error":{{"code":-31000,"message":"bad"}}}}"#
        );
        let err = tolerant(&body).expect("ok");
        assert_eq!(err.error_code, Some(-31000));
        // A call that returned null, with or without a null error beside it.
        for body in [
            format!(r#"{{"v":"gabp/1","id":"{id}","type":"response","result":null}}"#),
            format!(r#"{{"v":"gabp/1","id":"{id}","type":"response","result":null,"error":null}}"#),
        ] {
            let null = tolerant(&body).expect(&body);
            assert_eq!(null.kind, MsgType::Response);
            assert!(!null.is_error(), "{body}");
            assert_eq!(
                &body.as_bytes()[null.result.clone().expect("a result")],
                b"null"
            );
        }
        // An error without its message (or with one that is not a string) is no answer a
        // bridge could take.
        for error in [
            r#"{"code":5}"#,
            r#"{"code":5,"message":7}"#,
            r#"{"message":"m"}"#,
        ] {
            let body = format!(r#"{{"v":"gabp/1","id":"{id}","type":"response","error":{error}}}"#);
            assert_eq!(
                tolerant(&body),
                Err(EnvelopeError::InvalidField("error")),
                "{body}"
            );
        }
        // Neither a result nor an error is still no response.
        assert_eq!(
            tolerant(&format!(
                r#"{{"v":"gabp/1","id":"{id}","type":"response","error":null}}"#
            )),
            Err(EnvelopeError::ResultAndError)
        );
        let ev = tolerant(r#"{"v":"gabp/1","id":"e1","type":"event","channel":"c","seq":1,"payload":{},"timestamp":17}"#).expect("ok");
        assert_eq!(ev.seq, Some(1));
        // Routing fields must still be sound.
        assert!(tolerant(r#"{"v":"gabp/1","type":"response","result":1}"#).is_err());
        // One rule with the strict boundary: what bridges could not decode is refused.
        assert_eq!(
            tolerant(r#"{"v":"gabp/1","type":"event","channel":"c","payload":{"x":1e999}}"#),
            Err(EnvelopeError::NonFiniteNumber)
        );
        assert_eq!(
            tolerant(r#"{"v":"gabp/1","type":"event","channel":"c","payload":"\ud800"}"#),
            Err(EnvelopeError::LoneSurrogate)
        );
    }

    #[test]
    fn method_pattern() {
        for ok in ["tools/call", "a/b/c", "x1/y_z-2"] {
            assert!(is_method_name(ok), "{ok}");
        }
        for bad in [
            "tools",
            "Tools/call",
            "tools/",
            "/a",
            "a//b",
            "1a/b",
            "a.b/c",
            "a/_b",
            "a/-",
            "",
            "/",
        ] {
            assert!(!is_method_name(bad), "{bad}");
        }
    }

    proptest::proptest! {
        /// The byte walk agrees with the pattern read segment by segment, and the UUID test
        /// with its groups, on text made of the characters that matter.
        #[test]
        fn name_and_id_tests_agree_with_their_patterns(s in "[a-z0-9_/.A-]{0,12}", id in "[0-9a-fA-FgG-]{34,38}") {
            let segment = |seg: &str| {
                let mut c = seg.bytes();
                c.next().is_some_and(|f| f.is_ascii_lowercase())
                    && c.all(|x| matches!(x, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
            };
            let pattern = s.split('/').count() >= 2 && s.split('/').all(segment);
            proptest::prop_assert_eq!(is_method_name(&s), pattern, "{}", s);
            let groups: Vec<&str> = id.split('-').collect();
            let canonical = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
                && groups.iter().all(|g| g.bytes().all(|c| c.is_ascii_hexdigit()));
            proptest::prop_assert_eq!(is_uuid(&id), canonical, "{}", id);
        }
    }

    #[test]
    fn a_frame_with_many_keys_leaves_no_scratch_space_held() {
        let keys: Vec<String> = (0..20_000).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let body = format!(
            r#"{{"v":"gabp/1","id":"550e8400-e29b-41d4-a716-446655440000","type":"request","method":"a/b","params":{{{}}},{}}}"#,
            keys.join(","),
            keys.join(",")
        );
        let mut p = Parser::new();
        // Refused (unknown top-level fields), after every key was seen.
        assert!(p.parse(body.as_bytes(), Mode::Strict).is_err());
        assert!(p.parse(body.as_bytes(), Mode::Tolerant).is_ok());
        assert!(p.keys.capacity() <= SCRATCH_KEPT && p.members.capacity() <= SCRATCH_KEPT);
    }

    #[test]
    fn parser_reuse_across_frames() {
        let mut p = Parser::new();
        for _ in 0..3 {
            assert!(p.parse(EVENT.as_bytes(), Mode::Strict).is_ok());
            assert!(p.parse(b"{]", Mode::Strict).is_err());
        }
    }
}
