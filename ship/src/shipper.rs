//! The shipping task: committed chunks and catalog snapshots of every session, in order, to
//! JetStream; the session's cursor advances only once JetStream acknowledged.
//!
//! It runs beside the relay, never in its way: the mod reader and the recorder never wait on
//! it, every RocksDB read and cursor write is on a blocking thread, and while NATS is slow or
//! down the relay records as ever and the task reconnects with backoff, then catches up. It
//! holds the store only for one round, so the recorder can still reopen it after an I/O error.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use async_nats::jetstream;
use gabp_engine::shipping::{
    ShipView, Shipment, Shipping, ShippingStatus, ShippingTask, StoreSlot,
};
use gabp_storage::ship::{CatalogSnapshot, Destination, Oversize, ShipCursor, SplitError};
use gabp_storage::{SessionId, SessionMeta, SessionState, Store};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::fleet::{Covered, Kind};
use super::{one_line, Connected, NatsFlags};

/// Chunks read and sent per round trip of acknowledgements.
const WINDOW_CHUNKS: usize = 64;
/// ... or about this many bytes.
const WINDOW_BYTES: usize = 8 << 20;
/// A live session at full rate is never caught up: its turn ends after this long, so that the
/// round lets go of the store (the recorder may need to reopen it) and the lag is refreshed.
const TURN: Duration = Duration::from_secs(1);
/// Room left in each message for its headers (id, kind, first frame) under the server's
/// `max_payload`, which counts headers and payload together.
const HEADER_ROOM: usize = 1024;

/// A session that cannot be shipped while the servers' `max_payload` stays what it is: one of
/// its frames does not fit any message. It waits (its lag shows it); the others ship.
#[derive(Debug, thiserror::Error)]
#[error("session {session} cannot be shipped: {oversize}; raise max_payload on the NATS servers (up to 64 MiB, deploy/nats-cluster.conf) and reconnect; the other sessions ship")]
pub struct Stuck {
    session: SessionId,
    oversize: Oversize,
}

/// What relay/status and the metrics show of shipping.
#[derive(Debug, Default)]
pub struct ShipStatus {
    connected: AtomicBool,
    lag_frames: AtomicU64,
    lag_bytes: AtomicU64,
    shipped_frames: AtomicU64,
    last_error: Mutex<Option<String>>,
    to: String,
    destination: Mutex<Option<Destination>>,
    /// The connection in use, asked live: a server gone mid-round shows at once, not when
    /// the round's acknowledgements time out.
    client: Mutex<Option<async_nats::Client>>,
}

impl ShipStatus {
    /// A status for shipping to `urls`.
    pub fn new(urls: &str) -> ShipStatus {
        ShipStatus {
            to: super::shown(urls),
            ..ShipStatus::default()
        }
    }

    /// The current view.
    pub fn view(&self) -> ShipView {
        let live = self
            .client
            .lock()
            .as_ref()
            .is_none_or(|c| c.connection_state() == async_nats::connection::State::Connected);
        let connected = self.connected.load(Ordering::Relaxed) && live;
        let mut last_error = self.last_error.lock().clone();
        if !live && last_error.is_none() {
            last_error = Some("the connection to NATS was lost; reconnecting".into());
        }
        ShipView {
            to: self.to.clone(),
            connected,
            lag_frames: self.lag_frames.load(Ordering::Relaxed),
            lag_bytes: self.lag_bytes.load(Ordering::Relaxed),
            shipped_frames: self.shipped_frames.load(Ordering::Relaxed),
            last_error,
        }
    }

    /// The destination shipping last reached (none before it reached one).
    pub fn destination(&self) -> Option<Destination> {
        *self.destination.lock()
    }

    fn set_lag(&self, frames: u64, bytes: u64) {
        self.lag_frames.store(frames, Ordering::Relaxed);
        self.lag_bytes.store(bytes, Ordering::Relaxed);
        metrics::gauge!("gabp_ship_lag_frames").set(frames as f64);
        metrics::gauge!("gabp_ship_lag_bytes").set(bytes as f64);
    }
}

impl ShippingStatus for ShipStatus {
    fn view(&self) -> ShipView {
        ShipStatus::view(self)
    }

    fn destination(&self) -> Option<Destination> {
        ShipStatus::destination(self)
    }
}

impl Shipping for Target {
    fn shown_destination(&self) -> String {
        super::shown(&self.urls)
    }

    fn start(&self, store: StoreSlot) -> Shipment {
        let status = Arc::new(ShipStatus::new(&self.urls));
        let task = Running::start(self.clone(), store, status.clone());
        Shipment {
            status,
            task: Box::new(task),
        }
    }
}

impl ShippingTask for Running {
    fn finish(
        self: Box<Self>,
        deadline: std::time::Instant,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(Running::finish(*self, deadline))
    }

    fn stop(self: Box<Self>) {
        Running::stop(*self)
    }
}

/// Settings of one shipper.
#[derive(Debug, Clone)]
pub struct Target {
    /// `nats://…` list.
    pub urls: String,
    /// Connection and stream options.
    pub flags: NatsFlags,
    /// This machine's name, the sessions' origin.
    pub host: String,
    /// How messages are signed.
    pub signing: super::Signing,
}

/// A running shipping task. It outlives the relay's other tasks: once the recorder has
/// stopped, [`Running::finish`] lets it ship what the recorder wrote last (the final frames,
/// every session's end) before the process exits.
#[derive(Debug)]
pub struct Running {
    handle: tokio::task::JoinHandle<()>,
    finish: CancellationToken,
    stop: CancellationToken,
}

impl Running {
    /// Starts shipping the recordings in `slot` to `target`.
    pub fn start(target: Target, slot: StoreSlot, status: Arc<ShipStatus>) -> Running {
        let (finish, stop) = (CancellationToken::new(), CancellationToken::new());
        let handle = tokio::spawn(run(target, slot, status, finish.clone(), stop.clone()));
        Running {
            handle,
            finish,
            stop,
        }
    }

    /// Call once the recorder has stopped: ships until nothing is behind, NATS cannot be
    /// reached, or `deadline` (whatever is left then ships on the next run, or with `ship`).
    pub async fn finish(mut self, deadline: std::time::Instant) {
        self.finish.cancel();
        if tokio::time::timeout_at(deadline.into(), &mut self.handle)
            .await
            .is_err()
        {
            self.stop.cancel();
            let _ = self.handle.await;
        }
    }

    /// Stops at once (the recorder did not stop in time).
    pub fn stop(self) {
        self.stop.cancel();
    }
}

/// Ships whatever is behind, reconnecting with backoff, until `stop`, or, once `finish` is
/// cancelled, until a whole round found nothing left (or NATS cannot be reached).
async fn run(
    target: Target,
    slot: StoreSlot,
    status: Arc<ShipStatus>,
    finish: CancellationToken,
    stop: CancellationToken,
) {
    match &target.signing.key {
        Some(k) => tracing::info!("shipping signed with fleet key {}", k.id()),
        None => tracing::warn!(
            "shipping unsigned (--insecure-unsigned): collectors cannot tell these messages from forged ones"
        ),
    }
    let mut backoff = Duration::from_millis(200);
    let mut last_logged: Option<String> = None;
    // Sessions this destination has whole, and that destination.
    let mut done = (None, HashSet::new());
    let mut last_to = None;
    loop {
        let round = async {
            // A relay stopping while NATS is unreachable does not wait out a connection attempt.
            let conn = tokio::select! {
                biased;
                _ = finish.cancelled() => return Ok(()),
                c = super::connect(&target.urls, &target.flags, "gabp-relay shipper") => c?,
            };
            if done.0 != Some(conn.to) {
                done = (Some(conn.to), HashSet::new());
            }
            last_to = Some(conn.to);
            *status.destination.lock() = Some(conn.to);
            *status.client.lock() = Some(conn.js.client());
            status.connected.store(true, Ordering::Relaxed);
            *status.last_error.lock() = None;
            // Sessions waiting for a larger max_payload, with the limit they did not fit:
            // tried again once the servers' limit is another (a reconfigured cluster).
            let mut stuck = HashMap::new();
            loop {
                // Only a round begun after the recorder stopped has seen its last writes.
                let last_round = finish.is_cancelled();
                let moved =
                    ship_round(&conn, &slot, &target, &status, &mut done.1, &mut stuck).await?;
                if !moved {
                    if last_round {
                        return Ok::<(), anyhow::Error>(());
                    }
                    // Nothing behind: look again shortly (off the hot path, a cheap catalog scan).
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = finish.cancelled() => {}
                    }
                }
            }
        };
        let e = tokio::select! {
            _ = stop.cancelled() => break,
            r = round => match r { Ok(()) => break, Err(e) => e },
        };
        status.connected.store(false, Ordering::Relaxed);
        let line = one_line(&e);
        if finish.is_cancelled() {
            tracing::warn!("shipping stopped at exit: {line}");
        } else if last_logged.as_deref() != Some(line.as_str()) {
            tracing::warn!("shipping paused, recording goes on: {line}");
            last_logged = Some(line.clone());
        }
        *status.last_error.lock() = Some(line);
        // While NATS cannot be reached the lag still grows with the recording: keep it true.
        if let Some((frames, bytes)) = lag_of(&slot, last_to, &done.1).await {
            status.set_lag(frames, bytes);
        }
        if finish.is_cancelled() {
            break;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = finish.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    if finish.is_cancelled() {
        let left = lag_of(&slot, last_to, &done.1).await;
        // The recorder has stopped and left the store here for this: close it now.
        drop(slot.lock().take());
        match left {
            Some((0, _)) => tracing::info!("shipping caught up before exit"),
            Some((frames, _)) => tracing::warn!(
                "{frames} recorded frame(s) not shipped at exit: they ship when the relay runs again with shipping on, or with `gabp-relay ship --all`"
            ),
            None => {}
        }
    }
}

/// Every session not known finished, with its cursor at `to` (at the destination that has
/// most of it while none was reached yet).
fn work_list(
    s: &Store,
    to: Option<Destination>,
    skip: &HashSet<SessionId>,
) -> Result<Vec<(SessionMeta, ShipCursor)>, gabp_storage::StoreError> {
    let mut work = Vec::new();
    for m in s.sessions()? {
        if skip.contains(&m.id) {
            continue;
        }
        let c = match to {
            Some(to) => s.ship_cursor(m.id, to)?,
            None => s.furthest_ship_cursor(m.id)?.unwrap_or_default(),
        };
        work.push((m, c));
    }
    Ok(work)
}

/// Frames and body bytes of `work` not acknowledged.
fn lag(work: &[(SessionMeta, ShipCursor)]) -> (u64, u64) {
    work.iter().fold((0, 0), |(f, b), (m, c)| {
        (
            f + m.frames.saturating_sub(c.frames),
            b + m.bytes.saturating_sub(c.bytes),
        )
    })
}

/// Frames and bytes recorded but not acknowledged by `to`, over every session not known
/// finished.
async fn lag_of(
    slot: &StoreSlot,
    to: Option<Destination>,
    done: &HashSet<SessionId>,
) -> Option<(u64, u64)> {
    let store = slot.lock().clone()?;
    let skip = done.clone();
    let read = blocking(store, move |s| work_list(s, to, &skip));
    read.await.ok().map(|(_, work)| lag(&work))
}

/// Ships what every unfinished session has behind; returns whether anything moved.
async fn ship_round(
    conn: &Connected,
    slot: &StoreSlot,
    target: &Target,
    status: &ShipStatus,
    done: &mut HashSet<SessionId>,
    stuck: &mut HashMap<SessionId, usize>,
) -> Result<bool> {
    let Some(store) = slot.lock().clone() else {
        return Ok(false);
    };
    let (skip, to) = (done.clone(), conn.to);
    let (s, work) = blocking(store, move |s| work_list(s, Some(to), &skip)).await?;
    let mut moved = false;
    let (frames, bytes) = lag(&work);
    status.set_lag(frames, bytes);
    for (m, c) in work {
        let limit = conn.js.client().max_payload();
        if stuck.get(&m.id).is_some_and(|&at| at == limit) {
            continue;
        }
        let before = c.frames;
        let (finished, cursor) = match ship_session(conn, &s, m.id, c, target, status).await {
            Ok(done) => done,
            Err(e) => match e.downcast::<Stuck>() {
                Ok(st) => {
                    let line = st.to_string();
                    tracing::warn!("{line}");
                    metrics::counter!("gabp_ship_stuck_sessions_total").increment(1);
                    *status.last_error.lock() = Some(line);
                    stuck.insert(m.id, limit);
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        moved |= cursor.frames != before;
        if finished {
            done.insert(m.id);
        }
    }
    Ok(moved)
}

/// Runs a store read on a blocking thread, handing the store back with the result.
async fn blocking<T: Send + 'static>(
    store: Store,
    f: impl FnOnce(&Store) -> Result<T, gabp_storage::StoreError> + Send + 'static,
) -> Result<(Store, T)> {
    tokio::task::spawn_blocking(move || {
        let r = f(&store);
        r.map(|t| (store, t))
    })
    .await
    .map_err(|e| anyhow!("shipping read failed: {e}"))?
    .map_err(|e| anyhow!("cannot read the recording to ship it: {e}"))
}

/// Ships one session from its cursor as far as it is committed, or for about a second (`TURN`) if that
/// is less; returns whether it is finished (ended, every frame and its final catalog
/// acknowledged) and the cursor.
pub async fn ship_session(
    conn: &Connected,
    store: &Store,
    id: SessionId,
    mut cursor: ShipCursor,
    target: &Target,
    status: &ShipStatus,
) -> Result<(bool, ShipCursor)> {
    // Never unsigned unless told so, whoever built the target.
    target.signing.check().map_err(|e| anyhow!("{e}"))?;
    let (js, to) = (&conn.js, conn.to);
    let subject = format!("{}.{}", target.flags.subject_prefix, id);
    let turn = std::time::Instant::now();
    loop {
        if turn.elapsed() >= TURN {
            return Ok((false, cursor));
        }
        // The snapshot is read before the chunks: an ended one then has every frame below.
        let (host, from) = (target.host.clone(), cursor.frames);
        let (_, (snap, chunks)) = blocking(store.clone(), move |s| {
            let snap = s.catalog_snapshot(id, &host)?;
            let chunks = s.chunks_from(id, from, WINDOW_CHUNKS, WINDOW_BYTES)?;
            Ok((snap, chunks))
        })
        .await?;
        let Some(mut snap) = snap else {
            return Ok((true, cursor));
        };
        if cursor.catalog_seq == 0
            || (chunks.is_empty() && snap.fingerprint() != cursor.catalog_hash)
        {
            send_catalog(js, &target.signing, &subject, &mut snap, &mut cursor).await?;
            save(store, id, to, cursor).await?;
        }
        if chunks.is_empty() {
            let finished =
                snap.meta.state == Some(SessionState::Ended) && cursor.frames >= snap.meta.frames;
            return Ok((finished, cursor));
        }
        // A recorder chunk may be larger than a message may be: ship it in runs of frames.
        let limit = js.client().max_payload().saturating_sub(HEADER_ROOM);
        let mut parts = Vec::with_capacity(chunks.len());
        for c in chunks {
            match c.split(limit) {
                Ok(p) => parts.extend(p),
                // What came before it ships first; the next window starts at it and fails.
                Err(_) if !parts.is_empty() => break,
                Err(SplitError::Oversize(oversize)) => {
                    return Err(anyhow::Error::new(Stuck {
                        session: id,
                        oversize,
                    }))
                }
                Err(SplitError::Store(e)) => {
                    return Err(anyhow!("cannot read the recording to ship it: {e}"))
                }
            }
        }
        let chunks = parts;
        // Send the window, then wait for every ack in order.
        let mut acks = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let covered = Covered {
                session: id,
                kind: Kind::Chunk,
                first: c.first,
                body: &c.data,
            };
            let msg = target
                .signing
                .message(&covered, &format!("{id}-{}", c.first))
                .payload(c.data.clone());
            acks.push(
                js.send_publish(subject.clone(), msg)
                    .await
                    .map_err(|e| anyhow!("publishing to JetStream failed: {}", one_line(&e)))?,
            );
        }
        for ack in acks {
            ack.await
                .map_err(|e| anyhow!("JetStream did not acknowledge: {}", one_line(&e)))?;
        }
        for c in &chunks {
            cursor.frames = c.first + c.frames;
            cursor.bytes += c.bytes;
            status.shipped_frames.fetch_add(c.frames, Ordering::Relaxed);
        }
        metrics::counter!("gabp_shipped_frames_total")
            .increment(chunks.iter().map(|c| c.frames).sum());
        save(store, id, to, cursor).await?;
    }
}

async fn send_catalog(
    js: &jetstream::Context,
    signing: &super::Signing,
    subject: &str,
    snap: &mut CatalogSnapshot,
    cursor: &mut ShipCursor,
) -> Result<()> {
    // Numbered by the clock (and above the last one sent): an archive fed by one destination
    // and then another (a cluster replaced) applies the newer snapshot, not the higher count.
    snap.seq = (cursor.catalog_seq + 1).max(gabp_rt::clock::now_ns());
    let body = serde_json::to_vec(&snap).map_err(|e| anyhow!("catalog snapshot: {e}"))?;
    let covered = Covered {
        session: snap.meta.id,
        kind: Kind::Catalog,
        first: 0,
        body: &body,
    };
    let msg = signing
        .message(&covered, &format!("{}-c{}", snap.meta.id, snap.seq))
        .payload(body.into());
    js.send_publish(subject.to_string(), msg)
        .await
        .map_err(|e| anyhow!("publishing to JetStream failed: {}", one_line(&e)))?
        .await
        .map_err(|e| anyhow!("JetStream did not acknowledge: {}", one_line(&e)))?;
    cursor.catalog_seq = snap.seq;
    cursor.catalog_hash = snap.fingerprint();
    Ok(())
}

async fn save(store: &Store, id: SessionId, to: Destination, cursor: ShipCursor) -> Result<()> {
    blocking(store.clone(), move |s| s.set_ship_cursor(id, to, &cursor))
        .await
        .map(|_| ())
}
