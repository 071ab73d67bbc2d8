//! Top-level envelope members as routing sees them: decoded keys, typed values and raw spans,
//! each envelope field at most once. Owns string decoding (borrowing when there are no escapes)
//! and must not judge a field's meaning (that is [`super::view`]'s).

use std::borrow::Cow;
use std::ops::Range;

use crate::error::EnvelopeError;
use crate::scan::{self, Member};

/// A top-level value as routing sees it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val<'a> {
    Str(Cow<'a, str>),
    UInt(u64),
    Int(i64),
    Null,
    Object,
    Other,
}

/// One top-level member: typed value and raw span.
#[derive(Debug)]
pub(super) struct Field<'a> {
    pub(super) val: Val<'a>,
    pub(super) span: Range<usize>,
    /// Where the member starts in the body: its key's opening quote.
    pub(super) start: usize,
}

/// The envelope fields routing reads, each at most once.
#[derive(Debug, Default)]
pub(super) struct Known<'a> {
    pub(super) v: Option<Field<'a>>,
    pub(super) id: Option<Field<'a>>,
    pub(super) ty: Option<Field<'a>>,
    pub(super) method: Option<Field<'a>>,
    pub(super) channel: Option<Field<'a>>,
    pub(super) seq: Option<Field<'a>>,
    pub(super) params: Option<Field<'a>>,
    pub(super) payload: Option<Field<'a>>,
    pub(super) result: Option<Field<'a>>,
    pub(super) error: Option<Field<'a>>,
    /// The first field that is not an envelope field (strict mode rejects it).
    pub(super) unknown: Option<String>,
}

impl<'a> Known<'a> {
    /// Which envelope field `key` (decoded) names, if any.
    pub(super) fn index(key: &[u8]) -> Option<usize> {
        Some(match key {
            b"v" => 0,
            b"id" => 1,
            b"type" => 2,
            b"method" => 3,
            b"channel" => 4,
            b"seq" => 5,
            b"params" => 6,
            b"payload" => 7,
            b"result" => 8,
            b"error" => 9,
            _ => return None,
        })
    }

    /// The slot of field [`Known::index`] `i`.
    pub(super) fn slot_at(&mut self, i: usize) -> &mut Option<Field<'a>> {
        match i {
            0 => &mut self.v,
            1 => &mut self.id,
            2 => &mut self.ty,
            3 => &mut self.method,
            4 => &mut self.channel,
            5 => &mut self.seq,
            6 => &mut self.params,
            7 => &mut self.payload,
            8 => &mut self.result,
            _ => &mut self.error,
        }
    }
}

/// Decodes a raw JSON string (quotes included), borrowing when it has no escapes.
pub(super) fn decode_str<'a>(
    text: &'a str,
    span: &Range<usize>,
) -> Result<Cow<'a, str>, EnvelopeError> {
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
    /// The value of member `m` of `text`.
    pub(super) fn from_raw(text: &'a str, m: &Member) -> Result<Field<'a>, EnvelopeError> {
        let raw = text
            .as_bytes()
            .get(m.value.clone())
            .ok_or(EnvelopeError::InvalidJson)?;
        let val = match raw[0] {
            // The scan said whether it has escapes: most strings are their bytes.
            b'"' if !m.escaped => Val::Str(Cow::Borrowed(
                text.get(m.value.start + 1..m.value.end - 1)
                    .ok_or(EnvelopeError::InvalidJson)?,
            )),
            b'"' => Val::Str(decode_str(text, &m.value)?),
            b'{' => Val::Object,
            b'n' => Val::Null,
            // A sequence number: digits only, summed in place (no text parse per event).
            b'0'..=b'9' => raw
                .iter()
                .try_fold(0u64, |n, &c| {
                    let d = c.wrapping_sub(b'0');
                    (d < 10).then(|| n.checked_mul(10)?.checked_add(u64::from(d)))?
                })
                .map_or(Val::Other, Val::UInt),
            b'-' if raw[1..].iter().all(u8::is_ascii_digit) => {
                match std::str::from_utf8(raw)
                    .ok()
                    .and_then(|s| s.parse::<i128>().ok())
                {
                    Some(n) if n >= 0 => u64::try_from(n).map_or(Val::Other, Val::UInt),
                    Some(n) => i64::try_from(n).map_or(Val::Other, Val::Int),
                    None => Val::Other,
                }
            }
            _ => Val::Other,
        };
        Ok(Field {
            val,
            span: m.value.clone(),
            start: m.key.start - 1,
        })
    }
}

/// Reads the error code of a response's error object from its raw span: `None` unless the
/// object has the integer `code` and the string `message` GABP requires of every error.
pub(super) fn error_code(body: &[u8], span: &Range<usize>) -> Option<i64> {
    let obj = &body[span.clone()];
    let mut inner = Vec::new();
    scan::members(obj, &mut inner)?;
    let message = inner.iter().find(|m| &obj[m.key.clone()] == b"message")?;
    if obj.get(message.value.start) != Some(&b'"') {
        return None;
    }
    let m = inner.iter().find(|m| &obj[m.key.clone()] == b"code")?;
    std::str::from_utf8(&obj[m.value.clone()])
        .ok()?
        .parse()
        .ok()
}

/// Keys echoed in error messages are cut short so a reply never grows with hostile input.
pub(super) fn truncate_key(k: &str) -> String {
    k.chars().take(64).collect()
}
