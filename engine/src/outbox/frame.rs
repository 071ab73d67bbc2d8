//! What an outbox holds and hands over: shared event frames, shared runs of events, control
//! frames, runs of dropped events, and the batch a writer takes in one go. Plain data; the
//! queueing rules are [`super`]'s.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

/// One event as fanned out: built once, shared by every subscriber.
#[derive(Debug)]
pub struct EventFrame {
    /// The channel name.
    pub channel: Arc<str>,
    /// The relay seq written into the frame.
    pub seq: u64,
    /// The complete wire frame (header and body).
    pub wire: Bytes,
    /// A relay notice: never dropped for events, bounded apart (see [`super::Outbox::push_notice`]).
    pub keep: bool,
}

/// Consecutive events of one read burst with the same subscribers, their wire frames back to
/// back in one buffer: built once, shared by every subscriber, queued and written as one entry
/// (one `writev` buffer) instead of one per event. Its events are still counted, bounded and
/// dropped one by one.
#[derive(Debug)]
pub struct EventRun {
    /// The events' wire frames, back to back.
    pub wire: Bytes,
    /// Each event, in order.
    pub events: Vec<RunEvent>,
}

/// One event of an [`EventRun`].
#[derive(Debug, Clone)]
pub struct RunEvent {
    /// The channel name.
    pub channel: Arc<str>,
    /// The relay seq written into the frame.
    pub seq: u64,
    /// Where the event's frame ends in the run's `wire`.
    pub end: u32,
}

impl EventRun {
    /// Where event `i`'s frame starts in `wire`.
    pub fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.events[i - 1].end as usize
        }
    }

    /// The wire length of event `i`.
    pub fn len_of(&self, i: usize) -> usize {
        self.events[i].end as usize - self.start(i)
    }
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
    /// Why, as the notice says it: the slow-bridge policy (`drop-oldest`), or `not-retained`
    /// for history a resume asked for that the relay no longer holds.
    pub policy: &'static str,
}

/// One queued frame: a shared event, or a control frame (a response or the relay's own reply).
#[derive(Debug, Clone)]
pub enum Frame {
    /// An event (or an ordered relay notice).
    Event(Arc<EventFrame>),
    /// Events `from..to` of a shared run.
    Run {
        /// The run.
        run: Arc<EventRun>,
        /// Its first event here.
        from: u32,
        /// One past its last event here.
        to: u32,
    },
    /// A control frame in wire form.
    Control(Bytes),
}

impl Frame {
    /// The wire bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Frame::Event(e) => &e.wire,
            Frame::Run { run, from, to } => {
                &run.wire[run.start(*from as usize)..run.events[*to as usize - 1].end as usize]
            }
            Frame::Control(b) => b,
        }
    }

    /// How many events it holds.
    pub fn events(&self) -> u64 {
        match self {
            Frame::Event(_) => 1,
            Frame::Run { from, to, .. } => u64::from(to - from),
            Frame::Control(_) => 0,
        }
    }
}

/// What a writer takes out in one go.
#[derive(Debug, Default)]
pub struct Batch {
    /// Drop runs to announce first.
    pub drops: Vec<DropRun>,
    /// The latest state notices (coalesced), written after the drop notices.
    pub latest: Vec<Arc<EventFrame>>,
    /// Frames in the order they were queued (a ring, so whole queues can be swapped, not copied).
    pub frames: VecDeque<Frame>,
}

impl Batch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.drops.is_empty() && self.latest.is_empty() && self.frames.is_empty()
    }
}
