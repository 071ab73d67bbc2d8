//! Requests for a standard MCP method whose params rmcp cannot read as that method's.
//!
//! rmcp takes such a request for a custom method and answers -32601 "method not found" (a
//! `tools/call` whose `arguments` is a string, say), which tells the client nothing true. The
//! transports answer it with -32602 Invalid params instead, saying what is wrong.

use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ClientRequest};
use serde_json::Value;

/// The methods MCP defines for a client to call: a request naming one that rmcp read as a
/// custom request had params of the wrong shape.
const STANDARD: &[&str] = &[
    "initialize",
    "ping",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "tools/call",
    "tools/list",
];

/// The longest reason given: a decoder's message may quote the offending value.
const MAX_REASON: usize = 200;

/// The id and the Invalid params message for a request whose params do not fit its method.
pub fn misshapen(msg: &ClientJsonRpcMessage) -> Option<(Value, String)> {
    let ClientJsonRpcMessage::Request(r) = msg else {
        return None;
    };
    let ClientRequest::CustomRequest(c) = &r.request else {
        return None;
    };
    let method = c.method.as_str();
    if !STANDARD.contains(&method) {
        return None;
    }
    let params = c.params.clone().unwrap_or(Value::Null);
    let mut why = match method {
        "tools/call" => serde_json::from_value::<CallToolRequestParams>(params)
            .err()
            .map(|e| e.to_string()),
        _ => None,
    }
    .unwrap_or_else(|| "they do not match the method's schema".into());
    if why.len() > MAX_REASON {
        let cut = (0..=MAX_REASON)
            .rev()
            .find(|&i| why.is_char_boundary(i))
            .unwrap_or(0);
        why.truncate(cut);
        why.push('…');
    }
    let id = serde_json::to_value(&r.id).unwrap_or(Value::Null);
    Some((id, format!("Invalid params for {method}: {why}")))
}
