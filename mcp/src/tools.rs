//! The relay's own MCP tools, beside the game's mirrored ones: their names, titles and input
//! schemas (what `tools/list` shows); `server` answers them.

use serde_json::{json, Value};

use super::server::{POLL_MAX, POLL_WAIT_MAX};

/// The definitions (names, titles, input schemas) of the relay's own tools.
pub(super) fn own_tools() -> Vec<Value> {
    vec![
        json!({
            "name": "events_poll",
            "title": "Poll game events",
            "description": "New events on the game's channels since a cursor. Pass back the returned `cursor` and `session` to continue; per channel, seq is contiguous (a `missed` entry says what the buffer no longer held). Waits up to waitMs for the first event.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "channels": { "type": "array", "items": { "type": "string" }, "description": "Channels to read (default: all)" },
                    "cursor": { "type": "object", "additionalProperties": { "type": "integer", "minimum": 0 }, "description": "Next seq wanted per channel, from the previous answer" },
                    "session": { "type": "string", "description": "The session the cursor belongs to, from the previous answer" },
                    "max": { "type": "integer", "minimum": 1, "maximum": POLL_MAX, "default": 100 },
                    "waitMs": { "type": "integer", "minimum": 0, "maximum": POLL_WAIT_MAX.as_millis() as u64, "default": 0 }
                }
            }
        }),
        json!({
            "name": "attention_get",
            "title": "Current attention item",
            "description": "The game's current open attention item (GABP attention/current), if any.",
            "inputSchema": { "type": "object", "properties": {} }
        }),
        json!({
            "name": "attention_ack",
            "title": "Acknowledge attention",
            "description": "Acknowledges an attention item by id (GABP attention/ack).",
            "inputSchema": {
                "type": "object",
                "properties": { "attentionId": { "type": "string" } },
                "required": ["attentionId"]
            }
        }),
        json!({
            "name": "relay_status",
            "title": "Relay status",
            "description": "The relay route's status: the mod session, channels with event counts, every bridge's queue and drops, recording health.",
            "inputSchema": { "type": "object", "properties": {} }
        }),
        json!({
            "name": "sessions_list",
            "title": "Recorded sessions",
            "description": "Sessions recorded in the data dir (when the front was given --data-dir), else the route's current session.",
            "inputSchema": { "type": "object", "properties": {} }
        }),
        json!({
            "name": "relay_lease",
            "title": "Controller lease",
            "description": "Takes, renews or gives back the route's controller lease (the relay's relay/lease): while this client holds it, only it may call the tools the route marks as leased. It ends on release, at expiry (ttlMs after the last acquire or renew), or when this client's connection to the relay ends. Answers {held, holder, conn, untilNs, ttlMs}.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "action": { "type": "string", "enum": ["acquire", "renew", "release"] },
                    "ttlMs": { "type": "integer", "minimum": 1, "maximum": 3600000, "default": 30000 }
                },
                "required": ["action"]
            }
        }),
        json!({
            "name": "mark",
            "title": "Mark the timeline",
            "description": "Marks the recorded session's timeline (an episode's start or end, a reward, a test step) through the relay's relay/mark; the mark is recorded with this client's name and time and never reaches the game.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "label": { "type": "string", "minLength": 1, "maxLength": 256 },
                    "data": { "description": "Anything to keep with the mark" }
                },
                "required": ["label"]
            }
        }),
        json!({
            "name": "relay_replay",
            "title": "Replay controls",
            "description": "Pauses, resumes, seeks, steps or paces a gabp-relay replay for every client attached to it (the relay's relay/replay), or reads where it is (action state). Seek takes toMs (ms from the session's start), toMark (a mark's label), or channel and toSeq; step takes events (a count) or toMark. Answers {state, atMs, speed, ...}. A live relay answers that it is no replay.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "action": { "type": "string", "enum": ["state", "pause", "resume", "seek", "step", "speed"] },
                    "toMs": { "type": "number", "minimum": 0 },
                    "toMark": { "type": "string", "minLength": 1, "maxLength": 256 },
                    "channel": { "type": "string" },
                    "toSeq": { "type": "integer", "minimum": 0 },
                    "events": { "type": "integer", "minimum": 1, "maximum": 1000000 },
                    "speed": { "description": "A factor (2 is twice as fast) or \"max\"" }
                },
                "required": ["action"]
            }
        }),
    ]
}
