//! Building an [`EnvelopeView`] from typed fields: the strict path (every object's keys
//! distinct, the parameter schemas of [`super::params`]) and the rules both modes share
//! (version, type, id, method, channel, seq). Must not parse: it reads what the scanner found.

use super::fields::{error_code, truncate_key, Field, Known, Val};
use super::params;
use super::repeats::{refuse_top_level_repeats, scan_noting_repeats};
use super::{is_method_name, is_uuid};
use super::{read_known, EnvelopeView, Mode, MsgType};
use crate::error::EnvelopeError;
use crate::scan::{Key, Member};
use crate::PROTOCOL_VERSION;

/// Strict mode: the scanner validates the grammar (finite numbers, paired surrogates, depth),
/// then no object may repeat a key, no field may be unknown, and the enforced schemas hold.
pub(super) fn strict_view<'a>(
    text: &'a str,
    members: &mut Vec<Member>,
    keys: &mut Vec<Key>,
) -> Result<EnvelopeView<'a>, EnvelopeError> {
    let body = text.as_bytes();
    let nested = scan_noting_repeats(text, members, keys)?;
    // The envelope's own keys first: reading its fields refuses a repeated envelope field; any
    // other top-level key is refused as unknown, and named as a repeat first when it is one.
    let mut known = Known::default();
    read_known(text, members, Mode::Strict, &mut known)?;
    if known.unknown.is_some() {
        refuse_top_level_repeats(text, members, keys)?;
    }
    if let Some(repeat) = nested {
        return Err(repeat);
    }
    let view = build_view(body, &mut known, Mode::Strict)?;
    let text_of = |f: &Option<Field<'_>>| f.as_ref().map(|f| &text[f.span.clone()]);
    match view.kind {
        MsgType::Request => {
            let m = view.method.as_deref().expect("requests have a method");
            match text_of(&known.params) {
                Some(p) => params::check_request(m, p)?,
                None => params::check_request_without_params(m)?,
            }
        }
        MsgType::Event => {
            if let (Some(c), Some(p)) = (view.channel.as_deref(), text_of(&known.payload)) {
                params::check_event_payload(c, p)?;
            }
        }
        MsgType::Response => {
            if let Some(e) = text_of(&known.error) {
                params::check_error_object(e)?;
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
