//! The resume window: the route's most recent events, per channel, kept for bridges that
//! reconnect and ask for what they missed (`relay.resume`, see `crate::bridge`).
//!
//! The window keeps a copy of each event's wire bytes in a ring of fixed-size blocks, written
//! in publish order, and per channel where each kept event sits. Copying beats keeping the
//! fanned-out `Arc<EventFrame>`: an event held until 16,384 newer ones had passed was cold by
//! the time it was freed, and its allocation cold when reused (17 % of the relay's CPU per
//! event with one bridge; BENCHMARKS.md). The ring is written in sequence and its
//! blocks are reused, so each event costs one streaming copy and nothing to free.
//!
//! It is bounded for the whole route, in frames and in bytes (its memory is those bytes plus at
//! most two blocks): the oldest event (whatever its channel) goes first. Per channel the kept
//! seqs are contiguous, so any kept seq is found by subtraction. The window belongs to a
//! session and is cleared with it. Reading history copies the events out, into frames of their
//! own.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::outbox::EventFrame;

/// Bytes per ring block.
const BLOCK: usize = 64 * 1024;

/// One channel's kept events.
#[derive(Debug, Default)]
struct Kept {
    name: Option<Arc<str>>,
    /// The seq of the oldest kept event (the rest follow it without a gap).
    first_seq: u64,
    /// Ring position and length of each kept event's wire bytes, oldest first.
    at: VecDeque<(u64, u32)>,
}

/// The recent events of one route.
#[derive(Debug, Default)]
pub struct Window {
    max_frames: usize,
    max_bytes: usize,
    frames: usize,
    bytes: usize,
    /// Per channel id.
    channels: Vec<Kept>,
    /// The channel id of every kept event, in publish order (which one to forget next).
    order: VecDeque<u32>,
    /// The ring: block number `first_block + i` holds ring positions `[n * BLOCK, (n+1) * BLOCK)`.
    blocks: VecDeque<Box<[u8]>>,
    first_block: u64,
    /// The ring position the next byte goes to.
    end: u64,
    /// The last block let go, reused for the next one.
    spare: Option<Box<[u8]>>,
}

impl Window {
    /// A window keeping at most `max_frames` events and `max_bytes` wire bytes (0 frames: off).
    pub fn new(max_frames: usize, max_bytes: usize) -> Window {
        Window {
            max_frames,
            max_bytes,
            ..Window::default()
        }
    }

    /// Forgets everything (a new session).
    pub fn clear(&mut self) {
        self.channels.clear();
        self.order.clear();
        self.frames = 0;
        self.bytes = 0;
        self.spare = self.blocks.pop_front().or(self.spare.take());
        self.blocks.clear();
        self.first_block = 0;
        self.end = 0;
    }

    /// Keeps a copy of `wire`, the frame of event `seq` of channel `id` (named `name`; the
    /// channel's next seq), forgetting the oldest events past the bounds.
    pub fn push(&mut self, id: u32, name: &Arc<str>, seq: u64, wire: &[u8]) {
        if self.max_frames == 0 {
            return;
        }
        let i = id as usize;
        if self.channels.len() <= i {
            self.channels.resize_with(i + 1, Kept::default);
        }
        let at = self.end;
        self.write(wire);
        let ch = &mut self.channels[i];
        if ch.at.is_empty() {
            ch.first_seq = seq;
        }
        if ch.name.is_none() {
            ch.name = Some(name.clone());
        }
        ch.at.push_back((at, wire.len() as u32));
        self.order.push_back(id);
        self.frames += 1;
        self.bytes += wire.len();
        while self.frames > self.max_frames || (self.bytes > self.max_bytes && self.frames > 1) {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            let ch = &mut self.channels[old as usize];
            if let Some((_, len)) = ch.at.pop_front() {
                ch.first_seq += 1;
                self.frames -= 1;
                self.bytes -= len as usize;
            }
        }
        self.let_go_of_blocks();
    }

    /// Appends `bytes` at the ring's end.
    fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let off = (self.end % BLOCK as u64) as usize;
            if off == 0 {
                if self.blocks.is_empty() {
                    self.first_block = self.end / BLOCK as u64;
                }
                let b = self
                    .spare
                    .take()
                    .unwrap_or_else(|| vec![0; BLOCK].into_boxed_slice());
                self.blocks.push_back(b);
            }
            let block = self.blocks.back_mut().expect("the block at the end");
            let n = bytes.len().min(BLOCK - off);
            block[off..off + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.end += n as u64;
        }
    }

    /// Lets go of the blocks before the oldest kept event (keeping one to reuse).
    fn let_go_of_blocks(&mut self) {
        let oldest = self
            .order
            .front()
            .and_then(|&c| self.channels[c as usize].at.front())
            .map_or(self.end, |&(at, _)| at);
        while self.first_block < oldest / BLOCK as u64 {
            let Some(b) = self.blocks.pop_front() else {
                break;
            };
            self.spare = Some(b);
            self.first_block += 1;
        }
    }

    /// A copy of the `len` bytes at ring position `at` (kept, so in the ring).
    fn read(&self, mut at: u64, len: usize) -> Bytes {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let block = &self.blocks[(at / BLOCK as u64 - self.first_block) as usize];
            let off = (at % BLOCK as u64) as usize;
            let n = (len - out.len()).min(BLOCK - off);
            out.extend_from_slice(&block[off..off + n]);
            at += n as u64;
        }
        Bytes::from(out)
    }

    /// The oldest seq kept on channel `id`, if any.
    pub fn first_seq(&self, id: u32) -> Option<u64> {
        let ch = self.channels.get(id as usize)?;
        (!ch.at.is_empty()).then_some(ch.first_seq)
    }

    /// Copies of the kept events of channel `id` from seq `from` on, at most `max_frames` of
    /// them and (past the first) `max_bytes`: empty if `from` is not kept.
    pub fn slice(
        &self,
        id: u32,
        from: u64,
        max_frames: usize,
        max_bytes: usize,
    ) -> Vec<Arc<EventFrame>> {
        let Some(ch) = self.channels.get(id as usize) else {
            return Vec::new();
        };
        let (Some(name), Some(first)) = (&ch.name, self.first_seq(id)) else {
            return Vec::new();
        };
        if from < first {
            return Vec::new();
        }
        let skip = ((from - first) as usize).min(ch.at.len());
        let mut out = Vec::new();
        let mut bytes = 0;
        for (k, &(at, len)) in ch.at.range(skip..).enumerate() {
            let len = len as usize;
            if out.len() >= max_frames || (!out.is_empty() && bytes + len > max_bytes) {
                break;
            }
            bytes += len;
            out.push(Arc::new(EventFrame {
                channel: name.clone(),
                seq: from + k as u64,
                wire: self.read(at, len),
                keep: false,
            }));
        }
        out
    }

    /// (events kept, their wire bytes).
    pub fn size(&self) -> (usize, usize) {
        (self.frames, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(w: &mut Window, id: u32, e: &EventFrame) {
        w.push(id, &e.channel, e.seq, &e.wire);
    }

    fn ev(channel: &str, seq: u64, len: usize) -> Arc<EventFrame> {
        Arc::new(EventFrame {
            channel: Arc::from(channel),
            seq,
            wire: bytes::Bytes::from(vec![b'x'; len]),
            keep: false,
        })
    }

    #[test]
    fn keeps_the_newest_events_of_the_route_within_both_bounds() {
        let mut w = Window::new(4, 1000);
        for s in 0..3 {
            keep(&mut w, 0, &ev("a", s, 10));
        }
        for s in 0..3 {
            keep(&mut w, 1, &ev("b", s, 10));
        }
        // Route-wide: the two oldest (a0, a1) went.
        assert_eq!(w.size(), (4, 40));
        assert_eq!(w.first_seq(0), Some(2));
        assert_eq!(w.first_seq(1), Some(0));
        let b: Vec<u64> = w.slice(1, 1, 10, 1000).iter().map(|e| e.seq).collect();
        assert_eq!(b, vec![1, 2]);
        assert!(w.slice(0, 1, 10, 1000).is_empty(), "a1 is no longer kept");
        assert!(w.slice(0, 3, 10, 1000).is_empty(), "nothing from a3 on yet");
        // Bytes: a big event pushes out the oldest until the bytes fit (a2, b0, b1 go).
        keep(&mut w, 1, &ev("b", 3, 990));
        assert_eq!(w.size(), (2, 1000));
        assert_eq!((w.first_seq(0), w.first_seq(1)), (None, Some(2)));
        // Slices are bounded in frames and bytes (one always fits).
        let mut w = Window::new(100, 1 << 20);
        for s in 0..10 {
            keep(&mut w, 0, &ev("a", s, 100));
        }
        assert_eq!(w.slice(0, 2, 3, 1 << 20).len(), 3);
        assert_eq!(w.slice(0, 2, 10, 250).len(), 2);
        assert_eq!(w.slice(0, 2, 10, 1).len(), 1);
        w.clear();
        assert_eq!((w.size(), w.first_seq(0)), ((0, 0), None));
        let mut off = Window::new(0, 1 << 20);
        keep(&mut off, 0, &ev("a", 0, 1));
        assert_eq!(off.size(), (0, 0));
    }

    /// An event whose bytes say which it is.
    fn marked(channel: &str, seq: u64, len: usize) -> Arc<EventFrame> {
        let wire: Vec<u8> = (0..len)
            .map(|i| (seq as usize * 31 + i * 7 + channel.len()) as u8)
            .collect();
        Arc::new(EventFrame {
            channel: Arc::from(channel),
            seq,
            wire: Bytes::from(wire),
            keep: false,
        })
    }

    #[test]
    fn events_read_back_byte_for_byte_across_blocks_and_memory_stays_bounded() {
        // Sizes that straddle blocks, one larger than a block, on two channels.
        let sizes = [1, 300, BLOCK - 5, 17, 3 * BLOCK + 11, 4096, BLOCK, 2];
        let max_bytes = 5 * BLOCK;
        let mut w = Window::new(1 << 20, max_bytes);
        let mut published: Vec<Arc<EventFrame>> = Vec::new();
        for round in 0..40u64 {
            for (k, &len) in sizes.iter().enumerate() {
                let channel = if k % 3 == 0 { "a" } else { "bb" };
                let seq = published.iter().filter(|e| &*e.channel == channel).count() as u64;
                let e = marked(channel, seq, len + round as usize);
                keep(&mut w, u32::from(channel != "a"), &e);
                published.push(e);
                let (frames, bytes) = w.size();
                assert!(bytes <= max_bytes || frames == 1, "{bytes} bytes kept");
                assert!(
                    w.blocks.len() <= bytes.div_ceil(BLOCK) + 2,
                    "{} blocks for {bytes} bytes",
                    w.blocks.len()
                );
                // Every kept event of both channels reads back as it was published.
                for (id, channel) in [(0u32, "a"), (1, "bb")] {
                    let Some(first) = w.first_seq(id) else {
                        continue;
                    };
                    let kept = w.slice(id, first, usize::MAX, usize::MAX);
                    let want: Vec<&Arc<EventFrame>> = published
                        .iter()
                        .filter(|e| &*e.channel == channel && e.seq >= first)
                        .collect();
                    assert_eq!(kept.len(), want.len());
                    for (got, want) in kept.iter().zip(want) {
                        assert_eq!((got.seq, &got.wire), (want.seq, &want.wire));
                        assert_eq!(&*got.channel, channel);
                    }
                }
            }
        }
        // A new session starts an empty ring.
        w.clear();
        keep(&mut w, 0, &marked("a", 0, 10));
        assert_eq!(w.slice(0, 0, 9, 1 << 20)[0].wire, marked("a", 0, 10).wire);
    }
}
