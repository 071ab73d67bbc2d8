//! One bridge's timeline of a recorded session: a blocking reader streams the session's events
//! from the store into a small bounded queue, and an async pacer delivers them into the
//! bridge's outbox on the recorded timeline (scaled by the speed, or as fast as the bridge
//! takes them).
//!
//! Memory per bridge is a few batches of events, whatever the session's length. Nothing is
//! dropped: when the outbox is full the pacer waits (and the reader behind it), so a slow bridge
//! slows only its own timeline. What it plays, when and at what pace is the playhead's
//! ([`super::playback`]): free, each timeline on its own; controlled, every timeline follows the
//! one log of changes. Each bridge numbers its own events per channel from 0, until a seek (or,
//! in a controlled replay, from the start): then each event carries its seq as recorded, so a
//! jump shows in the seqs right after the notice announcing it. The end of the range, each
//! `--loop` restart and each playback change are announced on the `relay/replay` channel, in
//! order with the events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gabp_proto::{frame_bytes, message, Mode, Parser};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::playback::{Judged, Pass, Playback, Verdict};
use super::recorded::ReplayPlan;
use super::Speed;
use crate::direct::write_from_reader;
use crate::outbox::{EventFrame, Offer, Outbox};
use crate::route::{BridgeState, Route};

/// Events per batch handed from the reader to the pacer.
const BATCH: usize = 256;
/// Batches the reader may be ahead of the pacer.
const READ_AHEAD: usize = 4;
/// How often a bridge's progress is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// The channel of the replay's own notices.
pub const NOTICE_CHANNEL: &str = "relay/replay";

/// A recorded event on its way to the pacer.
struct Played {
    /// Its frame number in the session.
    frame: u64,
    /// Its offset from the session's start.
    offset_ns: u64,
    channel: u32,
    /// Its seq as recorded.
    relay_seq: u64,
    body: Bytes,
}

enum Msg {
    Events(Vec<Played>),
    /// The pass reached the end of the replayed range.
    End,
    Failed(String),
}

/// What one bridge's timeline shares with the front.
#[derive(Debug)]
pub struct Shared {
    /// Channels the bridge subscribes to, by the recording's channel id.
    pub subs: Vec<AtomicBool>,
    /// Signalled on every subscribe (a loop with nothing to deliver waits for one).
    pub resubscribed: Notify,
    /// Events delivered so far.
    pub delivered: AtomicU64,
}

/// Reads one pass over the replayed range (blocking): every event `pass` plays, in order.
fn read_pass(plan: &ReplayPlan, pass: Pass, tx: mpsc::Sender<Msg>) {
    let mut batch = Vec::with_capacity(BATCH);
    for (n, item) in plan
        .store
        .frames_from(plan.meta.id, pass.read_from)
        .enumerate()
    {
        let (no, rec) = match item {
            Ok(numbered) => numbered,
            Err(e) => {
                let _ = tx.blocking_send(Msg::Failed(e.to_string()));
                return;
            }
        };
        if n % 4096 == 0 && tx.is_closed() {
            return;
        }
        match plan.judge(&pass, no, &rec) {
            Judged::Skip => continue,
            Judged::End => break,
            Judged::Play => {}
        }
        // A copy, so the chunk the body was sliced from is freed at once.
        batch.push(Played {
            frame: no,
            offset_ns: plan.offset(rec.time_ns),
            channel: rec.channel.unwrap_or_default(),
            relay_seq: rec.relay_seq.unwrap_or_default(),
            body: Bytes::copy_from_slice(&rec.body),
        });
        if batch.len() >= BATCH
            && tx
                .blocking_send(Msg::Events(std::mem::replace(
                    &mut batch,
                    Vec::with_capacity(BATCH),
                )))
                .is_err()
        {
            return;
        }
    }
    if !batch.is_empty() && tx.blocking_send(Msg::Events(batch)).is_err() {
        return;
    }
    let _ = tx.blocking_send(Msg::End);
}

/// The pacer's state for one bridge.
struct Pacer<'a> {
    route: &'a Route,
    bridge: &'a BridgeState,
    plan: Arc<ReplayPlan>,
    shared: &'a Shared,
    parser: Parser,
    /// Next seq per channel id, for this bridge.
    seqs: Vec<u64>,
    /// Seqs as recorded (after a seek, or in a controlled replay) instead of counted.
    recorded_seqs: bool,
    notices: u64,
    logged: Instant,
}

/// Leaves the playhead when the timeline ends (its task returns or is aborted).
struct Seat<'a>(&'a Playback, u32);

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.0.leave(self.1);
    }
}

/// Plays the recording to `bridge` from now on, following `playback`, until the bridge goes
/// away or the replay stops.
pub async fn play(
    route: Arc<Route>,
    bridge: Arc<BridgeState>,
    plan: Arc<ReplayPlan>,
    playback: Arc<Playback>,
    shared: Arc<Shared>,
) {
    let mut follow = playback.join(bridge.conn);
    let _seat = Seat(&playback, bridge.conn);
    let mut changes = playback.watch();
    let mut p = Pacer {
        route: &route,
        bridge: &bridge,
        plan: plan.clone(),
        shared: &shared,
        parser: Parser::new(),
        seqs: vec![0; plan.names.len()],
        recorded_seqs: !follow.is_free(),
        notices: 0,
        logged: Instant::now(),
    };
    tracing::info!(route = %route.cfg.name, conn = bridge.conn, session = %plan.meta.id, "replay started for a bridge");
    let cut = bridge.outbox.cut_signal();
    loop {
        // One pass over the range (none while the replay stands at its end).
        let (tx, mut rx) = mpsc::channel(READ_AHEAD);
        let mut over = follow.mode.ended;
        if !over {
            let (plan, pass) = (plan.clone(), follow.pass);
            tokio::task::spawn_blocking(move || read_pass(&plan, pass, tx));
        }
        let mut queue: VecDeque<Played> = VecDeque::new();
        let before = shared.delivered.load(Ordering::Relaxed);
        loop {
            if queue.is_empty() && !over {
                match rx.recv().await {
                    Some(Msg::Events(batch)) => queue.extend(batch),
                    Some(Msg::End) | None => over = true,
                    Some(Msg::Failed(why)) => {
                        tracing::error!(route = %route.cfg.name, conn = bridge.conn, "replay cannot read the recording: {why}");
                        p.notice(json!({"state": "failed", "sessionId": plan.meta.id.to_string()}));
                        return;
                    }
                }
                continue;
            }
            changes.borrow_and_update();
            let idle = over
                && follow.mode.speed == Speed::Max
                && shared.delivered.load(Ordering::Relaxed) == before;
            let verdict = playback.decide(
                &mut follow,
                queue.iter().map(|e| (e.frame, e.offset_ns)),
                idle,
            );
            match verdict {
                Verdict::Play(n) => {
                    for ev in queue.drain(..n) {
                        if !p.deliver(ev).await {
                            return;
                        }
                    }
                    write_from_reader(&route, &bridge.outbox);
                    p.progress();
                }
                Verdict::Wait(due) => {
                    write_from_reader(&route, &bridge.outbox);
                    tokio::select! {
                        _ = route.cancel.cancelled() => return,
                        _ = cut.cancelled() => return,
                        _ = tokio::time::sleep_until(due) => {}
                        c = changes.changed() => if c.is_err() { return },
                    }
                }
                Verdict::Hold => {
                    write_from_reader(&route, &bridge.outbox);
                    tokio::select! {
                        _ = route.cancel.cancelled() => return,
                        _ = cut.cancelled() => return,
                        c = changes.changed() => if c.is_err() { return },
                    }
                }
                Verdict::Idle => {
                    // Nothing of this pass was for the bridge: wait for a subscription rather
                    // than spin over the recording.
                    tokio::select! {
                        _ = route.cancel.cancelled() => return,
                        _ = cut.cancelled() => return,
                        _ = shared.resubscribed.notified() => {}
                        c = changes.changed() => if c.is_err() { return },
                    }
                }
                Verdict::Notice(v) => p.announce(v),
                Verdict::Jump { notice, rebase } => {
                    p.announce(notice);
                    p.recorded_seqs |= rebase;
                    // Dropping the receiver stops the reader.
                    break;
                }
            }
        }
    }
}

impl Pacer<'_> {
    /// Sequences one event for this bridge and queues it, waiting while the outbox is full;
    /// false once the bridge is gone.
    async fn deliver(&mut self, ev: Played) -> bool {
        let cid = ev.channel as usize;
        if !self
            .shared
            .subs
            .get(cid)
            .is_some_and(|s| s.load(Ordering::Relaxed))
        {
            return true;
        }
        let span = self
            .parser
            .parse(&ev.body, Mode::Tolerant)
            .ok()
            .and_then(|v| v.seq_span.clone());
        let seq = if self.recorded_seqs {
            ev.relay_seq
        } else {
            self.seqs[cid]
        };
        self.seqs[cid] = seq + 1;
        let frame = Arc::new(EventFrame {
            channel: self.plan.names[cid].clone(),
            seq,
            wire: gabp_proto::rewrite::wire_with_seq(&ev.body, span, seq),
            keep: false,
        });
        if !offer(self.route, &self.bridge.outbox, &frame).await {
            return false;
        }
        self.shared.delivered.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn progress(&mut self) {
        if self.logged.elapsed() >= PROGRESS_EVERY {
            self.logged = Instant::now();
            tracing::info!(route = %self.route.cfg.name, conn = self.bridge.conn, events = self.shared.delivered.load(Ordering::Relaxed), "replay progress");
        }
    }

    /// Announces a playback change; the end and a `--loop` restart say how many events this
    /// bridge got.
    fn announce(&mut self, mut payload: Value) {
        let delivered = self.shared.delivered.load(Ordering::Relaxed);
        let (route, conn) = (&self.route.cfg.name, self.bridge.conn);
        match payload["state"].as_str() {
            Some("ended") => {
                tracing::info!(route = %route, conn, events = delivered, "replay reached the end of the recording");
                payload["events"] = json!(delivered);
            }
            Some("restarted") => {
                tracing::info!(route = %route, conn, pass = payload["loop"].as_u64(), events = delivered, "replay restarts from the beginning (--loop)");
                payload["events"] = json!(delivered);
            }
            _ => {}
        }
        self.notice(payload);
    }

    /// Queues a `relay/replay` notice, in order with the events, and writes it out.
    fn notice(&mut self, payload: Value) {
        let body = message::event(NOTICE_CHANNEL, self.notices, payload);
        self.bridge.outbox.push_notice(Arc::new(EventFrame {
            channel: Arc::from(NOTICE_CHANNEL),
            seq: self.notices,
            wire: frame_bytes(&body),
            keep: true,
        }));
        self.notices += 1;
        write_from_reader(self.route, &self.bridge.outbox);
    }
}

/// Offers an event, waiting for room while the outbox is full (a replay is lossless: the
/// timeline waits, not the bridge's events); false once the outbox is closed or cut.
async fn offer(route: &Route, outbox: &Outbox, ev: &Arc<EventFrame>) -> bool {
    loop {
        match outbox.offer(ev) {
            Offer::Queued => return true,
            Offer::QueuedAfterDrop(n) => {
                route.metrics.dropped.increment(n);
                return true;
            }
            Offer::Full => {
                write_from_reader(route, outbox);
                tokio::select! {
                    _ = outbox.space() => {}
                    _ = route.cancel.cancelled() => return false,
                }
            }
            Offer::Disconnected => {
                route.metrics.dropped.increment(1);
                return false;
            }
            Offer::Closed => return false,
        }
    }
}
