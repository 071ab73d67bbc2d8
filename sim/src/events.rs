//! What a publisher sends and when: the event bodies (seeded, sized, only id/seq/time change),
//! the emission schedule (a fixed rate, or as fast as possible), and closed-loop pacing.
//!
//! The simulated mod and the load generator's broker publishers (Redis, NATS) share this, so
//! every system measured sees the same bytes at the same pace.
//!
//! Pacing: at "max" rate an open-loop publisher outruns its slowest reader, and then one
//! system drops (the relay's `drop-oldest`), another buffers without bound or disconnects
//! (Redis, NATS). A [`Pace`] keeps the publisher at most `window` events ahead of the slowest
//! reader, so "max" means the highest rate every reader receives in full, for every system.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use gabp_proto::encode_frame;
use rand::{Rng, SeedableRng};

use gabp_rt::clock::now_ns;

/// Prebuilt event bytes: only the id, seq and time change per event.
#[derive(Debug)]
pub struct EventTemplate {
    quirks: bool,
    pad: String,
    counter: u64,
    id_prefix: u32,
    channels: Vec<String>,
    pick: rand::rngs::SmallRng,
    body: String,
}

impl EventTemplate {
    /// Bodies of about `payload_bytes` for `channels`; `quirks` adds an event `timestamp`.
    pub fn new(channels: &[String], payload_bytes: usize, seed: u64, quirks: bool) -> Self {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        // Fixed envelope overhead is about 150 bytes; the padding brings the body to size.
        let overhead = 150 + if quirks { 30 } else { 0 };
        let pad_len = payload_bytes.saturating_sub(overhead);
        let pad = (0..pad_len)
            .map(|_| char::from(b'a' + rng.gen_range(0..26u8)))
            .collect();
        EventTemplate {
            quirks,
            pad,
            counter: 0,
            id_prefix: rng.gen(),
            // JSON-escaped once, so any name (quotes, control characters) makes a valid body.
            channels: channels
                .iter()
                .map(|c| {
                    let quoted = serde_json::to_string(c).expect("a string serializes");
                    quoted[1..quoted.len() - 1].to_string()
                })
                .collect(),
            pick: rand::rngs::SmallRng::seed_from_u64(seed ^ 0x9e37_79b9),
            body: String::with_capacity(payload_bytes + 200),
        }
    }

    /// The channel index of the next event (seeded, uniform).
    pub fn next_channel(&mut self) -> usize {
        self.pick.gen_range(0..self.channels.len().max(1))
    }

    /// The JSON body of an event on channel `ch`.
    pub fn body(&mut self, ch: usize, seq: u64, t_ns: u64) -> &[u8] {
        use std::fmt::Write as _;
        self.counter += 1;
        self.body.clear();
        let _ = write!(
            self.body,
            r#"{{"v":"gabp/1","id":"{:08x}-0000-4000-8000-{:012x}","type":"event","channel":"{}","seq":{},"payload":{{"t":{},"pad":"{}"}}"#,
            self.id_prefix, self.counter, self.channels[ch], seq, t_ns, self.pad
        );
        if self.quirks {
            let _ = write!(self.body, r#","timestamp":{}"#, t_ns / 1_000_000);
        }
        self.body.push('}');
        self.body.as_bytes()
    }

    /// The event framed for the GABP wire, appended to `wire`.
    pub fn write_frame(&mut self, ch: usize, seq: u64, t_ns: u64, wire: &mut BytesMut) {
        let body = self.body(ch, seq, t_ns);
        encode_frame(body, wire);
    }
}

/// When events are due: a fixed rate with scheduled send times, or as fast as possible
/// (optionally paced by the slowest reader).
#[derive(Debug)]
pub struct Schedule {
    rate: Option<f64>,
    limit: u64,
    pace: Option<Arc<Pace>>,
    start: Instant,
    start_ns: u64,
    tick: Duration,
}

/// Events per batch at max rate (one write call each).
const MAX_RATE_BATCH: u64 = 256;

impl Schedule {
    /// `rate` events/s (`None` = max), at most `limit` events, paced by `pace` at max rate.
    pub fn new(rate: Option<f64>, limit: u64, pace: Option<Arc<Pace>>) -> Schedule {
        Schedule {
            rate,
            limit,
            pace,
            start: Instant::now(),
            start_ns: now_ns(),
            tick: Duration::ZERO,
        }
    }

    /// At a fixed rate, writes the events that fell due once per `tick` (as a game writes what
    /// a frame produced once per frame), not each as it falls due: one write per tick instead
    /// of one per event. Each event keeps its own scheduled time, so the wait shows as latency.
    pub fn with_tick(mut self, tick: Duration) -> Schedule {
        self.tick = tick;
        self
    }

    /// Blocks until events are due after `emitted`, and returns their numbers; `None` once
    /// `stop()` says so or the limit is reached.
    pub fn next(&mut self, emitted: u64, stop: &dyn Fn() -> bool) -> Option<Range<u64>> {
        loop {
            if stop() || emitted >= self.limit {
                return None;
            }
            match self.rate {
                Some(rate) => {
                    let elapsed = self.ticked(self.start.elapsed());
                    let due = ((elapsed.as_secs_f64() * rate) as u64).min(self.limit);
                    if due > emitted {
                        return Some(emitted..due.min(emitted + 1024));
                    }
                    // The next event's time, on the tick after it when ticking.
                    let next = Duration::from_secs_f64((emitted + 1) as f64 / rate);
                    let next = if self.tick.is_zero() || self.ticked(next) == next {
                        next
                    } else {
                        self.ticked(next) + self.tick
                    };
                    thread::sleep(
                        next.saturating_sub(self.start.elapsed())
                            .min(Duration::from_millis(5)),
                    );
                }
                None => {
                    let end = (emitted + MAX_RATE_BATCH).min(self.limit);
                    if let Some(p) = &self.pace {
                        if !p.wait_for_room(end, stop) {
                            return None;
                        }
                    }
                    return Some(emitted..end);
                }
            }
        }
    }

    /// `t` rounded down to the tick (unchanged without one).
    fn ticked(&self, t: Duration) -> Duration {
        if self.tick.is_zero() {
            return t;
        }
        let n = t.as_nanos() / self.tick.as_nanos();
        self.tick * u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The time event `i` is stamped with: its scheduled time at a fixed rate, now at max rate.
    pub fn stamp(&self, i: u64) -> u64 {
        match self.rate {
            Some(rate) => self.start_ns + (i as f64 * 1e9 / rate) as u64,
            None => now_ns(),
        }
    }
}

/// Closed-loop pacing shared by one publisher and its readers (see the module docs).
#[derive(Debug)]
pub struct Pace {
    window: u64,
    expected: usize,
    joined: AtomicUsize,
    received: Box<[AtomicU64]>,
}

/// A reader's counter retired from pacing (the reader left).
const RETIRED: u64 = u64::MAX;

impl Pace {
    /// Pacing for `readers` readers, at most `window` events in flight to any of them. The
    /// publisher sends nothing until every reader has [`joined`](Pace::join), so all of them
    /// count from the same first event.
    pub fn new(readers: usize, window: u64) -> Arc<Pace> {
        Arc::new(Pace {
            window: window.max(1),
            expected: readers,
            joined: AtomicUsize::new(0),
            received: (0..readers).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// A reader is ready (subscribed); returns its slot, or `None` if all slots are taken.
    pub fn join(self: &Arc<Self>) -> Option<PaceSlot> {
        let i = self.joined.fetch_add(1, Ordering::AcqRel);
        (i < self.expected).then(|| PaceSlot {
            pace: self.clone(),
            i,
        })
    }

    fn slowest(&self) -> u64 {
        self.received
            .iter()
            .map(|r| r.load(Ordering::Acquire))
            .min()
            .unwrap_or(RETIRED)
    }

    /// Blocks until sending up to event number `end` keeps the publisher within the window of
    /// the slowest reader. Returns `false` if `stop()` said so first.
    pub fn wait_for_room(&self, end: u64, stop: &dyn Fn() -> bool) -> bool {
        let mut spins = 0u32;
        loop {
            if stop() {
                return false;
            }
            let armed = self.joined.load(Ordering::Acquire) >= self.expected;
            if armed && end <= self.slowest().saturating_add(self.window) {
                return true;
            }
            // A short spin for the common near-miss, then sleep: the readers share the cores.
            spins += 1;
            if spins < 16 {
                thread::yield_now();
            } else {
                thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// One reader's place in a [`Pace`]; dropping it retires the reader.
#[derive(Debug)]
pub struct PaceSlot {
    pace: Arc<Pace>,
    i: usize,
}

impl PaceSlot {
    /// Counts `n` more events received.
    pub fn received(&self, n: u64) {
        self.pace.received[self.i].fetch_add(n, Ordering::Release);
    }
}

impl Drop for PaceSlot {
    fn drop(&mut self) {
        self.pace.received[self.i].store(RETIRED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_bodies_are_valid_gabp_events_of_the_asked_size() {
        let chans = vec!["a/b".to_string(), "c/d".to_string()];
        let mut t = EventTemplate::new(&chans, 256, 7, false);
        let ch = t.next_channel();
        let body = t.body(ch, 42, 1_000).to_vec();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["seq"], 42);
        assert_eq!(v["payload"]["t"], 1_000);
        assert_eq!(v["channel"], chans[ch].as_str());
        assert!((230..=290).contains(&body.len()), "{}", body.len());
        let mut p = gabp_proto::Parser::new();
        p.parse(&body, gabp_proto::Mode::Strict)
            .expect("strict GABP");
    }

    #[test]
    fn pace_waits_for_every_reader_then_for_the_slowest() {
        let pace = Pace::new(2, 10);
        let never = || false;
        let a = pace.join().expect("slot");
        // Not armed: one reader of two.
        let stop_after_one = {
            let n = std::cell::Cell::new(0);
            move || {
                n.set(n.get() + 1);
                n.get() > 1
            }
        };
        assert!(!pace.wait_for_room(1, &stop_after_one));
        let b = pace.join().expect("slot");
        assert!(pace.join().is_none(), "only two slots");
        assert!(pace.wait_for_room(10, &never));
        a.received(10);
        let once = {
            let n = std::cell::Cell::new(0);
            move || {
                n.set(n.get() + 1);
                n.get() > 1
            }
        };
        assert!(
            !pace.wait_for_room(11, &once),
            "b has received nothing: 11 would exceed its window"
        );
        b.received(5);
        assert!(pace.wait_for_room(15, &never));
        drop(b);
        assert!(
            pace.wait_for_room(20, &never),
            "a retired reader holds nobody"
        );
    }

    #[test]
    fn fixed_rate_schedule_stamps_scheduled_times() {
        let mut s = Schedule::new(Some(1e9), 5, None);
        let r = s.next(0, &|| false).expect("due");
        assert!(r.start == 0 && r.end <= 5);
        assert!(s.stamp(1) > s.stamp(0));
        assert_eq!(s.next(5, &|| false), None, "limit reached");
    }

    #[test]
    fn a_tick_writes_what_fell_due_once_per_tick() {
        let tick = Duration::from_millis(20);
        let mut s = Schedule::new(Some(1000.0), u64::MAX, None).with_tick(tick);
        let mut emitted = 0;
        let mut batches = 0;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(110) {
            let r = s.next(emitted, &|| false).expect("due");
            emitted = r.end;
            batches += 1;
        }
        // 1,000 events/s in 20 ms ticks: ~20 events a write, ~6 writes in 110 ms.
        assert!(batches <= 7, "{batches} writes");
        assert!(emitted >= 80, "{emitted} events");
        assert!(
            s.stamp(1) - s.stamp(0) == 1_000_000,
            "each event keeps its own time"
        );
    }
}
