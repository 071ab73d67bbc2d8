//! `relay/mark`, the relay's own request that marks a timeline: its bounds and which marks the
//! relay accepts. One rule for the bridge reader, which answers marks, and every reader of a
//! recording, which lists only the marks the relay accepted (a refused one may be recorded).

use serde_json::Value;

use crate::{Mode, MsgType, Parser};

/// The method.
pub const MARK: &str = "relay/mark";

/// Longest `relay/mark` label.
pub const MAX_MARK_LABEL: usize = 256;

/// Most bytes of a whole `relay/mark` request as sent (label, data and envelope): a mark is a
/// label and a little JSON, not a payload channel.
pub const MAX_MARK_BYTES: usize = 2048;

/// The label of a `relay/mark` with these params, if the relay accepts it: a non-empty string
/// of at most [`MAX_MARK_LABEL`] bytes. One rule for the bridge reader, which answers marks,
/// and the exporters, which list only the marks it accepted (a refused one may be recorded).
pub fn mark_label(params: &Value) -> Option<&str> {
    params["label"]
        .as_str()
        .filter(|l| !l.is_empty() && l.len() <= MAX_MARK_LABEL)
}

/// Why a `relay/mark` request of `len` bytes with these params is refused, if it is.
pub fn mark_refusal(len: usize, params: &Value) -> Option<String> {
    if len > MAX_MARK_BYTES {
        return Some(format!(
            "relay/mark is {len} bytes; a mark (label and data) may take at most {MAX_MARK_BYTES}"
        ));
    }
    mark_label(params).is_none().then(|| {
        format!("relay/mark needs a label: a non-empty string of at most {MAX_MARK_LABEL} bytes")
    })
}

/// The label of `body`, a recorded bridge frame, if it is a `relay/mark` the relay accepted:
/// valid at the bridge boundary (the strict parse: UUID id, no duplicate keys, …) and with a
/// label [`mark_label`] takes. Marks are rare, so each is parsed again, strictly.
pub fn accepted_mark(parser: &mut Parser, body: &[u8]) -> Option<String> {
    let view = parser.parse(body, Mode::Strict).ok()?;
    if view.kind != MsgType::Request || view.method.as_deref() != Some(MARK) {
        return None;
    }
    let params: Value = view
        .params
        .and_then(|p| serde_json::from_slice(&body[p]).ok())
        .unwrap_or(Value::Null);
    if mark_refusal(body.len(), &params).is_some() {
        return None;
    }
    mark_label(&params).map(String::from)
}
