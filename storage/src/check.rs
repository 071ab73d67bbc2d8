//! Consistency check of one recorded session: frames, index and catalog must agree.
//!
//! Used by `gabp-relay sessions check` and by the crash and soak tests. It proves the
//! recording is a clean prefix: frame numbers contiguous from 0, every chunk decodable, relay
//! seqs contiguous per channel (except across an announced [`crate::Gap`]: frames lost under
//! `continue`), every chunk's channel runs indexed and every index entry naming such a run, and
//! the catalog's counts equal to what is stored. Anything that cannot be read is a problem,
//! never a silent stop.
//!
//! It streams: one pass over the chunks holds one chunk and a next-seq per channel, looking up
//! the index entry each channel run should have; only when the index holds more entries than
//! that does a second pass over the index read the chunks they name. Memory does not grow with
//! the session's length (a set of every frame's seq cost 690 MB at 9 M frames).

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use rocksdb::{Direction as Scan, IteratorMode, ReadOptions};
use serde::Serialize;

use crate::chunk::{self, FrameRecord};
use crate::error::StoreError;
use crate::keys::{self, IndexEntry, CF_CHAN_INDEX, CF_FRAMES};
use crate::store::Store;
use crate::SessionId;

/// Problems listed in a report; more are counted, not kept.
const SHOWN: usize = 50;

/// What the check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// The session checked.
    pub session: String,
    /// Frames read.
    pub frames: u64,
    /// Chunks read.
    pub chunks: u64,
    /// Index entries read.
    pub index_entries: u64,
    /// Channels with events.
    pub channels: u64,
    /// Announced gaps (frames lost under `continue`).
    pub gaps: u64,
    /// Frames the gaps account for.
    pub lost_frames: u64,
    /// Every inconsistency found (the first 50, then how many more); empty means sound.
    pub problems: Vec<String>,
    /// Problems found beyond the first [`SHOWN`].
    #[serde(skip)]
    more: u64,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < SHOWN {
            self.problems.push(p);
        } else {
            self.more += 1;
        }
    }
}

/// One channel's run inside a chunk, as the writer indexes it: (channel, first relay seq, its
/// frame number, frames).
type Run = (u32, u64, u64, u32);

/// The runs of `recs`, a chunk starting at frame `first`.
fn runs_of(first: u64, recs: &[FrameRecord], runs: &mut Vec<Run>) {
    runs.clear();
    for (i, rec) in recs.iter().enumerate() {
        if let (Some(ch), Some(seq)) = (rec.channel, rec.relay_seq) {
            match runs.iter_mut().find(|r| r.0 == ch) {
                Some(r) => r.3 += 1,
                None => runs.push((ch, seq, first + i as u64, 1)),
            }
        }
    }
}

impl Store {
    /// Checks one session. Read errors are reported as problems, not returned.
    pub fn check_session(&self, id: SessionId) -> Result<CheckReport, StoreError> {
        self.check_session_with(id, &mut |_| {})
    }

    /// [`Store::check_session`], telling `progress` how many frames it has read so far after
    /// each chunk.
    pub fn check_session_with(
        &self,
        id: SessionId,
        progress: &mut dyn FnMut(u64),
    ) -> Result<CheckReport, StoreError> {
        let mut r = CheckReport {
            session: id.to_string(),
            ..CheckReport::default()
        };
        if let Err(e) = self.check_into(id, &mut r, progress) {
            r.problem(format!("unreadable: {}", e.detail()));
        }
        if r.more > 0 {
            r.problems.push(format!("... and {} more problems", r.more));
        }
        Ok(r)
    }

    /// A scan that does not fill the block cache: a check reads each block once.
    fn scan(&self, cf: &str, from: &[u8]) -> rocksdb::DBIteratorWithThreadMode<'_, rocksdb::DB> {
        let mut ro = ReadOptions::default();
        ro.fill_cache(false);
        self.db
            .iterator_cf_opt(self.cf(cf), ro, IteratorMode::From(from, Scan::Forward))
    }

    fn check_into(
        &self,
        id: SessionId,
        r: &mut CheckReport,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), StoreError> {
        let Some(meta) = self.session(id)? else {
            r.problem("no catalog entry".into());
            return Ok(());
        };
        let gaps = self.gaps(id)?;
        let announced: HashSet<(u32, u64, u64)> = gaps
            .iter()
            .flat_map(|g| g.channels.iter().map(|&(c, s, n)| (c, s, s + n)))
            .collect();
        let lost: u64 = gaps.iter().map(|g| g.frames).sum();
        if lost != meta.lost_frames {
            r.problem(format!(
                "catalog counts {} lost frames, gap records {lost}",
                meta.lost_frames
            ));
        }
        r.gaps = gaps.len() as u64;
        r.lost_frames = lost;
        let index = self.cf(CF_CHAN_INDEX);
        let (mut bytes, mut expect, mut indexed) = (0u64, 0u64, 0u64);
        let mut next_seq: HashMap<u32, u64> = HashMap::new();
        let (mut recs, mut runs) = (Vec::new(), Vec::new());
        for item in self.scan(CF_FRAMES, &keys::frame_key(id, 0)) {
            let (k, v) = match item {
                Ok(kv) => kv,
                Err(e) => {
                    r.problem(format!(
                        "unreadable frame: {}",
                        StoreError::from(e).detail()
                    ));
                    break;
                }
            };
            let Some((s, first)) = keys::parse_frame_key(&k) else {
                break;
            };
            if s != id {
                break;
            }
            r.chunks += 1;
            if first > expect {
                r.problem(format!("chunk at frame {first}, expected {expect}: a hole"));
            } else if first < expect {
                r.problem(format!(
                    "chunk at frame {first} overlaps frames before {expect}"
                ));
            }
            recs.clear();
            if let Err(e) = chunk::decode_into(Bytes::from(v.into_vec()), &mut recs) {
                r.problem(format!("unreadable frame: {}", e.detail()));
                break;
            }
            expect = first + recs.len() as u64;
            progress(expect);
            for (i, rec) in recs.iter().enumerate() {
                let n = first + i as u64;
                r.frames += 1;
                bytes += rec.body.len() as u64;
                if let (Some(ch), Some(seq)) = (rec.channel, rec.relay_seq) {
                    if ch as usize >= meta.channels.len() {
                        r.problem(format!("frame {n} names unknown channel {ch}"));
                    }
                    let want = next_seq.entry(ch).or_insert(0);
                    if seq != *want && !announced.contains(&(ch, *want, seq)) {
                        r.problem(format!(
                            "channel {ch}: relay seq {seq} where {want} was due"
                        ));
                    }
                    *want = seq + 1;
                }
            }
            runs_of(first, &recs, &mut runs);
            for &(ch, seq, n, count) in &runs {
                let found = self.db.get_cf(index, keys::index_key(id, ch, seq))?;
                match found.as_deref().map(IndexEntry::decode) {
                    None => r.problem(format!(
                        "channel {ch} from seq {seq} (frame {n}) has no index entry"
                    )),
                    Some(None) => r.problem(format!("index ({ch},{seq}) does not decode")),
                    Some(Some(e)) if e.frame_no != n => r.problem(format!(
                        "index ({ch},{seq}) says frame {}, stored at {n}",
                        e.frame_no
                    )),
                    Some(Some(e)) if e.chunk != first || e.count != count => {
                        r.problem(format!(
                            "index ({ch},{seq}) says chunk {} with {} frames, stored in chunk {first} with {count}",
                            e.chunk, e.count
                        ))
                    }
                    Some(Some(_)) => indexed += 1,
                }
            }
        }
        r.channels = next_seq.len() as u64;
        let start = keys::index_key(id, 0, 0);
        for item in self.scan(CF_CHAN_INDEX, &start) {
            let (k, _) = item?;
            if !k.starts_with(&start[..16]) {
                break;
            }
            r.index_entries += 1;
        }
        if r.index_entries > indexed {
            self.find_stray_index_entries(id, r)?;
        }
        if meta.frames != r.frames {
            r.problem(format!(
                "catalog counts {} frames, {} stored",
                meta.frames, r.frames
            ));
        }
        if meta.bytes != bytes {
            r.problem(format!(
                "catalog counts {} bytes, {} stored",
                meta.bytes, bytes
            ));
        }
        Ok(())
    }

    /// The second pass: every index entry that names no channel run of a stored chunk.
    fn find_stray_index_entries(
        &self,
        id: SessionId,
        r: &mut CheckReport,
    ) -> Result<(), StoreError> {
        let frames = self.cf(CF_FRAMES);
        let start = keys::index_key(id, 0, 0);
        // The chunk last read and its runs: entries of one channel name successive chunks.
        let mut cached: Option<(u64, Vec<Run>)> = None;
        let mut recs = Vec::new();
        for item in self.scan(CF_CHAN_INDEX, &start) {
            let (k, v) = item?;
            let Some((s, ch, seq)) = keys::parse_index_key(&k) else {
                break;
            };
            if s != id {
                break;
            }
            let Some(e) = IndexEntry::decode(&v) else {
                r.problem(format!("index ({ch},{seq}) does not decode"));
                continue;
            };
            if cached.as_ref().map(|c| c.0) != Some(e.chunk) {
                let mut runs = Vec::new();
                if let Some(v) = self.db.get_cf(frames, keys::frame_key(id, e.chunk))? {
                    recs.clear();
                    chunk::decode_into(Bytes::from(v), &mut recs)?;
                    runs_of(e.chunk, &recs, &mut runs);
                }
                cached = Some((e.chunk, runs));
            }
            let runs = &cached.as_ref().expect("just filled").1;
            if !runs
                .iter()
                .any(|&(c, s, n, _)| c == ch && s == seq && n == e.frame_no)
            {
                r.problem(format!("index ({ch},{seq}) names a missing frame"));
            }
        }
        Ok(())
    }
}
