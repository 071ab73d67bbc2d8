//! A bridge's bounded outbox, and what happens when it is full.
//!
//! The publisher (the mod reader) never waits for a bridge unless that bridge's policy is
//! `block`. Events and control frames (responses, notices) share one queue, so a bridge gets
//! them in the order they were produced (a mod response never overtakes the events the mod sent
//! before it). The drop policy only ever drops events, since a dropped response would lose an
//! outcome; control frames have a byte bound of their own (the outbox byte bound): past it the
//! bridge is cut, since nothing can be dropped and it reads too slowly to keep up.
//!
//! Every dropped event is remembered as a per-channel seq range; the writer turns the ranges
//! into `relay/dropped` events placed exactly where the gap is, so every drop is visible.
//!
//! The relay's own notices (`relay/session`, `relay/replay`) keep their place among the events
//! and are never dropped for them; they are bounded like events (frames and bytes, counted apart
//! so a burst of events cannot crowd them out). A notice that only states something's current
//! state (`relay/lease`) is coalesced instead: a bridge holds at most one per channel, the
//! latest, written before the next frames it takes, however fast the state changes.
//!
//! A bridge is *cut* (its connection reset and its state freed at once) when its policy is
//! `disconnect` and it falls behind, when its control frames or notices pass their bound, or
//! when its peer reads nothing for the write deadline.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub(crate) mod socket;

use socket::SocketSlot;

mod frame;
mod runs;

pub use frame::{Batch, DropRun, EventFrame, EventRun, Frame, RunEvent};
pub use runs::{Runs, RUN_BYTES};

/// A subscriber: a bridge's connection number and outbox.
pub type Subscriber = (u32, Arc<Outbox>);

/// The result of offering an event to an outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Queued.
    Queued,
    /// Queued after dropping this many older events.
    QueuedAfterDrop(u64),
    /// Full and the policy is `block`: wait with [`Outbox::space`] and offer again.
    Full,
    /// Full and the policy is `disconnect`: the bridge is now cut.
    Disconnected,
    /// The outbox was already closed.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Frame>,
    events: usize,
    event_bytes: usize,
    controls: usize,
    control_bytes: usize,
    notices: usize,
    notice_bytes: usize,
    drops: Vec<DropRun>,
    /// The latest state notice of each coalesced channel, not yet taken.
    latest: Vec<Arc<EventFrame>>,
    closed: bool,
    /// The size of the last event refused under `block`: [`Outbox::space`] waits for room
    /// for that much (waiting for "fewer frames" alone spun when the byte bound was reached).
    want: usize,
}

impl State {
    fn fits(&self, len: usize, max_frames: usize, max_bytes: usize) -> bool {
        self.events == 0 || (self.events < max_frames && self.event_bytes + len <= max_bytes)
    }
}

/// What [`Outbox::offer_all`] did with a run of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// Events queued, from the start of the run.
    pub queued: usize,
    /// Older events dropped to make room (policy `drop-oldest`).
    pub dropped: u64,
    /// `Queued` or `QueuedAfterDrop(dropped)` when the whole run was queued; otherwise why
    /// the event after the queued ones was not (`Full`, `Disconnected`, `Closed`).
    pub outcome: Offer,
}

/// Why a bridge was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutReason {
    /// Policy `disconnect` and its outbox was full.
    Slow,
    /// Its control frames (responses, replies) passed their bound.
    ControlBacklog,
    /// It read nothing for the write deadline.
    WriteDeadline,
    /// The relay's notices to it passed their bound.
    NoticeBacklog,
}

impl CutReason {
    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CutReason::Slow => "its outbox is full (policy disconnect)",
            CutReason::ControlBacklog => "it does not read its responses",
            CutReason::WriteDeadline => "it read nothing within the write deadline",
            CutReason::NoticeBacklog => "it does not read the relay's notices",
        }
    }
}

/// A bounded queue of frames for one bridge.
/// An outbox's fill, read at one moment (see [`Outbox::depth`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Events queued.
    pub events: usize,
    /// Their bytes.
    pub event_bytes: usize,
    /// Control frames queued (replies, notices).
    pub controls: usize,
    /// Their bytes.
    pub control_bytes: usize,
    /// Relay notices queued (coalesced ones included).
    pub notices: usize,
    /// Their bytes.
    pub notice_bytes: usize,
    /// Bytes taken by the writer and not yet accepted by the socket.
    pub unwritten: usize,
}

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
    /// Cancelled when the bridge is cut: its connection task resets the socket at once.
    cut: CancellationToken,
    cut_reason: Mutex<Option<CutReason>>,
    /// The bridge's socket, while nobody is writing to it (see [`socket`]).
    socket: SocketSlot,
    /// Bytes taken from here that the socket has not accepted yet, as the writer last saw
    /// them: a resume's history counts them against the bound too.
    unwritten: AtomicUsize,
}

impl Outbox {
    /// An outbox bounded by `max_frames` events and `max_bytes` of event bytes (and, separately,
    /// `max_bytes` of control bytes).
    pub fn new(policy: OnSlow, max_frames: usize, max_bytes: usize) -> Outbox {
        Outbox {
            policy,
            max_frames: max_frames.max(1),
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            space: Notify::new(),
            wake_pending: AtomicBool::new(false),
            unwritten: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            cut: CancellationToken::new(),
            cut_reason: Mutex::new(None),
            socket: SocketSlot::default(),
        }
    }

    /// The slot holding the bridge's socket between writes: the writer task leases it for the
    /// length of a write; the mod reader writes in place while holding the lock.
    pub(crate) fn socket(&self) -> &SocketSlot {
        &self.socket
    }

    /// Forgets that a wake is owed (the caller is about to write instead of waking).
    pub fn clear_wake_mark(&self) {
        self.wake_pending.store(false, Ordering::Release);
    }

    /// Whether anything is queued.
    pub fn has_queued(&self) -> bool {
        let st = self.state.lock();
        !(st.queue.is_empty() && st.drops.is_empty() && st.latest.is_empty())
    }

    /// The policy applied when full.
    pub fn policy(&self) -> OnSlow {
        self.policy
    }

    /// Offers an event. Neither writes nor wakes the writer: the mod reader marks the outbox
    /// ([`Outbox::mark_for_wake`]) and, once per burst, writes directly or wakes the writer
    /// (`direct::write_from_reader`), so one write covers many events.
    pub fn offer(&self, ev: &Arc<EventFrame>) -> Offer {
        self.offer_all(std::slice::from_ref(ev)).outcome
    }

    /// Offers events in order under one lock: exactly as offering them one by one, stopping
    /// at the first that is not queued.
    pub fn offer_all(&self, evs: &[Arc<EventFrame>]) -> Offered {
        self.offer_each(
            evs.len(),
            |i| evs[i].wire.len(),
            |st, i| st.queue.push_back(Frame::Event(evs[i].clone())),
        )
    }

    /// Offers the events of `run` from its `from`-th on, as [`Outbox::offer_all`] would offer
    /// them one by one, queueing those taken as one entry of the shared run (the mod reader
    /// hands each subscriber a burst's run at once).
    pub fn offer_run(&self, run: &Arc<EventRun>, from: usize) -> Offered {
        let n = run.events.len().saturating_sub(from);
        self.offer_each(
            n,
            |i| run.len_of(from + i),
            |st, i| {
                let i = (from + i) as u32;
                match st.queue.back_mut() {
                    Some(Frame::Run { run: r, to, .. }) if *to == i && Arc::ptr_eq(r, run) => {
                        *to += 1
                    }
                    _ => st.queue.push_back(Frame::Run {
                        run: run.clone(),
                        from: i,
                        to: i + 1,
                    }),
                }
            },
        )
    }

    /// Queues with `push` each of `n` events (the `i`-th `len(i)` bytes) that the bounds and the
    /// policy admit, in order, under one lock, stopping at the first that is not queued.
    fn offer_each(
        &self,
        n: usize,
        len: impl Fn(usize) -> usize,
        mut push: impl FnMut(&mut State, usize),
    ) -> Offered {
        let mut done = Offered {
            queued: 0,
            dropped: 0,
            outcome: Offer::Queued,
        };
        let mut st = self.state.lock();
        for i in 0..n {
            let len = len(i);
            match self.make_room(&mut st, len) {
                Offer::Queued => {}
                Offer::QueuedAfterDrop(k) => done.dropped += k,
                refused => {
                    done.outcome = refused;
                    break;
                }
            }
            st.events += 1;
            st.event_bytes += len;
            push(&mut st, i);
            done.queued += 1;
        }
        drop(st);
        if done.outcome == Offer::Disconnected {
            self.cut(CutReason::Slow);
        }
        if done.dropped > 0 {
            self.dropped.fetch_add(done.dropped, Ordering::Relaxed);
            if done.outcome == Offer::Queued {
                done.outcome = Offer::QueuedAfterDrop(done.dropped);
            }
        }
        done
    }

    /// Whether an event of `len` bytes may be queued now, after dropping older events if the
    /// policy is `drop-oldest` (`QueuedAfterDrop`). `Disconnected` means the caller must cut the
    /// bridge (after letting go of the lock).
    fn make_room(&self, st: &mut State, len: usize) -> Offer {
        let (max_frames, max_bytes) = (self.max_frames, self.max_bytes);
        if st.closed {
            return Offer::Closed;
        }
        if st.fits(len, max_frames, max_bytes) {
            return Offer::Queued;
        }
        match self.policy {
            OnSlow::Block => {
                st.want = len;
                Offer::Full
            }
            OnSlow::Disconnect => Offer::Disconnected,
            OnSlow::DropOldest => {
                let mut n = 0;
                let mut kept = Vec::new();
                while !st.fits(len, max_frames, max_bytes) {
                    let Some(old) = st.queue.pop_front() else {
                        break;
                    };
                    match old {
                        Frame::Event(e) if !e.keep => {
                            st.events -= 1;
                            st.event_bytes -= e.wire.len();
                            record_drop(&mut st.drops, &e.channel, e.seq);
                            n += 1;
                        }
                        // A run loses its oldest event; the rest stays in front.
                        Frame::Run { run, from, to } => {
                            let ev = &run.events[from as usize];
                            st.events -= 1;
                            st.event_bytes -= run.len_of(from as usize);
                            record_drop(&mut st.drops, &ev.channel, ev.seq);
                            n += 1;
                            if from + 1 < to {
                                st.queue.push_front(Frame::Run {
                                    run,
                                    from: from + 1,
                                    to,
                                });
                            }
                        }
                        // Notices and control frames are never dropped (nor counted as
                        // events): they go back in front below.
                        other => kept.push(other),
                    }
                }
                // Kept frames go back in front, in order: they were the oldest.
                for k in kept.into_iter().rev() {
                    st.queue.push_front(k);
                }
                Offer::QueuedAfterDrop(n)
            }
        }
    }

    /// Queues a relay notice in the event stream, in order with events. It is never dropped
    /// for events; notices are bounded by the outbox's frame and byte bounds of their own (one
    /// always fits), and past them the bridge is cut, as it has stopped reading. Returns false
    /// if the notice was not queued (closed, or cut now).
    pub fn push_notice(&self, ev: Arc<EventFrame>) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        let len = ev.wire.len();
        if st.notices > 0
            && (st.notices >= self.max_frames || st.notice_bytes + len > self.max_bytes)
        {
            drop(st);
            self.cut(CutReason::NoticeBacklog);
            return false;
        }
        st.notices += 1;
        st.notice_bytes += len;
        st.queue.push_back(Frame::Event(ev));
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Sets the latest state notice of `ev`'s channel, replacing the one not yet taken: a
    /// bridge needs the current state (the lease's holder), not every change, so at most one
    /// per channel is held however fast it changes. It is written before the frames of the
    /// next take. Returns false if the outbox is closed.
    pub fn set_latest(&self, ev: Arc<EventFrame>) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        let len = ev.wire.len();
        match st.latest.iter().position(|l| l.channel == ev.channel) {
            Some(i) => {
                let old = std::mem::replace(&mut st.latest[i], ev);
                st.notice_bytes = st.notice_bytes - old.wire.len() + len;
            }
            None => {
                st.latest.push(ev);
                st.notices += 1;
                st.notice_bytes += len;
            }
        }
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Queues a control frame (a response or the relay's reply), in order with events. Control
    /// frames are never dropped; past their byte bound (one frame always fits) the bridge is cut
    /// instead. Returns false if the frame was not queued (closed, or cut now).
    pub fn push_control(&self, wire: Bytes) -> bool {
        let queued = self.queue_control(wire);
        if queued {
            self.wake.notify_one();
        }
        queued
    }

    /// Queues a control frame as [`Outbox::push_control`] does, without waking the writer:
    /// the mod reader queues answers so and writes them itself at the end of its burst
    /// ([`Outbox::mark_for_wake`]), as it does events.
    pub fn queue_control(&self, wire: Bytes) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        if st.controls > 0 && st.control_bytes + wire.len() > self.max_bytes {
            drop(st);
            self.cut(CutReason::ControlBacklog);
            return false;
        }
        st.controls += 1;
        st.control_bytes += wire.len();
        st.queue.push_back(Frame::Control(wire));
        true
    }

    /// Bytes of control frames queued and not yet taken by the writer.
    pub fn control_bytes(&self) -> usize {
        self.state.lock().control_bytes
    }

    /// Waits until at most `bytes` of control frames are queued (or the outbox closes).
    pub async fn control_below(&self, bytes: usize) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if st.closed || st.control_bytes <= bytes {
                    return;
                }
            }
            self.wake.notify_one();
            notified.await;
        }
    }

    /// Waits until at most `frames` events and `bytes` of event bytes are queued or taken and
    /// not yet written (or the outbox closes): a resuming bridge's history is streamed as the
    /// socket drains, never more of it held than the outbox's bounds.
    pub async fn events_below(&self, frames: usize, bytes: usize) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                let unwritten = self.unwritten.load(Ordering::Acquire);
                if st.closed || (st.events <= frames && st.event_bytes + unwritten <= bytes) {
                    return;
                }
            }
            self.wake.notify_one();
            notified.await;
        }
    }

    /// Announces events the bridge will never get (a resume asked for history the relay no
    /// longer holds): a `relay/dropped` notice with `policy` `not-retained`, written before
    /// the frames queued after it. Returns false if the outbox is closed.
    pub fn push_gap(&self, channel: Arc<str>, from: u64, to: u64) -> bool {
        let mut st = self.state.lock();
        if st.closed {
            return false;
        }
        // A window that let more go while the last notice waited: still one notice.
        match st.drops.last_mut() {
            Some(last)
                if last.policy == NOT_RETAINED
                    && last.channel == channel
                    && last.to + 1 == from =>
            {
                last.to = to;
                last.count += to - from + 1;
            }
            _ => st.drops.push(DropRun {
                channel,
                from,
                to,
                count: to - from + 1,
                policy: NOT_RETAINED,
            }),
        }
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

    /// Waits until the event refused last (policy `block`) would fit, or the outbox closes.
    pub async fn space(&self) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if st.closed || st.fits(st.want, self.max_frames, self.max_bytes) {
                    return;
                }
            }
            self.wake.notify_one();
            notified.await;
        }
    }

    /// Waits until there is something to take (or the outbox closes).
    pub async fn ready(&self) {
        self.wake.notified().await;
    }

    /// Takes everything queued. Returns `None` once the outbox is closed and drained.
    pub fn take(&self, batch: &mut Batch) -> Option<()> {
        let mut st = self.state.lock();
        batch.drops.append(&mut st.drops);
        batch.latest.append(&mut st.latest);
        let events = st.events;
        let taken = st.queue.len();
        if batch.frames.is_empty() {
            // The usual case: hand the whole ring over (no copy); the batch's empty ring,
            // with the capacity it had, takes its place.
            std::mem::swap(&mut batch.frames, &mut st.queue);
        } else {
            batch.frames.extend(st.queue.drain(..));
        }
        // Taken is not yet written: counted as unwritten before anyone waiting for room is
        // told (the taker then sets the exact figure), or a resume's history could be queued
        // again in the moment between the two and a bridge that reads nothing hold twice its
        // bound.
        self.unwritten.fetch_add(
            st.event_bytes + st.control_bytes + st.notice_bytes,
            Ordering::AcqRel,
        );
        st.events = 0;
        st.event_bytes = 0;
        st.controls = 0;
        st.control_bytes = 0;
        st.notices = 0;
        st.notice_bytes = 0;
        // A long burst leaves a big ring behind; give it back once the bursts are over (not
        // at every take at full rate, where it would be regrown at once).
        if st.queue.capacity() > 4096 && taken < 256 {
            st.queue.shrink_to(256);
        }
        let closed = st.closed;
        drop(st);
        self.space.notify_waiters();
        self.delivered.fetch_add(events as u64, Ordering::Relaxed);
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

    /// Cuts the bridge: closes the outbox, forgets what is queued, and signals its connection
    /// task to reset the socket and free the bridge's state at once.
    pub fn cut(&self, reason: CutReason) {
        {
            let mut st = self.state.lock();
            st.closed = true;
            st.queue = VecDeque::new();
            st.drops = Vec::new();
            st.latest = Vec::new();
            st.events = 0;
            st.event_bytes = 0;
            st.controls = 0;
            st.control_bytes = 0;
            st.notices = 0;
            st.notice_bytes = 0;
        }
        self.cut_reason.lock().get_or_insert(reason);
        self.cut.cancel();
        self.wake.notify_one();
        self.space.notify_waiters();
    }

    /// Cancelled once the bridge is cut.
    pub fn cut_signal(&self) -> &CancellationToken {
        &self.cut
    }

    /// Why the bridge was cut, if it was.
    pub fn cut_reason(&self) -> Option<CutReason> {
        *self.cut_reason.lock()
    }

    /// Whether the outbox is closed.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// What is queued, and what was taken and not yet written, as of one moment: a take
    /// moves bytes from the one to the other under the same lock, so a reader never counts
    /// them in both (or in neither).
    pub fn depth(&self) -> Depth {
        let st = self.state.lock();
        Depth {
            events: st.events,
            event_bytes: st.event_bytes,
            controls: st.controls,
            control_bytes: st.control_bytes,
            notices: st.notices,
            notice_bytes: st.notice_bytes,
            unwritten: self.unwritten.load(Ordering::Acquire),
        }
    }

    /// Notes the bytes the socket has yet to accept (the writer's view after staging or
    /// writing); a drop wakes whoever waits for room.
    pub fn note_unwritten(&self, bytes: usize) {
        if self.unwritten.swap(bytes, Ordering::AcqRel) > bytes {
            self.space.notify_waiters();
        }
    }

    /// Bytes taken from here and not yet accepted by the socket.
    pub fn unwritten(&self) -> usize {
        self.unwritten.load(Ordering::Acquire)
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

const DROP_OLDEST: &str = "drop-oldest";
const NOT_RETAINED: &str = "not-retained";

fn record_drop(drops: &mut Vec<DropRun>, channel: &Arc<str>, seq: u64) {
    if let Some(run) = drops.iter_mut().rev().find(|r| r.channel == *channel) {
        if run.to + 1 == seq && run.policy == DROP_OLDEST {
            run.to = seq;
            run.count += 1;
            return;
        }
    }
    drops.push(DropRun {
        channel: channel.clone(),
        from: seq,
        to: seq,
        count: 1,
        policy: DROP_OLDEST,
    });
}

/// What happens when a bridge's outbox is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnSlow {
    /// Drop that bridge's oldest queued events; it sees a seq gap and a `relay/dropped` event.
    #[default]
    DropOldest,
    /// Disconnect that bridge.
    Disconnect,
    /// Wait for that bridge (lossless; stalls the whole route). For trusted consumers only.
    Block,
}

impl OnSlow {
    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnSlow::DropOldest => "drop-oldest",
            OnSlow::Disconnect => "disconnect",
            OnSlow::Block => "block",
        }
    }
}

impl std::str::FromStr for OnSlow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop-oldest" => Ok(OnSlow::DropOldest),
            "disconnect" => Ok(OnSlow::Disconnect),
            "block" => Ok(OnSlow::Block),
            _ => Err(format!(
                "unknown policy {s:?}: expected drop-oldest, disconnect or block"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
