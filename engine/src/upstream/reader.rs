//! Reading the mod during a session: every frame is parsed (tolerantly), events are sequenced
//! and fanned out through the hub, responses go back to the bridge that asked, and every frame
//! goes to the recorder.
//!
//! The reader is the only publisher of events, so per channel order is the mod's order. It
//! never waits for a bridge (unless a bridge's policy is `block`); it does wait for the
//! recorder, which is what makes recording lossless. Outbox wake-ups are batched: touched
//! writers are woken once the socket has nothing more buffered, or every 256 to 1,024 frames at
//! full rate (by the outbox bound), and reads are large (256 KiB), so a burst is one `writev`
//! per bridge. Recorder messages go out in batches of up to 1,024, or after lingering at most
//! 5 ms, so a slow trickle of frames does not become many tiny batches, but never after a
//! bridge could see what they record: whatever a bridge sends once it has a frame (a mark, a
//! request) must be recorded after that frame, or episode exports cut by marks lose their
//! answers. When the recorder has no room (a slow or failing disk), bridges still get what was
//! read first, and the reader then waits at the recorder's queue, ahead of anything the bridges
//! send back.
//!
//! The mod is trusted for content, not for cost: what no bridge could decode (non-finite
//! numbers, lone surrogates), what would exceed `--max-body` once sequenced, and events on
//! channels past [`MAX_CHANNELS`] are anomalies, counted and recorded, never forwarded. A frame
//! over `--max-body` as sent is passed over unread (counted, its bytes never held). Either way,
//! a request such a frame answered gets an error at once, not at `--request-timeout`.
//! Trusted content may still repeat a bridge's words, tokens included (an echoed argument, a
//! channel a bridge named after one): answers are recorded redacted, unroutable frames with
//! the plain spelling of a secret replaced, and events only when their channel's name holds a
//! secret (looked at once per channel, so the event path pays no search).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use gabp_proto::codec::Read;
use gabp_proto::{encode_header, ErrorCode, Mode, MsgType, Parser};
use gabp_rt::clock::now_ns;
use gabp_storage::{Direction, EndReason, FrameRecord};
use uuid::Uuid;

use super::{Frames, Repeats, MAX_CHANNELS};
use crate::outbox::{EventRun, Offer, Outbox, Runs};
use crate::pending::Origin;
use crate::recorder::RecMsg;
use crate::route::{Route, SessionInfo};

/// Recorder messages batched before a send even if the socket still has data.
const RECORD_BATCH: usize = 1024;
/// How long recorder messages may wait in the reader before they are sent: at low rates this
/// turns many tiny batches into few larger ones, and the recorder thread (which commits every
/// 10 ms) is woken a few times per commit rather than hundreds: on a small machine every wake-up
/// of another thread can delay the readers and writers that carry events.
const RECORD_LINGER: Duration = Duration::from_millis(5);
/// Frames processed before writers are woken even if the socket still has data: at full rate the
/// socket never runs dry, and writers must drain outboxes long before they fill. A sixteenth of
/// the outbox bound (1,024 at the default), never fewer than 256: fewer, larger writes per
/// event, on both ends of every bridge's socket.
fn wake_every(outbox_frames: usize) -> usize {
    (outbox_frames / 16).clamp(256, 1024)
}
/// The mod's read buffer gets [`READ_ROOM`] more room whenever less than [`READ_ROOM_MIN`] is
/// left: once frames have been split off it, the buffer only grows by 64 KiB at a time (`bytes`
/// caps what it remembers of its first capacity), and reads would then end after about 200
/// events of 256 B: each read burst becomes a `writev` to every bridge.
const READ_ROOM: usize = 256 * 1024;
const READ_ROOM_MIN: usize = 64 * 1024;

/// What [`Reader::take_records`] sends: `records` whole when at least a quarter full (a new
/// room of [`RECORD_BATCH`] is left), else a copy of just its messages (the room stays).
fn take_batch(records: &mut Vec<RecMsg>) -> Vec<RecMsg> {
    if records.len() >= records.capacity() / 4 {
        std::mem::replace(records, Vec::with_capacity(RECORD_BATCH))
    } else {
        let mut snug = Vec::with_capacity(records.len());
        snug.append(records);
        snug
    }
}

/// Gives the read buffer room for a large read when it is nearly drained (so moving what it
/// holds, part of one frame, costs little).
fn make_read_room(frames: &mut Frames) {
    let buf = frames.read_buffer_mut();
    if buf.capacity() - buf.len() < READ_ROOM_MIN && buf.len() < 4096 {
        buf.reserve(READ_ROOM);
    }
}

/// Per-session reader state.
struct Reader<'a> {
    route: &'a Arc<Route>,
    session: &'a SessionInfo,
    parser: Parser,
    records: Vec<RecMsg>,
    /// This burst's published events, not yet offered, in shared runs (see [`Runs`]).
    runs: Runs,
    touched: Vec<Arc<Outbox>>,
    channel_counters: Vec<metrics::Counter>,
    /// Per channel id, whether its name holds a secret (a bridge subscribed to a channel named
    /// after a token, and the mod publishes on it): its events are then recorded redacted.
    /// Looked at once per channel, so other events cost no search.
    channel_secret: Vec<bool>,
    last_record_send: std::time::Instant,
    clock: BurstClock,
    /// Channels this session has used (the hub's table holds as many).
    channels: usize,
    /// Events published in this session: no channel's relay seq is larger.
    events: u64,
    /// Frames over `--max-body` skipped: said once a minute at most, however many.
    oversized: Repeats,
}

/// Arrival time for a burst of events: read once per [`BurstClock::EVERY`] events and after
/// every wait for the socket, so a burst read in one go shares one reading (reading the clock
/// per event was ~1.3% of the relay's CPU at full rate) and times never go backwards.
struct BurstClock {
    ns: u64,
    uses: u32,
}

impl BurstClock {
    const EVERY: u32 = 32;

    fn now(&mut self) -> u64 {
        if self.uses == 0 {
            self.ns = self.ns.max(now_ns());
        }
        self.uses = (self.uses + 1) % Self::EVERY;
        self.ns
    }

    /// The next reading is fresh (the reader waited).
    fn expire(&mut self) {
        self.uses = 0;
    }
}

pub(super) async fn read_loop(
    route: &Arc<Route>,
    session: &SessionInfo,
    frames: &mut Frames,
) -> EndReason {
    let mut r = Reader {
        route,
        session,
        parser: Parser::new(),
        records: Vec::with_capacity(RECORD_BATCH),
        runs: Runs::default(),
        touched: Vec::new(),
        channel_counters: Vec::new(),
        channel_secret: Vec::new(),
        last_record_send: std::time::Instant::now(),
        clock: BurstClock { ns: 0, uses: 0 },
        channels: 0,
        events: 0,
        oversized: Repeats::default(),
    };
    let mut since_flush = 0usize;
    // A frame begun must end within --frame-timeout, as a bridge's must: a mod stuck mid-frame
    // (a wrong Content-Length, a hung writer) would otherwise hold every answer and event
    // behind it, with the route looking healthy.
    let frame_timeout = route.cfg.frame_timeout;
    let mut stall_check = tokio::time::interval((frame_timeout / 4).max(Duration::from_millis(10)));
    stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut partial_since: Option<std::time::Instant> = None;
    let wake_every = wake_every(route.cfg.outbox_frames);
    loop {
        make_read_room(frames);
        let next = match frames.next().now_or_never() {
            Some(n) => n,
            None => {
                r.flush(false).await;
                // Wait for the socket; lingering recorder messages go out after RECORD_LINGER.
                loop {
                    tokio::select! {
                        biased;
                        _ = route.cancel.cancelled() => {
                            r.flush(true).await;
                            return EndReason::RelayShutdown;
                        }
                        n = frames.next() => {
                            r.clock.expire();
                            break n;
                        }
                        _ = tokio::time::sleep(RECORD_LINGER), if !r.records.is_empty() => r.flush(true).await,
                        _ = stall_check.tick() => {
                            if frames.read_buffer().is_empty() && !frames.decoder().is_mid_frame() {
                                partial_since = None;
                            } else if partial_since.get_or_insert_with(std::time::Instant::now).elapsed() > frame_timeout {
                                r.flush(true).await;
                                tracing::warn!(route = %route.cfg.name, "the mod did not complete a frame within --frame-timeout {frame_timeout:?}; reconnecting");
                                return EndReason::ModGone;
                            }
                        }
                    }
                }
            }
        };
        partial_since = None;
        match next {
            Some(Ok(read)) => {
                match read {
                    Read::Frame(frame) => r.on_frame(frame.body).await,
                    Read::Skipped { len, answers } => r.on_oversized(len, answers).await,
                }
                since_flush += 1;
                if since_flush >= wake_every || r.records.len() >= RECORD_BATCH {
                    r.flush(false).await;
                    since_flush = 0;
                    // A mod that never pauses never reaches the select below: shutdown is
                    // checked here too.
                    if route.cancel.is_cancelled() {
                        r.flush(true).await;
                        return EndReason::RelayShutdown;
                    }
                }
            }
            Some(Err(e)) => {
                r.flush(true).await;
                tracing::warn!(route = %route.cfg.name, error = %e, "mod connection broken");
                return EndReason::ModGone;
            }
            None => {
                r.flush(true).await;
                return EndReason::Clean;
            }
        }
    }
}

impl Reader<'_> {
    /// Wakes touched writers; sends recorder messages when `force`d, when the batch is full, or
    /// once they have lingered long enough (and always before events reach a bridge).
    async fn flush(&mut self, force: bool) {
        let delivering = !self.runs.is_empty();
        self.fan_out().await;
        for o in self.touched.drain(..) {
            crate::direct::write_from_reader(self.route, &o);
        }
        // Records the recorder had no room for wait now, once the bridges have their events,
        // so this reader is in the recorder's queue before anything they send back.
        let due = force
            || delivering
            || self.records.len() >= RECORD_BATCH
            || self.last_record_send.elapsed() >= RECORD_LINGER;
        if due {
            self.send_records().await;
        }
    }

    /// Hands the frames read so far to the recorder if it takes them now; they stay here
    /// otherwise. Called before anything read reaches a bridge: the recorder's queue is first
    /// in, first out, so a bridge's reply to a frame (recorded by its own reader) is then
    /// recorded after that frame.
    fn offer_records(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let Some(rec) = &self.route.recorder else {
            return self.records.clear();
        };
        match rec.try_send_batch(self.take_records()) {
            Ok(()) => self.last_record_send = std::time::Instant::now(),
            // Back in the order read, before anything read after them.
            Err(back) if back.capacity() >= self.records.capacity() => self.records = back,
            Err(back) => self.records.extend(back),
        }
    }

    /// Hands the frames read so far to the recorder, waiting for room, in the order read.
    async fn send_records(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let Some(rec) = &self.route.recorder else {
            return self.records.clear();
        };
        self.last_record_send = std::time::Instant::now();
        let batch = self.take_records();
        rec.send_batch(batch).await;
    }

    /// The records read so far, as a batch no larger than they need: a full batch goes as it
    /// is, a small one (at low rates, a burst is an event or two) is copied out and the room
    /// kept here. The recorder's queue is bounded by the bytes its batches hold, and a batch
    /// of one message in room for a thousand would hold a thousand times its size.
    fn take_records(&mut self) -> Vec<RecMsg> {
        take_batch(&mut self.records)
    }

    /// Records a frame, redacted as everything the relay records is (`Route::redacted`): the
    /// mod may echo what a bridge sent, names included.
    fn record(&mut self, mut rec: FrameRecord) {
        if self.route.recorder.is_some() {
            rec.body = self.route.redacted(&rec.body);
            self.record_as_is(rec);
        }
    }

    /// Records a frame known to hold no secret.
    fn record_as_is(&mut self, rec: FrameRecord) {
        if self.route.recorder.is_some() {
            self.records.push(RecMsg::Frame {
                session: self.session.id,
                rec,
            });
        }
    }

    fn anomaly(&mut self, body: Bytes, json_ok: bool, why: &str) {
        self.route.metrics.anomalies.increment(1);
        tracing::debug!(route = %self.route.cfg.name, why, "unroutable frame from the mod");
        if self.route.recorder.is_some() {
            self.records.push(RecMsg::Anomaly {
                session: self.session.id,
            });
        }
        // Kept byte for byte, as evidence of what the mod sent, but for the plain spelling of a
        // secret (one the mod echoed from a bridge); decoding to find an escaped one would
        // withhold the very frames that failed to decode.
        let body = self.route.access.table().redactor().redact_plain(&body);
        self.record_as_is(FrameRecord::message(
            Direction::ModToRelay,
            0,
            now_ns(),
            json_ok,
            body,
        ));
    }

    async fn on_frame(&mut self, body: Bytes) {
        let route = self.route;
        route.metrics.mod_in.increment(1);
        let view = match self.parser.parse(&body, Mode::Tolerant) {
            Ok(v) => v,
            Err(e) => {
                // Non-finite numbers and lone surrogates break the same rule as bad grammar:
                // no peer downstream could decode the frame.
                let json_ok = !matches!(
                    e,
                    gabp_proto::EnvelopeError::InvalidJson
                        | gabp_proto::EnvelopeError::InvalidUtf8
                        | gabp_proto::EnvelopeError::NonFiniteNumber
                        | gabp_proto::EnvelopeError::LoneSurrogate
                        | gabp_proto::EnvelopeError::TooDeep
                );
                let why = e.to_string();
                // A malformed answer to a pending request: its bridge hears so now, not when
                // the request times out.
                let scan = gabp_proto::scan::LooseScan::of(gabp_proto::ANSWER_KEYS, &body);
                let Some(entry) = self.waiting_for(gabp_proto::answer_id(&scan)) else {
                    return self.anomaly(body, json_ok, &why);
                };
                self.fan_out().await;
                self.anomaly(body, json_ok, &why);
                let why = format!("the mod's answer could not be read ({why}); the request may or may not have taken effect");
                return self
                    .answer_unforwarded(entry, ErrorCode::OutcomeUnknown, why)
                    .await;
            }
        };
        match view.kind {
            MsgType::Event => {
                let channel = view
                    .channel
                    .as_deref()
                    .expect("tolerant events have a channel");
                // The relay's seq can be longer than the mod's (or added where the mod sent
                // none): an event that would then exceed --max-body is refused, so no peer
                // with the same limit is ever sent a frame it must refuse. The session's event
                // count bounds the channel's seq and is checked first (no lock); only an event
                // near the limit asks the hub for the seq it would really get.
                let sequenced = |seq: u64| {
                    let mut digits = [0u8; 20];
                    let seq_len = gabp_proto::rewrite::decimal(seq, &mut digits).len();
                    match &view.seq_span {
                        Some(span) => body.len() - span.len().min(body.len()) + seq_len,
                        None => body.len() + ",\"seq\":".len() + seq_len,
                    }
                };
                // Any seq has at most 20 digits: most events are far enough below the limit
                // to skip counting them.
                if body.len() + ",\"seq\":".len() + 20 > route.cfg.max_body
                    && sequenced(self.events) > route.cfg.max_body
                    && sequenced(route.hub.next_seq(channel).1) > route.cfg.max_body
                {
                    return self.anomaly(
                        body,
                        true,
                        "event too large to forward once the relay's seq is written",
                    );
                }
                if self.channels >= MAX_CHANNELS && !route.hub.knows(channel) {
                    return self.anomaly(body, true, "event on a channel past the session's limit");
                }
                let p = route
                    .hub
                    .publish(channel, &body, view.seq_span.clone(), &mut self.runs);
                self.events += 1;
                let cid = p.channel_id as usize;
                if p.new_channel {
                    self.channels += 1;
                    let table = route.access.table();
                    let secret = table.redactor().hits(channel);
                    if route.recorder.is_some() {
                        self.records.push(RecMsg::Channel {
                            session: self.session.id,
                            id: p.channel_id,
                            name: table.redactor().redact_name(channel).into_owned(),
                        });
                    }
                    if self.channel_counters.len() <= cid {
                        self.channel_counters
                            .resize(cid + 1, metrics::Counter::noop());
                        self.channel_secret.resize(cid + 1, false);
                    }
                    self.channel_counters[cid] = route.metrics.channel_events(channel, secret);
                    self.channel_secret[cid] = secret;
                }
                if let Some(c) = self.channel_counters.get(cid) {
                    c.increment(1);
                }
                let mod_seq = view.seq;
                let time_ns = self.clock.now();
                let rec = FrameRecord {
                    dir: Direction::ModToRelay,
                    conn: 0,
                    time_ns,
                    channel: Some(p.channel_id),
                    mod_seq,
                    relay_seq: Some(p.seq),
                    json_ok: true,
                    body: body.clone(),
                };
                // Events are most of what is recorded: only those of a channel whose name
                // holds a secret are searched (the mod's own content is trusted).
                if self.channel_secret.get(cid).copied().unwrap_or(false) {
                    self.record(rec);
                } else {
                    self.record_as_is(rec);
                }
            }
            MsgType::Response => {
                // A response never overtakes the events the mod sent before it.
                self.fan_out().await;
                let Some(upstream_id) = view.id.as_deref().and_then(|s| Uuid::parse_str(s).ok())
                else {
                    return self.anomaly(body, true, "response without a relay id");
                };
                let Some(entry) = route.pending.take(&upstream_id) else {
                    return self.anomaly(body, true, "response to an unknown or expired request");
                };
                let outcome = if view.is_error() { "error" } else { "ok" };
                let (latency, count) = route.request_metrics(&entry.method, outcome);
                latency.record(entry.sent.elapsed().as_secs_f64());
                count.increment(1);
                match &entry.origin {
                    Origin::Bridge {
                        conn,
                        outbox,
                        bridge_id,
                        ..
                    } => {
                        let wire = response_wire(
                            &body,
                            view.id_span.clone().expect("responses have an id"),
                            view.absent_null.clone(),
                            bridge_id,
                        );
                        let (conn, outbox) = (*conn, outbox.clone());
                        // A mod may echo a bridge's arguments: recorded redacted.
                        self.record(FrameRecord::message(
                            Direction::ModToRelay,
                            conn,
                            now_ns(),
                            true,
                            body,
                        ));
                        // Recorded before the bridge can have it (see the module docs).
                        self.offer_records();
                        // Written with this burst's events, by this reader when the bridge's
                        // writer is idle: no wake-up of another task per answer.
                        if outbox.queue_control(wire) && outbox.mark_for_wake() {
                            self.touched.push(outbox);
                        }
                        self.send_records().await;
                    }
                    Origin::Relay => {
                        if view.is_error() {
                            // The mod's error may name the channels asked for, a bridge's names.
                            let said = route.redacted(&body);
                            tracing::warn!(route = %route.cfg.name, method = %entry.method, "mod refused the relay's request: {}", String::from_utf8_lossy(&said));
                        }
                        self.record(FrameRecord::message(
                            Direction::ModToRelay,
                            0,
                            now_ns(),
                            true,
                            body,
                        ));
                    }
                }
            }
            MsgType::Request => self.anomaly(body, true, "the mod sent a request"),
        }
    }

    /// A mod frame over `--max-body`, passed over unread: counted as an anomaly (the recording
    /// has its count, not its bytes, which were never held), and the request it answered, if
    /// what streamed by names one, is told so at once.
    async fn on_oversized(&mut self, len: u64, answers: Option<String>) {
        let route = self.route;
        route.metrics.mod_in.increment(1);
        route.metrics.anomalies.increment(1);
        if let Some(since) = self.oversized.note("oversized") {
            tracing::warn!(route = %route.cfg.name, bytes = len, max_body = route.cfg.max_body, more_since_last_said = since, "a mod frame over --max-body was skipped unread");
        }
        if route.recorder.is_some() {
            self.records.push(RecMsg::Anomaly {
                session: self.session.id,
            });
        }
        let Some(entry) = self.waiting_for(answers) else {
            return;
        };
        self.fan_out().await;
        let why = format!(
            "the mod's answer is {len} bytes, over this relay's --max-body of {} bytes, and is not read",
            route.cfg.max_body
        );
        self.answer_unforwarded(entry, ErrorCode::TooLarge, why)
            .await;
    }

    /// The pending request `id` names, taken.
    fn waiting_for(&self, id: Option<String>) -> Option<crate::pending::Entry> {
        let id = Uuid::parse_str(&id?).ok()?;
        self.route.pending.take(&id)
    }

    /// Answers the request a mod frame that could not be forwarded (malformed, or too large)
    /// was meant to answer, at once rather than after `--request-timeout`. Recorded (the
    /// anomaly, then this answer) before the bridge can have the answer.
    async fn answer_unforwarded(
        &mut self,
        entry: crate::pending::Entry,
        code: ErrorCode,
        msg: String,
    ) {
        let (_, count) = self.route.request_metrics(&entry.method, "malformed");
        count.increment(1);
        let Some((conn, outbox, body)) = entry.error_reply(code, &msg) else {
            return;
        };
        if !outbox.is_closed() {
            self.record(FrameRecord::message(
                Direction::RelayToBridge,
                conn,
                now_ns(),
                true,
                body.clone(),
            ));
        }
        self.offer_records();
        outbox.push_control(gabp_proto::frame_bytes(&body));
        self.send_records().await;
    }

    /// Offers the burst's events: each run to each of its subscribers as one entry, runs in
    /// publish order, so every bridge still gets its events in the mod's order.
    async fn fan_out(&mut self) {
        if self.runs.is_empty() {
            return;
        }
        // Recorded before any bridge can have them (see the module docs); with no room at the
        // recorder they are delivered first, and the reader then waits for it (`flush`).
        self.offer_records();
        for (subscribers, run) in self.runs.take() {
            for (conn, outbox) in subscribers.iter() {
                self.offer_run(*conn, outbox, &run).await;
            }
        }
    }

    async fn offer_run(&mut self, conn: u32, outbox: &Arc<Outbox>, run: &Arc<EventRun>) {
        let mut from = 0;
        loop {
            let done = outbox.offer_run(run, from);
            if done.dropped > 0 {
                self.route.metrics.dropped.increment(done.dropped);
            }
            match done.outcome {
                Offer::Queued | Offer::QueuedAfterDrop(_) | Offer::Closed => {}
                Offer::Full => {
                    // Block policy: let every writer drain, then wait for this one.
                    from += done.queued;
                    for o in self.touched.drain(..) {
                        o.wake();
                    }
                    tokio::select! {
                        _ = outbox.space() => continue,
                        _ = self.route.cancel.cancelled() => return,
                    }
                }
                Offer::Disconnected => {
                    tracing::info!(route = %self.route.cfg.name, conn, "bridge disconnected: its outbox is full (policy disconnect)");
                    self.route.metrics.dropped.increment(1);
                }
            }
            break;
        }
        if outbox.mark_for_wake() {
            self.touched.push(outbox.clone());
        }
    }
}

/// The wire frame of a mod response with the bridge's id put back (in place when the lengths
/// agree, which they do for UUID ids), and without the member a tolerant read counted as absent
/// (`cut`: a `"error": null` beside a result), so the bridge gets exactly one of the two.
fn response_wire(
    body: &[u8],
    id_span: Range<usize>,
    cut: Option<Range<usize>>,
    bridge_id: &str,
) -> Bytes {
    if let Some(cut) = cut {
        let mut kept = Vec::with_capacity(body.len() - cut.len());
        kept.extend_from_slice(&body[..cut.start]);
        kept.extend_from_slice(&body[cut.end..]);
        // Members never overlap: the id lies wholly before or wholly after the cut.
        let shift = if id_span.start >= cut.end {
            cut.len()
        } else {
            0
        };
        return response_wire(
            &kept,
            id_span.start - shift..id_span.end - shift,
            None,
            bridge_id,
        );
    }
    if id_span.len() == bridge_id.len() + 2 {
        let mut out = BytesMut::with_capacity(gabp_proto::codec::frame_len(body.len()));
        encode_header(body.len(), &mut out);
        let at = out.len();
        out.extend_from_slice(body);
        gabp_proto::rewrite::rewrite_id_in_place(&mut out[at..], id_span, bridge_id.as_bytes());
        out.freeze()
    } else {
        gabp_proto::frame_bytes(&gabp_proto::rewrite::with_id(body, id_span, bridge_id))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    use tokio_util::codec::FramedRead;

    use super::*;

    /// Whenever the mod's read buffer is nearly drained, it has room for a large read: bursts
    /// of a few hundred events each would otherwise mean a `writev` per bridge per 64 KiB.
    #[tokio::test]
    async fn a_drained_read_buffer_has_room_for_a_large_read() {
        let body = format!(
            r#"{{"v":"gabp/1","type":"event","channel":"a/b","seq":1,"payload":{{"pad":"{}"}}}}"#,
            "x".repeat(200)
        );
        let mut wire = BytesMut::new();
        for _ in 0..3000 {
            gabp_proto::encode_frame(body.as_bytes(), &mut wire);
        }
        let (mut mod_side, relay_side) = tokio::io::duplex(wire.len());
        mod_side.write_all(&wire).await.expect("written");
        drop(mod_side);
        let mut frames: Frames = FramedRead::with_capacity(
            Box::pin(relay_side),
            gabp_proto::SkippingCodec::new(1 << 20),
            256 * 1024,
        );
        let mut checked = 0;
        let mut read = 0;
        loop {
            make_read_room(&mut frames);
            let buf = frames.read_buffer();
            if buf.len() < 4096 {
                assert!(
                    buf.capacity() - buf.len() >= READ_ROOM_MIN,
                    "{} bytes of room after {read} frames",
                    buf.capacity() - buf.len()
                );
                checked += 1;
            }
            match frames.next().await {
                Some(Ok(_)) => read += 1,
                Some(Err(e)) => panic!("{e}"),
                None => break,
            }
        }
        assert_eq!(read, 3000);
        assert!(checked > 10, "the buffer was drained {checked} times");
    }

    #[test]
    fn a_batch_for_the_recorder_is_never_mostly_empty_room() {
        let mark = || RecMsg::Mark;
        let mut records = Vec::with_capacity(RECORD_BATCH);
        records.push(mark());
        let batch = take_batch(&mut records);
        assert_eq!((batch.len(), batch.capacity()), (1, 1));
        assert!(records.is_empty() && records.capacity() == RECORD_BATCH);
        records.extend((0..RECORD_BATCH).map(|_| mark()));
        let batch = take_batch(&mut records);
        assert_eq!(batch.len(), RECORD_BATCH);
        assert!(records.is_empty() && records.capacity() == RECORD_BATCH);
        for n in [1, 100, 255, 256, 700] {
            records.extend((0..n).map(|_| mark()));
            let batch = take_batch(&mut records);
            assert_eq!(batch.len(), n);
            assert!(batch.capacity() <= 4 * n, "{n} in {}", batch.capacity());
        }
    }

    #[test]
    fn writers_are_woken_at_least_every_256_frames_and_at_most_every_1024() {
        assert_eq!(wake_every(16 * 1024), 1024);
        assert_eq!(wake_every(1 << 20), 1024);
        assert_eq!(wake_every(8 * 1024), 512);
        assert_eq!(wake_every(64), 256);
    }
}
