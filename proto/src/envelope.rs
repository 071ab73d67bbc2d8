//! The envelope view: one simd-json parse per frame into a small view borrowed from the body.
//!
//! simd-json rewrites its input, so the body that gets forwarded is never parsed: [`Parser`]
//! copies it into a per-connection scratch buffer and parses that with reused buffers. The
//! resulting [`EnvelopeView`] holds only what routing needs (type, id, method, channel, seq and
//! where the params, payload, result and error sit in the *original* body, found by
//! [`crate::scan`]). Nothing is re-serialized.
//!
//! Two modes follow DESIGN.md. [`Mode::Strict`] is for bridges (untrusted): the full envelope
//! schema, UUID ids, the method pattern, no duplicate keys anywhere, no unknown envelope fields,
//! no non-finite numbers, and the parameter checks of [`crate::params`]. [`Mode::Tolerant`] is
//! for the mod (trusted, quirky): `"result": null` / `"error": null` count as absent, extra fields
//! are allowed, and only what routing needs must be well formed.

use std::borrow::Cow;
use std::ops::Range;

use simd_json::{Node, StaticNode};

use crate::error::EnvelopeError;
use crate::params;
use crate::scan::{self, Member};
use crate::PROTOCOL_VERSION;

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
}

impl EnvelopeView<'_> {
    /// Whether this is an error response.
    pub fn is_error(&self) -> bool {
        self.error_code.is_some()
    }
}

/// A reusable parser; keep one per connection so its buffers are allocated once.
#[derive(Default)]
pub struct Parser {
    scratch: Vec<u8>,
    buffers: Option<simd_json::Buffers>,
    tape: Vec<Node<'static>>,
    members: Vec<Member>,
    keys: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Parser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parser")
            .field("scratch_capacity", &self.scratch.capacity())
            .finish()
    }
}

/// Reuses a vector's allocation for a different lifetime; the vector is empty, so no value
/// crosses lifetimes (the in-place `collect` keeps the allocation).
fn recycle<'b>(mut v: Vec<Node<'_>>) -> Vec<Node<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| -> Node<'b> { unreachable!("vector was cleared") })
        .collect()
}

/// Number of tape nodes taken by the value at `i`, itself included.
pub(crate) fn node_size(tape: &[Node<'_>], i: usize) -> usize {
    match tape[i] {
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        _ => 1,
    }
}

/// Iterates an object's members on the tape as (key, value index).
pub(crate) fn object_members<'t, 'a>(
    tape: &'t [Node<'a>],
    at: usize,
) -> impl Iterator<Item = (&'a str, usize)> + 't {
    let len = match tape[at] {
        Node::Object { len, .. } => len,
        _ => 0,
    };
    let mut next = at + 1;
    (0..len).filter_map(move |_| {
        let key = match tape.get(next)? {
            Node::String(k) => *k,
            _ => return None,
        };
        let value = next + 1;
        next = value + node_size(tape, value);
        Some((key, value))
    })
}

/// A canonical 8-4-4-4-12 hex UUID string.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `^[a-z][a-z0-9_-]*(/[a-z][a-z0-9_-]*)+$`: the method and tool-name pattern of GABP 1.0.
pub fn is_method_name(s: &str) -> bool {
    let mut segments = 0;
    for seg in s.split('/') {
        let mut chars = seg.bytes();
        match chars.next() {
            Some(b'a'..=b'z') => {}
            _ => return false,
        }
        if !chars.all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')) {
            return false;
        }
        segments += 1;
    }
    segments >= 2
}

/// Which top-level fields a message type allows in strict mode.
fn allowed(kind: MsgType, key: &str) -> bool {
    matches!(key, "v" | "id" | "type")
        || match kind {
            MsgType::Request => matches!(key, "method" | "params"),
            MsgType::Response => matches!(key, "result" | "error"),
            MsgType::Event => matches!(key, "channel" | "seq" | "payload"),
        }
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
        if std::str::from_utf8(body).is_err() {
            return Err(EnvelopeError::InvalidUtf8);
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(body);
        let buffers = self
            .buffers
            .get_or_insert_with(|| simd_json::Buffers::new(body.len()));
        let mut tape = simd_json::tape::Tape(recycle(std::mem::take(&mut self.tape)));
        let filled = simd_json::fill_tape(&mut self.scratch, buffers, &mut tape);
        let result = match filled {
            Ok(()) => {
                self.members.clear();
                read_view(body, &tape.0, mode, &mut self.members, &mut self.keys)
            }
            Err(_) => Err(EnvelopeError::InvalidJson),
        };
        self.tape = recycle(tape.0);
        result
    }
}

/// Checks every object on the tape for duplicate keys, and every number for finiteness.
fn check_whole_tape(
    tape: &[Node<'_>],
    keys: &mut Vec<(usize, usize)>,
) -> Result<(), EnvelopeError> {
    for (i, node) in tape.iter().enumerate() {
        match node {
            Node::Static(StaticNode::F64(f)) if !f.is_finite() => {
                return Err(EnvelopeError::NonFiniteNumber)
            }
            Node::Object { len, .. } if *len > 1 => check_duplicates(tape, i, keys)?,
            _ => {}
        }
    }
    Ok(())
}

fn check_duplicates(
    tape: &[Node<'_>],
    at: usize,
    keys: &mut Vec<(usize, usize)>,
) -> Result<(), EnvelopeError> {
    let names: Vec<&str> = object_members(tape, at).map(|(k, _)| k).collect();
    keys.clear();
    if names.len() <= 16 {
        for (i, a) in names.iter().enumerate() {
            if names[..i].contains(a) {
                return Err(EnvelopeError::DuplicateKey(truncate_key(a)));
            }
        }
    } else {
        let mut seen = std::collections::HashSet::with_capacity(names.len());
        for a in &names {
            if !seen.insert(*a) {
                return Err(EnvelopeError::DuplicateKey(truncate_key(a)));
            }
        }
    }
    Ok(())
}

/// Keys echoed in error messages are cut short so a reply never grows with hostile input.
fn truncate_key(k: &str) -> String {
    k.chars().take(64).collect()
}

fn string_at<'t>(tape: &[Node<'t>], i: usize) -> Option<&'t str> {
    match tape.get(i) {
        Some(Node::String(s)) => Some(s),
        _ => None,
    }
}

fn is_null(tape: &[Node<'_>], i: usize) -> bool {
    matches!(tape.get(i), Some(Node::Static(StaticNode::Null)))
}

/// The decoded string, borrowed from the body when it has no escapes.
fn borrow_or_own<'a>(body: &'a [u8], span: &Range<usize>, decoded: &str) -> Cow<'a, str> {
    let inner = &body[span.start + 1..span.end - 1];
    if inner == decoded.as_bytes() {
        Cow::Borrowed(std::str::from_utf8(inner).expect("body was checked as UTF-8"))
    } else {
        Cow::Owned(decoded.to_owned())
    }
}

fn read_view<'a>(
    body: &'a [u8],
    tape: &[Node<'_>],
    mode: Mode,
    members: &mut Vec<Member>,
    keys: &mut Vec<(usize, usize)>,
) -> Result<EnvelopeView<'a>, EnvelopeError> {
    if !matches!(tape.first(), Some(Node::Object { .. })) {
        return Err(EnvelopeError::NotAnObject);
    }
    match mode {
        Mode::Strict => check_whole_tape(tape, keys)?,
        Mode::Tolerant => check_duplicates(tape, 0, keys)?,
    }
    scan::members(body, members).ok_or(EnvelopeError::InvalidJson)?;

    let mut version = None;
    let mut kind = None;
    let (mut id, mut method, mut channel, mut seq) = (None, None, None, None);
    let (mut params, mut payload, mut result, mut error) = (None, None, None, None);
    let mut n_members = 0;
    for ((key, value), raw) in object_members(tape, 0).zip(members.iter()) {
        n_members += 1;
        let span = raw.value.clone();
        match key {
            "v" => version = Some(string_at(tape, value).ok_or(EnvelopeError::WrongVersion)?),
            "type" => {
                kind = Some(match string_at(tape, value) {
                    Some("request") => MsgType::Request,
                    Some("response") => MsgType::Response,
                    Some("event") => MsgType::Event,
                    _ => return Err(EnvelopeError::InvalidType),
                })
            }
            "id" => id = Some((value, span)),
            "method" => method = Some((value, span)),
            "channel" => channel = Some((value, span)),
            "seq" => seq = Some((value, span)),
            "params" => params = Some((value, span)),
            "payload" => payload = Some((value, span)),
            "result" => result = Some((value, span)),
            "error" => error = Some((value, span)),
            _ => {}
        }
    }
    if n_members != members.len() {
        return Err(EnvelopeError::InvalidJson);
    }
    if version.ok_or(EnvelopeError::MissingField("v"))? != PROTOCOL_VERSION {
        return Err(EnvelopeError::WrongVersion);
    }
    let kind = kind.ok_or(EnvelopeError::MissingField("type"))?;
    if mode == Mode::Strict {
        if let Some((key, _)) = object_members(tape, 0).find(|(k, _)| !allowed(kind, k)) {
            return Err(EnvelopeError::UnknownField(truncate_key(key)));
        }
    }
    if mode == Mode::Tolerant {
        // A mod's explicit nulls mean "absent".
        result = result.filter(|(i, _)| !is_null(tape, *i));
        error = error.filter(|(i, _)| !is_null(tape, *i));
    }

    let mut view = EnvelopeView {
        kind,
        id: None,
        id_span: None,
        method: None,
        channel: None,
        seq: None,
        seq_span: None,
        params: None,
        payload: None,
        result: None,
        error_code: None,
    };

    match id {
        Some((i, span)) => {
            let s = string_at(tape, i).ok_or(EnvelopeError::InvalidField("id"))?;
            if mode == Mode::Strict && !is_uuid(s) {
                return Err(EnvelopeError::InvalidField("id"));
            }
            view.id = Some(borrow_or_own(body, &span, s));
            view.id_span = Some(span);
        }
        None if mode == Mode::Strict || kind != MsgType::Event => {
            return Err(EnvelopeError::MissingField("id"))
        }
        None => {}
    }

    match kind {
        MsgType::Request => {
            let (i, span) = method.ok_or(EnvelopeError::MissingField("method"))?;
            let m = string_at(tape, i).ok_or(EnvelopeError::InvalidField("method"))?;
            if !is_method_name(m) {
                return Err(EnvelopeError::InvalidField("method"));
            }
            view.method = Some(borrow_or_own(body, &span, m));
            if let Some((i, span)) = params {
                if !matches!(tape[i], Node::Object { .. }) {
                    return Err(EnvelopeError::InvalidField("params"));
                }
                if mode == Mode::Strict {
                    params::check_request(m, tape, i)?;
                }
                view.params = Some(span);
            } else if mode == Mode::Strict {
                params::check_request_without_params(m)?;
            }
        }
        MsgType::Response => {
            match (&result, &error) {
                (Some(_), Some(_)) | (None, None) => return Err(EnvelopeError::ResultAndError),
                _ => {}
            }
            view.result = result.map(|(_, span)| span);
            if let Some((i, _)) = error {
                view.error_code = Some(read_error(tape, i, mode)?);
            }
        }
        MsgType::Event => {
            let (i, span) = channel.ok_or(EnvelopeError::MissingField("channel"))?;
            let c = string_at(tape, i)
                .filter(|c| !c.is_empty())
                .ok_or(EnvelopeError::InvalidField("channel"))?;
            view.channel = Some(borrow_or_own(body, &span, c));
            match seq {
                Some((i, span)) => {
                    let n = match tape[i] {
                        Node::Static(StaticNode::U64(n)) => Some(n),
                        Node::Static(StaticNode::I64(n)) if n >= 0 => Some(n as u64),
                        _ => None,
                    };
                    if n.is_none() && mode == Mode::Strict {
                        return Err(EnvelopeError::InvalidField("seq"));
                    }
                    view.seq = n;
                    view.seq_span = Some(span);
                }
                None if mode == Mode::Strict => return Err(EnvelopeError::MissingField("seq")),
                None => {}
            }
            match payload {
                Some((i, span)) => {
                    if mode == Mode::Strict {
                        params::check_event_payload(c, tape, i)?;
                    }
                    view.payload = Some(span);
                }
                None if mode == Mode::Strict => return Err(EnvelopeError::MissingField("payload")),
                None => {}
            }
        }
    }
    Ok(view)
}

fn read_error(tape: &[Node<'_>], at: usize, mode: Mode) -> Result<i64, EnvelopeError> {
    if !matches!(tape[at], Node::Object { .. }) {
        return Err(EnvelopeError::InvalidField("error"));
    }
    let mut code = None;
    let mut has_message = false;
    for (key, value) in object_members(tape, at) {
        match key {
            "code" => {
                code = match tape[value] {
                    Node::Static(StaticNode::I64(n)) => Some(n),
                    Node::Static(StaticNode::U64(n)) => i64::try_from(n).ok(),
                    _ => None,
                }
            }
            "message" => has_message = matches!(tape[value], Node::String(m) if !m.is_empty()),
            "data" => {}
            _ if mode == Mode::Strict => return Err(EnvelopeError::InvalidField("error")),
            _ => {}
        }
    }
    if mode == Mode::Strict && !has_message {
        return Err(EnvelopeError::InvalidField("error"));
    }
    code.ok_or(EnvelopeError::InvalidField("error"))
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
                EnvelopeError::InvalidJson,
            ), // simd-json refuses overflowing numbers outright
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
        let ev = tolerant(r#"{"v":"gabp/1","id":"e1","type":"event","channel":"c","seq":1,"payload":{},"timestamp":17}"#).expect("ok");
        assert_eq!(ev.seq, Some(1));
        // Routing fields must still be sound.
        assert!(tolerant(r#"{"v":"gabp/1","type":"response","result":1}"#).is_err());
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
        ] {
            assert!(!is_method_name(bad), "{bad}");
        }
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
