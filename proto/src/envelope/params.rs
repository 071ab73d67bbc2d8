//! Parameter checks for the methods whose schemas the relay enforces at the bridge boundary.
//!
//! Only methods with a schema in GABP 1.0 that the relay must keep honest are checked here:
//! `session/hello`, `tools/call` (tool-name pattern; `arguments` or the legacy `parameters`),
//! `events/subscribe` / `events/unsubscribe` (a non-empty array of non-empty strings) and
//! `attention/ack` (an attention id). Attention events are checked against the attention object.
//! Everything else passes through untouched; the mod is the authority on its own methods.

use simd_json::{Node, StaticNode};

use crate::envelope::{is_method_name, node_size, object_members};
use crate::error::EnvelopeError;

type Tape<'t, 'a> = &'t [Node<'a>];

fn field<'a>(tape: Tape<'_, 'a>, at: usize, name: &str) -> Option<usize> {
    object_members(tape, at)
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn non_empty_string(tape: Tape<'_, '_>, i: usize) -> bool {
    matches!(tape[i], Node::String(s) if !s.is_empty())
}

/// Checks a request's params object (at tape index `at`) for the enforced methods.
pub(crate) fn check_request(
    method: &str,
    tape: Tape<'_, '_>,
    at: usize,
) -> Result<(), EnvelopeError> {
    match method {
        "session/hello" => {
            for name in ["token", "bridgeVersion", "platform", "launchId"] {
                match field(tape, at, name) {
                    Some(i) if matches!(tape[i], Node::String(_)) => {}
                    _ => return Err(EnvelopeError::InvalidParams(
                        "session/hello needs string token, bridgeVersion, platform and launchId",
                    )),
                }
            }
        }
        "tools/call" => {
            match field(tape, at, "name") {
                Some(i) if matches!(tape[i], Node::String(n) if is_method_name(n)) => {}
                _ => {
                    return Err(EnvelopeError::InvalidParams(
                        "tools/call needs a tool name like \"namespace/tool\"",
                    ))
                }
            }
            for args in ["arguments", "parameters"] {
                if let Some(i) = field(tape, at, args) {
                    if !matches!(tape[i], Node::Object { .. }) {
                        return Err(EnvelopeError::InvalidParams(
                            "tools/call arguments must be an object",
                        ));
                    }
                }
            }
        }
        "events/subscribe" | "events/unsubscribe" => {
            let Some(i) = field(tape, at, "channels") else {
                return Err(EnvelopeError::InvalidParams(
                    "channels must be a non-empty array of channel names",
                ));
            };
            let Node::Array { len, .. } = tape[i] else {
                return Err(EnvelopeError::InvalidParams(
                    "channels must be a non-empty array of channel names",
                ));
            };
            let mut item = i + 1;
            for _ in 0..len {
                if !non_empty_string(tape, item) {
                    return Err(EnvelopeError::InvalidParams(
                        "channels must be a non-empty array of channel names",
                    ));
                }
                item += node_size(tape, item);
            }
            if len == 0 {
                return Err(EnvelopeError::InvalidParams(
                    "channels must be a non-empty array of channel names",
                ));
            }
        }
        "attention/ack" => match field(tape, at, "attentionId") {
            Some(i) if non_empty_string(tape, i) => {}
            _ => {
                return Err(EnvelopeError::InvalidParams(
                    "attention/ack needs an attentionId",
                ))
            }
        },
        _ => {}
    }
    Ok(())
}

/// Requests whose schema requires params fail when params are absent.
pub(crate) fn check_request_without_params(method: &str) -> Result<(), EnvelopeError> {
    match method {
        "session/hello" | "tools/call" | "events/subscribe" | "events/unsubscribe"
        | "attention/ack" => Err(EnvelopeError::InvalidParams(
            "params are required for this method",
        )),
        _ => Ok(()),
    }
}

const ATTENTION_REQUIRED: [&str; 9] = [
    "attentionId",
    "state",
    "severity",
    "blocking",
    "stateInvalidated",
    "summary",
    "openedAtSequence",
    "latestSequence",
    "totalUrgentEntries",
];

/// Checks an event payload on the attention lifecycle channels against the attention object.
pub(crate) fn check_event_payload(
    channel: &str,
    tape: Tape<'_, '_>,
    at: usize,
) -> Result<(), EnvelopeError> {
    if !matches!(
        channel,
        "attention/opened" | "attention/updated" | "attention/cleared"
    ) {
        return Ok(());
    }
    const BAD: EnvelopeError =
        EnvelopeError::InvalidParams("attention payload does not match the attention object");
    if !matches!(tape[at], Node::Object { .. }) {
        return Err(BAD);
    }
    for name in ATTENTION_REQUIRED {
        let Some(i) = field(tape, at, name) else {
            return Err(BAD);
        };
        let ok = match name {
            "blocking" | "stateInvalidated" => matches!(tape[i], Node::Static(StaticNode::Bool(_))),
            "state" => matches!(tape[i], Node::String("open" | "cleared")),
            "severity" => matches!(
                tape[i],
                Node::String("info" | "warning" | "error" | "fatal")
            ),
            "attentionId" | "summary" => non_empty_string(tape, i),
            _ => {
                matches!(tape[i], Node::Static(StaticNode::U64(_)))
                    || matches!(tape[i], Node::Static(StaticNode::I64(n)) if n >= 0)
            }
        };
        if !ok {
            return Err(BAD);
        }
    }
    Ok(())
}
