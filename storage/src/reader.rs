//! Streaming reads of a recorded session: every frame in arrival order, or one channel from a
//! given relay seq; one frame by number; the first frame at a time offset; event counts from
//! the channel index. Memory stays at one chunk whatever the session's size.

use std::sync::atomic::Ordering;

use rocksdb::{Direction as ScanDirection, IteratorMode, DB};

use crate::chunk::{self, FrameRecord};
use crate::error::StoreError;
use crate::keys::{self, IndexEntry, CF_CHAN_INDEX, CF_FRAMES};
use crate::meter::ReadMeter;
use crate::store::Store;
use crate::SessionId;

/// A frame with its number within the session.
pub type Numbered = (u64, FrameRecord);

/// Iterates a session's frames in arrival order.
pub struct FrameIter<'a> {
    iter: rocksdb::DBIteratorWithThreadMode<'a, DB>,
    meter: &'a ReadMeter,
    session: SessionId,
    chunk: std::vec::IntoIter<FrameRecord>,
    next_no: u64,
    /// Frames numbered below this are read but not returned.
    skip_before: u64,
    done: bool,
}

impl Iterator for FrameIter<'_> {
    type Item = Result<Numbered, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(rec) = self.chunk.next() {
                let n = self.next_no;
                self.next_no += 1;
                if n < self.skip_before {
                    continue;
                }
                return Some(Ok((n, rec)));
            }
            if self.done {
                return None;
            }
            let (k, v) = match self.iter.next()? {
                Ok(kv) => kv,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e.into()));
                }
            };
            match keys::parse_frame_key(&k) {
                Some((s, first)) if s == self.session => {
                    self.next_no = first;
                    match chunk::decode(bytes::Bytes::from(v.into_vec())) {
                        Ok(recs) => {
                            self.meter
                                .frames
                                .fetch_add(recs.len() as u64, Ordering::Relaxed);
                            self.chunk = recs.into_iter();
                        }
                        Err(e) => {
                            self.done = true;
                            return Some(Err(e));
                        }
                    }
                }
                _ => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

impl Store {
    /// What this store's readers have read so far (to watch from another thread).
    pub fn read_meter(&self) -> std::sync::Arc<ReadMeter> {
        self.meter.clone()
    }

    /// Every frame of `session` in arrival order, from frame `from` on.
    pub fn frames_from(&self, session: SessionId, from: u64) -> FrameIter<'_> {
        // Start at the chunk holding `from`: the last chunk key at or before it.
        let target = keys::frame_key(session, from);
        let mut first = keys::frame_key(session, 0);
        let mut rev = self.db.iterator_cf(
            self.cf(CF_FRAMES),
            IteratorMode::From(&target, ScanDirection::Reverse),
        );
        if let Some(Ok((k, _))) = rev.next() {
            if let Some((s, n)) = keys::parse_frame_key(&k) {
                if s == session {
                    first = keys::frame_key(session, n);
                }
            }
        }
        // A scan reads each block once: keeping its blocks in the block cache (up to the cache's
        // size, per column family) only costs memory.
        let mut ro = rocksdb::ReadOptions::default();
        ro.fill_cache(false);
        let iter = self.db.iterator_cf_opt(
            self.cf(CF_FRAMES),
            ro,
            IteratorMode::From(&first, ScanDirection::Forward),
        );
        self.meter.reading(session);
        FrameIter {
            iter,
            meter: &self.meter,
            session,
            chunk: Vec::new().into_iter(),
            next_no: 0,
            skip_before: from,
            done: false,
        }
    }

    /// Every frame of `session` in arrival order.
    pub fn frames(&self, session: SessionId) -> FrameIter<'_> {
        self.frames_from(session, 0)
    }

    /// The frame number where channel `channel`'s frames with relay seq `>= seq` begin, from
    /// the channel index; `None` if the channel has no such frames.
    pub fn channel_start(
        &self,
        session: SessionId,
        channel: u32,
        seq: u64,
    ) -> Result<Option<u64>, StoreError> {
        // The chunk holding `seq` is the last index key at or before it; a seq older than the
        // channel's first entry starts at the first entry.
        let key = keys::index_key(session, channel, seq);
        for direction in [ScanDirection::Reverse, ScanDirection::Forward] {
            let mut it = self
                .db
                .iterator_cf(self.cf(CF_CHAN_INDEX), IteratorMode::From(&key, direction));
            if let Some(item) = it.next() {
                let (k, v) = item?;
                if matches!(keys::parse_index_key(&k), Some((s, c, _)) if s == session && c == channel)
                {
                    let e = IndexEntry::decode(&v)
                        .ok_or_else(|| StoreError::Corrupt("index entry".into()))?;
                    return Ok(Some(e.chunk));
                }
            }
        }
        Ok(None)
    }

    /// Frames of one channel with relay seq `>= seq`, in order, found through the index.
    pub fn channel_frames(
        &self,
        session: SessionId,
        channel: u32,
        seq: u64,
    ) -> Result<impl Iterator<Item = Result<Numbered, StoreError>> + '_, StoreError> {
        let start = self.channel_start(session, channel, seq)?;
        let iter = start.map(|from| self.frames_from(session, from));
        Ok(iter.into_iter().flatten().filter(move |item| match item {
            Ok((_, r)) => r.channel == Some(channel) && r.relay_seq.is_some_and(|s| s >= seq),
            Err(_) => true,
        }))
    }

    /// Every index entry of a session, as (channel, first relay seq, entry).
    pub fn index_entries(
        &self,
        session: SessionId,
    ) -> Result<Vec<(u32, u64, IndexEntry)>, StoreError> {
        let start = keys::index_key(session, 0, 0);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_CHAN_INDEX),
            IteratorMode::From(&start, ScanDirection::Forward),
        ) {
            let (k, v) = item?;
            match keys::parse_index_key(&k) {
                Some((s, c, seq)) if s == session => out.push((
                    c,
                    seq,
                    IndexEntry::decode(&v)
                        .ok_or_else(|| StoreError::Corrupt("index entry".into()))?,
                )),
                _ => break,
            }
        }
        Ok(out)
    }

    /// Every index entry of a session, as (channel, first relay seq, entry), streamed.
    pub fn index_iter(
        &self,
        session: SessionId,
    ) -> impl Iterator<Item = Result<(u32, u64, IndexEntry), StoreError>> + '_ {
        let start = keys::index_key(session, 0, 0);
        self.db
            .iterator_cf(
                self.cf(CF_CHAN_INDEX),
                IteratorMode::From(&start, ScanDirection::Forward),
            )
            .map_while(move |item| match item {
                Err(e) => Some(Err(e.into())),
                Ok((k, v)) => match keys::parse_index_key(&k) {
                    Some((s, c, seq)) if s == session => Some(
                        IndexEntry::decode(&v)
                            .map(|e| (c, seq, e))
                            .ok_or_else(|| StoreError::Corrupt("index entry".into())),
                    ),
                    _ => None,
                },
            })
    }

    /// Frame number `n` of `session`, if recorded (one chunk is read).
    pub fn frame_at(&self, session: SessionId, n: u64) -> Result<Option<FrameRecord>, StoreError> {
        match self.frames_from(session, n).next() {
            Some(Ok((m, rec))) if m == n => Ok(Some(rec)),
            Some(Ok(_)) | None => Ok(None),
            Some(Err(e)) => Err(e),
        }
    }

    /// The number one past the session's last frame (0 when it has none): read from its last
    /// chunk, not by counting.
    pub fn frame_end(&self, session: SessionId) -> Result<u64, StoreError> {
        let last = keys::frame_key(session, u64::MAX);
        let mut rev = self.db.iterator_cf(
            self.cf(CF_FRAMES),
            IteratorMode::From(&last, ScanDirection::Reverse),
        );
        match rev.next() {
            Some(item) => {
                let (k, v) = item?;
                match keys::parse_frame_key(&k) {
                    Some((s, first)) if s == session => {
                        Ok(first + chunk::decode(bytes::Bytes::from(v.into_vec()))?.len() as u64)
                    }
                    _ => Ok(0),
                }
            }
            None => Ok(0),
        }
    }

    /// The first frame received at or after `time_ns` (ns since epoch), found by bisection
    /// (a few chunk reads, whatever the session's length); `frame_end` if there is none.
    /// Receive times are monotonic up to the interleaving of concurrent writers (well under a
    /// millisecond), so a caller needing exactness reads from a little earlier and filters.
    pub fn frame_at_time(&self, session: SessionId, time_ns: u64) -> Result<u64, StoreError> {
        let (mut lo, mut hi) = (0, self.frame_end(session)?);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.frame_at(session, mid)? {
                Some(rec) if rec.time_ns < time_ns => lo = mid + 1,
                Some(_) => hi = mid,
                // A hole (a gap under `continue`): look after it.
                None => lo = mid + 1,
            }
        }
        Ok(lo)
    }

    /// Events (frames with a relay seq) from frame `from` on, on channels `wanted` accepts,
    /// counted from the channel index: only the chunk holding `from` is read.
    pub fn count_events(
        &self,
        session: SessionId,
        from: u64,
        wanted: impl Fn(u32) -> bool,
    ) -> Result<u64, StoreError> {
        let holding = self.chunk_holding(session, from)?;
        let mut n = 0u64;
        // Channels whose run in the chunk holding `from` starts before it: only some of that
        // run's frames count, so that one chunk is read.
        let mut partial = Vec::new();
        for item in self.index_iter(session) {
            let (channel, _, e) = item?;
            if !wanted(channel) {
                continue;
            }
            if e.frame_no >= from {
                n += u64::from(e.count);
            } else if holding == Some(e.chunk) {
                partial.push(channel);
            }
        }
        if let (Some(first), false) = (holding, partial.is_empty()) {
            let value = self
                .db
                .get_cf(self.cf(CF_FRAMES), keys::frame_key(session, first))?
                .ok_or_else(|| StoreError::Corrupt("chunk named by the index".into()))?;
            let recs = chunk::decode(bytes::Bytes::from(value))?;
            n += recs
                .iter()
                .enumerate()
                .filter(|(i, r)| {
                    first + *i as u64 >= from
                        && r.relay_seq.is_some()
                        && r.channel.is_some_and(|c| partial.contains(&c))
                })
                .count() as u64;
        }
        Ok(n)
    }

    /// The key (first frame number) of the chunk holding frame `n`, if any.
    fn chunk_holding(&self, session: SessionId, n: u64) -> Result<Option<u64>, StoreError> {
        let target = keys::frame_key(session, n);
        let mut rev = self.db.iterator_cf(
            self.cf(CF_FRAMES),
            IteratorMode::From(&target, ScanDirection::Reverse),
        );
        match rev.next() {
            Some(item) => {
                let (k, _) = item?;
                Ok(keys::parse_frame_key(&k)
                    .filter(|(s, _)| *s == session)
                    .map(|(_, first)| first))
            }
            None => Ok(None),
        }
    }

    /// Every chunk key (first frame number) of a session, with its record count.
    pub fn chunk_keys(&self, session: SessionId) -> Result<Vec<(u64, usize)>, StoreError> {
        let start = keys::frame_key(session, 0);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_FRAMES),
            IteratorMode::From(&start, ScanDirection::Forward),
        ) {
            let (k, v) = item?;
            match keys::parse_frame_key(&k) {
                Some((s, n)) if s == session => {
                    out.push((n, chunk::decode(bytes::Bytes::from(v.into_vec()))?.len()))
                }
                _ => break,
            }
        }
        Ok(out)
    }
}
