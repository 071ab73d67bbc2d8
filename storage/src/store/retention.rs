//! Deleting sessions and retention (what a rule would delete, then deleting it), and giving
//! their disk space back.
//!
//! A delete is one synced batch of range deletions (frames, index, details) and catalog
//! deletes: the session is gone for every reader at once. Range deletions alone free nothing
//! on disk, so the space is then reclaimed: table files wholly inside the session's ranges are
//! dropped (no I/O), and what is left of the ranges is compacted away. A relay (retention on
//! its recorder thread) hands that compaction to a background thread, so recording goes on; a
//! command opened with [`Store::open_for_change`] compacts before returning, so the space is
//! free when `sessions rm` exits.

use std::sync::{Arc, Condvar, Mutex};

use rocksdb::{BottommostLevelCompaction, CompactOptions, DB};

use crate::catalog::{SessionMeta, SessionState};
use crate::destination::Destination;
use crate::error::StoreError;
use crate::keys::{self, CF_CATALOG, CF_CHAN_INDEX, CF_DETAILS, CF_FRAMES};
use crate::store::Store;
use crate::SessionId;

/// The column families a session's bulk lives in.
const RANGED: [&str; 3] = [CF_FRAMES, CF_CHAN_INDEX, CF_DETAILS];

/// Reclaims the space of deleted sessions, inline or on a thread of its own. Shared by every
/// clone of a [`Store`]; when the last one goes, a compaction under way is stopped (the
/// deletes are already durable; only the space waits for RocksDB's own compactions).
pub(crate) struct Reclaimer {
    db: Arc<DB>,
    background: bool,
    work: Arc<(Mutex<Work>, Condvar)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The background thread's queue: one id per deleted session (as many as were deleted).
#[derive(Default)]
struct Work {
    queued: Vec<SessionId>,
    /// Queued or being compacted.
    pending: usize,
    stop: bool,
}

impl Reclaimer {
    pub(crate) fn new(db: Arc<DB>, background: bool) -> Reclaimer {
        Reclaimer {
            db,
            background,
            work: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    fn reclaim(&self, id: SessionId) {
        if !self.background {
            compact_session(&self.db, id);
            return;
        }
        let (work, wake) = &*self.work;
        {
            let mut w = work.lock().expect("reclaim lock");
            w.queued.push(id);
            w.pending += 1;
        }
        wake.notify_all();
        let mut thread = self.thread.lock().expect("reclaim lock");
        if thread.is_none() {
            let (db, work) = (self.db.clone(), self.work.clone());
            let spawned = std::thread::Builder::new()
                .name("gabp-reclaim".into())
                .spawn(move || reclaim_loop(&db, &work));
            match spawned {
                Ok(t) => *thread = Some(t),
                // No thread: the space waits for RocksDB's own compactions.
                Err(e) => tracing::warn!(error = %e, "cannot start reclaiming disk space"),
            }
        }
    }

    fn wait(&self) {
        if self.thread.lock().expect("reclaim lock").is_none() {
            return;
        }
        let (work, idle) = &*self.work;
        let mut w = work.lock().expect("reclaim lock");
        while w.pending > 0 {
            w = idle.wait(w).expect("reclaim lock");
        }
    }
}

fn reclaim_loop(db: &DB, work: &(Mutex<Work>, Condvar)) {
    let (lock, cv) = work;
    loop {
        let id = {
            let mut w = lock.lock().expect("reclaim lock");
            loop {
                if w.stop {
                    return;
                }
                if let Some(id) = w.queued.pop() {
                    break id;
                }
                w = cv.wait(w).expect("reclaim lock");
            }
        };
        compact_session(db, id);
        lock.lock().expect("reclaim lock").pending -= 1;
        cv.notify_all();
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        let Some(t) = self.thread.get_mut().ok().and_then(Option::take) else {
            return;
        };
        if let Ok(mut w) = self.work.0.lock() {
            w.stop = true;
        }
        self.work.1.notify_all();
        // The last handle is going: stop a compaction under way rather than hold the shutdown
        // (or a reopen after an I/O error) for it.
        self.db.cancel_all_background_work(true);
        let _ = t.join();
    }
}

/// Drops the table files wholly inside `id`'s ranges, then compacts what is left of them.
fn compact_session(db: &DB, id: SessionId) {
    let (start, end) = (keys::catalog_key(id), keys::session_end(id));
    let mut co = CompactOptions::default();
    // Automatic compactions (the recorder's flushes into L0) keep running beside this one.
    co.set_exclusive_manual_compaction(false);
    // Without a compaction filter RocksDB would skip the bottom level, where old sessions are.
    co.set_bottommost_level_compaction(BottommostLevelCompaction::ForceOptimized);
    for name in RANGED {
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        if let Err(e) = db.delete_file_in_range_cf(&cf, &start[..], &end[..]) {
            tracing::warn!(error = %e, "could not drop the table files of a deleted session");
        }
        db.compact_range_cf_opt(&cf, Some(&start[..]), Some(&end[..]), &co);
    }
}

impl Store {
    /// Deletes a session (its frames, index entries, details and catalog entry) in one synced
    /// batch, then reclaims its disk space: in the background for a relay, before returning
    /// for a store opened with [`Store::open_for_change`].
    pub fn delete_session(&self, id: SessionId) -> Result<(), StoreError> {
        let start = keys::catalog_key(id);
        let end = keys::session_end(id);
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_FRAMES), &start[..], &end[..]);
        batch.delete_range_cf(self.cf(CF_CHAN_INDEX), &start[..], &end[..]);
        if let Some(cf) = self.details_cf() {
            batch.delete_range_cf(cf, &start[..], &end[..]);
        }
        // The catalog is small: point deletes of each part (and of an older data dir's entry).
        let catalog = self.cf(CF_CATALOG);
        let iter = self.db.iterator_cf(
            catalog,
            rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward),
        );
        for item in iter {
            let (k, _) = item?;
            if !k.starts_with(&start) {
                break;
            }
            batch.delete_cf(catalog, k);
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        self.reclaimer.reclaim(id);
        Ok(())
    }

    /// Waits until the disk space of every session deleted so far has been reclaimed.
    pub fn wait_reclaimed(&self) {
        self.reclaimer.wait();
    }

    /// What retention by `rule` would delete now, oldest first, and what it keeps that it would
    /// otherwise delete. Reads the catalog (and ship cursors) only; [`Store::delete_expired`] deletes.
    pub fn retention_plan(&self, rule: &RetentionRule) -> Result<RetentionPlan, StoreError> {
        let sessions = self.sessions()?;
        let before: u64 = sessions.iter().map(|m| m.bytes).sum();
        let mut plan = RetentionPlan {
            before_bytes: before,
            ..RetentionPlan::default()
        };
        // What is left once the sessions planned so far are gone: oldest go first while it
        // is over the size.
        let mut left = before;
        for m in sessions {
            let over_age = rule.max_age_ns.is_some_and(|age| {
                rule.now_ns.saturating_sub(m.ended_ns.unwrap_or(m.last_ns)) > age
            });
            let over_size = rule.max_bytes.is_some_and(|cap| left > cap);
            if !over_age && !over_size {
                continue;
            }
            if m.state != Some(SessionState::Ended) {
                plan.kept_recording += 1;
                continue;
            }
            let shipped = match rule.deletable {
                Deletable::Ended => true,
                Deletable::ShippedTo(Some(to)) => self.fully_shipped_to(&m, to)?,
                Deletable::ShippedTo(None) => false,
                Deletable::ShippedAnywhere => self.fully_shipped(&m)?,
            };
            if !shipped {
                plan.kept_unshipped += 1;
                continue;
            }
            left -= m.bytes;
            plan.expired.push(Expired {
                meta: m,
                over_age,
                over_size,
            });
        }
        plan.after_bytes = left;
        Ok(plan)
    }

    /// Deletes what retention by `rule` finds ([`Store::retention_plan`]), oldest first, each
    /// with [`Store::delete_session`], calling `deleted` after each (a relay logs it there: on
    /// an error, what was deleted before it has been said). Returns what it deleted.
    pub fn delete_expired(
        &self,
        rule: &RetentionRule,
        mut deleted: impl FnMut(&Expired),
    ) -> Result<Vec<Expired>, StoreError> {
        let plan = self.retention_plan(rule)?;
        for e in &plan.expired {
            self.delete_session(e.meta.id)?;
            deleted(e);
        }
        Ok(plan.expired)
    }

    /// Deletes ended sessions older than `max_age_ns` or beyond `max_bytes` in total (oldest
    /// first). Returns the ids deleted. Sessions still recording are never deleted.
    pub fn apply_retention(
        &self,
        now_ns: u64,
        max_age_ns: Option<u64>,
        max_bytes: Option<u64>,
    ) -> Result<Vec<SessionId>, StoreError> {
        let rule = RetentionRule {
            now_ns,
            max_age_ns,
            max_bytes,
            deletable: Deletable::Ended,
        };
        Ok(self
            .delete_expired(&rule, |_| {})?
            .into_iter()
            .map(|e| e.meta.id)
            .collect())
    }

    /// Retention that keeps what destination `to` does not have whole (everything unshipped
    /// while `to` is unknown: an earlier destination's copy may since have been deleted):
    /// deletes ended sessions older than `max_age_ns` or beyond `max_bytes` (oldest first).
    pub fn apply_retention_shipped(
        &self,
        now_ns: u64,
        max_age_ns: Option<u64>,
        max_bytes: Option<u64>,
        to: Option<Destination>,
    ) -> Result<Vec<SessionId>, StoreError> {
        let rule = RetentionRule {
            now_ns,
            max_age_ns,
            max_bytes,
            deletable: Deletable::ShippedTo(to),
        };
        Ok(self
            .delete_expired(&rule, |_| {})?
            .into_iter()
            .map(|e| e.meta.id)
            .collect())
    }
}

/// Which ended sessions retention may delete (one still recording never is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletable {
    /// Every ended session.
    Ended,
    /// Only those this destination acknowledged whole; none while it is unknown (`None`).
    ShippedTo(Option<Destination>),
    /// Only those some destination acknowledged whole.
    ShippedAnywhere,
}

/// A retention rule: delete ended sessions that ended more than `max_age_ns` before `now_ns`,
/// and the oldest while all sessions together hold more than `max_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct RetentionRule {
    /// Now, in ns since the epoch.
    pub now_ns: u64,
    /// The oldest a session may be, counted from its end (its last frame if it has none).
    pub max_age_ns: Option<u64>,
    /// The most all sessions together may hold (their recorded bytes).
    pub max_bytes: Option<u64>,
    /// Which sessions may go.
    pub deletable: Deletable,
}

/// A session retention deletes, and why.
#[derive(Debug, Clone)]
pub struct Expired {
    /// Its catalog entry as it was.
    pub meta: SessionMeta,
    /// It ended longer ago than the age allows.
    pub over_age: bool,
    /// The sessions up to and including it hold more than the size allows.
    pub over_size: bool,
}

impl Expired {
    /// Why, in words: `over age`, `over size` or `over age and size`.
    pub fn why(&self) -> &'static str {
        match (self.over_age, self.over_size) {
            (true, true) => "over age and size",
            (true, false) => "over age",
            _ => "over size",
        }
    }
}

/// What retention would do now.
#[derive(Debug, Clone, Default)]
pub struct RetentionPlan {
    /// The sessions it deletes, oldest first.
    pub expired: Vec<Expired>,
    /// Sessions over the age or size kept because they are still recording (or were when a
    /// relay stopped without ending them: `repair` ends them).
    pub kept_recording: usize,
    /// Sessions over the age or size kept because they are not shipped whole.
    pub kept_unshipped: usize,
    /// Recorded bytes of every session before.
    pub before_bytes: u64,
    /// Recorded bytes of every session once the expired are gone.
    pub after_bytes: u64,
}
