//! The session catalog in the store: listing sessions, looking one up, the details written
//! once (welcome, channel names, gaps), writing an entry outside a group commit, changing a
//! session's tags, and marking the sessions of a dead relay as crashed.
//!
//! Listing is one scan of the `catalog` column family: a few small keys per session (see
//! [`crate::keys`]), never a frame, so it stays fast with thousands of sessions.

use rocksdb::{Direction, IteratorMode, WriteBatch};

use crate::catalog::{encode_record, Counters, EndReason, Gap, Parts, SessionMeta, SessionState};
use crate::error::StoreError;
use crate::keys::{self, Detail, CF_CATALOG};
use crate::store::{Durability, Store};
use crate::SessionId;

impl Store {
    /// Every session in the catalog, oldest first (ids are UUID v7). Entries hold the session
    /// record, counters and bridges; [`Store::session`] and [`Store::resolve`] also fill in the
    /// welcome and channels.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        self.read_catalog(None)
    }

    /// Gathers the catalog's parts in key order, one session after another (or only `only`).
    fn read_catalog(&self, only: Option<SessionId>) -> Result<Vec<SessionMeta>, StoreError> {
        let start = only.map(keys::catalog_key);
        let mode = match &start {
            Some(k) => IteratorMode::From(k, Direction::Forward),
            None => IteratorMode::Start,
        };
        let mut out = Vec::new();
        let mut cur: Option<(SessionId, Parts)> = None;
        for item in self.db.iterator_cf(self.cf(CF_CATALOG), mode) {
            let (k, v) = item?;
            // A part a later version added is skipped, not an error: listing keeps working.
            let Some((id, part)) = keys::parse_catalog_key(&k) else {
                continue;
            };
            if only.is_some_and(|o| o != id) {
                break;
            }
            match &mut cur {
                Some((c, parts)) if *c == id => parts.add(part, &v)?,
                _ => {
                    if let Some((c, parts)) = cur.take() {
                        out.push(self.present(parts.into_meta(c)?));
                    }
                    let mut parts = Parts::default();
                    parts.add(part, &v)?;
                    cur = Some((id, parts));
                }
            }
        }
        if let Some((c, parts)) = cur {
            out.push(self.present(parts.into_meta(c)?));
        }
        Ok(out)
    }

    fn present(&self, mut m: SessionMeta) -> SessionMeta {
        if self.orphaned && m.state == Some(SessionState::Recording) {
            mark_crashed(&mut m);
        }
        m
    }

    /// One session's catalog entry with its welcome and channel names.
    pub fn session(&self, id: SessionId) -> Result<Option<SessionMeta>, StoreError> {
        match self.read_catalog(Some(id))?.pop() {
            Some(mut m) => {
                self.fill_details(&mut m)?;
                Ok(Some(m))
            }
            None => Ok(None),
        }
    }

    /// `meta` with its welcome and channel names: itself when they are there, else a copy
    /// filled from their own keys (an entry from [`Store::sessions`] holds counters only).
    pub fn with_details<'a>(
        &self,
        meta: &'a SessionMeta,
    ) -> Result<std::borrow::Cow<'a, SessionMeta>, StoreError> {
        if !meta.channels.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(meta));
        }
        let mut m = meta.clone();
        self.fill_details(&mut m)?;
        Ok(std::borrow::Cow::Owned(m))
    }

    /// Fills in the welcome and channel names stored under their own keys.
    pub fn fill_details(&self, m: &mut SessionMeta) -> Result<(), StoreError> {
        if let Some(w) = self.detail(m.id, Detail::Welcome, 0)? {
            m.welcome = Some(
                serde_json::from_slice(&w)
                    .map_err(|e| StoreError::Corrupt(format!("welcome: {e}")))?,
            );
        }
        self.for_each_detail(m.id, Detail::Channel, |id, v| {
            let i = id as usize;
            if m.channels.len() <= i {
                m.channels.resize(i + 1, String::new());
            }
            m.channels[i] = String::from_utf8_lossy(v).into_owned();
            Ok(())
        })
    }

    fn detail(&self, id: SessionId, kind: Detail, n: u64) -> Result<Option<Vec<u8>>, StoreError> {
        match self.details_cf() {
            Some(cf) => Ok(self.db.get_cf(cf, keys::detail_key(id, kind, n))?),
            None => Ok(None),
        }
    }

    /// Calls `f(number, value)` for every `details` record of one kind, in number order.
    pub(crate) fn for_each_detail(
        &self,
        id: SessionId,
        kind: Detail,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let Some(cf) = self.details_cf() else {
            return Ok(());
        };
        let start = keys::detail_key(id, kind, 0);
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
        {
            let (k, v) = item?;
            match keys::parse_detail_key(&k) {
                Some((s, kd, n)) if s == id && kd == kind as u8 => f(n, &v)?,
                _ => break,
            }
        }
        Ok(())
    }

    /// A session's gaps: frames lost to failed writes under `continue`.
    pub fn gaps(&self, id: SessionId) -> Result<Vec<Gap>, StoreError> {
        let mut out = Vec::new();
        self.for_each_detail(id, Detail::Gap, |_, v| {
            out.push(
                serde_json::from_slice(v)
                    .map_err(|e| StoreError::Corrupt(format!("gap record: {e}")))?,
            );
            Ok(())
        })?;
        Ok(out)
    }

    /// Finds a session by full id, unique id prefix, or `latest`; with welcome and channels.
    pub fn resolve(&self, query: &str) -> Result<SessionMeta, StoreError> {
        let mut m = self.resolve_entry(query)?;
        self.fill_details(&mut m)?;
        Ok(m)
    }

    fn resolve_entry(&self, query: &str) -> Result<SessionMeta, StoreError> {
        let all = self.sessions()?;
        if query == "latest" || query == "last" {
            return all
                .into_iter()
                .last()
                .ok_or_else(|| StoreError::NoSuchSession(query.into()));
        }
        let q = query.to_ascii_lowercase();
        let mut hits = all.into_iter().filter(|m| {
            m.id.to_string().starts_with(&q) || m.id.simple().to_string().starts_with(&q)
        });
        match (hits.next(), hits.next()) {
            (Some(m), None) if !q.is_empty() => Ok(m),
            (Some(_), Some(_)) => Err(StoreError::Ambiguous(query.into())),
            _ => Err(StoreError::NoSuchSession(query.into())),
        }
    }

    /// Writes a whole catalog entry on its own (outside a group commit): the session record,
    /// counters and every bridge, plus the welcome and channels when `meta` carries them. An
    /// older data dir's single entry for the session is replaced by these parts.
    pub fn put_meta(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        put_parts(self, &mut batch, meta);
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(self.opts.durability == Durability::Batch);
        self.db.write_opt(batch, &wo)?;
        Ok(())
    }

    /// Replaces a session's tags (only its session record is rewritten). Call on a store
    /// opened with [`Store::open_for_change`], so no relay is writing the record meanwhile.
    pub fn set_tags(
        &self,
        id: SessionId,
        tags: std::collections::BTreeMap<String, String>,
    ) -> Result<SessionMeta, StoreError> {
        let mut m = self
            .read_catalog(Some(id))?
            .pop()
            .ok_or_else(|| StoreError::NoSuchSession(id.to_string()))?;
        m.tags = tags;
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(CF_CATALOG),
            keys::session_key(id),
            encode_record(&m),
        );
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(self.opts.durability == Durability::Batch);
        self.db.write_opt(batch, &wo)?;
        Ok(m)
    }

    /// Marks sessions left `recording` by a dead relay as ended by crash. Called on every
    /// read-write open, when no other relay can be writing (RocksDB's lock is held). A session
    /// collected from elsewhere is left as its source last said: its relay may be recording
    /// it still, and its end arrives with a later catalog snapshot.
    pub fn recover_crashed(&self) -> Result<Vec<SessionId>, StoreError> {
        let mut fixed = Vec::new();
        for mut m in self.sessions()? {
            if m.state == Some(SessionState::Recording) && self.origin(m.id)?.is_none() {
                mark_crashed(&mut m);
                self.put_meta(&m)?;
                fixed.push(m.id);
            }
        }
        Ok(fixed)
    }
}

fn mark_crashed(m: &mut SessionMeta) {
    m.state = Some(SessionState::Ended);
    m.end_reason = Some(EndReason::Crash);
    m.ended_ns = Some(m.last_ns.max(m.started_ns));
    for b in &mut m.bridges {
        b.detached_ns.get_or_insert(m.last_ns);
    }
}

/// Adds every part of `meta`'s catalog entry to `batch`, replacing a legacy entry.
pub(crate) fn put_parts(store: &Store, batch: &mut WriteBatch, meta: &SessionMeta) {
    let cf = store.cf(CF_CATALOG);
    batch.delete_cf(cf, keys::catalog_key(meta.id));
    batch.put_cf(cf, keys::session_key(meta.id), encode_record(meta));
    batch.put_cf(cf, keys::counters_key(meta.id), Counters::of(meta).encode());
    for b in &meta.bridges {
        batch.put_cf(
            cf,
            keys::bridge_key(meta.id, b.conn),
            serde_json::to_vec(b).expect("a bridge serializes"),
        );
    }
    // An older entry's inline welcome and channels move to their own keys.
    if let Some(details) = store.details_cf() {
        if let Some(w) = &meta.welcome {
            batch.put_cf(
                details,
                keys::detail_key(meta.id, Detail::Welcome, 0),
                serde_json::to_vec(w).expect("a JSON value serializes"),
            );
        }
        for (i, name) in meta.channels.iter().enumerate() {
            batch.put_cf(
                details,
                keys::detail_key(meta.id, Detail::Channel, i as u64),
                name.as_bytes(),
            );
        }
    }
}
