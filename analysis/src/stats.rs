//! `gabp-relay stats`: per-channel and per-method figures of a recorded session.
//!
//! Computed in one streaming pass over the frames: event counts, rates and payload sizes per
//! channel, the mod's own seq anomalies (gaps and restarts), request latency percentiles per
//! method (relay→mod request to mod→relay response), errors, and drops per bridge.
//!
//! Memory is about 1.4 KB per channel all told (100,000 channels: 141 MiB peak, measured by
//! `tests/it/stats_memory.rs`, names and JSON output included): distributions are kept in a sparse
//! [`Sketch`] (within 1/16 of the true value), never a full histogram per channel (which cost
//! ~350 KB each: 10,000 channels took 3.45 GB). Methods are few (at most 64 and a pool): their
//! latencies are kept as the report keeps them (2 significant figures, capped at the exact
//! longest call), so `stats` and `report` show the same percentiles.

use std::collections::{BTreeMap, HashMap};

use gabp_proto::{ErrorCode, Mode, MsgType, Parser};
use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use serde::Serialize;

use crate::calls::{latency_at, new_latency, take_answered, MAX_METHODS, MAX_OPEN, OTHER_METHODS};

/// A sparse log-linear histogram: values below 32 exactly, larger ones in buckets of 1/16 of
/// their power of two; only buckets that occur are stored (a channel's payload sizes and a
/// method's latencies fall in a handful).
#[derive(Debug, Clone, Default)]
pub struct Sketch {
    buckets: Vec<(u16, u64)>,
    n: u64,
    sum: u128,
    max: u64,
}

impl Sketch {
    fn bucket(v: u64) -> u16 {
        if v < 32 {
            return v as u16;
        }
        let e = 63 - v.leading_zeros();
        let m = (v >> (e - 4)) & 15;
        (32 + (e - 5) * 16 + m as u32) as u16
    }

    /// The largest value of bucket `b`.
    fn high(b: u16) -> u64 {
        if b < 32 {
            return b as u64;
        }
        let (e, m) = ((b as u32 - 32) / 16 + 5, (b as u64 - 32) % 16);
        let low = (16 + m) << (e - 4);
        low + ((1u64 << (e - 4)) - 1)
    }

    /// Adds a value.
    pub fn record(&mut self, v: u64) {
        let b = Self::bucket(v);
        match self.buckets.binary_search_by_key(&b, |x| x.0) {
            Ok(i) => self.buckets[i].1 += 1,
            Err(i) => self.buckets.insert(i, (b, 1)),
        }
        self.n += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    /// The value at quantile `q` (0..=1), within 1/16; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let want = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(b, c) in &self.buckets {
            seen += c;
            if seen >= want {
                return Self::high(b).min(self.max);
            }
        }
        self.max
    }

    /// The mean (exact); 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }
}

/// Figures of one channel.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelStats {
    /// The channel.
    pub channel: String,
    /// Events received from the mod.
    pub events: u64,
    /// Events per second over the session.
    pub rate_per_s: f64,
    /// Mean payload size in bytes.
    pub payload_mean: f64,
    /// 99th percentile payload size in bytes.
    pub payload_p99: u64,
    /// Gaps in the mod's seq (events the mod numbered but never sent).
    pub mod_seq_gaps: u64,
    /// Times the mod's seq went backwards (the game restarted counting).
    pub mod_seq_restarts: u64,
}

/// Figures of one method.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodStats {
    /// The method.
    pub method: String,
    /// Requests forwarded.
    pub calls: u64,
    /// Error responses.
    pub errors: u64,
    /// Requests never answered in the session.
    pub unanswered: u64,
    /// Latency percentiles in milliseconds; `None` (JSON `null`) when no call was answered,
    /// so an unmeasured latency never reads as 0 ms.
    pub p50_ms: Option<f64>,
    /// 90th percentile.
    pub p90_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Maximum.
    pub max_ms: Option<f64>,
}

/// Drops of one bridge.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BridgeStats {
    /// Connection number.
    pub conn: u32,
    /// Its identity's name (`[[route.bridge]]`); `None` for the route's own token.
    pub name: Option<String>,
    /// Its bridgeVersion.
    pub bridge_version: String,
    /// The label it gave itself (its hello's `clientInfo.name`), if any.
    pub label: Option<String>,
    /// Events dropped for it.
    pub dropped: u64,
    /// `relay/dropped` notices it was sent.
    pub drop_notices: u64,
    /// Bad frames it sent that were answered and counted but not recorded (past the first 16).
    pub unrecorded_bad_frames: u64,
    /// Requests the relay refused because its identity's role or globs forbid them (-32006),
    /// as `relay/status` counts them.
    pub denied: u64,
    /// Requests refused because another bridge held the route's controller lease (-32008).
    pub lease_refused: u64,
    /// Requests refused over its identity's rate (-32007): counted as it left, not recorded.
    pub rate_limited: u64,
}

/// The relay's own recorded refusals of one bridge's requests, by kind.
#[derive(Default, Clone, Copy)]
struct Refusals {
    denied: u64,
    lease_refused: u64,
}

/// Everything `stats` reports.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStats {
    /// Session id.
    pub session: String,
    /// Route.
    pub route: String,
    /// Duration in seconds.
    pub duration_s: f64,
    /// Frames recorded.
    pub frames: u64,
    /// Bytes recorded.
    pub bytes: u64,
    /// Unroutable mod frames.
    pub anomalies: u64,
    /// The session's tags.
    pub tags: BTreeMap<String, String>,
    /// Per channel.
    pub channels: Vec<ChannelStats>,
    /// Per method.
    pub methods: Vec<MethodStats>,
    /// Per bridge.
    pub bridges: Vec<BridgeStats>,
}

struct Chan {
    events: u64,
    sizes: Sketch,
    last_mod_seq: Option<u64>,
    gaps: u64,
    restarts: u64,
}

/// A method's figures, kept as the report keeps them so both show the same percentiles.
struct Method {
    calls: u64,
    errors: u64,
    latency: hdrhistogram::Histogram<u64>,
    max_ns: u64,
}

/// Computes a session's stats.
pub fn compute(store: &Store, meta: &SessionMeta) -> Result<SessionStats, StoreError> {
    compute_with(store, meta, &mut |_| {})
}

/// [`compute`], telling `progress` how many frames it has read so far, every 4,096 frames.
pub fn compute_with(
    store: &Store,
    meta: &SessionMeta,
    progress: &mut dyn FnMut(u64),
) -> Result<SessionStats, StoreError> {
    let meta = &*store.with_details(meta)?;
    let mut chans: BTreeMap<u32, Chan> = BTreeMap::new();
    let mut methods: BTreeMap<String, Method> = BTreeMap::new();
    // Awaited requests: upstream id -> (method, sent at, the bridge's conn).
    let mut open: HashMap<String, (String, u64, u32)> = HashMap::new();
    let mut unanswered_untracked: HashMap<String, u64> = HashMap::new();
    let mut notices: HashMap<u32, u64> = HashMap::new();
    // Keyed by the catalog's bridges only, so a recording's junk conns add no entries.
    let mut refusals: HashMap<u32, Refusals> = meta
        .bridges
        .iter()
        .map(|b| (b.conn, Refusals::default()))
        .collect();
    let mut parser = Parser::new();
    for (n, item) in store.frames(meta.id).enumerate() {
        if n % 4096 == 0 {
            progress(n as u64);
        }
        let (_, rec) = item?;
        let Ok(view) = parser.parse(&rec.body, Mode::Tolerant) else {
            continue;
        };
        match (rec.dir, view.kind) {
            (Direction::ModToRelay, MsgType::Event) => {
                let c = chans
                    .entry(rec.channel.unwrap_or(u32::MAX))
                    .or_insert_with(|| Chan {
                        events: 0,
                        sizes: Sketch::default(),
                        last_mod_seq: None,
                        gaps: 0,
                        restarts: 0,
                    });
                c.events += 1;
                c.sizes
                    .record(view.payload.map_or(0, |p| p.len() as u64).max(1));
                if let Some(s) = rec.mod_seq {
                    match c.last_mod_seq {
                        Some(prev) if s > prev + 1 => c.gaps += s - prev - 1,
                        Some(prev) if s <= prev => c.restarts += 1,
                        _ => {}
                    }
                    c.last_mod_seq = Some(s);
                }
            }
            (Direction::RelayToMod, MsgType::Request) => {
                // The report's bounds: methods past the first MAX_METHODS are pooled, and at
                // most MAX_OPEN requests are awaited (the rest count as unanswered), so a
                // session of endless distinct methods or unanswered calls reads in bounded
                // memory and prints a bounded table.
                let name = view.method.as_deref().unwrap_or("?");
                let method = if methods.contains_key(name) || methods.len() < MAX_METHODS {
                    name.to_string()
                } else {
                    OTHER_METHODS.to_string()
                };
                methods
                    .entry(method.clone())
                    .or_insert_with(|| Method {
                        calls: 0,
                        errors: 0,
                        latency: new_latency(),
                        max_ns: 0,
                    })
                    .calls += 1;
                if let Some(id) = view.id.as_deref() {
                    if open.len() < MAX_OPEN {
                        open.insert(id.to_string(), (method, rec.time_ns, rec.conn));
                    } else {
                        *unanswered_untracked.entry(method).or_default() += 1;
                    }
                }
            }
            (Direction::ModToRelay, MsgType::Response) => {
                // Only an answer the relay routed to the caller is its answer: one that came
                // after the caller was told -32001 (past --request-timeout) is recorded as an
                // anomaly, with no conn, and leaves the call unanswered.
                let Some((method, sent, _)) = view
                    .id
                    .as_deref()
                    .and_then(|id| take_answered(&mut open, id, rec.conn))
                else {
                    continue;
                };
                let m = methods.get_mut(&method).expect("inserted with the request");
                if view.is_error() {
                    m.errors += 1;
                }
                let took = rec.time_ns.saturating_sub(sent).max(1);
                m.latency.saturating_record(took);
                m.max_ns = m.max_ns.max(took);
            }
            (Direction::RelayToBridge, MsgType::Event)
                if view.channel.as_deref() == Some("relay/dropped") =>
            {
                *notices.entry(rec.conn).or_default() += 1;
            }
            (Direction::RelayToBridge, MsgType::Response) => {
                let (Some(code), Some(r)) = (view.error_code, refusals.get_mut(&rec.conn)) else {
                    continue;
                };
                match ErrorCode::from_code(code) {
                    Some(ErrorCode::Forbidden) => r.denied += 1,
                    Some(ErrorCode::LeaseHeld) => r.lease_refused += 1,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let mut unanswered = unanswered_untracked;
    for (method, ..) in open.into_values() {
        *unanswered.entry(method).or_default() += 1;
    }
    let secs = (meta.duration_ns() as f64 / 1e9).max(1e-9);
    Ok(SessionStats {
        session: meta.id.to_string(),
        route: meta.route.clone(),
        duration_s: meta.duration_ns() as f64 / 1e9,
        frames: meta.frames,
        bytes: meta.bytes,
        anomalies: meta.anomalies,
        tags: meta.tags.clone(),
        channels: chans
            .into_iter()
            .map(|(id, c)| ChannelStats {
                channel: meta
                    .channels
                    .get(id as usize)
                    .cloned()
                    .unwrap_or_else(|| "?".into()),
                events: c.events,
                rate_per_s: c.events as f64 / secs,
                payload_mean: c.sizes.mean(),
                payload_p99: c.sizes.quantile(0.99),
                mod_seq_gaps: c.gaps,
                mod_seq_restarts: c.restarts,
            })
            .collect(),
        methods: methods
            .into_iter()
            .map(|(method, m)| {
                let answered = !m.latency.is_empty();
                let at =
                    |q: f64| answered.then(|| latency_at(&m.latency, m.max_ns, q) as f64 / 1e6);
                MethodStats {
                    unanswered: unanswered.get(&method).copied().unwrap_or(0),
                    calls: m.calls,
                    errors: m.errors,
                    p50_ms: at(0.5),
                    p90_ms: at(0.9),
                    p99_ms: at(0.99),
                    max_ms: answered.then(|| m.max_ns as f64 / 1e6),
                    method,
                }
            })
            .collect(),
        bridges: meta
            .bridges
            .iter()
            .map(|b| {
                let r = refusals.get(&b.conn).copied().unwrap_or_default();
                BridgeStats {
                    conn: b.conn,
                    name: b.name.clone(),
                    bridge_version: b.bridge_version.clone(),
                    label: b.label.clone(),
                    dropped: b.dropped,
                    drop_notices: notices.get(&b.conn).copied().unwrap_or(0),
                    unrecorded_bad_frames: b.unrecorded_bad_frames,
                    // The recording keeps a bridge's first refusals only; the count it left
                    // with holds them all (a relay killed first left none: the recorded stand).
                    denied: r.denied.max(b.denied),
                    lease_refused: r.lease_refused.max(b.lease_refused),
                    rate_limited: b.rate_limited,
                }
            })
            .collect(),
    })
}

/// A latency cell of the table: milliseconds to the microsecond, `-` when none was measured.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// The human-readable table: sizes in binary units, a section only when it has rows.
pub fn render(s: &SessionStats) -> String {
    use gabp_rt::display::{bytes, name};
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "session {}  route {}  {:.1}s  {} frames  {}  {} anomalies",
        s.session,
        name(&s.route),
        s.duration_s,
        s.frames,
        bytes(s.bytes),
        s.anomalies
    );
    if !s.tags.is_empty() {
        let tags: Vec<String> = s
            .tags
            .iter()
            .map(|(k, v)| format!("{k}={}", name(v)))
            .collect();
        let _ = writeln!(o, "tags {}", tags.join(" "));
    }
    if !s.channels.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<28} {:>10} {:>12} {:>12} {:>10} {:>6} {:>8}",
            "CHANNEL", "EVENTS", "RATE (ev/s)", "PAYLOAD (B)", "P99 (B)", "GAPS", "RESTARTS"
        );
    }
    for c in &s.channels {
        let _ = writeln!(
            o,
            "{:<28} {:>10} {:>12.1} {:>12.1} {:>10} {:>6} {:>8}",
            name(&c.channel),
            c.events,
            c.rate_per_s,
            c.payload_mean,
            c.payload_p99,
            c.mod_seq_gaps,
            c.mod_seq_restarts
        );
    }
    if !s.methods.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<28} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "METHOD",
            "CALLS",
            "ERRORS",
            "UNANSWERED",
            "P50 (ms)",
            "P90 (ms)",
            "P99 (ms)",
            "MAX (ms)"
        );
    }
    for m in &s.methods {
        let _ = writeln!(
            o,
            "{:<28} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}",
            name(&m.method),
            m.calls,
            m.errors,
            m.unanswered,
            ms(m.p50_ms),
            ms(m.p90_ms),
            ms(m.p99_ms),
            ms(m.max_ms)
        );
    }
    if !s.bridges.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<6} {:<20} {:<20} {:<28} {:>10} {:>12} {:>6} {:>13} {:>12}",
            "CONN",
            "NAME",
            "LABEL",
            "BRIDGE",
            "DROPPED",
            "DROP NOTICES",
            "DENIED",
            "LEASE REFUSED",
            "RATE LIMITED"
        );
    }
    // A session that thousands of bridges joined keeps the table readable: the first ones are
    // listed, the count of the rest is said (`--json` has them all).
    for b in s.bridges.iter().take(BRIDGE_ROWS) {
        let _ = writeln!(
            o,
            "{:<6} {:<20} {:<20} {:<28} {:>10} {:>12} {:>6} {:>13} {:>12}",
            b.conn,
            b.name
                .as_deref()
                .map_or_else(|| gabp_storage::catalog::DEFAULT_IDENTITY.into(), name),
            b.label.as_deref().map_or_else(|| "-".into(), name),
            name(&b.bridge_version),
            b.dropped,
            b.drop_notices,
            b.denied,
            b.lease_refused,
            b.rate_limited
        );
    }
    if s.bridges.len() > BRIDGE_ROWS {
        let _ = writeln!(
            o,
            "({} more bridges; `stats --json` lists every one)",
            s.bridges.len() - BRIDGE_ROWS
        );
    }
    o
}

/// Bridges listed in the table (`--json` lists all).
const BRIDGE_ROWS: usize = 200;

#[cfg(test)]
mod tests {
    use super::Sketch;

    #[test]
    fn sketch_quantiles_are_within_a_sixteenth() {
        let mut s = Sketch::default();
        for v in 1..=10_000u64 {
            s.record(v);
        }
        for q in [0.5, 0.9, 0.99] {
            let exact = (q * 10_000.0) as u64;
            let got = s.quantile(q);
            assert!(
                got >= exact && got <= exact + exact / 16 + 1,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(s.quantile(1.0), 10_000);
        assert!((s.mean() - 5000.5).abs() < 1e-9);
        let mut one = Sketch::default();
        one.record(512);
        assert_eq!(one.quantile(0.99), 512);
        assert_eq!(Sketch::default().quantile(0.5), 0);
        for v in [31u64, 32, 33, 1 << 40, u64::MAX] {
            assert!(Sketch::high(Sketch::bucket(v)) >= v);
        }
    }
}
