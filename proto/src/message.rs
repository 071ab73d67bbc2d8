//! Builders for the frames the relay writes itself: errors, events and requests.
//!
//! Output is ASCII-only JSON (non-ASCII escaped as `\uXXXX`), because a widely used mod library
//! counts `Content-Length` in characters, so ASCII bodies are the only ones both counts agree on.
//! These run off the hot path (errors, control events, handshakes), so they may use serde_json.

use bytes::Bytes;
use serde_json::Value;

use crate::codes::ErrorCode;
use crate::PROTOCOL_VERSION;

/// Serializes `value` as compact JSON with every non-ASCII character escaped.
pub fn to_ascii_json(value: &Value) -> Vec<u8> {
    let s = serde_json::to_string(value).expect("serializing a Value cannot fail");
    ascii_escaped(s).into_bytes()
}

/// JSON text `json` with every non-ASCII character escaped as `\uXXXX` (UTF-16 units). Valid
/// JSON stays valid: outside strings it is ASCII already.
pub fn ascii_escaped(json: String) -> String {
    if json.is_ascii() {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// The id used in an error reply when the offending frame's own id could not be read: GABP
/// requires a UUID, so the nil UUID stands for "no id" rather than JSON-RPC's `null`.
pub const NIL_ID: &str = "00000000-0000-0000-0000-000000000000";

/// An error response body for request `id` (the nil UUID when the id is unknown).
pub fn error_response(
    id: Option<&str>,
    code: ErrorCode,
    message: &str,
    data: Option<Value>,
) -> Bytes {
    let mut error = serde_json::json!({ "code": code.code(), "message": message });
    if let Some(data) = data {
        error["data"] = data;
    }
    let v = serde_json::json!({
        "v": PROTOCOL_VERSION,
        "id": id.unwrap_or(NIL_ID),
        "type": "response",
        "error": error,
    });
    Bytes::from(to_ascii_json(&v))
}

/// A success response body for request `id` whose `result` is `result`, a valid JSON value
/// written as is (the mod's welcome, forwarded byte for byte).
pub fn result_response_raw(id: &str, result: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(result.len() + id.len() + 48);
    out.extend_from_slice(b"{\"v\":\"");
    out.extend_from_slice(PROTOCOL_VERSION.as_bytes());
    out.extend_from_slice(b"\",\"id\":");
    out.extend_from_slice(&to_ascii_json(&Value::from(id)));
    out.extend_from_slice(b",\"type\":\"response\",\"result\":");
    out.extend_from_slice(result);
    out.push(b'}');
    Bytes::from(out)
}

/// A success response body for request `id`.
pub fn result_response(id: &str, result: Value) -> Bytes {
    let v = serde_json::json!({ "v": PROTOCOL_VERSION, "id": id, "type": "response", "result": result });
    Bytes::from(to_ascii_json(&v))
}

/// An event body with a fresh UUID id.
pub fn event(channel: &str, seq: u64, payload: Value) -> Bytes {
    let v = serde_json::json!({
        "v": PROTOCOL_VERSION,
        "id": uuid::Uuid::new_v4().to_string(),
        "type": "event",
        "channel": channel,
        "seq": seq,
        "payload": payload,
    });
    Bytes::from(to_ascii_json(&v))
}

/// A request body with the given id.
pub fn request(id: &str, method: &str, params: Value) -> Bytes {
    let v = serde_json::json!({ "v": PROTOCOL_VERSION, "id": id, "type": "request", "method": method, "params": params });
    Bytes::from(to_ascii_json(&v))
}

/// The strings of a JSON array, in order, with anything else in it skipped; empty for a value
/// that is not an array. Peers send channel lists this way (`events/subscribe` params, the
/// welcome's `capabilities.events`).
pub fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The channels a mod advertised in its welcome (`capabilities.events`).
pub fn advertised_channels(welcome: &Value) -> Vec<String> {
    string_list(&welcome["capabilities"]["events"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Mode, Parser};

    #[test]
    fn built_messages_pass_strict_validation_and_are_ascii() {
        let id = uuid::Uuid::new_v4().to_string();
        let mut p = Parser::new();
        for body in [
            error_response(Some(&id), ErrorCode::BadToken, "bad token", None),
            result_response(&id, serde_json::json!({"name": "é✓😀"})),
            event("relay/dropped", 0, serde_json::json!({"count": 3})),
            request(&id, "tools/list", serde_json::json!({})),
        ] {
            assert!(body.is_ascii());
            p.parse(&body, Mode::Strict).expect("valid envelope");
        }
        let w = serde_json::json!({"capabilities": {"events": ["a", 1, "b", null]}});
        assert_eq!(advertised_channels(&w), ["a", "b"]);
        assert!(string_list(&serde_json::json!({"a": 1})).is_empty());
        let r = result_response(&id, serde_json::json!("😀"));
        let v: Value = serde_json::from_slice(&r).expect("json");
        assert_eq!(v["result"], "😀");
    }
}
