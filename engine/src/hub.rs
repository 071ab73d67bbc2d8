//! The hub: per-channel relay seq, subscriptions, and fan-out of one shared frame.
//!
//! The mod reader publishes each event once. Under one short lock the hub picks the channel's
//! next relay seq (contiguous from 0 per session and channel) and writes the frame with it,
//! once, into the reader's burst, in the run of the channel's subscribers ([`Runs`]); each run
//! is then offered to every one of them as one shared entry. Subscriber lists are
//! copy-on-write, so publishing never allocates for them.
//!
//! Subscriptions belong to bridges and survive a mod reconnect; channel ids and seqs belong to
//! a session and restart with it.
//!
//! Each published frame is also kept in the route's resume `Window` (its bytes copied under the
//! same lock, so the window always ends at the channel's last seq). A resuming bridge reads
//! history from it and joins the live stream with [`Hub::join`], which hands it the last few
//! events and subscribes it in one step: no event can fall between history and live.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
// Channel names are short and chosen by the mod the relay connects to, not by the bridges:
// a fast non-keyed hash is enough (and SipHash was ~2% of the relay's CPU at full rate).
use rustc_hash::FxHashMap as HashMap;

pub use crate::outbox::Subscriber;
use crate::outbox::{EventFrame, Offer, Outbox, Runs};
use crate::window::Window;

#[derive(Debug)]
struct ChannelState {
    id: u32,
    name: Arc<str>,
    next_seq: u64,
}

#[derive(Debug, Default)]
struct State {
    channels: HashMap<Arc<str>, ChannelState>,
    subs: HashMap<Arc<str>, Arc<Vec<Subscriber>>>,
    window: Window,
    /// Counts sessions: a resume's reads are valid only within the epoch they started in.
    epoch: u64,
}

/// What a resuming bridge can have of one channel's history now.
#[derive(Debug, Default)]
pub struct History {
    /// Kept events from the seq asked for on (empty if that seq is no longer kept).
    pub events: Vec<Arc<EventFrame>>,
    /// The oldest seq the window keeps on the channel (`None`: nothing kept).
    pub first_kept: Option<u64>,
    /// The channel's next seq (0 if it has had no event in this session).
    pub next_seq: u64,
    /// The channel's session-scoped id, if it has had an event.
    pub id: Option<u32>,
}

/// The outcome of [`Hub::join`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Subscribed; the tail (this many events) was queued before any live event.
    Joined(usize),
    /// More history than the tail allows (or not in the window): read more first.
    Behind,
    /// The session changed since the resume began.
    Stale,
}

/// One published event, its frame written to the burst's [`Runs`].
#[derive(Debug)]
pub struct Published {
    /// The relay seq it got.
    pub seq: u64,
    /// The channel's session-scoped id.
    pub channel_id: u32,
    /// Whether this is the channel's first event in the session.
    pub new_channel: bool,
    /// How many bridges get it.
    pub subscribers: usize,
}

/// Bytes a wire frame may add to its body: the header (`Content-Length` with up to 20 digits,
/// `Content-Type`) and a seq of up to 20 digits where the body had a shorter one or none.
const WIRE_SLACK: usize = 128;

/// Routing state of one route.
#[derive(Debug, Default)]
pub struct Hub {
    state: Mutex<State>,
}

impl Hub {
    /// An empty hub without a resume window.
    pub fn new() -> Hub {
        Hub::default()
    }

    /// An empty hub keeping the route's last `frames` events (at most `bytes`) for resumes.
    pub fn with_window(frames: usize, bytes: usize) -> Hub {
        let hub = Hub::default();
        hub.state.lock().window = Window::new(frames, bytes);
        hub
    }

    /// Forgets channel ids, seqs and the window: a new session starts numbering from 0.
    pub fn new_session(&self) {
        let mut st = self.state.lock();
        st.channels.clear();
        st.window.clear();
        st.epoch += 1;
    }

    /// Assigns the next relay seq on `channel` and writes the frame with it into `runs`, in
    /// the run of the channel's subscribers.
    pub fn publish(
        &self,
        channel: &str,
        body: &[u8],
        seq_span: Option<Range<usize>>,
        runs: &mut Runs,
    ) -> Published {
        {
            let mut st = self.state.lock();
            let st = &mut *st;
            let next_id = st.channels.len() as u32;
            let mut new_channel = false;
            let ch = match st.channels.get_mut(channel) {
                Some(ch) => ch,
                None => {
                    new_channel = true;
                    let name: Arc<str> = Arc::from(channel);
                    st.channels.entry(name.clone()).or_insert(ChannelState {
                        id: next_id,
                        name,
                        next_seq: 0,
                    })
                }
            };
            let seq = ch.next_seq;
            ch.next_seq += 1;
            let id = ch.id;
            let subs = st.subs.get(channel);
            // Written under the lock (one copy) so the window never lags the seq: a resume
            // joining the live stream sees every event below the next seq kept. A frame is at
            // most the body, a longer seq and a header (`WIRE_SLACK`).
            let out = runs.buffer_for(subs, body.len() + WIRE_SLACK);
            let at = out.len();
            gabp_proto::rewrite::put_wire_with_seq(body, seq_span, seq, out);
            st.window.push(id, &ch.name, seq, &out[at..]);
            runs.written(&ch.name, seq);
            Published {
                seq,
                channel_id: id,
                new_channel,
                subscribers: subs.map_or(0, |s| s.len()),
            }
        }
    }

    /// (events, bytes) the resume window holds now.
    pub fn window_size(&self) -> (usize, usize) {
        self.state.lock().window.size()
    }

    /// The current session's epoch (it changes with [`Hub::new_session`]).
    pub fn epoch(&self) -> u64 {
        self.state.lock().epoch
    }

    /// (epoch, the channel's next seq): 0 for a channel with no event yet.
    pub fn next_seq(&self, channel: &str) -> (u64, u64) {
        let st = self.state.lock();
        (st.epoch, st.channels.get(channel).map_or(0, |c| c.next_seq))
    }

    /// Kept history of `channel` from seq `from` (at most `max_frames` events and about
    /// `max_bytes`), or `None` if the session changed since `epoch`.
    pub fn history(
        &self,
        epoch: u64,
        channel: &str,
        from: u64,
        max_frames: usize,
        max_bytes: usize,
    ) -> Option<History> {
        let st = self.state.lock();
        if st.epoch != epoch {
            return None;
        }
        let Some(ch) = st.channels.get(channel) else {
            return Some(History::default());
        };
        Some(History {
            events: st.window.slice(ch.id, from, max_frames, max_bytes),
            first_kept: st.window.first_seq(ch.id),
            next_seq: ch.next_seq,
            id: Some(ch.id),
        })
    }

    /// Joins a resuming bridge to the live stream: if, for every `(channel, next seq to send)`,
    /// what the channel published from that seq on is in the window and fits in `room`
    /// (frames, bytes), those events are offered to `outbox` and the bridge is subscribed, all
    /// under the lock, so the next published event follows them with no gap and no duplicate.
    pub fn join(
        &self,
        epoch: u64,
        conn: u32,
        outbox: &Arc<Outbox>,
        wants: &[(String, u64)],
        room: (usize, usize),
    ) -> Join {
        let mut st = self.state.lock();
        if st.epoch != epoch {
            return Join::Stale;
        }
        let (mut frames, mut bytes) = (0usize, 0usize);
        let mut tails = Vec::new();
        for (c, next) in wants {
            let Some(ch) = st.channels.get(c.as_str()) else {
                continue;
            };
            if *next >= ch.next_seq {
                continue;
            }
            let need = (ch.next_seq - next) as usize;
            if frames + need > room.0 {
                return Join::Behind;
            }
            // Copied out of the window: no further than the room left.
            let tail = st
                .window
                .slice(ch.id, *next, need, room.1.saturating_sub(bytes));
            bytes += tail.iter().map(|e| e.wire.len()).sum::<usize>();
            if tail.len() != need || bytes > room.1 {
                return Join::Behind;
            }
            frames += need;
            tails.push(tail);
        }
        let mut queued = 0;
        for ev in tails.iter().flatten() {
            // Room was checked by the caller; a bridge that filled it meanwhile gets its policy.
            if matches!(outbox.offer(ev), Offer::Closed | Offer::Disconnected) {
                break;
            }
            queued += 1;
        }
        for (c, _) in wants {
            add_subscriber(&mut st.subs, conn, outbox, c);
        }
        Join::Joined(queued)
    }

    /// Adds a subscriber to channels; returns the channels that had no subscriber before.
    pub fn subscribe(&self, conn: u32, outbox: &Arc<Outbox>, channels: &[String]) -> Vec<String> {
        let mut st = self.state.lock();
        let mut first = Vec::new();
        for c in channels {
            if add_subscriber(&mut st.subs, conn, outbox, c) {
                first.push(c.clone());
            }
        }
        first
    }

    /// Removes a subscriber from channels; returns the channels left with no subscriber.
    pub fn unsubscribe(&self, conn: u32, channels: &[String]) -> Vec<String> {
        let mut st = self.state.lock();
        let mut emptied = Vec::new();
        for c in channels {
            let Some(list) = st.subs.get_mut(c.as_str()) else {
                continue;
            };
            if !list.iter().any(|(id, _)| *id == conn) {
                continue;
            }
            let next: Vec<Subscriber> =
                list.iter().filter(|(id, _)| *id != conn).cloned().collect();
            if next.is_empty() {
                st.subs.remove(c.as_str());
                emptied.push(c.clone());
            } else {
                *list = Arc::new(next);
            }
        }
        emptied
    }

    /// Whether `channel` has had an event in this session.
    pub fn knows(&self, channel: &str) -> bool {
        self.state.lock().channels.contains_key(channel)
    }

    /// Every channel some bridge subscribes to.
    pub fn wanted(&self) -> Vec<String> {
        self.state
            .lock()
            .subs
            .keys()
            .map(|k| k.to_string())
            .collect()
    }

    /// (channel, events so far) of the current session.
    pub fn channel_counts(&self) -> Vec<(String, u64)> {
        let st = self.state.lock();
        let mut v: Vec<(String, u64)> = st
            .channels
            .values()
            .map(|c| (c.name.to_string(), c.next_seq))
            .collect();
        v.sort();
        v
    }
}

/// Adds `conn` to `channel`'s subscribers (copy-on-write); returns whether it is the first.
fn add_subscriber(
    subs: &mut HashMap<Arc<str>, Arc<Vec<Subscriber>>>,
    conn: u32,
    outbox: &Arc<Outbox>,
    channel: &str,
) -> bool {
    let list = subs.entry(Arc::from(channel)).or_default();
    if list.iter().any(|(id, _)| *id == conn) {
        return false;
    }
    let first = list.is_empty();
    let mut next: Vec<Subscriber> = list.as_ref().clone();
    next.push((conn, outbox.clone()));
    *list = Arc::new(next);
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OnSlow;
    use gabp_proto::{Mode, Parser};

    #[test]
    fn seq_is_contiguous_per_channel_and_restarts_with_the_session() {
        let hub = Hub::new();
        let body = br#"{"v":"gabp/1","id":"x","type":"event","channel":"a","seq":41,"payload":{}}"#;
        let at = body
            .windows(6)
            .position(|w| w == b"\"seq\":")
            .expect("seq key")
            + 6;
        let span = Some(at..at + 2);
        assert_eq!(&body[at..at + 2], b"41");
        let mut runs = Runs::default();
        let seqs: Vec<u64> = (0..3)
            .map(|_| hub.publish("a", body, span.clone(), &mut runs).seq)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2]);
        assert_eq!(hub.publish("b", body, span.clone(), &mut runs).seq, 0);
        hub.new_session();
        let o = Arc::new(Outbox::new(OnSlow::DropOldest, 10, 1000));
        hub.subscribe(1, &o, &["a".into()]);
        let p = hub.publish("a", body, span.clone(), &mut runs);
        assert_eq!((p.seq, p.new_channel), (0, true));
        // The seq is written into the shared frame itself.
        let taken = runs.take();
        assert_eq!(taken.len(), 1, "no run for events nobody subscribes to");
        let wire = &taken[0].1.wire;
        let start = wire.iter().position(|&b| b == b'{').expect("body");
        let view = Parser::new()
            .parse(&wire[start..], Mode::Tolerant)
            .expect("valid");
        assert_eq!(view.seq, Some(0));
    }

    #[test]
    fn subscriptions_report_first_and_last_subscribers() {
        let hub = Hub::new();
        let o = Arc::new(Outbox::new(OnSlow::DropOldest, 10, 1000));
        assert_eq!(
            hub.subscribe(1, &o, &["a".into(), "b".into()]),
            vec!["a", "b"]
        );
        assert!(hub.subscribe(2, &o, &["a".into()]).is_empty());
        assert!(hub.subscribe(2, &o, &["a".into()]).is_empty(), "idempotent");
        let mut runs = Runs::default();
        assert_eq!(hub.publish("a", b"{}", None, &mut runs).subscribers, 2);
        assert!(hub.unsubscribe(1, &["a".into()]).is_empty());
        assert_eq!(hub.unsubscribe(2, &["a".into()]), vec!["a"]);
        assert_eq!(hub.publish("a", b"{}", None, &mut runs).subscribers, 0);
    }
}
