//! The shipping task: committed chunks and catalog snapshots of every session, in order, to
//! JetStream; the session's cursor advances only once JetStream acknowledged.
//!
//! It runs beside the relay, never in its way: the mod reader and the recorder never wait on
//! it, every RocksDB read and cursor write is on a blocking thread, and while NATS is slow or
//! down the relay records as ever and the task reconnects with backoff, then catches up. It
//! holds the store only for one round, so the recorder can still reopen it after an I/O error.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use async_nats::jetstream::{self, message::PublishMessage as Publish};
use gabp_storage::ship::{CatalogSnapshot, Oversize, ShipCursor, SplitError};
use gabp_storage::{SessionId, SessionState, Store};
use parking_lot::Mutex;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{one_line, NatsFlags, FIRST, KIND};

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

/// Where the relay's store is to be found; empty while the recorder reopens it.
pub type StoreSlot = Arc<Mutex<Option<Store>>>;

/// What relay/status and the metrics show of shipping.
#[derive(Debug, Default)]
pub struct ShipStatus {
    connected: AtomicBool,
    lag_frames: AtomicU64,
    lag_bytes: AtomicU64,
    shipped_frames: AtomicU64,
    last_error: Mutex<Option<String>>,
    to: String,
}

/// A serializable view of [`ShipStatus`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShipView {
    /// The cluster, without credentials.
    pub to: String,
    /// Whether the last round reached JetStream.
    pub connected: bool,
    /// Frames recorded but not acknowledged yet.
    pub lag_frames: u64,
    /// Body bytes recorded but not acknowledged yet.
    pub lag_bytes: u64,
    /// Frames acknowledged since the relay started.
    pub shipped_frames: u64,
    /// The last error, one line.
    pub last_error: Option<String>,
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
        ShipView {
            to: self.to.clone(),
            connected: self.connected.load(Ordering::Relaxed),
            lag_frames: self.lag_frames.load(Ordering::Relaxed),
            lag_bytes: self.lag_bytes.load(Ordering::Relaxed),
            shipped_frames: self.shipped_frames.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }

    fn set_lag(&self, frames: u64, bytes: u64) {
        self.lag_frames.store(frames, Ordering::Relaxed);
        self.lag_bytes.store(bytes, Ordering::Relaxed);
        metrics::gauge!("gabp_ship_lag_frames").set(frames as f64);
        metrics::gauge!("gabp_ship_lag_bytes").set(bytes as f64);
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
}

/// Runs until `cancel`: reconnects with backoff, ships whatever is behind.
pub async fn run(
    target: Target,
    slot: StoreSlot,
    status: Arc<ShipStatus>,
    cancel: CancellationToken,
) {
    let mut backoff = Duration::from_millis(200);
    let mut last_logged: Option<String> = None;
    let mut done = HashSet::new();
    loop {
        let round = async {
            let js = super::connect(&target.urls, &target.flags, "gabp-relay shipper").await?;
            status.connected.store(true, Ordering::Relaxed);
            *status.last_error.lock() = None;
            // Sessions waiting for a larger max_payload, with the limit they did not fit:
            // tried again once the servers' limit is another (a reconfigured cluster).
            let mut stuck = HashMap::new();
            loop {
                let moved = ship_round(&js, &slot, &target, &status, &mut done, &mut stuck).await?;
                if !moved {
                    // Nothing behind: look again shortly (off the hot path, a cheap catalog scan).
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), anyhow::Error>(())
        };
        let e = tokio::select! {
            _ = cancel.cancelled() => return,
            r = round => match r { Ok(()) => continue, Err(e) => e },
        };
        status.connected.store(false, Ordering::Relaxed);
        let line = one_line(&e);
        if last_logged.as_deref() != Some(line.as_str()) {
            tracing::warn!("shipping paused, recording goes on: {line}");
            last_logged = Some(line.clone());
        }
        *status.last_error.lock() = Some(line);
        // While NATS cannot be reached the lag still grows with the recording: keep it true.
        if let Some((frames, bytes)) = lag_of(&slot, &done).await {
            status.set_lag(frames, bytes);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Frames and bytes recorded but not acknowledged, over every session not known finished.
async fn lag_of(slot: &StoreSlot, done: &HashSet<SessionId>) -> Option<(u64, u64)> {
    let store = slot.lock().clone()?;
    let skip = done.clone();
    let read = blocking(store, move |s| {
        let mut lag = (0u64, 0u64);
        for m in s.sessions()? {
            if !skip.contains(&m.id) {
                let c = s.ship_cursor(m.id)?;
                lag.0 += m.frames.saturating_sub(c.frames);
                lag.1 += m.bytes.saturating_sub(c.bytes);
            }
        }
        Ok(lag)
    });
    read.await.ok().map(|(_, lag)| lag)
}

/// Ships what every unfinished session has behind; returns whether anything moved.
async fn ship_round(
    js: &jetstream::Context,
    slot: &StoreSlot,
    target: &Target,
    status: &ShipStatus,
    done: &mut HashSet<SessionId>,
    stuck: &mut HashMap<SessionId, usize>,
) -> Result<bool> {
    let Some(store) = slot.lock().clone() else {
        return Ok(false);
    };
    let skip = done.clone();
    let (s, work) = blocking(store, move |s| {
        let mut work = Vec::new();
        for m in s.sessions()? {
            if skip.contains(&m.id) {
                continue;
            }
            let c = s.ship_cursor(m.id)?;
            work.push((m, c));
        }
        Ok(work)
    })
    .await?;
    let mut moved = false;
    let mut lag = (0u64, 0u64);
    for (m, c) in &work {
        lag.0 += m.frames.saturating_sub(c.frames);
        lag.1 += m.bytes.saturating_sub(c.bytes);
    }
    status.set_lag(lag.0, lag.1);
    for (m, c) in work {
        let limit = js.client().max_payload();
        if stuck.get(&m.id).is_some_and(|&at| at == limit) {
            continue;
        }
        let before = c.frames;
        let (finished, cursor) = match ship_session(js, &s, m.id, c, target, status).await {
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
    js: &jetstream::Context,
    store: &Store,
    id: SessionId,
    mut cursor: ShipCursor,
    target: &Target,
    status: &ShipStatus,
) -> Result<(bool, ShipCursor)> {
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
            send_catalog(js, &subject, &mut snap, &mut cursor).await?;
            save(store, id, cursor).await?;
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
            let msg = Publish::build()
                .message_id(format!("{id}-{}", c.first))
                .header(KIND, "chunk")
                .header(FIRST, c.first.to_string().as_str())
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
        save(store, id, cursor).await?;
    }
}

async fn send_catalog(
    js: &jetstream::Context,
    subject: &str,
    snap: &mut CatalogSnapshot,
    cursor: &mut ShipCursor,
) -> Result<()> {
    snap.seq = cursor.catalog_seq + 1;
    let body = serde_json::to_vec(&snap).map_err(|e| anyhow!("catalog snapshot: {e}"))?;
    let msg = Publish::build()
        .message_id(format!("{}-c{}", snap.meta.id, snap.seq))
        .header(KIND, "catalog")
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

async fn save(store: &Store, id: SessionId, cursor: ShipCursor) -> Result<()> {
    blocking(store.clone(), move |s| s.set_ship_cursor(id, &cursor))
        .await
        .map(|_| ())
}
