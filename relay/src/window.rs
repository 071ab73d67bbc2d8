//! The resume window: the route's most recent events, per channel, kept for bridges that
//! reconnect and ask for what they missed (`relay.resume`, see `crate::bridge`).
//!
//! The window holds the same `Arc<EventFrame>` the hub fans out, so keeping an event costs a
//! pointer, not a copy. It is bounded for the whole route, in frames and in bytes: the oldest
//! event (whatever its channel) goes first. Per channel the kept seqs are contiguous, so any
//! kept seq is found by subtraction. The window belongs to a session and is cleared with it.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::outbox::EventFrame;

/// The recent events of one route.
#[derive(Debug, Default)]
pub struct Window {
    max_frames: usize,
    max_bytes: usize,
    frames: usize,
    bytes: usize,
    /// Per channel id: its kept events, oldest first, seqs contiguous.
    channels: Vec<VecDeque<Arc<EventFrame>>>,
    /// The channel id of every kept event, in publish order (which one to forget next).
    order: VecDeque<u32>,
}

impl Window {
    /// A window keeping at most `max_frames` events and `max_bytes` wire bytes (0 frames: off).
    pub fn new(max_frames: usize, max_bytes: usize) -> Window {
        Window {
            max_frames,
            max_bytes,
            ..Window::default()
        }
    }

    /// Forgets everything (a new session).
    pub fn clear(&mut self) {
        self.channels.clear();
        self.order.clear();
        self.frames = 0;
        self.bytes = 0;
    }

    /// Keeps `ev`, published on channel `id` with the channel's next seq, forgetting the oldest
    /// events past the bounds.
    pub fn push(&mut self, id: u32, ev: &Arc<EventFrame>) {
        if self.max_frames == 0 {
            return;
        }
        let i = id as usize;
        if self.channels.len() <= i {
            self.channels.resize_with(i + 1, VecDeque::new);
        }
        self.channels[i].push_back(ev.clone());
        self.order.push_back(id);
        self.frames += 1;
        self.bytes += ev.wire.len();
        while self.frames > self.max_frames || (self.bytes > self.max_bytes && self.frames > 1) {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(e) = self.channels[old as usize].pop_front() {
                self.frames -= 1;
                self.bytes -= e.wire.len();
            }
        }
    }

    /// The oldest seq kept on channel `id`, if any.
    pub fn first_seq(&self, id: u32) -> Option<u64> {
        self.channels.get(id as usize)?.front().map(|e| e.seq)
    }

    /// Kept events of channel `id` from seq `from` on, at most `max_frames` of them and (past
    /// the first) `max_bytes`: empty if `from` is not kept.
    pub fn slice(
        &self,
        id: u32,
        from: u64,
        max_frames: usize,
        max_bytes: usize,
    ) -> Vec<Arc<EventFrame>> {
        let Some(q) = self.channels.get(id as usize) else {
            return Vec::new();
        };
        let Some(first) = q.front().map(|e| e.seq) else {
            return Vec::new();
        };
        if from < first {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        for e in q.range(((from - first) as usize).min(q.len())..) {
            if out.len() >= max_frames || (!out.is_empty() && bytes + e.wire.len() > max_bytes) {
                break;
            }
            bytes += e.wire.len();
            out.push(e.clone());
        }
        out
    }

    /// (events kept, their wire bytes).
    pub fn size(&self) -> (usize, usize) {
        (self.frames, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(channel: &str, seq: u64, len: usize) -> Arc<EventFrame> {
        Arc::new(EventFrame {
            channel: Arc::from(channel),
            seq,
            wire: bytes::Bytes::from(vec![b'x'; len]),
            keep: false,
        })
    }

    #[test]
    fn keeps_the_newest_events_of_the_route_within_both_bounds() {
        let mut w = Window::new(4, 1000);
        for s in 0..3 {
            w.push(0, &ev("a", s, 10));
        }
        for s in 0..3 {
            w.push(1, &ev("b", s, 10));
        }
        // Route-wide: the two oldest (a0, a1) went.
        assert_eq!(w.size(), (4, 40));
        assert_eq!(w.first_seq(0), Some(2));
        assert_eq!(w.first_seq(1), Some(0));
        let b: Vec<u64> = w.slice(1, 1, 10, 1000).iter().map(|e| e.seq).collect();
        assert_eq!(b, vec![1, 2]);
        assert!(w.slice(0, 1, 10, 1000).is_empty(), "a1 is no longer kept");
        assert!(w.slice(0, 3, 10, 1000).is_empty(), "nothing from a3 on yet");
        // Bytes: a big event pushes out the oldest until the bytes fit (a2, b0, b1 go).
        w.push(1, &ev("b", 3, 990));
        assert_eq!(w.size(), (2, 1000));
        assert_eq!((w.first_seq(0), w.first_seq(1)), (None, Some(2)));
        // Slices are bounded in frames and bytes (one always fits).
        let mut w = Window::new(100, 1 << 20);
        for s in 0..10 {
            w.push(0, &ev("a", s, 100));
        }
        assert_eq!(w.slice(0, 2, 3, 1 << 20).len(), 3);
        assert_eq!(w.slice(0, 2, 10, 250).len(), 2);
        assert_eq!(w.slice(0, 2, 10, 1).len(), 1);
        w.clear();
        assert_eq!((w.size(), w.first_seq(0)), ((0, 0), None));
        let mut off = Window::new(0, 1 << 20);
        off.push(0, &ev("a", 0, 1));
        assert_eq!(off.size(), (0, 0));
    }
}
