//! One bridge's timeline of a recorded session: a blocking reader streams the session's events
//! from the store into a small bounded queue, and an async pacer delivers them into the
//! bridge's outbox on the recorded timeline (scaled by the speed, or as fast as the bridge
//! takes them).
//!
//! Memory per bridge is a few batches of events, whatever the session's length. Nothing is
//! dropped: when the outbox is full the pacer waits (and the reader behind it), so a slow bridge
//! slows only its own timeline. Each bridge numbers its own events per channel from 0. The end
//! of the recording, and each `--loop` restart, is announced on the `relay/replay` channel, in
//! order with the events.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gabp_proto::{frame_bytes, message, Mode, Parser};
use gabp_storage::Direction;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

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
    /// Offset on the replayed timeline (after `--from`).
    offset_ns: u64,
    channel: u32,
    body: Bytes,
}

enum Msg {
    Events(Vec<Played>),
    /// The pass reached the end of the session.
    End {
        last_offset_ns: u64,
    },
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

/// Reads one pass over the session (blocking): every event `plan` plays, in order.
fn read_pass(plan: &ReplayPlan, tx: mpsc::Sender<Msg>) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_offset_ns = 0;
    for (n, item) in plan
        .store
        .frames_from(plan.meta.id, plan.start_frame)
        .enumerate()
    {
        let rec = match item {
            Ok((_, rec)) => rec,
            Err(e) => {
                let _ = tx.blocking_send(Msg::Failed(e.to_string()));
                return;
            }
        };
        if n % 4096 == 0 && tx.is_closed() {
            return;
        }
        let (Some(channel), Some(_)) = (rec.channel, rec.relay_seq) else {
            continue;
        };
        let offset = rec.time_ns.saturating_sub(plan.meta.started_ns);
        if rec.dir != Direction::ModToRelay || offset < plan.from_ns || !plan.plays(channel) {
            continue;
        }
        last_offset_ns = offset - plan.from_ns;
        // A copy, so the chunk the body was sliced from is freed at once.
        batch.push(Played {
            offset_ns: last_offset_ns,
            channel,
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
    let _ = tx.blocking_send(Msg::End { last_offset_ns });
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
    notices: u64,
    logged: Instant,
}

/// Plays the recording to `bridge` from now on, until it ends (or, looping, forever), the bridge
/// goes away, or the replay stops.
pub async fn play(
    route: Arc<Route>,
    bridge: Arc<BridgeState>,
    plan: Arc<ReplayPlan>,
    shared: Arc<Shared>,
) {
    let mut p = Pacer {
        route: &route,
        bridge: &bridge,
        plan: plan.clone(),
        shared: &shared,
        parser: Parser::new(),
        seqs: vec![0; plan.names.len()],
        notices: 0,
        logged: Instant::now(),
    };
    tracing::info!(route = %route.cfg.name, conn = bridge.conn, session = %plan.meta.id, "replay started for a bridge");
    let mut pass = 0u64;
    loop {
        let before = shared.delivered.load(Ordering::Relaxed);
        let Some(ended) = p.pass().await else { return };
        pass += 1;
        let delivered = shared.delivered.load(Ordering::Relaxed);
        if plan.looping && plan.events > 0 {
            if delivered == before && plan.speed == Speed::Max {
                // Nothing of this pass was for the bridge: wait for a subscription rather than
                // spin over the recording.
                tokio::select! {
                    _ = route.cancel.cancelled() => return,
                    _ = shared.resubscribed.notified() => {}
                }
            }
            tracing::info!(route = %route.cfg.name, conn = bridge.conn, pass, events = delivered, "replay restarts from the beginning (--loop)");
            p.notice(json!({"state": "restarted", "sessionId": plan.meta.id.to_string(), "loop": pass, "events": delivered}));
            continue;
        }
        tracing::info!(route = %route.cfg.name, conn = bridge.conn, events = delivered, at_secs = ended / 1_000_000_000, "replay reached the end of the recording");
        p.notice(
            json!({"state": "ended", "sessionId": plan.meta.id.to_string(), "events": delivered}),
        );
        return;
    }
}

impl Pacer<'_> {
    /// One pass over the recording; `None` if the timeline must stop (bridge gone, replay
    /// stopping, read error), else where the pass ended on the timeline.
    async fn pass(&mut self) -> Option<u64> {
        let start = Instant::now();
        let (tx, mut rx) = mpsc::channel(READ_AHEAD);
        let plan = self.plan.clone();
        let reader = tokio::task::spawn_blocking(move || read_pass(&plan, tx));
        let mut end = None;
        while let Some(msg) = rx.recv().await {
            match msg {
                Msg::Events(batch) => {
                    for ev in batch {
                        if let Speed::Factor(f) = self.plan.speed {
                            let due =
                                start + Duration::from_nanos((ev.offset_ns as f64 / f) as u64);
                            if !self.wait_until(due).await {
                                return None;
                            }
                        }
                        if !self.deliver(ev).await {
                            return None;
                        }
                    }
                    write_from_reader(self.route, &self.bridge.outbox);
                    self.progress();
                }
                Msg::End { last_offset_ns } => end = Some(last_offset_ns),
                Msg::Failed(why) => {
                    tracing::error!(route = %self.route.cfg.name, conn = self.bridge.conn, "replay cannot read the recording: {why}");
                    self.notice(
                        json!({"state": "failed", "sessionId": self.plan.meta.id.to_string()}),
                    );
                    return None;
                }
            }
        }
        let _ = reader.await;
        let end = end?;
        // A pass lasts as long as the recording did (scaled), even if its last events were
        // not for this bridge.
        if let Speed::Factor(f) = self.plan.speed {
            let due = start + Duration::from_nanos((end as f64 / f) as u64);
            if !self.wait_until(due).await {
                return None;
            }
        }
        Some(end + self.plan.from_ns)
    }

    /// Waits until `due`, having first written what is queued; false if the replay stops.
    async fn wait_until(&self, due: Instant) -> bool {
        if due <= Instant::now() {
            return true;
        }
        write_from_reader(self.route, &self.bridge.outbox);
        tokio::select! {
            _ = self.route.cancel.cancelled() => false,
            _ = self.bridge.outbox.cut_signal().cancelled() => false,
            _ = tokio::time::sleep_until(due) => true,
        }
    }

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
        let seq = self.seqs[cid];
        self.seqs[cid] += 1;
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
