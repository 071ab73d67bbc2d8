//! One reader's accounting, whatever carried the event (a GABP bridge, a Redis or NATS
//! subscriber): per-channel seq contiguity, announced drops, latency from each event's
//! scheduled send time (`payload.t`), and the reader's place in closed-loop pacing.

use std::sync::Arc;

use gabp_rt::clock::now_ns;
use gabp_sim::events::PaceSlot;
use hdrhistogram::Histogram;

use super::{find_channel, find_u64, latency_histogram, Window};

/// What one reader saw in the window.
#[derive(Debug)]
pub struct ReaderResult {
    /// Events received in the window.
    pub events: u64,
    /// Event latency from scheduled send time, ns.
    pub latency: Histogram<u64>,
    /// Seq gaps not announced by a drop notice.
    pub unannounced_gaps: u64,
    /// Events announced as dropped (`relay/dropped`).
    pub dropped: u64,
    /// Whether the target closed the connection early.
    pub disconnected: bool,
}

/// Counts what one reader receives.
#[derive(Debug)]
pub struct Tally {
    result: ReaderResult,
    window: Arc<Window>,
    last: Vec<(Vec<u8>, u64)>,
    pace: Option<PaceSlot>,
    unpaced: u64,
    /// Window events not yet added to the window's running count.
    unshared: u64,
}

/// Events counted before telling the pace (one atomic add per batch, not per event).
const PACE_EVERY: u64 = 32;

impl Tally {
    /// A reader counting inside `window`, reporting to `pace` if the run is paced.
    pub fn new(window: Arc<Window>, pace: Option<PaceSlot>) -> Tally {
        Tally {
            result: ReaderResult {
                events: 0,
                latency: latency_histogram(),
                unannounced_gaps: 0,
                dropped: 0,
                disconnected: false,
            },
            window,
            last: Vec::new(),
            pace,
            unpaced: 0,
            unshared: 0,
        }
    }

    /// Accounts one event body; returns whether it was a data event (not a relay notice).
    pub fn event(&mut self, body: &[u8]) -> bool {
        let Some(channel) = find_channel(body) else {
            return false;
        };
        let open = self.window.is_open();
        if channel == b"relay/dropped" {
            let n = find_u64(body, b"\"count\":").unwrap_or(0);
            let to = find_u64(body, b"\"toSeq\":");
            let ch = memchr::memmem::find(body, b"\"payload\":")
                .and_then(|p| find_channel(&body[p..]).map(<[u8]>::to_vec));
            if let (Some(ch), Some(to)) = (ch, to) {
                self.set_last(&ch, to);
            }
            if open {
                self.result.dropped += n;
            }
            return false;
        }
        if channel.starts_with(b"relay/") {
            return false;
        }
        let Some(seq) = find_u64(body, b"\"seq\":") else {
            return false;
        };
        if let Some(prev) = self.get_last(channel) {
            if seq != prev + 1 && open {
                self.result.unannounced_gaps += 1;
            }
        }
        self.set_last(channel, seq);
        if open {
            self.result.events += 1;
            self.unshared += 1;
            if let Some(t) = find_u64(body, b"\"t\":") {
                let _ = self
                    .result
                    .latency
                    .record(now_ns().saturating_sub(t).max(1));
            }
        }
        self.unpaced += 1;
        if self.unpaced == PACE_EVERY {
            self.flush_pace();
        }
        true
    }

    /// Reports events counted so far to the pace (call when the read buffer runs dry).
    pub fn flush_pace(&mut self) {
        if let Some(p) = &self.pace {
            p.received(self.unpaced);
        }
        self.unpaced = 0;
        if self.unshared > 0 {
            self.window
                .add_delivered(std::mem::take(&mut self.unshared));
        }
    }

    /// The connection closed before the run stopped.
    pub fn disconnected(&mut self) {
        self.result.disconnected = true;
    }

    /// The result (retires the reader from pacing).
    pub fn finish(self) -> ReaderResult {
        self.result
    }

    fn get_last(&self, ch: &[u8]) -> Option<u64> {
        self.last.iter().find(|(c, _)| c == ch).map(|(_, s)| *s)
    }

    fn set_last(&mut self, ch: &[u8], seq: u64) {
        match self.last.iter_mut().find(|(c, _)| c == ch) {
            Some(e) => e.1 = seq,
            None => self.last.push((ch.to_vec(), seq)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ch: &str, seq: u64) -> Vec<u8> {
        format!(r#"{{"type":"event","channel":"{ch}","seq":{seq},"payload":{{"t":1}}}}"#)
            .into_bytes()
    }

    #[test]
    fn gaps_count_unless_announced() {
        let w = Arc::new(Window::default());
        w.set(true);
        let mut t = Tally::new(w, None);
        assert!(t.event(&ev("a", 0)));
        assert!(t.event(&ev("b", 0)));
        assert!(t.event(&ev("a", 1)));
        assert!(t.event(&ev("a", 3)), "gap");
        let notice = br#"{"type":"event","channel":"relay/dropped","seq":0,"payload":{"channel":"a","fromSeq":4,"toSeq":9,"count":6}}"#;
        assert!(!t.event(notice));
        assert!(t.event(&ev("a", 10)), "announced");
        let r = t.finish();
        assert_eq!((r.events, r.unannounced_gaps, r.dropped), (5, 1, 6));
    }
}
