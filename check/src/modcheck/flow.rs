//! The concurrency probes of `check-mod`: requests pipelined in one write (each answered once),
//! and requests pipelined in bursts while the mod streams every channel it advertises (every
//! frame whole: a mod writing a header and its body apart interleaves them with another
//! thread's), with each channel's seq followed (its start, gaps, order).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::{secs, Peer, Runner, UNKNOWN_METHOD};
use crate::report::{count, Check, Verdict};
use crate::wire::{self, Got, Header, Problem};

/// Requests sent in one write by the pipelining check.
const PIPELINED: usize = 32;
/// Requests per burst while events flow, and the time between bursts.
const BURST: usize = 16;
const BURST_EVERY: Duration = Duration::from_millis(100);

/// Answers counted per request id.
#[derive(Debug, Default)]
struct Tally {
    counts: HashMap<String, u32>,
    /// The ids in the order their first answer came.
    order: Vec<String>,
}

impl Tally {
    fn expect(&mut self, id: &str) {
        self.counts.insert(id.to_string(), 0);
    }

    /// Counts an answer; false when its id was never sent.
    fn answer(&mut self, id: &str) -> bool {
        match self.counts.get_mut(id) {
            Some(n) => {
                if *n == 0 {
                    self.order.push(id.to_string());
                }
                *n += 1;
                true
            }
            None => false,
        }
    }

    fn unanswered(&self) -> usize {
        self.counts.values().filter(|&&n| n == 0).count()
    }

    fn repeated(&self) -> usize {
        self.counts.values().filter(|&&n| n > 1).count()
    }

    fn sent(&self) -> usize {
        self.counts.len()
    }
}

/// One channel's seq as seen.
#[derive(Debug, Default)]
struct SeqTrack {
    first: Option<u64>,
    last: Option<u64>,
    events: u64,
    /// The first jump forward (`last`, `next`) and how many there were.
    gap: Option<(u64, u64)>,
    gaps: u64,
    /// The first step back or repeat, and how many there were.
    back: Option<(u64, u64)>,
    backs: u64,
}

impl SeqTrack {
    fn see(&mut self, seq: u64) {
        self.events += 1;
        match self.last {
            None => self.first = Some(seq),
            Some(last) if seq == last + 1 => {}
            Some(last) if seq > last => {
                self.gaps += 1;
                self.gap.get_or_insert((last, seq));
            }
            Some(last) => {
                self.backs += 1;
                self.back.get_or_insert((last, seq));
            }
        }
        self.last = Some(seq);
    }
}

impl Runner<'_> {
    /// The request pipelined: `tools/list` if it answers, else the method no mod has.
    fn light_request(&self) -> (&'static str, Value) {
        if self.tools_list_works {
            ("tools/list", json!({}))
        } else {
            (UNKNOWN_METHOD, json!({}))
        }
    }

    /// `n` requests framed back to back, their ids expected in `tally`.
    fn burst(&self, n: usize, tally: &mut Tally) -> Vec<u8> {
        let (method, params) = self.light_request();
        let mut bytes = Vec::new();
        for _ in 0..n {
            let id = uuid::Uuid::new_v4().to_string();
            let body = wire::request(&id, method, &params);
            bytes.extend(Header::Relay.bytes(body.len()));
            bytes.extend(body);
            tally.expect(&id);
        }
        bytes
    }

    pub(super) async fn check_pipelined(&mut self, peer: &mut Peer) {
        let mut tally = Tally::default();
        let bytes = self.burst(PIPELINED, &mut tally);
        let (method, _) = self.light_request();
        let wait = self.opts.wait;
        let check = |v, d| Check::new("concurrency.pipelined", "§8", v, d);
        if peer.wire.send_raw(&bytes, wait).await.is_err() {
            self.checks
                .push(check(Verdict::Fail, "the mod stopped reading".into()));
            return;
        }
        let deadline = Instant::now() + wait;
        let mut broken = None;
        while tally.unanswered() > 0 {
            match peer.wire.next(deadline).await {
                Got::Frame(f) => {
                    let id = f.msg["id"].as_str().unwrap_or_default().to_string();
                    let mine = f.msg["type"] == "response" && tally.answer(&id);
                    self.note(&f, mine);
                }
                Got::Broken(p) => {
                    broken.get_or_insert(p);
                }
                Got::Closed | Got::TimedOut => break,
            }
        }
        // Late duplicates: what else arrives shortly.
        let linger = Instant::now() + Duration::from_millis(100);
        while let Got::Frame(f) = peer.wire.next(linger).await {
            let id = f.msg["id"].as_str().unwrap_or_default().to_string();
            let mine = f.msg["type"] == "response" && tally.answer(&id);
            self.note(&f, mine);
        }
        let said = format!("{PIPELINED} {method} requests in one write");
        let c = if let Some(p) = broken {
            check(
                Verdict::Fail,
                format!("{said}: the answers broke the stream: {p}"),
            )
        } else if tally.unanswered() > 0 {
            check(
                Verdict::Fail,
                format!(
                    "{said}: {} unanswered within {} (each request must be read on its own, however they arrive)",
                    tally.unanswered(),
                    secs(wait)
                ),
            )
        } else if tally.repeated() > 0 {
            check(
                Verdict::Fail,
                format!("{said}: {} answered more than once", tally.repeated()),
            )
        } else {
            check(Verdict::Pass, format!("{said}, each answered once"))
        };
        self.checks.push(c);
    }

    pub(super) async fn check_flow(&mut self) {
        let wait = self.opts.wait;
        let flow = self.opts.flow;
        let seq_check =
            |v, d| Check::new("events.seq", "§8", v, d).schema("events/event.message.json");
        let flow_check = |v, d| Check::new("concurrency.events", "§8", v, d);
        if self.channels.is_empty() {
            let why = "the welcome advertises no channels (capabilities.events)".to_string();
            self.checks.push(flow_check(Verdict::Skip, why.clone()));
            self.checks.push(seq_check(Verdict::Skip, why));
            return;
        }
        let mut peer = match self.open(Header::Relay).await {
            Ok(p) => p,
            Err(e) => {
                let why = format!("no connection: {e}");
                self.checks.push(flow_check(Verdict::Fail, why.clone()));
                self.checks.push(seq_check(Verdict::Skip, why));
                return;
            }
        };
        let mut tally = Tally::default();
        let sub = uuid::Uuid::new_v4().to_string();
        tally.expect(&sub);
        let body = wire::request(
            &sub,
            "events/subscribe",
            &json!({ "channels": self.channels }),
        );
        let mut seqs: BTreeMap<String, SeqTrack> = BTreeMap::new();
        let mut events = 0u64;
        let start = Instant::now();
        let flow_end = start + flow;
        let last_answer = flow_end + wait;
        let mut next_burst = start + BURST_EVERY;
        let mut closed = false;
        if peer.wire.send(&body, Header::Relay, wait).await.is_err() {
            closed = true;
        }
        while !closed {
            let now = Instant::now();
            if now >= next_burst && now < flow_end {
                let bytes = self.burst(BURST, &mut tally);
                if peer.wire.send_raw(&bytes, wait).await.is_err() {
                    break;
                }
                next_burst += BURST_EVERY;
            }
            if now >= flow_end && tally.unanswered() == 0 {
                break;
            }
            let until = if now < flow_end {
                next_burst.min(flow_end)
            } else {
                last_answer
            };
            match peer.wire.next(until).await {
                Got::Frame(f) => {
                    let mut mine = false;
                    match f.msg["type"].as_str() {
                        Some("event") => {
                            events += 1;
                            if let (Some(c), Some(s)) =
                                (f.msg["channel"].as_str(), f.msg["seq"].as_u64())
                            {
                                seqs.entry(c.to_string()).or_default().see(s);
                            }
                        }
                        Some("response") => {
                            mine = tally.answer(f.msg["id"].as_str().unwrap_or_default());
                        }
                        _ => {}
                    }
                    self.note(&f, mine);
                }
                Got::Broken(_) => {}
                Got::Closed => closed = true,
                Got::TimedOut if Instant::now() >= last_answer => break,
                Got::TimedOut => {}
            }
        }
        let problems = peer.wire.seen.problems.clone();
        self.close(peer).await;
        let interleaved = self
            .log
            .seen
            .problems
            .iter()
            .find(|p| matches!(p, Problem::Interleaved(_)));
        let requests = tally.sent() - 1;
        let answers = tally.order.iter().filter(|id| **id != sub).count();
        let seen = format!(
            "{} on {} and {answers} of {requests} pipelined answers in {}",
            count(events, "event"),
            count(seqs.len() as u64, "channel"),
            secs(flow)
        );
        let c = if let Some(p) = interleaved {
            let n = self
                .log
                .seen
                .problems
                .iter()
                .filter(|p| matches!(p, Problem::Interleaved(_)))
                .count();
            flow_check(
                Verdict::Fail,
                format!("{seen}: {}, e.g. {p}", count(n as u64, "broken frame")),
            )
            .hint("write each frame (header and body) in one write, under one lock that every thread writing to the connection (answers, events) takes")
        } else if let Some(p) = problems.first() {
            flow_check(Verdict::Fail, format!("{seen}: the stream broke: {p}"))
        } else if closed {
            flow_check(
                Verdict::Fail,
                format!("{seen}: the mod closed the connection"),
            )
        } else if tally.unanswered() > 0 {
            flow_check(
                Verdict::Fail,
                format!(
                    "{seen}: {} requests unanswered within {} of the last",
                    tally.unanswered(),
                    secs(wait)
                ),
            )
        } else if tally.repeated() > 0 {
            flow_check(
                Verdict::Fail,
                format!("{seen}: {} answered more than once", tally.repeated()),
            )
        } else if events == 0 {
            flow_check(
                Verdict::Skip,
                format!("{seen}: no event came after subscribing to every advertised channel, so nothing flowed beside the answers"),
            )
        } else {
            flow_check(Verdict::Pass, format!("{seen}: every frame whole"))
        };
        self.checks.push(c);
        let mut seq = seq_verdict(&seqs, seq_check);
        if interleaved.is_some() && seq.verdict == Verdict::Fail {
            seq.detail += " (frames broken by interleaving lose their events)";
        }
        self.checks.push(seq);
    }
}

/// The seq check's verdict over every channel followed.
fn seq_verdict(
    seqs: &BTreeMap<String, SeqTrack>,
    check: impl Fn(Verdict, String) -> Check,
) -> Check {
    if seqs.is_empty() {
        return check(
            Verdict::Skip,
            "no event with a channel and a seq arrived".into(),
        );
    }
    if let Some((c, t)) = seqs.iter().find(|(_, t)| t.backs > 0) {
        let (a, b) = t.back.unwrap_or_default();
        return check(
            Verdict::Fail,
            format!(
                "{c:?}: seq {b} after {a} ({} steps back or repeats): events are to come in seq order per channel",
                t.backs
            ),
        );
    }
    if let Some((c, t)) = seqs.iter().find(|(_, t)| t.gaps > 0) {
        let (a, b) = t.gap.unwrap_or_default();
        return check(
            Verdict::Fail,
            format!(
                "{c:?}: seq {b} after {a} ({} gaps): events were lost, or one counter serves several channels",
                t.gaps
            ),
        );
    }
    let late: Vec<String> = seqs
        .iter()
        .filter(|(_, t)| t.first != Some(0))
        .map(|(c, t)| format!("{c:?} from {}", t.first.unwrap_or_default()))
        .collect();
    let total: u64 = seqs.values().map(|t| t.events).sum();
    if late.is_empty() {
        check(
            Verdict::Pass,
            format!(
                "{total} events on {} channels, each from seq 0 without a gap",
                seqs.len()
            ),
        )
    } else {
        check(
            Verdict::Tolerated,
            format!(
                "contiguous, but {}: the relay numbers each channel from 0 per session, so its bridges see 0",
                late.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(channels: &[(&str, &[u64])]) -> Check {
        let mut seqs = BTreeMap::new();
        for (c, list) in channels {
            let t: &mut SeqTrack = seqs.entry(c.to_string()).or_default();
            for &s in *list {
                t.see(s);
            }
        }
        seq_verdict(&seqs, |v, d| Check::new("events.seq", "§8", v, d))
    }

    #[test]
    fn seq_from_zero_passes_from_one_is_tolerated_and_gaps_or_steps_back_fail() {
        assert_eq!(
            verdict(&[("a", &[0, 1, 2]), ("b", &[0])]).verdict,
            Verdict::Pass
        );
        let from_one = verdict(&[("a", &[1, 2, 3])]);
        assert_eq!(from_one.verdict, Verdict::Tolerated);
        assert!(
            from_one.detail.contains("\"a\" from 1"),
            "{}",
            from_one.detail
        );
        let gap = verdict(&[("a", &[0, 1, 3, 4, 6])]);
        assert_eq!(gap.verdict, Verdict::Fail);
        assert!(
            gap.detail.contains("seq 3 after 1 (2 gaps)"),
            "{}",
            gap.detail
        );
        let back = verdict(&[("a", &[0, 1, 1])]);
        assert_eq!(back.verdict, Verdict::Fail);
        assert!(back.detail.contains("seq 1 after 1"), "{}", back.detail);
    }
}
