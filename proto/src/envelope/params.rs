//! Parameter checks for the methods whose schemas the relay enforces at the bridge boundary.
//!
//! Only methods with a schema in GABP 1.0 that the relay must keep honest are checked here:
//! `session/hello`, `tools/call` (tool-name pattern; `arguments` or the legacy `parameters`),
//! `events/subscribe` / `events/unsubscribe` (a non-empty array of non-empty strings) and
//! `attention/ack` (an attention id). Attention events are checked against the attention object.
//! Everything else passes through untouched; the mod is the authority on its own methods.
//! The values are read from the body's bytes, which the scanner has already validated.

use super::object::{array_items, integer, is_non_empty_string, string, Object};
use crate::envelope::is_method_name;
use crate::error::EnvelopeError;

/// The longest channel name a bridge may subscribe to, in bytes, unless the mod advertises it.
pub const MAX_CHANNEL_NAME: usize = 256;

/// Checks a request's params object (its text, `params`) for the enforced methods.
pub(crate) fn check_request(method: &str, params: &str) -> Result<(), EnvelopeError> {
    if !matches!(
        method,
        "session/hello"
            | "tools/call"
            | "events/subscribe"
            | "events/unsubscribe"
            | "attention/ack"
    ) {
        return Ok(());
    }
    // The envelope's scan validated every byte of it.
    let obj = Object::read(params).ok_or(EnvelopeError::InvalidField("params"))?;
    match method {
        "session/hello" => {
            let fields = obj.fields(["token", "bridgeVersion", "platform", "launchId"]);
            for value in fields {
                if !value.is_some_and(|v| v.starts_with('"')) {
                    return Err(EnvelopeError::InvalidParams(
                        "session/hello needs string token, bridgeVersion, platform and launchId",
                    ));
                }
            }
        }
        "tools/call" => {
            let [name, arguments, parameters] = obj.fields(["name", "arguments", "parameters"]);
            if !name.and_then(string).is_some_and(|n| is_method_name(&n)) {
                return Err(EnvelopeError::InvalidParams(
                    "tools/call needs a tool name like \"namespace/tool\"",
                ));
            }
            for args in [arguments, parameters] {
                if args.is_some_and(|v| !v.starts_with('{')) {
                    return Err(EnvelopeError::InvalidParams(
                        "tools/call arguments must be an object",
                    ));
                }
            }
        }
        "events/subscribe" | "events/unsubscribe" => {
            let [channels] = obj.fields(["channels"]);
            let names = channels.and_then(array_items);
            if !names.is_some_and(|n| !n.is_empty() && n.iter().all(|c| is_non_empty_string(c))) {
                return Err(EnvelopeError::InvalidParams(
                    "channels must be a non-empty array of channel names",
                ));
            }
        }
        _ => {
            let [id] = obj.fields(["attentionId"]);
            if !id.is_some_and(is_non_empty_string) {
                return Err(EnvelopeError::InvalidParams(
                    "attention/ack needs an attentionId",
                ));
            }
        }
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

/// Checks an event payload (its text) on the attention lifecycle channels against the
/// attention object.
pub(crate) fn check_event_payload(channel: &str, payload: &str) -> Result<(), EnvelopeError> {
    if !matches!(
        channel,
        "attention/opened" | "attention/updated" | "attention/cleared"
    ) {
        return Ok(());
    }
    const BAD: EnvelopeError =
        EnvelopeError::InvalidParams("attention payload does not match the attention object");
    let obj = Object::read(payload).ok_or(BAD)?;
    let values = obj.fields(ATTENTION_REQUIRED);
    for (name, value) in ATTENTION_REQUIRED.into_iter().zip(values) {
        let value = value.ok_or(BAD)?;
        let ok = match name {
            "blocking" | "stateInvalidated" => matches!(value, "true" | "false"),
            "state" => string(value).is_some_and(|s| matches!(&*s, "open" | "cleared")),
            "severity" => {
                string(value).is_some_and(|s| matches!(&*s, "info" | "warning" | "error" | "fatal"))
            }
            "attentionId" | "summary" => is_non_empty_string(value),
            _ => integer(value).is_some_and(|n| n >= 0),
        };
        if !ok {
            return Err(BAD);
        }
    }
    Ok(())
}

/// An error object has an integer code, a non-empty message, optional data, nothing else.
pub(crate) fn check_error_object(error: &str) -> Result<(), EnvelopeError> {
    const BAD: EnvelopeError = EnvelopeError::InvalidField("error");
    let obj = Object::read(error).ok_or(BAD)?;
    let (mut has_code, mut has_message) = (false, false);
    for (key, value) in obj.entries() {
        match key.as_deref() {
            Some("code") => has_code = integer(value).is_some(),
            Some("message") => has_message = is_non_empty_string(value),
            Some("data") => {}
            _ => return Err(BAD),
        }
    }
    if has_code && has_message {
        Ok(())
    } else {
        Err(BAD)
    }
}
