//! The recorder thread: takes frame records over a bounded queue and group-commits them.
//!
//! The queue blocks its senders when full, so a recorder that falls behind slows the mod
//! reader (and through TCP, the game) instead of dropping anything. RocksDB runs only on this
//! thread, never on an async worker. Each loop takes everything queued (up to a cap), writes it
//! as one batch, and syncs once per batch when durability is `batch`.
//!
//! A failed commit is never silent: it is logged, counted, visible in [`Recorder::health`]
//! (relay/status, the `gabp_recorder_healthy` gauge), and the policy applies. `stall` retries
//! the whole batch with backoff, reopening the database between tries (RocksDB fails every
//! write after an I/O error until reopened), and closes a gate in [`Recorder::send_batch`] so
//! the mod reader waits at once instead of filling the queue; `continue` drops the batch and
//! records the loss as a gap that `sessions check` understands. Asked to stop while writes
//! fail, the recorder gives up: the recording keeps its committed prefix, and it says so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use gabp_storage::{
    BridgeInfo, EndReason, FrameRecord, SessionId, SessionMeta, SessionWriter, Store,
};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

mod thread;

pub use gabp_rt::private_files::private_file_modes;
use thread::run;

/// Messages to the recorder thread, applied in order.
#[derive(Debug)]
pub enum RecMsg {
    /// A session starts.
    Begin(Box<SessionMeta>),
    /// A channel of a session gets its id.
    Channel {
        /// The session.
        session: SessionId,
        /// The channel's session-scoped id.
        id: u32,
        /// Its name.
        name: String,
    },
    /// A frame.
    Frame {
        /// The session.
        session: SessionId,
        /// The frame.
        rec: FrameRecord,
    },
    /// A bridge attached or changed.
    Bridge {
        /// The session.
        session: SessionId,
        /// The bridge.
        info: Box<BridgeInfo>,
    },
    /// A mod frame could not be routed.
    Anomaly {
        /// The session.
        session: SessionId,
    },
    /// A session ends.
    End {
        /// The session.
        session: SessionId,
        /// How.
        reason: EndReason,
        /// When (ns since epoch).
        at_ns: u64,
    },
    /// Answer once everything before this message is committed.
    Flush(oneshot::Sender<()>),
    /// Sync what is committed and mark it so (`gabp_storage::mark`): sent about once a second,
    /// so a write-ahead log lost or cut short later is refused, not read as less.
    Mark,
    /// Apply retention (on this thread: it must hold the only handle on the store to reopen).
    Retain {
        /// Delete ended sessions older than this.
        max_age_ns: Option<u64>,
        /// Delete oldest ended sessions beyond this many bytes.
        max_bytes: Option<u64>,
        /// With shipping on (without `--retain-unshipped`): keep every session this
        /// destination does not have whole (all of them while none was reached yet).
        keep_unshipped: Option<Option<gabp_storage::ship::Destination>>,
    },
}

/// Applies retention to `store` (`keep_unshipped` as in [`RecMsg::Retain`]) and logs, at info
/// level, each session it deletes (id, route, bytes and why) as it goes, then the count: a
/// relay never deletes a recording without saying so. Runs where the store's only writer is:
/// at start, then on the recorder thread.
pub(crate) fn apply_retention(
    store: &Store,
    max_age_ns: Option<u64>,
    max_bytes: Option<u64>,
    keep_unshipped: Option<Option<gabp_storage::ship::Destination>>,
) {
    use gabp_storage::retention::{Deletable, RetentionRule};
    let rule = RetentionRule {
        now_ns: gabp_rt::clock::now_ns(),
        max_age_ns,
        max_bytes,
        deletable: keep_unshipped.map_or(Deletable::Ended, Deletable::ShippedTo),
    };
    let done = store.delete_expired(&rule, |e| {
        tracing::info!(
            session = %e.meta.id,
            route = %gabp_rt::display::name(&e.meta.route),
            bytes = e.meta.bytes,
            why = e.why(),
            "retention deleted a session"
        );
    });
    match done {
        Ok(deleted) if !deleted.is_empty() => {
            let bytes: u64 = deleted.iter().map(|e| e.meta.bytes).sum();
            tracing::info!(
                deleted = deleted.len(),
                bytes,
                "retention removed old sessions"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "retention failed"),
    }
}

/// The recorder's health, as relay/status shows it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Whether the last commit succeeded.
    pub ok: bool,
    /// When the current run of failures began (ns since epoch).
    pub failing_since_ns: Option<u64>,
    /// The last error, one line.
    pub last_error: Option<String>,
    /// Failed commits retried, in total.
    pub retries: u64,
    /// Frames given up (dropped under `continue`, or left at shutdown while failing).
    pub lost_frames: u64,
    /// Of those, frames left unrecorded because writes still failed at the shutdown bound.
    pub unrecorded_at_shutdown: u64,
}

#[derive(Debug)]
struct Shared {
    health: Mutex<Health>,
    /// Open while senders may enqueue: healthy, or not holding the mod (`continue`), or
    /// stopping. Closed, [`Recorder::send_batch`] waits: the mod reader stops reading.
    gate: watch::Sender<bool>,
    stopping: AtomicBool,
    /// Once stopping: when to stop retrying a failing disk, a little before the shutdown bound
    /// so that the queue can still be drained and the relay exit within it.
    give_up_at: Mutex<Option<Instant>>,
    /// How long the last reopen of the data dir took: during shutdown no reopen starts that
    /// would, at that pace, run past `give_up_at` (replaying a big write-ahead log takes
    /// seconds, and the shutdown bound is a promise).
    reopen_took: Mutex<Duration>,
    policy: OnRecordError,
    /// The store, for reads of what is committed (a resume's history, the shipper's chunks):
    /// emptied while the thread reopens it, and a reader holds its clone only for one bounded
    /// read.
    store: crate::shipping::StoreSlot,
    /// Shipping's status, when the relay ships.
    ship: std::sync::OnceLock<Arc<dyn crate::shipping::ShippingStatus>>,
}

impl Shared {
    fn set_gate(&self) {
        let ok = self.health.lock().ok;
        let open =
            ok || self.policy == OnRecordError::Continue || self.stopping.load(Ordering::Relaxed);
        self.gate
            .send_if_modified(|g| std::mem::replace(g, open) != open);
    }
}

/// Bytes the queue may hold by default (`--record-queue`): the recorder's memory bound whatever
/// frames arrive, and what a crash can leave out of a recording while the recorder lags. The
/// queue's capacity in batches is one per KiB of the budget, which every batch takes at least,
/// so the byte budget is always the bound that holds the mod, whatever the batches' sizes. (At
/// 16,384 batches, a relay that read events one or two at a time, each its own batch, was held
/// at half the budget.) A queued batch's slot is a few dozen bytes: the budget bounds memory.
pub const DEFAULT_BUDGET: usize = 256 << 20;
/// Batches applied per commit at most.
const MAX_BATCH: usize = 512;
/// How long the recorder gathers before a commit: one WAL sync per tick instead of one per
/// arriving batch. A crash loses at most this much of what was received; nothing before it.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(10);

/// A batch of messages and the byte budget it holds until committed.
#[derive(Debug)]
struct RecBatch {
    msgs: Vec<RecMsg>,
    _budget: Option<OwnedSemaphorePermit>,
}

/// KiB of a byte budget of `all` KiB a batch takes: its frame bodies and its own allocation
/// (a batch of one message in room for a thousand holds that room until it is committed), at
/// least 1, at most all.
fn budget_kib(msgs: &Vec<RecMsg>, all: usize) -> u32 {
    let bodies: usize = msgs
        .iter()
        .map(|m| match m {
            RecMsg::Frame { rec, .. } => rec.body.len(),
            _ => 0,
        })
        .sum();
    let bytes = bodies + msgs.capacity() * std::mem::size_of::<RecMsg>();
    (bytes / 1024).clamp(1, all.max(1)) as u32
}

/// Handle for sending to the recorder.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<RecBatch>,
    budget: Arc<Semaphore>,
    /// The budget's size in KiB.
    budget_kib: usize,
    shared: Arc<Shared>,
}

/// The running recorder thread.
#[derive(Debug)]
pub struct RecorderThread {
    handle: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl Recorder {
    /// Starts the recorder thread over `store`, its queue bounded by `budget` bytes (at least
    /// 1 KiB; see [`DEFAULT_BUDGET`]).
    /// `store` must be the only handle on the data dir: the thread reopens it after I/O errors.
    pub fn start(store: Store, policy: OnRecordError, budget: usize) -> (Recorder, RecorderThread) {
        let budget_kib = (budget / 1024).max(1);
        let (tx, rx) = mpsc::channel(budget_kib);
        let shared = Arc::new(Shared {
            health: Mutex::new(Health {
                ok: true,
                ..Health::default()
            }),
            gate: watch::Sender::new(true),
            stopping: AtomicBool::new(false),
            give_up_at: Mutex::new(None),
            reopen_took: Mutex::new(Duration::ZERO),
            policy,
            store: Arc::new(Mutex::new(Some(store.clone()))),
            ship: std::sync::OnceLock::new(),
        });
        metrics::gauge!("gabp_recorder_healthy").set(1.0);
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("gabp-recorder".into())
            .spawn(move || run(SessionWriter::new(store), rx, &sh))
            .expect("spawning the recorder thread");
        (
            Recorder {
                tx,
                budget: Arc::new(Semaphore::new(budget_kib)),
                budget_kib,
                shared: shared.clone(),
            },
            RecorderThread {
                handle: Some(handle),
                shared,
            },
        )
    }

    /// The store, to read what is committed (on a blocking thread, never an async worker;
    /// drop it after one bounded read: the recorder cannot reopen the store while it is held).
    /// `None` while the recorder is reopening it.
    pub fn store(&self) -> Option<Store> {
        self.shared.store.lock().clone()
    }

    /// The recorder's health now.
    pub fn health(&self) -> Health {
        self.shared.health.lock().clone()
    }

    /// Why a failing recorder holds its senders now (policy `stall`), if it does: its last
    /// error, one line.
    pub fn holding(&self) -> Option<String> {
        if *self.shared.gate.borrow() {
            return None;
        }
        let why = self.health().last_error;
        Some(why.unwrap_or_else(|| "the last commit failed".into()))
    }

    /// Sends a message, waiting while the queue is full (this is the lossless backpressure).
    /// Returns whether it was held by a failing recorder (policy `stall`) first.
    pub async fn send(&self, msg: RecMsg) -> bool {
        self.send_batch(vec![msg]).await
    }

    /// Sends messages as one batch, waiting for queue room and byte budget. Returns whether
    /// it was held by a failing recorder (policy `stall`) first.
    pub async fn send_batch(&self, msgs: Vec<RecMsg>) -> bool {
        if msgs.is_empty() {
            return false;
        }
        // Under `stall`, a failing recorder holds the mod now, not after the queue is full.
        let held = !*self.shared.gate.borrow();
        if held {
            let mut gate = self.shared.gate.subscribe();
            let _ = gate.wait_for(|open| *open).await;
        }
        let budget = self
            .budget
            .clone()
            .acquire_many_owned(budget_kib(&msgs, self.budget_kib))
            .await
            .ok();
        if self
            .tx
            .send(RecBatch {
                msgs,
                _budget: budget,
            })
            .await
            .is_err()
        {
            tracing::error!("recorder thread is gone; frames not recorded");
            metrics::counter!("gabp_record_errors_total").increment(1);
        }
        held
    }

    /// Sends `msgs` as one batch if the recorder takes them now (its gate open, budget and queue
    /// room free); gives them back otherwise, for [`Recorder::send_batch`] to wait with.
    pub fn try_send_batch(&self, msgs: Vec<RecMsg>) -> Result<(), Vec<RecMsg>> {
        if msgs.is_empty() {
            return Ok(());
        }
        if !*self.shared.gate.borrow() {
            return Err(msgs);
        }
        let Ok(permit) = self
            .budget
            .clone()
            .try_acquire_many_owned(budget_kib(&msgs, self.budget_kib))
        else {
            return Err(msgs);
        };
        match self.tx.try_send(RecBatch {
            msgs,
            _budget: Some(permit),
        }) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b)) => {
                Err(b.msgs)
            }
        }
    }

    /// Sends without ever waiting: for tasks that must not stall (bridge writers). When the
    /// queue is full the message is handed to a task that waits, so it is still recorded.
    pub fn send_detached(&self, msg: RecMsg) {
        let msgs = vec![msg];
        let kib = budget_kib(&msgs, self.budget_kib);
        let msg = match self.budget.clone().try_acquire_many_owned(kib) {
            Ok(permit) => match self.tx.try_send(RecBatch {
                msgs,
                _budget: Some(permit),
            }) {
                Ok(()) => return,
                Err(
                    mpsc::error::TrySendError::Full(mut b)
                    | mpsc::error::TrySendError::Closed(mut b),
                ) => b.msgs.pop().expect("the batch holds the message"),
            },
            Err(_) => {
                let mut msgs = msgs;
                msgs.pop().expect("the batch holds the message")
            }
        };
        let me = self.clone();
        tokio::spawn(async move { me.send(msg).await });
    }

    /// Waits until everything sent so far is committed.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        self.send(RecMsg::Flush(tx)).await;
        let _ = rx.await;
    }

    /// Batches waiting in the queue (the recorder's lag).
    pub fn lag(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Bytes of the byte budget that batches not yet committed hold (bodies and allocations,
    /// KiB granularity): what a crash (`kill -9`, power loss) would leave out of the
    /// recording, though bridges may already have it (they get events before they are
    /// committed). Near the budget when the recorder lags and holds the mod.
    pub fn lag_bytes(&self) -> u64 {
        (self
            .budget_kib
            .saturating_sub(self.budget.available_permits()) as u64)
            * 1024
    }

    /// Where the shipper finds the store (empty while the recorder reopens it).
    pub fn store_slot(&self) -> crate::shipping::StoreSlot {
        self.shared.store.clone()
    }

    /// Shows `status` in relay/status from now on.
    pub fn set_ship(&self, status: Arc<dyn crate::shipping::ShippingStatus>) {
        let _ = self.shared.ship.set(status);
    }

    /// Shipping's status, if the relay ships.
    pub fn ship(&self) -> Option<crate::shipping::ShipView> {
        self.shared.ship.get().map(|s| s.view())
    }
}

impl RecorderThread {
    /// Shutdown has begun, to end by `deadline`: let held senders through; if writes are
    /// failing, keep retrying (a freed disk still gets everything, and the session's end)
    /// until shortly before the deadline, then give up keeping the committed prefix.
    pub fn begin_stop(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        *self.shared.give_up_at.lock() =
            Some(deadline - (left / 4).min(Duration::from_millis(500)));
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.set_gate();
    }

    /// Waits for the thread to drain its queue and exit (all senders must be dropped first);
    /// returns how many frames were left unrecorded because the disk still failed at shutdown.
    pub fn join(mut self) -> u64 {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.shared.health.lock().unrecorded_at_shutdown
    }
}

/// What the recorder does when a write fails (disk full, I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnRecordError {
    /// Keep retrying; the relay stops reading from the mod meanwhile (nothing is lost).
    #[default]
    Stall,
    /// Drop the failed batch (counted in the session's `lost_frames`) and keep relaying.
    Continue,
}

impl std::str::FromStr for OnRecordError {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stall" => Ok(OnRecordError::Stall),
            "continue" => Ok(OnRecordError::Continue),
            _ => Err(format!("unknown policy {s:?}: expected stall or continue")),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use gabp_storage::{Direction, FrameRecord};

    use super::*;

    fn frame(len: usize) -> RecMsg {
        RecMsg::Frame {
            session: SessionId::nil(),
            rec: FrameRecord::message(
                Direction::ModToRelay,
                0,
                1,
                true,
                Bytes::from(vec![b'x'; len]),
            ),
        }
    }

    /// A batch holds its room until it is committed, so the budget counts it: a queue of
    /// one-event batches in room for a thousand each once held ~0.5 GiB under a 256 MiB budget.
    #[test]
    fn a_batch_takes_budget_for_its_room_as_well_as_its_bodies() {
        const ALL: usize = super::DEFAULT_BUDGET / 1024;
        let mut roomy = Vec::with_capacity(1024);
        roomy.push(frame(300));
        let room = 1024 * std::mem::size_of::<RecMsg>() / 1024;
        assert!(
            budget_kib(&roomy, ALL) as usize >= room,
            "{}",
            budget_kib(&roomy, ALL)
        );
        let snug = vec![frame(300)];
        assert_eq!(budget_kib(&snug, ALL), 1);
        let big = vec![frame(64 * 1024), frame(64 * 1024)];
        assert_eq!(budget_kib(&big, ALL), 128);
        // A batch larger than a small budget takes all of it, never waits for more.
        assert_eq!(budget_kib(&big, 64), 64);
    }
}
