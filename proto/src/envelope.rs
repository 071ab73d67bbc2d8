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
        self.members.clear();
        match mode {
            Mode::Tolerant => {
                scan::members(body, &mut self.members)
                    .ok_or_else(|| not_object_or_invalid(body))?;
                let mut known = Known::default();
                for m in &self.members {
                    let raw = &body[m.key.clone()];
                    let decoded;
                    let key: &[u8] = if raw.contains(&b'\\') {
                        decoded = decode_str(text, &(m.key.start - 1..m.key.end + 1))?;
                        decoded.as_bytes()
                    } else {
                        raw
                    };
                    // Extra fields are the mod's business; only routing fields are read.
                    if let Some(slot) = known.slot(key) {
                        if slot.replace(Field::from_raw(text, m)?).is_some() {
                            return Err(EnvelopeError::DuplicateKey(truncate_key(
                                &String::from_utf8_lossy(key),
                            )));
                        }
                    }
                }
                build_view(body, &known, mode)
            }
            Mode::Strict => {
                self.scratch.clear();
                self.scratch.extend_from_slice(body);
                let buffers = self
                    .buffers
                    .get_or_insert_with(|| simd_json::Buffers::new(body.len()));
                let mut tape = simd_json::tape::Tape(recycle(std::mem::take(&mut self.tape)));
                let result = match simd_json::fill_tape(&mut self.scratch, buffers, &mut tape) {
                    Ok(()) => strict_view(body, &tape.0, &mut self.members),
                    Err(_) => Err(invalid_json(body)),
                };
                self.tape = recycle(tape.0);
                result
            }
        }
    }
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
        None => EnvelopeError::InvalidJson,
    }
}

/// A top-level value as routing sees it.
#[derive(Debug, Clone, PartialEq)]
enum Val<'a> {
    Str(Cow<'a, str>),
    UInt(u64),
    Int(i64),
    Null,
    Object,
    Other,
}

/// One top-level member: decoded key, typed value, raw span, and (strict) its tape index.
#[derive(Debug)]
struct Field<'a> {
    key: Cow<'a, str>,
    val: Val<'a>,
    span: Range<usize>,
    node: Option<usize>,
}

/// The envelope fields routing reads, each at most once.
#[derive(Debug, Default)]
struct Known<'a> {
    v: Option<Field<'a>>,
    id: Option<Field<'a>>,
    ty: Option<Field<'a>>,
    method: Option<Field<'a>>,
    channel: Option<Field<'a>>,
    seq: Option<Field<'a>>,
    params: Option<Field<'a>>,
    payload: Option<Field<'a>>,
    result: Option<Field<'a>>,
    error: Option<Field<'a>>,
    /// The first field that is not an envelope field (strict mode rejects it).
    unknown: Option<String>,
}

impl<'a> Known<'a> {
    fn slot(&mut self, key: &[u8]) -> Option<&mut Option<Field<'a>>> {
        Some(match key {
            b"v" => &mut self.v,
            b"id" => &mut self.id,
            b"type" => &mut self.ty,
            b"method" => &mut self.method,
            b"channel" => &mut self.channel,
            b"seq" => &mut self.seq,
            b"params" => &mut self.params,
            b"payload" => &mut self.payload,
            b"result" => &mut self.result,
            b"error" => &mut self.error,
            _ => return None,
        })
    }
}

/// Decodes a raw JSON string (quotes included), borrowing when it has no escapes.
fn decode_str<'a>(text: &'a str, span: &Range<usize>) -> Result<Cow<'a, str>, EnvelopeError> {
    let inner = text
        .get(span.start + 1..span.end - 1)
        .ok_or(EnvelopeError::InvalidJson)?;
    if !inner.as_bytes().contains(&b'\\') {
        return Ok(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(&text[span.clone()])
        .map(Cow::Owned)
        .map_err(|_| EnvelopeError::InvalidJson)
}

impl<'a> Field<'a> {
    fn from_raw(text: &'a str, m: &Member) -> Result<Field<'a>, EnvelopeError> {
        let key = decode_str(text, &(m.key.start - 1..m.key.end + 1))?;
        let raw = text
            .as_bytes()
            .get(m.value.clone())
            .ok_or(EnvelopeError::InvalidJson)?;
        let parse = |raw: &[u8]| {
            std::str::from_utf8(raw)
                .ok()
                .and_then(|s| s.parse::<i128>().ok())
        };
        let val = match raw[0] {
            b'"' => Val::Str(decode_str(text, &m.value)?),
            b'{' => Val::Object,
            b'n' => Val::Null,
            b'0'..=b'9' | b'-' if raw[1..].iter().all(u8::is_ascii_digit) => match parse(raw) {
                Some(n) if n >= 0 => u64::try_from(n).map_or(Val::Other, Val::UInt),
                Some(n) => i64::try_from(n).map_or(Val::Other, Val::Int),
                None => Val::Other,
            },
            _ => Val::Other,
        };
        Ok(Field {
            key,
            val,
            span: m.value.clone(),
            node: None,
        })
    }
}

/// Strict mode: the tape validates everything (duplicates at every level, finite numbers,
/// parameter schemas); the scanner supplies the spans.
fn strict_view<'a>(
    body: &'a [u8],
    tape: &[Node<'_>],
    members: &mut Vec<Member>,
) -> Result<EnvelopeView<'a>, EnvelopeError> {
    if !matches!(tape.first(), Some(Node::Object { .. })) {
        return Err(EnvelopeError::NotAnObject);
    }
    check_whole_tape(tape)?;
    // simd-json lets some lone surrogates through; the scanner holds the one rule.
    scan::members(body, members).ok_or_else(|| invalid_json(body))?;
    let mut known = Known::default();
    let mut count = 0;
    for ((key, node), m) in object_members(tape, 0).zip(members.iter()) {
        count += 1;
        let span = m.value.clone();
        let val = match tape[node] {
            Node::String(s) => Val::Str(borrow_or_own(body, &span, s)),
            Node::Object { .. } => Val::Object,
            Node::Static(StaticNode::Null) => Val::Null,
            Node::Static(StaticNode::U64(n)) => Val::UInt(n),
            Node::Static(StaticNode::I64(n)) if n >= 0 => Val::UInt(n as u64),
            Node::Static(StaticNode::I64(n)) => Val::Int(n),
            _ => Val::Other,
        };
        let raw_key = &body[m.key.clone()];
        let key = if raw_key == key.as_bytes() {
            Cow::Borrowed(std::str::from_utf8(raw_key).expect("checked UTF-8"))
        } else {
            Cow::Owned(key.to_string())
        };
        let field = Field {
            key,
            val,
            span,
            node: Some(node),
        };
        match known.slot(field.key.as_bytes()) {
            Some(slot) => *slot = Some(field), // duplicates were refused on the tape
            None => {
                known.unknown.get_or_insert_with(|| field.key.to_string());
            }
        }
    }
    if count != members.len() {
        return Err(EnvelopeError::InvalidJson);
    }
    let view = build_view(body, &known, Mode::Strict)?;
    // Schema checks of the enforced methods and of attention events, on the tape.
    let node_of = |f: &Option<Field<'_>>| f.as_ref().and_then(|f| f.node);
    match view.kind {
        MsgType::Request => {
            let m = view.method.as_deref().expect("requests have a method");
            match node_of(&known.params) {
                Some(i) => params::check_request(m, tape, i)?,
                None => params::check_request_without_params(m)?,
            }
        }
        MsgType::Event => {
            if let (Some(c), Some(i)) = (view.channel.as_deref(), node_of(&known.payload)) {
                params::check_event_payload(c, tape, i)?;
            }
        }
        MsgType::Response => {
            if let Some(i) = node_of(&known.error) {
                check_error_object(tape, i)?;
            }
        }
    }
    Ok(view)
}

/// Strict: an error object has an integer code, a non-empty message, optional data, nothing else.
fn check_error_object(tape: &[Node<'_>], at: usize) -> Result<(), EnvelopeError> {
    let mut has_code = false;
    let mut has_message = false;
    for (key, value) in object_members(tape, at) {
        match key {
            "code" => {
                has_code = matches!(
                    tape[value],
                    Node::Static(StaticNode::I64(_) | StaticNode::U64(_))
                )
            }
            "message" => has_message = matches!(tape[value], Node::String(m) if !m.is_empty()),
            "data" => {}
            _ => return Err(EnvelopeError::InvalidField("error")),
        }
    }
    if has_code && has_message {
        Ok(())
    } else {
        Err(EnvelopeError::InvalidField("error"))
    }
}

/// Reads the error code of a response's error object from its raw span.
fn error_code(body: &[u8], span: &Range<usize>) -> Option<i64> {
    let obj = &body[span.clone()];
    let mut inner = Vec::new();
    scan::members(obj, &mut inner)?;
    let m = inner.iter().find(|m| &obj[m.key.clone()] == b"code")?;
    std::str::from_utf8(&obj[m.value.clone()])
        .ok()?
        .parse()
        .ok()
}

/// Builds the view from typed fields; shared by both modes.
fn build_view<'a>(
    body: &'a [u8],
    k: &Known<'a>,
    mode: Mode,
) -> Result<EnvelopeView<'a>, EnvelopeError> {
    match &k.v.as_ref().ok_or(EnvelopeError::MissingField("v"))?.val {
        Val::Str(v) if v == PROTOCOL_VERSION => {}
        _ => return Err(EnvelopeError::WrongVersion),
    }
    let kind = match &k
        .ty
        .as_ref()
        .ok_or(EnvelopeError::MissingField("type"))?
        .val
    {
        Val::Str(t) if t == "request" => MsgType::Request,
        Val::Str(t) if t == "response" => MsgType::Response,
        Val::Str(t) if t == "event" => MsgType::Event,
        _ => return Err(EnvelopeError::InvalidType),
    };
    if mode == Mode::Strict {
        if let Some(u) = &k.unknown {
            return Err(EnvelopeError::UnknownField(truncate_key(u)));
        }
        // Fields that belong to another message type.
        let foreign: &[(&Option<Field<'a>>, &str)] = match kind {
            MsgType::Request => &[
                (&k.channel, "channel"),
                (&k.seq, "seq"),
                (&k.payload, "payload"),
                (&k.result, "result"),
                (&k.error, "error"),
            ],
            MsgType::Response => &[
                (&k.method, "method"),
                (&k.params, "params"),
                (&k.channel, "channel"),
                (&k.seq, "seq"),
                (&k.payload, "payload"),
            ],
            MsgType::Event => &[
                (&k.method, "method"),
                (&k.params, "params"),
                (&k.result, "result"),
                (&k.error, "error"),
            ],
        };
        if let Some((_, name)) = foreign.iter().find(|(f, _)| f.is_some()) {
            return Err(EnvelopeError::UnknownField(name.to_string()));
        }
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
    match &k.id {
        Some(Field {
            val: Val::Str(s),
            span,
            ..
        }) => {
            if mode == Mode::Strict && !is_uuid(s) {
                return Err(EnvelopeError::InvalidField("id"));
            }
            view.id = Some(s.clone());
            view.id_span = Some(span.clone());
        }
        Some(_) => return Err(EnvelopeError::InvalidField("id")),
        None if mode == Mode::Strict || kind != MsgType::Event => {
            return Err(EnvelopeError::MissingField("id"))
        }
        None => {}
    }
    match kind {
        MsgType::Request => {
            match &k
                .method
                .as_ref()
                .ok_or(EnvelopeError::MissingField("method"))?
                .val
            {
                Val::Str(m) if is_method_name(m) => view.method = Some(m.clone()),
                _ => return Err(EnvelopeError::InvalidField("method")),
            }
            if let Some(p) = &k.params {
                if p.val != Val::Object {
                    return Err(EnvelopeError::InvalidField("params"));
                }
                view.params = Some(p.span.clone());
            }
        }
        MsgType::Response => {
            // A mod's explicit nulls mean "absent"; from a bridge a null is a value.
            let is_present = |f: &&Field<'a>| mode == Mode::Strict || f.val != Val::Null;
            match (
                k.result.as_ref().filter(is_present),
                k.error.as_ref().filter(is_present),
            ) {
                (Some(_), Some(_)) | (None, None) => return Err(EnvelopeError::ResultAndError),
                (Some(r), None) => view.result = Some(r.span.clone()),
                (None, Some(e)) => {
                    if e.val != Val::Object {
                        return Err(EnvelopeError::InvalidField("error"));
                    }
                    view.error_code = Some(
                        error_code(body, &e.span).ok_or(EnvelopeError::InvalidField("error"))?,
                    );
                }
            }
        }
        MsgType::Event => {
            match &k
                .channel
                .as_ref()
                .ok_or(EnvelopeError::MissingField("channel"))?
                .val
            {
                Val::Str(c) if !c.is_empty() => view.channel = Some(c.clone()),
                _ => return Err(EnvelopeError::InvalidField("channel")),
            }
            match &k.seq {
                Some(f) => {
                    match f.val {
                        Val::UInt(n) => view.seq = Some(n),
                        _ if mode == Mode::Strict => {
                            return Err(EnvelopeError::InvalidField("seq"))
                        }
                        _ => {}
                    }
                    view.seq_span = Some(f.span.clone());
                }
                None if mode == Mode::Strict => return Err(EnvelopeError::MissingField("seq")),
                None => {}
            }
            match &k.payload {
                Some(f) => view.payload = Some(f.span.clone()),
                None if mode == Mode::Strict => return Err(EnvelopeError::MissingField("payload")),
                None => {}
            }
        }
    }
    Ok(view)
}

/// Checks every object on the tape for duplicate keys, and every number for finiteness.
fn check_whole_tape(tape: &[Node<'_>]) -> Result<(), EnvelopeError> {
    for (i, node) in tape.iter().enumerate() {
        match node {
            Node::Static(StaticNode::F64(f)) if !f.is_finite() => {
                return Err(EnvelopeError::NonFiniteNumber)
            }
            Node::Object { len, .. } if *len > 1 => check_duplicates(tape, i)?,
            _ => {}
        }
    }
    Ok(())
}

fn check_duplicates(tape: &[Node<'_>], at: usize) -> Result<(), EnvelopeError> {
    let names: Vec<&str> = object_members(tape, at).map(|(k, _)| k).collect();
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

/// The decoded string, borrowed from the body when it has no escapes.
fn borrow_or_own<'a>(body: &'a [u8], span: &Range<usize>, decoded: &str) -> Cow<'a, str> {
    let inner = &body[span.start + 1..span.end - 1];
    if inner == decoded.as_bytes() {
        Cow::Borrowed(std::str::from_utf8(inner).expect("body was checked as UTF-8"))
    } else {
        Cow::Owned(decoded.to_owned())
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
