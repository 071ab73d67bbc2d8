//! The recorder thread's loop: take what is queued, apply it to the session writers, commit
//! once per tick under the `--on-record-error` policy (retrying whole batches, reopening the
//! store, or recording a gap), note health, and stop within the shutdown bound. The only place
//! RocksDB is written; it must never run on an async worker.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gabp_storage::SessionWriter;
use tokio::sync::{mpsc, oneshot};

use super::OnRecordError;
use super::{RecBatch, RecMsg, Shared, COMMIT_INTERVAL, MAX_BATCH};

/// Applies one message to the session writer; flush requests are answered after the commit,
/// and a mark request (`mark` set) is met after it too.
pub(super) fn apply(
    w: &mut SessionWriter,
    msg: RecMsg,
    flushes: &mut Vec<oneshot::Sender<()>>,
    mark: &mut bool,
) {
    match msg {
        RecMsg::Mark => *mark = true,
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
        RecMsg::Retain {
            max_age_ns,
            max_bytes,
            keep_unshipped,
        } => {
            if let Some(s) = w.store() {
                super::apply_retention(s, max_age_ns, max_bytes, keep_unshipped);
            }
        }
    }
}

/// Reopens the store, taking it from readers (resume, shipper) meanwhile: a handle there would
/// keep the old database, and RocksDB's lock, open.
fn reopen(w: &mut SessionWriter, shared: &Shared) -> Result<(), gabp_storage::StoreError> {
    let started = Instant::now();
    drop(shared.store.lock().take());
    let r = w.reopen();
    *shared.store.lock() = w.store().cloned();
    *shared.reopen_took.lock() = started.elapsed();
    r
}

/// Whether a reopen, taking as long as the last one, ends well before the recorder gives up.
fn reopen_fits(shared: &Shared) -> bool {
    let Some(give_up) = *shared.give_up_at.lock() else {
        return true;
    };
    give_up.saturating_duration_since(Instant::now()) > *shared.reopen_took.lock() * 2
}

/// Notes a failed commit in the health record, the gauge and (rate-limited) the log.
pub(super) fn note_failure(shared: &Shared, e: &gabp_storage::StoreError, what: &str) {
    let line = e.to_string();
    let log = {
        let mut h = shared.health.lock();
        let first = h.ok;
        h.ok = false;
        h.failing_since_ns
            .get_or_insert_with(gabp_rt::clock::now_ns);
        h.retries += 1;
        let changed = h.last_error.as_deref() != Some(line.as_str());
        h.last_error = Some(line.clone());
        // Log the first failure, a new error, and then every 20th retry.
        first || changed || h.retries.is_multiple_of(20)
    };
    metrics::gauge!("gabp_recorder_healthy").set(0.0);
    shared.set_gate();
    if log {
        tracing::error!(error = %line, "recording failed; {what}");
    }
}

pub(super) fn note_success(shared: &Shared) {
    let mut h = shared.health.lock();
    if !h.ok {
        let since = h.failing_since_ns.take().unwrap_or_default();
        let secs = gabp_rt::clock::now_ns().saturating_sub(since) as f64 / 1e9;
        h.ok = true;
        drop(h);
        metrics::gauge!("gabp_recorder_healthy").set(1.0);
        shared.set_gate();
        tracing::info!(
            failing_for_s = format!("{secs:.1}"),
            "recording works again"
        );
    }
}

/// Sleeps up to `d`, returning early when shutdown begins, and during shutdown not past the
/// moment the recorder gives up.
pub(super) fn nap(shared: &Shared, d: Duration) {
    let was_stopping = shared.stopping.load(Ordering::Relaxed);
    let mut until = Instant::now() + d;
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            if !was_stopping {
                return;
            }
            if let Some(by) = *shared.give_up_at.lock() {
                until = until.min(by);
            }
        }
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

/// Lowers this thread's CPU priority (nice 10): fanning out and answering bridges come first;
/// the recorder keeps up anyway, and if it ever falls behind its queue slows the mod, losing
/// nothing.
pub(super) fn lower_own_priority() {
    // SAFETY: setpriority(2) on the calling thread (who = 0 names the caller's TID on Linux);
    // it takes no pointers and touches no memory.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    if rc != 0 {
        tracing::debug!("could not lower the recorder thread's priority");
    }
}

/// Commits what is staged, applying the failure policy; returns true if it gave up because
/// shutdown began while writes were failing.
pub(super) fn commit_with_policy(
    w: &mut SessionWriter,
    shared: &Shared,
    last_reopen: &mut Instant,
) -> bool {
    let frames = metrics::counter!("gabp_recorded_frames_total");
    let commits = metrics::histogram!("gabp_record_commit_seconds");
    let errors = metrics::counter!("gabp_record_errors_total");
    let lost = metrics::counter!("gabp_record_lost_frames_total");
    let mut backoff = Duration::from_millis(50);
    loop {
        let started = Instant::now();
        let e = match w.commit() {
            Ok(n) => {
                frames.increment(n as u64);
                commits.record(started.elapsed().as_secs_f64());
                note_success(shared);
                return false;
            }
            Err(e) => e,
        };
        errors.increment(1);
        w.note_error();
        let give_up_at = *shared.give_up_at.lock();
        if shared.stopping.load(Ordering::Relaxed) && give_up_at.is_none_or(|t| Instant::now() >= t)
        {
            let n = w.discard_staged();
            lost.increment(n as u64);
            let mut h = shared.health.lock();
            h.lost_frames += n as u64;
            h.unrecorded_at_shutdown += n as u64;
            drop(h);
            tracing::error!(error = %e, lost_frames = n, "recording failed during shutdown; giving up: the recording ends at its last committed frame (frames still queued are dropped too; the total is said at exit)");
            return true;
        }
        match shared.policy {
            OnRecordError::Stall => {
                note_failure(shared, &e, "holding the mod and retrying the whole batch");
                nap(shared, backoff);
                // Shutting down, retry often: the bound is near.
                let cap = if shared.stopping.load(Ordering::Relaxed) {
                    Duration::from_millis(250)
                } else {
                    Duration::from_secs(2)
                };
                backoff = (backoff * 2).min(cap);
                // RocksDB fails every write after an I/O error until it is reopened.
                if reopen_fits(shared) {
                    if let Err(e) = reopen(w, shared) {
                        tracing::debug!(error = %e, "reopening the data dir failed; retrying");
                    }
                }
            }
            OnRecordError::Continue => {
                let n = w.discard_staged();
                lost.increment(n as u64);
                shared.health.lock().lost_frames += n as u64;
                note_failure(
                    shared,
                    &e,
                    "batch dropped and recorded as a gap (on-record-error=continue)",
                );
                // Frames keep flowing meanwhile: reopen at most once a second.
                if last_reopen.elapsed() >= Duration::from_secs(1) && reopen_fits(shared) {
                    *last_reopen = Instant::now();
                    if let Err(e) = reopen(w, shared) {
                        tracing::debug!(error = %e, "reopening the data dir failed");
                    } else if w.commit().is_ok() {
                        // The gap record is in; else it goes with the next commit.
                        note_success(shared);
                    }
                }
                return false;
            }
        }
    }
}

pub(super) fn run(mut w: SessionWriter, mut rx: mpsc::Receiver<RecBatch>, shared: &Shared) {
    lower_own_priority();
    let lost = metrics::counter!("gabp_record_lost_frames_total");
    let mut flushes = Vec::new();
    let mut gave_up = false;
    let mut last_reopen = Instant::now();
    // Batches are kept until their commit so their byte budget is released only then.
    let mut held = Vec::with_capacity(MAX_BATCH);
    let mut last_commit = Instant::now();
    // Whether anything was written since the committed mark was last moved.
    let mut unmarked = false;
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
        let mut mark = false;
        for b in held.iter_mut() {
            for msg in b.msgs.drain(..) {
                unmarked |= !matches!(msg, RecMsg::Mark);
                apply(&mut w, msg, &mut flushes, &mut mark);
            }
        }
        if gave_up {
            // Shutdown gave up on a failing disk: count, do not retry.
            let n = w.discard_staged();
            lost.increment(n as u64);
            let mut h = shared.health.lock();
            h.lost_frames += n as u64;
            h.unrecorded_at_shutdown += n as u64;
        } else {
            gave_up = commit_with_policy(&mut w, shared, &mut last_reopen);
            if mark && unmarked && !gave_up && shared.health.lock().ok {
                // Synced (a no-op wait under `batch`, the only sync under `none`), then marked.
                match w.store().map(|s| s.sync()) {
                    Some(Ok(())) => unmarked = false,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "could not move the committed mark")
                    }
                    None => {}
                }
            }
        }
        held.clear();
        last_commit = Instant::now();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
    drop(shared.store.lock().take());
    if gave_up {
        return;
    }
    // Every sender is gone: whatever is open was ended by its route; commit what remains.
    if let Err(e) = w.commit() {
        // Under `continue` too: what is dropped now, and losses whose gap record never got
        // in, are nowhere in the recording, so they are counted for the exit.
        let dropped = w.discard_staged() as u64;
        let n = w.unrecorded_losses();
        lost.increment(dropped);
        let mut h = shared.health.lock();
        h.lost_frames += dropped;
        h.unrecorded_at_shutdown += n;
        drop(h);
        tracing::error!(error = %e, unrecorded_frames = n, "final recorder commit failed; the recording ends at its last committed frame");
    }
    if let Some(Err(e)) = w.store().map(|s| s.sync()) {
        tracing::error!(error = %e, "final WAL sync failed");
    }
    // Tables, not only the write-ahead log, hold the recording once stopped, when the
    // shutdown bound leaves time for it (a memtable of 64 MiB takes well under a second).
    let room = (*shared.give_up_at.lock())
        .is_none_or(|t| t.saturating_duration_since(Instant::now()) >= Duration::from_secs(2));
    if room {
        if let Some(Err(e)) = w.store().map(|s| s.flush_tables()) {
            tracing::warn!(error = %e, "could not write the recording out as tables at the stop; it is in the write-ahead log");
        }
    }
    // The shipper ships what was committed last (it lets go of the store when done).
    *shared.store.lock() = if shared.ship.get().is_some() {
        w.store().cloned()
    } else {
        None
    };
}
