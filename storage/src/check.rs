//! Consistency check of one recorded session: frames, index and catalog must agree.
//!
//! Used by `gabp-relay sessions check` and by the crash and soak tests. It proves the
//! recording is a clean prefix: frame numbers contiguous from 0, every chunk decodable, relay
//! seqs contiguous per channel (except across an announced [`crate::Gap`]: frames lost under
//! `continue`), every index entry pointing at the frame it names, and the catalog's counts equal
//! to what is stored. Anything that cannot be read is a problem, never a silent stop.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::StoreError;
use crate::store::Store;
use crate::SessionId;

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
    /// Every inconsistency found; empty means the session is sound.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether no problem was found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Store {
    /// Checks one session. Read errors are reported as problems, not returned.
    pub fn check_session(&self, id: SessionId) -> Result<CheckReport, StoreError> {
        let mut r = CheckReport {
            session: id.to_string(),
            ..CheckReport::default()
        };
        if let Err(e) = self.check_into(id, &mut r) {
            r.problems.push(format!("unreadable: {}", e.detail()));
        }
        const SHOWN: usize = 50;
        if r.problems.len() > SHOWN {
            let more = r.problems.len() - SHOWN;
            r.problems.truncate(SHOWN);
            r.problems.push(format!("... and {more} more problems"));
        }
        Ok(r)
    }

    fn check_into(&self, id: SessionId, r: &mut CheckReport) -> Result<(), StoreError> {
        let Some(meta) = self.session(id)? else {
            r.problems.push("no catalog entry".into());
            return Ok(());
        };
        let gaps = self.gaps(id)?;
        let announced: std::collections::HashSet<(u32, u64, u64)> = gaps
            .iter()
            .flat_map(|g| g.channels.iter().map(|&(c, s, n)| (c, s, s + n)))
            .collect();
        let lost: u64 = gaps.iter().map(|g| g.frames).sum();
        if lost != meta.lost_frames {
            r.problems.push(format!(
                "catalog counts {} lost frames, gap records {lost}",
                meta.lost_frames
            ));
        }
        r.gaps = gaps.len() as u64;
        r.lost_frames = lost;
        let chunks = self.chunk_keys(id)?;
        r.chunks = chunks.len() as u64;
        let mut expect = 0u64;
        for (first, n) in &chunks {
            if *first != expect {
                r.problems
                    .push(format!("chunk at frame {first}, expected {expect}: a hole"));
            }
            expect = first + *n as u64;
        }
        let mut bytes = 0u64;
        let mut next_seq: HashMap<u32, u64> = HashMap::new();
        let mut frame_at: HashMap<(u32, u64), u64> = HashMap::new();
        let mut next_frame = 0u64;
        for item in self.frames(id) {
            let (n, rec) = match item {
                Ok(x) => x,
                Err(e) => {
                    r.problems.push(format!("unreadable frame: {}", e.detail()));
                    break;
                }
            };
            if n != next_frame {
                // Reported once per discontinuity (a hole was reported above), not per frame.
                r.problems
                    .push(format!("frame {n} out of order (expected {next_frame})"));
            }
            next_frame = n + 1;
            r.frames += 1;
            bytes += rec.body.len() as u64;
            if let (Some(ch), Some(seq)) = (rec.channel, rec.relay_seq) {
                if ch as usize >= meta.channels.len() {
                    r.problems
                        .push(format!("frame {n} names unknown channel {ch}"));
                }
                let want = next_seq.entry(ch).or_insert(0);
                if seq != *want && !announced.contains(&(ch, *want, seq)) {
                    r.problems.push(format!(
                        "channel {ch}: relay seq {seq} where {want} was due"
                    ));
                }
                *want = seq + 1;
                frame_at.insert((ch, seq), n);
            }
        }
        r.channels = next_seq.len() as u64;
        for (ch, seq, e) in self.index_entries(id)? {
            r.index_entries += 1;
            match frame_at.get(&(ch, seq)) {
                Some(&n) if n == e.frame_no => {}
                Some(&n) => r.problems.push(format!(
                    "index ({ch},{seq}) says frame {}, stored at {n}",
                    e.frame_no
                )),
                None => r
                    .problems
                    .push(format!("index ({ch},{seq}) names a missing frame")),
            }
        }
        if meta.frames != r.frames {
            r.problems.push(format!(
                "catalog counts {} frames, {} stored",
                meta.frames, r.frames
            ));
        }
        if meta.bytes != bytes {
            r.problems.push(format!(
                "catalog counts {} bytes, {} stored",
                meta.bytes, bytes
            ));
        }
        Ok(())
    }
}
