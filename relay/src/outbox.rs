//! A bridge's bounded outbox, and what happens when it is full.
//!
//! The publisher (the mod reader) never waits for a bridge unless that bridge's policy is
//! `block`. Events and control frames (responses, notices) queue separately: the drop policy
//! only ever drops events, since a dropped response would lose an outcome. Control frames are
//! bounded by the per-bridge pending-request cap instead.
//!
//! Every dropped event is remembered as a per-channel seq range; the writer turns the ranges
//! into `relay/dropped` events placed exactly where the gap is, so every drop is visible.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::OnSlow;
use crate::sink::Sink;

/// One event as fanned out: built once, shared by every subscriber.
#[derive(Debug)]
pub struct EventFrame {
    /// The channel name.
    pub channel: Arc<str>,
    /// The relay seq written into the frame.
    pub seq: u64,
    /// The complete wire frame (header and body).
    pub wire: Bytes,
    /// Never dropped: relay notices that must keep their place in the event stream.
    pub keep: bool,
}

/// A run of dropped events on one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropRun {
    /// The channel.
    pub channel: Arc<str>,
    /// First dropped seq.
    pub from: u64,
    /// Last dropped seq.
    pub to: u64,
    /// Events dropped (`to - from + 1` unless runs were merged across a gap).
    pub count: u64,
}

/// The result of offering an event to an outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued.
    Queued,
    /// Queued after dropping this many older events.
    QueuedAfterDrop(u64),
    /// Full and the policy is `block`: wait with [`Outbox::space`] and offer again.
    Full,
    /// Full and the policy is `disconnect`: the outbox is now closed.
    Disconnected,
    /// The outbox was already closed.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    control: VecDeque<Bytes>,
    events: VecDeque<Arc<EventFrame>>,
    event_bytes: usize,
    drops: Vec<DropRun>,
    closed: bool,
}

/// What a writer takes out in one go.
#[derive(Debug, Default)]
pub struct Batch {
    /// Drop runs to announce first.
    pub drops: Vec<DropRun>,
    /// Control frames (wire form).
    pub control: Vec<Bytes>,
    /// Events in order.
    pub events: Vec<Arc<EventFrame>>,
}

impl Batch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.drops.is_empty() && self.control.is_empty() && self.events.is_empty()
    }
}

/// A bounded queue of frames for one bridge.
#[derive(Debug)]
pub struct Outbox {
    policy: OnSlow,
    max_frames: usize,
    max_bytes: usize,
    state: Mutex<State>,
    wake: Notify,
    space: Notify,
    /// Set when a publisher has pushed but not yet woken the writer (wakes are batched).
    wake_pending: AtomicBool,
    dropped: AtomicU64,
    delivered: AtomicU64,
    /// The bridge's socket, while nobody is writing to it (see [`crate::sink`]).
    sink: Mutex<Option<Sink>>,
}

impl Outbox {
    /// An outbox bounded by `max_frames` events and `max_bytes` of event bytes.
    pub fn new(policy: OnSlow, max_frames: usize, max_bytes: usize) -> Outbox {
        Outbox {
            policy,
            max_frames: max_frames.max(1),
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            space: Notify::new(),
            wake_pending: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            sink: Mutex::new(None),
        }
    }

    /// The slot holding the bridge's socket between writes: the writer task takes it out for
    /// the length of a write; the mod reader writes in place while holding the lock.
    pub fn sink_slot(&self) -> &Mutex<Option<Sink>> {
        &self.sink
    }

    /// Forgets that a wake is owed (the caller is about to write instead of waking).
    pub fn clear_wake_mark(&self) {
        self.wake_pending.store(false, Ordering::Release);
    }

    /// Whether anything is queued.
    pub fn has_queued(&self) -> bool {
        let st = self.state.lock();
        !(st.events.is_empty() && st.control.is_empty() && st.drops.is_empty())
    }

    /// The policy applied when full.
    pub fn policy(&self) -> OnSlow {
        self.policy
    }

    /// Offers an event. Neither writes nor wakes the writer: the mod reader marks the outbox
    /// ([`Outbox::mark_for_wake`]) and, once per burst, writes directly or wakes the writer
    /// (`bridge::write_from_reader`), so one write covers many events.
    pub fn offer(&self, ev: &Arc<EventFrame>) -> Offer {
        let len = ev.wire.len();
        let mut st = self.state.lock();
        if st.closed {
            return Offer::Closed;
        }
        let fits = |st: &State| {
            st.events.len() < self.max_frames
                && (st.event_bytes + len <= self.max_bytes || st.events.is_empty())
        };
        if fits(&st) {
            st.event_bytes += len;
            st.events.push_back(ev.clone());
            return Offer::Queued;
        }
        match self.policy {
            OnSlow::Block => Offer::Full,
            OnSlow::Disconnect => {
                st.closed = true;
                drop(st);
                self.wake.notify_one();
                self.space.notify_waiters();
                Offer::Disconnected
            }
            OnSlow::DropOldest => {
                let mut n = 0;
                let mut kept = Vec::new();
                while !fits(&st) {
                    let Some(old) = st.events.pop_front() else {
                        break;
                    };
                    st.event_bytes -= old.wire.len();
                    if old.keep {
                        kept.push(old);
                        continue;
                    }
                    record_drop(&mut st.drops, &old);
                    n += 1;
                }
                // Kept notices go back in front, in order: they were the oldest.
                for k in kept.into_iter().rev() {
                    st.event_bytes += k.wire.len();
                    st.events.push_front(k);
                }
                st.event_bytes += len;
                st.events.push_back(ev.clone());
                drop(st);
                self.dropped.fetch_add(n, Ordering::Relaxed);
                Offer::QueuedAfterDrop(n)
            }
        }
    }

    /// Queues a relay notice in the event stream, in order with events and past any bound (it is
    /// never dropped). Returns false if the outbox is closed.
    pub fn push_ordered(&self, ev: Arc<EventFrame>) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        st.event_bytes += ev.wire.len();
        st.events.push_back(ev);
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Queues a control frame (a response or notice). Returns false if the outbox is closed.
    pub fn push_control(&self, wire: Bytes) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        st.control.push_back(wire);
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Returns true the first time it is called after a wake; the caller then owns one wake.
    pub fn mark_for_wake(&self) -> bool {
        !self.wake_pending.swap(true, Ordering::AcqRel)
    }

    /// Wakes the writer.
    pub fn wake(&self) {
        self.wake_pending.store(false, Ordering::Release);
        self.wake.notify_one();
    }

    /// Waits until the writer has taken frames out (for the `block` policy).
    pub async fn space(&self) {
        let notified = self.space.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let st = self.state.lock();
            if st.closed || st.events.len() < self.max_frames {
                return;
            }
        }
        self.wake.notify_one();
        notified.await;
    }

    /// Waits until there is something to take (or the outbox closes).
    pub async fn ready(&self) {
        self.wake.notified().await;
    }

    /// Takes everything queued. Returns `None` once the outbox is closed and drained.
    pub fn take(&self, batch: &mut Batch) -> Option<()> {
        let mut st = self.state.lock();
        batch.drops.append(&mut st.drops);
        batch.control.extend(st.control.drain(..));
        batch.events.extend(st.events.drain(..));
        st.event_bytes = 0;
        let closed = st.closed;
        drop(st);
        self.space.notify_waiters();
        self.delivered
            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        if closed && batch.is_empty() {
            None
        } else {
            Some(())
        }
    }

    /// Closes the outbox: queued frames are still written, new ones refused.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_one();
        self.space.notify_waiters();
    }

    /// Whether the outbox is closed.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// (queued events, queued event bytes, queued control frames).
    pub fn depth(&self) -> (usize, usize, usize) {
        let st = self.state.lock();
        (st.events.len(), st.event_bytes, st.control.len())
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events handed to the writer so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

fn record_drop(drops: &mut Vec<DropRun>, ev: &EventFrame) {
    if let Some(run) = drops.iter_mut().rev().find(|r| r.channel == ev.channel) {
        if run.to + 1 == ev.seq {
            run.to = ev.seq;
            run.count += 1;
            return;
        }
    }
    drops.push(DropRun {
        channel: ev.channel.clone(),
        from: ev.seq,
        to: ev.seq,
        count: 1,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ch: &str, seq: u64) -> Arc<EventFrame> {
        Arc::new(EventFrame {
            channel: ch.into(),
            seq,
            wire: Bytes::from(vec![b'x'; 10]),
            keep: false,
        })
    }

    #[test]
    fn ordered_notices_keep_their_place_and_are_never_dropped() {
        let o = Outbox::new(OnSlow::DropOldest, 3, 1 << 20);
        o.offer(&ev("a", 0));
        let notice = EventFrame {
            channel: "relay/session".into(),
            seq: 0,
            wire: Bytes::from_static(b"n"),
            keep: true,
        };
        o.push_ordered(Arc::new(notice));
        for s in 1..6 {
            o.offer(&ev("a", s));
        }
        let mut b = Batch::default();
        o.take(&mut b).expect("open");
        let order: Vec<(&str, u64)> = b.events.iter().map(|e| (&*e.channel, e.seq)).collect();
        assert_eq!(
            order,
            vec![("relay/session", 0), ("a", 3), ("a", 4), ("a", 5)]
        );
        assert_eq!(
            b.drops,
            vec![DropRun {
                channel: "a".into(),
                from: 0,
                to: 2,
                count: 3
            }]
        );
    }

    #[test]
    fn drop_oldest_keeps_newest_and_records_runs() {
        let o = Outbox::new(OnSlow::DropOldest, 3, 1 << 20);
        for s in 0..5 {
            o.offer(&ev("a", s));
        }
        o.push_control(Bytes::from_static(b"resp"));
        let mut b = Batch::default();
        o.take(&mut b).expect("open");
        assert_eq!(
            b.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(
            b.drops,
            vec![DropRun {
                channel: "a".into(),
                from: 0,
                to: 1,
                count: 2
            }]
        );
        assert_eq!(b.control.len(), 1, "control frames are never dropped");
        assert_eq!(o.dropped(), 2);
    }

    #[test]
    fn byte_bound_applies() {
        let o = Outbox::new(OnSlow::DropOldest, 100, 25);
        for s in 0..4 {
            o.offer(&ev("a", s));
        }
        assert_eq!(o.depth().0, 2);
    }

    #[test]
    fn disconnect_and_block_policies() {
        let o = Outbox::new(OnSlow::Disconnect, 1, 1 << 20);
        assert_eq!(o.offer(&ev("a", 0)), Offer::Queued);
        assert_eq!(o.offer(&ev("a", 1)), Offer::Disconnected);
        assert!(o.is_closed());
        let mut b = Batch::default();
        assert!(o.take(&mut b).is_some(), "queued frames still drain");
        let mut b = Batch::default();
        assert!(o.take(&mut b).is_none());

        let o = Outbox::new(OnSlow::Block, 1, 1 << 20);
        assert_eq!(o.offer(&ev("a", 0)), Offer::Queued);
        assert_eq!(o.offer(&ev("a", 1)), Offer::Full);
        assert_eq!(o.dropped(), 0);
    }
}
