//! Building an [`EnvelopeView`] from typed fields: the strict path (tape-validated, with the
//! parameter schemas of [`crate::params`]) and the rules both modes share (version, type, id,
//! method, channel, seq). Must not parse: it reads what [`super::fields`] and the tape hold.

use simd_json::{Node, StaticNode};

use super::fields::{borrow_or_own, error_code, truncate_key, Field, Known, Val};
use super::params;
use super::tape::{check_error_object, check_whole_tape, object_members};
use super::{invalid_json, is_method_name, is_uuid, EnvelopeView, Mode, MsgType};
use crate::error::EnvelopeError;
use crate::scan::{self, Member};
use crate::PROTOCOL_VERSION;

/// Strict mode: the tape validates everything (duplicates at every level, finite numbers,
/// parameter schemas); the scanner supplies the spans.
pub(super) fn strict_view<'a>(
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
        let field = Field {
            val,
            span,
            start: m.key.start - 1,
            node: Some(node),
        };
        match known.slot(key.as_bytes()) {
            Some(slot) => *slot = Some(field), // duplicates were refused on the tape
            None => {
                known.unknown.get_or_insert_with(|| key.to_string());
            }
        }
    }
    if count != members.len() {
        return Err(EnvelopeError::InvalidJson);
    }
    let view = build_view(body, &mut known, Mode::Strict)?;
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

/// Builds the view from typed fields; shared by both modes.
pub(super) fn build_view<'a>(
    body: &'a [u8],
    k: &mut Known<'a>,
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
        absent_null: None,
    };
    // The strings move into the view (the caller reads only spans and tape nodes after).
    match &mut k.id {
        Some(Field {
            val: Val::Str(s),
            span,
            ..
        }) => {
            if mode == Mode::Strict && !is_uuid(s) {
                return Err(EnvelopeError::InvalidField("id"));
            }
            view.id = Some(std::mem::take(s));
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
            match &mut k
                .method
                .as_mut()
                .ok_or(EnvelopeError::MissingField("method"))?
                .val
            {
                Val::Str(m) if is_method_name(m) => view.method = Some(std::mem::take(m)),
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
                (Some(_), Some(_)) => return Err(EnvelopeError::ResultAndError),
                // Both absent or null: a mod's `"result": null` (beside `"error": null` or
                // alone) is a call that returned null, and must reach the bridge that waits.
                (None, None) => match &k.result {
                    Some(r) => {
                        view.result = Some(r.span.clone());
                        view.absent_null = k.error.as_ref().map(|e| member_cut(body, e));
                    }
                    None => return Err(EnvelopeError::ResultAndError),
                },
                (Some(r), None) => {
                    view.result = Some(r.span.clone());
                    view.absent_null = k.error.as_ref().map(|e| member_cut(body, e));
                }
                (None, Some(e)) => {
                    view.absent_null = k.result.as_ref().map(|r| member_cut(body, r));
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
            match &mut k
                .channel
                .as_mut()
                .ok_or(EnvelopeError::MissingField("channel"))?
                .val
            {
                Val::Str(c) if !c.is_empty() => view.channel = Some(std::mem::take(c)),
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

/// The bytes to cut to remove member `f` from its object and leave valid JSON: the member and
/// the comma before it (or, for the first member, the comma and whitespace after it).
fn member_cut(body: &[u8], f: &Field<'_>) -> std::ops::Range<usize> {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let before = body[..f.start].iter().rposition(|b| !ws(b));
    match before {
        Some(comma) if body[comma] == b',' => comma..f.span.end,
        _ => {
            let after = body[f.span.end..].iter().position(|b| !ws(b));
            match after.map(|a| f.span.end + a) {
                Some(comma) if body[comma] == b',' => {
                    let next = body[comma + 1..].iter().position(|b| !ws(b));
                    f.start..comma + 1 + next.unwrap_or(0)
                }
                _ => f.start..f.span.end,
            }
        }
    }
}
