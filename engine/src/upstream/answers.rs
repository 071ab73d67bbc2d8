//! Recorded answers: which frames of a recording answer a given request.
//!
//! A request is identified by its key under the replay's [`MatchRule`] (`--match`: by default
//! its method and params, keys sorted), a 128-bit hash. One streaming pass over the session
//! pairs each forwarded request with the mod's response (by the relay's upstream id) and keeps
//! only (key, response frame number), sorted by key and then by recorded order: 24 bytes per
//! answered request, never a frame body. A bridge's request is answered by reading the frame
//! the index names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use gabp_proto::matching::{is_agent_call, MatchRule};
use gabp_proto::{message, Mode, MsgType, Parser};
use gabp_storage::{Direction, SessionId, Store, StoreError};
use serde_json::{json, Value};

/// Every answered request of a session: (key, response frame number), sorted by key, and by
/// recorded order within a key.
#[derive(Debug, Default)]
pub struct Answers {
    entries: Vec<(u128, u64)>,
}

impl Answers {
    /// Builds the index in one streaming pass over `session`, keyed under `rule`; `stop` ends
    /// it early (the replay is shutting down). Blocking: run it on a thread of its own.
    pub fn build(
        store: &Store,
        session: SessionId,
        rule: &MatchRule,
        stop: &AtomicBool,
    ) -> Result<Answers, StoreError> {
        let mut parser = Parser::new();
        // Requests sent and not yet answered: upstream id -> key.
        let mut asked: HashMap<u128, u128> = HashMap::new();
        let mut entries = Vec::new();
        for item in store.frames(session) {
            let (no, rec) = item?;
            if no % 65_536 == 0 && stop.load(Ordering::Relaxed) {
                break;
            }
            // Events (the bulk of a session) carry a channel: skipped without parsing.
            if rec.channel.is_some() {
                continue;
            }
            match rec.dir {
                Direction::RelayToMod | Direction::ModToRelay => {}
                _ => continue,
            }
            let Ok(view) = parser.parse(&rec.body, Mode::Tolerant) else {
                continue;
            };
            let Some(id) = view
                .id
                .as_deref()
                .and_then(|i| uuid::Uuid::parse_str(i).ok())
            else {
                continue;
            };
            match (rec.dir, view.kind) {
                (Direction::RelayToMod, MsgType::Request) => {
                    let method = view.method.as_deref().unwrap_or_default();
                    if !is_agent_call(method) {
                        continue;
                    }
                    let params = view.params.clone().map(|p| &rec.body[p]);
                    asked.insert(id.as_u128(), rule.key(method, params));
                }
                (Direction::ModToRelay, MsgType::Response) => {
                    if let Some(key) = asked.remove(&id.as_u128()) {
                        entries.push((key, no));
                    }
                }
                _ => {}
            }
        }
        // Stable: answers to one request keep their recorded order.
        entries.sort_by_key(|e| e.0);
        entries.shrink_to_fit();
        Ok(Answers { entries })
    }

    /// The `n`th recorded answer to `key` (the last once `n` runs past them), if any.
    pub fn pick(&self, key: u128, n: usize) -> Option<u64> {
        let start = self.entries.partition_point(|e| e.0 < key);
        let end = self.entries.partition_point(|e| e.0 <= key);
        (start < end).then(|| self.entries[(start + n).min(end - 1)].1)
    }

    /// Answered requests indexed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The message of the -32004 a request no recorded answer matches under `rule`.
pub fn no_match(rule: &MatchRule) -> &'static str {
    match rule {
        MatchRule::Exact => "no recorded response matches this request (method and params)",
        MatchRule::Ignore(_) => {
            "no recorded response matches this request (method and params, ignored fields aside)"
        }
        MatchRule::Order => "no recorded response to this method (--match order)",
    }
}

/// The recorded response in frame `frame`, re-addressed to the bridge's `id`: the answer
/// (`result` or `error`) is kept, the envelope is the bridge's.
pub fn answer_from(
    store: &Store,
    session: SessionId,
    frame: u64,
    id: &str,
) -> Result<Bytes, StoreError> {
    let rec = store
        .frame_at(session, frame)?
        .ok_or_else(|| StoreError::Corrupt("answer frame named by the index".into()))?;
    let mut msg: Value = serde_json::from_slice(&rec.body)
        .map_err(|_| StoreError::Corrupt("recorded answer".into()))?;
    Ok(match msg.get_mut("error").filter(|e| !e.is_null()) {
        Some(e) => {
            let v = json!({"v": "gabp/1", "id": id, "type": "response", "error": e.take()});
            Bytes::from(message::to_ascii_json(&v))
        }
        None => message::result_response(id, msg["result"].take()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_keys_ignore_key_order_and_tell_params_apart() {
        // The default `--match exact`, as the replay has always matched.
        let key = |m, p| MatchRule::Exact.key(m, p);
        let a = key(
            "tools/call",
            Some(&br#"{"name":"x","arguments":{"q":1,"r":2}}"#[..]),
        );
        let b = key(
            "tools/call",
            Some(&br#"{"arguments":{"r":2,"q":1},"name":"x"}"#[..]),
        );
        let c = key(
            "tools/call",
            Some(&br#"{"name":"x","arguments":{"q":2,"r":2}}"#[..]),
        );
        let d = key(
            "tools/list",
            Some(&br#"{"name":"x","arguments":{"q":1,"r":2}}"#[..]),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(key("m/x", None), key("m/x", Some(&b"{}"[..])));
    }

    #[test]
    fn answers_keep_recorded_order_within_a_key() {
        let mut entries = vec![(5u128, 10u64), (3, 4), (5, 2), (5, 30)];
        entries.sort_by_key(|e| e.0);
        let a = Answers { entries };
        let fives: Vec<_> = (0..4).map(|n| a.pick(5, n)).collect();
        assert_eq!(fives, vec![Some(10), Some(2), Some(30), Some(30)]);
        assert_eq!((a.pick(3, 1), a.pick(4, 0)), (Some(4), None));
    }
}
