//! The MCP client's event buffer: what the front's subscription delivered, kept per channel and
//! bounded, so an assistant can poll (`events_poll`) instead of holding a stream.
//!
//! Per channel the newest [`PER_CHANNEL`] events are kept, and all channels together stay under
//! the buffer's byte budget (payload plus [`OVERHEAD`] per event, so tiny events count too; the
//! oldest of the channel being written to goes first): [`STDIO_BYTES`] for `gabp-relay mcp`,
//! [`HTTP_BYTES`] per session of `serve --mcp-listen`. A poll
//! whose cursor points before what is still held is told which seqs it missed. Seq restarts at
//! 0 on a new mod session, so the buffer is cleared then and cursors carry the session id.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Notify;

/// Events kept per channel.
pub const PER_CHANNEL: usize = 4096;
/// The byte budget of `gabp-relay mcp`'s one client.
pub const STDIO_BYTES: usize = 16 * 1024 * 1024;
/// The byte budget of each HTTP MCP session (times the session cap: the HTTP front's worst case).
pub const HTTP_BYTES: usize = 2 * 1024 * 1024;
/// What one held event costs beside its payload (its record, the deque slot, the allocation).
pub const OVERHEAD: usize = 64;
/// Channels tracked at most (more are not buffered).
pub const MAX_CHANNELS: usize = 256;

struct Stored {
    /// Arrival order over all channels, for merging.
    order: u64,
    seq: u64,
    /// The payload's JSON text, as the relay sent it.
    payload: Box<str>,
}

#[derive(Default)]
struct Inner {
    session: String,
    channels: BTreeMap<String, VecDeque<Stored>>,
    bytes: usize,
    next_order: u64,
}

/// The bounded buffer, shared by the link's reader (writing) and the MCP handlers (reading).
pub struct Buffer {
    inner: Mutex<Inner>,
    notify: Notify,
    max_bytes: usize,
}

/// One event as returned by a poll.
struct Polled<'a> {
    channel: &'a str,
    seq: u64,
    payload: &'a str,
}

/// `[{"channel":…,"seq":…,"payload":…},…]`, the payload inserted as the JSON text it is.
fn events_json(events: &[Polled]) -> String {
    let mut out = String::with_capacity(events.iter().map(|e| e.payload.len() + 64).sum());
    out.push('[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"channel\":");
        out.push_str(&serde_json::to_string(e.channel).unwrap_or_default());
        out.push_str(",\"seq\":");
        out.push_str(&e.seq.to_string());
        out.push_str(",\"payload\":");
        out.push_str(e.payload);
        out.push('}');
    }
    out.push(']');
    out
}

/// A JSON object's text with `"events":EVENTS` added as its last member.
fn with_events(head: serde_json::Value, events: &[Polled]) -> String {
    let mut text = serde_json::to_string(&head).unwrap_or_else(|_| "{}".into());
    text.pop();
    if text.len() > 1 {
        text.push(',');
    }
    text.push_str("\"events\":");
    text.push_str(&events_json(events));
    text.push('}');
    text
}

/// Seqs a poll asked for that the buffer no longer holds.
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Missed {
    channel: String,
    from_seq: u64,
    to_seq: u64,
}

/// What a poll asks for.
#[derive(Debug, Default)]
pub struct Query {
    /// Channels to read; empty is every buffered channel.
    pub channels: Vec<String>,
    /// Next seq wanted per channel; a channel not named starts at its oldest buffered event
    /// (the answer's cursor names only channels with an event seen or a cursor given).
    pub cursor: BTreeMap<String, u64>,
    /// The session the cursor belongs to; another session's cursor is ignored (the current
    /// one is read from its seq 0).
    pub session: Option<String>,
    /// Most events returned.
    pub max: usize,
}

impl Buffer {
    /// An empty buffer holding at most `max_bytes` (payload plus [`OVERHEAD`] per event).
    pub fn new(max_bytes: usize) -> Buffer {
        Buffer {
            inner: Mutex::default(),
            notify: Notify::new(),
            max_bytes,
        }
    }

    /// Starts a new mod session: older events are gone (their seqs would repeat). Whether it
    /// replaced another.
    pub fn new_session(&self, session: &str) -> bool {
        let mut g = self.inner.lock();
        let replaced = g.session != session && !g.session.is_empty();
        if g.session != session {
            g.session = session.to_string();
            g.channels.clear();
            g.bytes = 0;
        }
        drop(g);
        self.notify.notify_waiters();
        replaced
    }

    /// The current session and the last seq held per channel (eviction keeps each channel's
    /// newest event, so it is the last one received); `None` before a session.
    pub fn last_seqs(&self) -> Option<(String, BTreeMap<String, u64>)> {
        let g = self.inner.lock();
        if g.session.is_empty() {
            return None;
        }
        let last = g
            .channels
            .iter()
            .filter_map(|(c, q)| Some((c.clone(), q.back()?.seq)))
            .collect();
        Some((g.session.clone(), last))
    }

    /// Adds an event.
    pub fn push(&self, channel: &str, seq: u64, payload: Box<str>) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        if !g.channels.contains_key(channel) && g.channels.len() >= MAX_CHANNELS {
            return;
        }
        let size = payload.len() + OVERHEAD;
        let order = g.next_order;
        g.next_order += 1;
        let q = g.channels.entry(channel.to_string()).or_default();
        while q.len() >= PER_CHANNEL || (g.bytes + size > self.max_bytes && !q.is_empty()) {
            if let Some(old) = q.pop_front() {
                g.bytes -= old.payload.len() + OVERHEAD;
            }
        }
        g.bytes += size;
        q.push_back(Stored {
            order,
            seq,
            payload,
        });
        self.notify.notify_waiters();
    }

    /// The newest `n` events of `channel`, oldest first, as JSON text.
    pub fn latest(&self, channel: &str, n: usize) -> String {
        let g = self.inner.lock();
        let events: Vec<Polled> = g
            .channels
            .get(channel)
            .map(|q| {
                q.iter()
                    .skip(q.len().saturating_sub(n))
                    .map(|s| Polled {
                        channel,
                        seq: s.seq,
                        payload: &s.payload,
                    })
                    .collect()
            })
            .unwrap_or_default();
        with_events(
            serde_json::json!({ "session": g.session, "channel": channel }),
            &events,
        )
    }

    /// Answers `q` as JSON text, waiting up to `wait` for at least one event.
    pub async fn poll(&self, q: &Query, wait: Duration) -> String {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(answer) = self.try_poll(q, false) {
                return answer;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.try_poll(q, true).unwrap_or_default();
            }
        }
    }

    /// The answer to `q`, or `None` when it holds no event and `empty_ok` is false.
    fn try_poll(&self, q: &Query, empty_ok: bool) -> Option<String> {
        let g = self.inner.lock();
        let same_session = q.session.as_deref().is_none_or(|s| s == g.session);
        let names: Vec<&String> = if q.channels.is_empty() {
            g.channels.keys().collect()
        } else {
            q.channels.iter().collect()
        };
        let mut missed = Vec::new();
        // Per channel: the events at or after its cursor (a slice of a deque, seq increasing).
        let mut runs: Vec<(&str, std::collections::vec_deque::Iter<'_, Stored>)> = Vec::new();
        let mut cursor: BTreeMap<String, u64> = BTreeMap::new();
        for name in names {
            // A caller of another session has seen nothing of this one: from its seq 0, so
            // whatever the buffer no longer holds of it is reported missed.
            let want = if same_session {
                q.cursor.get(name.as_str()).copied()
            } else {
                Some(0)
            };
            let Some(buf) = g.channels.get(name.as_str()) else {
                // Nothing seen on it yet: keep the caller's cursor; without one, the next poll
                // starts at the first event that arrives.
                if let Some(w) = want {
                    cursor.insert(name.clone(), w);
                }
                continue;
            };
            let start = match want {
                Some(w) => buf.partition_point(|s| s.seq < w),
                None => 0,
            };
            if let (Some(w), Some(first)) = (want, buf.front()) {
                if first.seq > w {
                    missed.push(Missed {
                        channel: name.clone(),
                        from_seq: w,
                        to_seq: first.seq - 1,
                    });
                }
            }
            let next = want.unwrap_or(0).max(buf.front().map_or(0, |f| f.seq));
            cursor.insert(name.clone(), next);
            runs.push((name.as_str(), buf.range(start..)));
        }
        // Merge the runs in arrival order, up to `max`.
        let mut heads: Vec<_> = runs
            .into_iter()
            .map(|(name, mut it)| {
                let head = it.next();
                (name, it, head)
            })
            .collect();
        let mut events: Vec<Polled> = Vec::new();
        while events.len() < q.max {
            let Some(i) = heads
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.2.map(|s| (i, s.order)))
                .min_by_key(|&(_, o)| o)
                .map(|(i, _)| i)
            else {
                break;
            };
            let (name, it, head) = &mut heads[i];
            if let Some(s) = head.take() {
                events.push(Polled {
                    channel: name,
                    seq: s.seq,
                    payload: &s.payload,
                });
                cursor.insert(name.to_string(), s.seq + 1);
            }
            *head = it.next();
        }
        if events.is_empty() && missed.is_empty() && !empty_ok {
            return None;
        }
        let more = heads.iter().any(|h| h.2.is_some());
        Some(with_events(
            serde_json::json!({
                "session": g.session,
                "cursor": cursor,
                "missed": missed,
                "more": more,
            }),
            &events,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn raw(v: u64) -> Box<str> {
        format!("{{\"n\":{v}}}").into()
    }

    fn poll_now(b: &Buffer, q: &Query) -> Value {
        serde_json::from_str(&b.try_poll(q, true).expect("answer")).expect("json")
    }

    #[test]
    fn a_cursor_walks_contiguously_and_reports_what_was_evicted() {
        let b = Buffer::new(STDIO_BYTES);
        b.new_session("s1");
        for i in 0..(PER_CHANNEL as u64 + 10) {
            b.push("a", i, raw(i));
        }
        let mut q = Query {
            max: 100,
            session: Some("s1".into()),
            ..Query::default()
        };
        q.cursor.insert("a".into(), 0);
        let v = poll_now(&b, &q);
        assert_eq!(v["missed"][0]["toSeq"], 9);
        assert_eq!(v["events"][0]["seq"], 10);
        assert_eq!(v["events"].as_array().map(Vec::len), Some(100));
        assert_eq!(v["cursor"]["a"], 110);
        assert_eq!(v["more"], true);
        // A cursor from another session starts at the oldest event held, and what this
        // session sent before it is reported missed (the caller saw none of it).
        q.session = Some("other".into());
        let v = poll_now(&b, &q);
        assert_eq!(v["events"][0]["seq"], 10);
        assert_eq!(
            v["missed"],
            json!([{"channel": "a", "fromSeq": 0, "toSeq": 9}])
        );
    }

    #[test]
    fn channels_merge_in_arrival_order_and_a_new_session_clears() {
        let b = Buffer::new(STDIO_BYTES);
        b.new_session("s1");
        b.push("a", 0, raw(0));
        b.push("b", 0, raw(1));
        b.push("a", 1, raw(2));
        let v = poll_now(
            &b,
            &Query {
                max: 10,
                ..Query::default()
            },
        );
        let ns: Vec<u64> = v["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["payload"]["n"].as_u64())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(ns, vec![0, 1, 2]);
        b.new_session("s2");
        assert!(b
            .try_poll(
                &Query {
                    max: 10,
                    ..Query::default()
                },
                false
            )
            .is_none());
    }
}
