//! The recorder thread: takes frame records over a bounded queue and group-commits them.
//!
//! The queue blocks its senders when full, so a recorder that falls behind slows the mod
//! reader (and through TCP, the game) instead of dropping anything. RocksDB runs only on this
//! thread, never on an async worker. Each loop takes everything queued (up to a cap), writes it
//! as one batch, and syncs once per batch when durability is `batch`.
//!
//! A failed commit is never silent: it is logged, counted, and the policy applies. `stall`
//! retries with backoff (the queue fills and the relay stops reading from the mod); `continue`
//! drops the batch, counting the loss in the session's catalog entry.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::sync::Arc;

use gabp_storage::{
    BridgeInfo, EndReason, FrameRecord, SessionId, SessionMeta, SessionWriter, Store,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::config::OnRecordError;

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
}

/// Queue capacity in batches: deep enough to ride out a slow fsync or a RocksDB write stall of
/// a second or more at low rates, where batches are small; memory is bounded by `BUDGET_KIB`.
pub const QUEUE: usize = 16 * 1024;
/// Body bytes the queue may hold, in KiB: the recorder's memory bound whatever frames arrive.
pub const BUDGET_KIB: usize = 256 * 1024;
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

/// Handle for sending to the recorder.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<RecBatch>,
    budget: Arc<Semaphore>,
}

/// The running recorder thread.
#[derive(Debug)]
pub struct RecorderThread {
    handle: Option<JoinHandle<()>>,
}

impl Recorder {
    /// Starts the recorder thread over `store`.
    pub fn start(store: Store, policy: OnRecordError) -> (Recorder, RecorderThread) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let handle = std::thread::Builder::new()
            .name("gabp-recorder".into())
            .spawn(move || run(SessionWriter::new(store), rx, policy))
            .expect("spawning the recorder thread");
        (
            Recorder {
                tx,
                budget: Arc::new(Semaphore::new(BUDGET_KIB)),
            },
            RecorderThread {
                handle: Some(handle),
            },
        )
    }

    /// Sends a message, waiting while the queue is full (this is the lossless backpressure).
    pub async fn send(&self, msg: RecMsg) {
        self.send_batch(vec![msg]).await;
    }

    /// Sends messages as one batch, waiting for queue room and byte budget.
    pub async fn send_batch(&self, msgs: Vec<RecMsg>) {
        if msgs.is_empty() {
            return;
        }
        let bytes: usize = msgs
            .iter()
            .map(|m| {
                if let RecMsg::Frame { rec, .. } = m {
                    rec.body.len()
                } else {
                    0
                }
            })
            .sum();
        let kib = (bytes / 1024).clamp(1, BUDGET_KIB) as u32;
        let budget = self.budget.clone().acquire_many_owned(kib).await.ok();
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
    }

    /// Sends without ever waiting: for tasks that must not stall (bridge writers). When the
    /// queue is full the message is handed to a task that waits, so it is still recorded.
    pub fn send_detached(&self, msg: RecMsg) {
        let bytes = if let RecMsg::Frame { rec, .. } = &msg {
            rec.body.len()
        } else {
            0
        };
        let kib = (bytes / 1024).clamp(1, BUDGET_KIB) as u32;
        let msg = match self.budget.clone().try_acquire_many_owned(kib) {
            Ok(permit) => match self.tx.try_send(RecBatch {
                msgs: vec![msg],
                _budget: Some(permit),
            }) {
                Ok(()) => return,
                Err(
                    mpsc::error::TrySendError::Full(mut b)
                    | mpsc::error::TrySendError::Closed(mut b),
                ) => b.msgs.pop().expect("the batch holds the message"),
            },
            Err(_) => msg,
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
}

impl RecorderThread {
    /// Waits for the thread to drain its queue and exit (all senders must be dropped first).
    pub fn join(mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn apply(w: &mut SessionWriter, msg: RecMsg, flushes: &mut Vec<oneshot::Sender<()>>) {
    match msg {
        RecMsg::Begin(meta) => w.begin(*meta),
        RecMsg::Channel { session, id, name } => w.define_channel(session, id, &name),
        RecMsg::Frame { session, rec } => {
            w.append(session, &rec);
        }
        RecMsg::Bridge { session, info } => w.upsert_bridge(session, *info),
        RecMsg::Anomaly { session } => w.note_anomaly(session),
        RecMsg::End {
            session,
            reason,
            at_ns,
        } => w.end(session, reason, at_ns),
        RecMsg::Flush(done) => flushes.push(done),
    }
}

/// Lowers this thread's CPU priority (nice 10): fanning out and answering bridges come first;
/// the recorder keeps up anyway, and if it ever falls behind its queue slows the mod, losing
/// nothing.
fn lower_own_priority() {
    // SAFETY: setpriority(2) on the calling thread (who = 0 names the caller's TID on Linux);
    // it takes no pointers and touches no memory.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    if rc != 0 {
        tracing::debug!("could not lower the recorder thread's priority");
    }
}

fn run(mut w: SessionWriter, mut rx: mpsc::Receiver<RecBatch>, policy: OnRecordError) {
    lower_own_priority();
    let frames = metrics::counter!("gabp_recorded_frames_total");
    let commits = metrics::histogram!("gabp_record_commit_seconds");
    let errors = metrics::counter!("gabp_record_errors_total");
    let lost = metrics::counter!("gabp_record_lost_frames_total");
    let mut flushes = Vec::new();
    // Batches are kept until their commit so their byte budget is released only then.
    let mut held = Vec::with_capacity(MAX_BATCH);
    let mut last_commit = Instant::now();
    while let Some(first) = rx.blocking_recv() {
        held.push(first);
        // Gather until the tick is over (or the batch is large), then commit once.
        loop {
            while held.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(b) => held.push(b),
                    Err(_) => break,
                }
            }
            let flush_asked = held.iter().any(|b| {
                b.msgs
                    .iter()
                    .any(|m| matches!(m, RecMsg::Flush(_) | RecMsg::End { .. }))
            });
            let due = last_commit + COMMIT_INTERVAL;
            let now = Instant::now();
            if held.len() >= MAX_BATCH || flush_asked || now >= due {
                break;
            }
            // One sleep to the tick, not many short ones: fewer wake-ups competing with the
            // relay's readers and writers for the cores (a flush request waits ≤ 10 ms).
            std::thread::sleep(due - now);
        }
        for b in held.iter_mut() {
            for msg in b.msgs.drain(..) {
                apply(&mut w, msg, &mut flushes);
            }
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            let started = Instant::now();
            match w.commit() {
                Ok(n) => {
                    frames.increment(n as u64);
                    commits.record(started.elapsed().as_secs_f64());
                    break;
                }
                Err(e) => {
                    errors.increment(1);
                    w.note_error();
                    match policy {
                        OnRecordError::Stall => {
                            tracing::error!(error = %e, retry_in = ?backoff, "recording failed; holding the mod until it succeeds");
                            std::thread::sleep(backoff);
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                        }
                        OnRecordError::Continue => {
                            let n = w.discard_staged();
                            lost.increment(n as u64);
                            tracing::error!(error = %e, lost_frames = n, "recording failed; batch dropped (on-record-error=continue)");
                            // Try to record the loss itself; if that fails too, it stays counted.
                            if w.commit().is_err() {
                                w.discard_staged();
                            }
                            break;
                        }
                    }
                }
            }
        }
        held.clear();
        last_commit = Instant::now();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
    // Every sender is gone: whatever is open was ended by its route; commit what remains.
    if let Err(e) = w.commit() {
        tracing::error!(error = %e, "final recorder commit failed");
    }
    if let Err(e) = w.store().sync() {
        tracing::error!(error = %e, "final WAL sync failed");
    }
}
