//! Metrics: names, per-route handles, and the Prometheus text endpoint.
//!
//! Hot-path counters are registered once per route and kept as handles, so counting a frame is
//! one atomic add. Label values come only from bounded sets: the route names of the config,
//! known GABP methods plus methods the mod has answered successfully (capped), and the mod's
//! channel names, sanitised and capped; bridge identity names from the config (`default` for a
//! route's own token); anything else is counted under `other`, so no peer can
//! grow `/metrics` by sending new names. A name that holds a secret (a bridge can name a method
//! or a channel after a token) is counted under `other` too: scrapes are read by more people
//! than the tokens are meant for. The port that serves them is `crate::http`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;

/// Every metric name the relay exports (the Grafana dashboard test checks against this).
pub const NAMES: &[&str] = &[
    "gabp_frames_total",
    "gabp_events_total",
    "gabp_dropped_total",
    "gabp_bridges_connected",
    "gabp_outbox_events",
    "gabp_request_duration_seconds",
    "gabp_requests_total",
    "gabp_upstream_reconnects_total",
    "gabp_upstream_connected",
    "gabp_anomalies_total",
    "gabp_bad_frames_total",
    "gabp_stall_refusals_total",
    "gabp_unauthenticated_frames_total",
    "gabp_auth_failures_total",
    "gabp_bridge_refusals_total",
    "gabp_identity_bridges_connected",
    "gabp_bridge_refusals_by_identity_total",
    "gabp_recorded_frames_total",
    "gabp_record_errors_total",
    "gabp_record_lost_frames_total",
    "gabp_record_commit_seconds",
    "gabp_recorder_lag",
    "gabp_recorder_lag_bytes",
];

/// Handles for one route's hot-path metrics.
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    /// Frames received from the mod.
    pub mod_in: Counter,
    /// Frames sent to the mod.
    pub mod_out: Counter,
    /// Frames received from bridges.
    pub bridge_in: Counter,
    /// Events delivered to bridges (counted per write batch).
    pub bridge_out: Counter,
    /// Events dropped by the slow-bridge policy.
    pub dropped: Counter,
    /// Bridges connected.
    pub bridges: Gauge,
    /// Deepest bridge outbox, in events.
    pub outbox_events: Gauge,
    /// Reconnects to the mod.
    pub reconnects: Counter,
    /// Whether the mod is connected.
    pub upstream_connected: Gauge,
    /// Unroutable mod frames.
    pub anomalies: Counter,
    /// Rejected bridge frames.
    pub bad_frames: Counter,
    /// Bridge requests and hellos refused because a failing recorder holds the mod (`stall`).
    pub stall_refusals: Counter,
    /// Failed hellos.
    pub auth_failures: Counter,
    /// Frames received before a successful hello (counted, never recorded).
    pub unauthenticated: Counter,
    /// Recorder queue depth, in batches.
    pub recorder_lag: Gauge,
    /// Bytes the recorder's queue holds uncommitted (what a crash would leave unrecorded).
    pub recorder_lag_bytes: Gauge,
    route: String,
    labels: Arc<Mutex<Labels>>,
}

/// The label value for anything outside the bounded sets.
pub const OTHER: &str = "other";
/// Methods beyond [`KNOWN_METHODS`] that may become labels (the first the mod answers).
pub const MAX_METHOD_LABELS: usize = 64;
/// Channel names that may become labels per route.
pub const MAX_CHANNEL_LABELS: usize = 256;
/// Longest label value taken from a name.
const MAX_LABEL_LEN: usize = 64;
/// Methods of GABP and the relay, always labelled as themselves.
pub const KNOWN_METHODS: &[&str] = &[
    "session/hello",
    "tools/list",
    "tools/call",
    "events/subscribe",
    "events/unsubscribe",
    "events/list",
    "resources/list",
    "resources/read",
    "attention/current",
    "attention/ack",
    "state/get",
    "relay/status",
    "relay/mark",
];

#[derive(Debug, Default)]
struct Labels {
    methods: HashSet<String>,
    channels: HashSet<String>,
    /// Each method label's latency histogram and outcome counters, registered once: building
    /// a metric's key (its labels, a lookup in the registry) on every answer costs more than
    /// the answer's own bookkeeping. Bounded as the labels are.
    requests: HashMap<String, RequestHandles>,
}

#[derive(Debug)]
struct RequestHandles {
    method: String,
    latency: Histogram,
    outcomes: Vec<(&'static str, Counter)>,
}

/// A name as a label value: printable ASCII letters, digits and `_ - . / :` only (anything
/// else becomes `_`), at most 64 characters.
pub fn sanitise(name: &str) -> String {
    name.chars()
        .take(MAX_LABEL_LEN)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-./:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl RouteMetrics {
    /// Registers the route's metrics.
    pub fn new(route: &str) -> RouteMetrics {
        let r = route.to_string();
        RouteMetrics {
            mod_in: metrics::counter!("gabp_frames_total", "route" => r.clone(), "direction" => "mod_in"),
            mod_out: metrics::counter!("gabp_frames_total", "route" => r.clone(), "direction" => "mod_out"),
            bridge_in: metrics::counter!("gabp_frames_total", "route" => r.clone(), "direction" => "bridge_in"),
            bridge_out: metrics::counter!("gabp_frames_total", "route" => r.clone(), "direction" => "bridge_out"),
            dropped: metrics::counter!("gabp_dropped_total", "route" => r.clone()),
            bridges: metrics::gauge!("gabp_bridges_connected", "route" => r.clone()),
            outbox_events: metrics::gauge!("gabp_outbox_events", "route" => r.clone()),
            reconnects: metrics::counter!("gabp_upstream_reconnects_total", "route" => r.clone()),
            upstream_connected: metrics::gauge!("gabp_upstream_connected", "route" => r.clone()),
            anomalies: metrics::counter!("gabp_anomalies_total", "route" => r.clone()),
            bad_frames: metrics::counter!("gabp_bad_frames_total", "route" => r.clone()),
            stall_refusals: metrics::counter!("gabp_stall_refusals_total", "route" => r.clone()),
            auth_failures: metrics::counter!("gabp_auth_failures_total", "route" => r.clone()),
            unauthenticated: metrics::counter!("gabp_unauthenticated_frames_total", "route" => r.clone()),
            recorder_lag: metrics::gauge!("gabp_recorder_lag", "route" => r.clone()),
            recorder_lag_bytes: metrics::gauge!("gabp_recorder_lag_bytes", "route" => r.clone()),
            route: r,
            labels: Arc::default(),
        }
    }

    /// The label for a channel: its sanitised name while fewer than [`MAX_CHANNEL_LABELS`]
    /// names are labelled, else `other`; `other` too when `secret` (its name holds one).
    pub fn channel_label(&self, channel: &str, secret: bool) -> String {
        if secret {
            return OTHER.into();
        }
        let name = sanitise(channel);
        let mut labels = self.labels.lock();
        if labels.channels.contains(&name) {
            return name;
        }
        if labels.channels.len() < MAX_CHANNEL_LABELS {
            labels.channels.insert(name.clone());
            return name;
        }
        OTHER.into()
    }

    /// The label for a method: itself if known, or once the mod has answered it successfully
    /// (the first [`MAX_METHOD_LABELS`] such) unless `secret` says it holds a secret, else
    /// `other`. `secret` is asked only of a method about to become a label.
    pub fn method_label(
        &self,
        method: &str,
        outcome: &str,
        secret: impl FnOnce(&str) -> bool,
    ) -> String {
        if KNOWN_METHODS.contains(&method) {
            return method.into();
        }
        let name = sanitise(method);
        let mut labels = self.labels.lock();
        if labels.methods.contains(&name) {
            return name;
        }
        if outcome == "ok" && labels.methods.len() < MAX_METHOD_LABELS && !secret(method) {
            labels.methods.insert(name.clone());
            return name;
        }
        OTHER.into()
    }

    /// The events counter of one channel (`secret`: its name holds one).
    pub fn channel_events(&self, channel: &str, secret: bool) -> Counter {
        metrics::counter!("gabp_events_total", "route" => self.route.clone(), "channel" => self.channel_label(channel, secret))
    }

    /// The latency histogram and the outcome counter of one method (`secret` as
    /// [`Self::method_label`] takes it).
    pub fn request(
        &self,
        method: &str,
        outcome: &'static str,
        secret: impl FnOnce(&str) -> bool,
    ) -> (Histogram, Counter) {
        // A method labelled as itself before (every known method, and the mod's own ones once
        // seen) is found without building its label: labels are their own label.
        if let Some(found) = self.labels.lock().requests.get(method).and_then(|h| {
            let (_, count) = h.outcomes.iter().find(|(o, _)| *o == outcome)?;
            Some((h.latency.clone(), count.clone()))
        }) {
            return found;
        }
        let method = self.method_label(method, outcome, secret);
        let mut labels = self.labels.lock();
        let handles = labels
            .requests
            .entry(method)
            .or_insert_with_key(|method| RequestHandles {
                latency: metrics::histogram!("gabp_request_duration_seconds", "route" => self.route.clone(), "method" => method.clone()),
                method: method.clone(),
                outcomes: Vec::new(),
            });
        let count = match handles.outcomes.iter().find(|(o, _)| *o == outcome) {
            Some((_, c)) => c.clone(),
            None => {
                let c = metrics::counter!("gabp_requests_total", "route" => self.route.clone(), "method" => handles.method.clone(), "outcome" => outcome);
                handles.outcomes.push((outcome, c.clone()));
                c
            }
        };
        (handles.latency.clone(), count)
    }
}

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0, 30.0,
            ],
        )
        .ok()?
        .install_recorder()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_bounded_sets() {
        let m = RouteMetrics::new("labels-test");
        let none = |_: &str| false;
        assert_eq!(m.method_label("tools/call", "error", none), "tools/call");
        assert_eq!(m.method_label("x/never-answered", "error", none), OTHER);
        assert_eq!(m.method_label("x/answered", "ok", none), "x/answered");
        assert_eq!(m.method_label("x/answered", "error", none), "x/answered");
        for i in 0..1000 {
            m.method_label(&format!("junk/m{i}"), "ok", none);
        }
        assert_eq!(m.labels.lock().methods.len(), MAX_METHOD_LABELS);
        assert_eq!(m.method_label("junk/late", "ok", none), OTHER);
        assert_eq!(m.channel_label("a\u{1b}[31m\r\n\0", false), "a__31m___");
        assert_eq!(m.channel_label(&"x".repeat(10_000), false).len(), 64);
        for i in 0..1000 {
            m.channel_label(&format!("c{i}"), false);
        }
        assert_eq!(m.labels.lock().channels.len(), MAX_CHANNEL_LABELS);
        assert_eq!(m.channel_label("late", false), OTHER);
    }

    #[test]
    fn names_holding_a_secret_are_never_labels() {
        let m = RouteMetrics::new("secret-labels-test");
        let secret = "0123456789abcdef0123456789abcdef";
        let holds = |name: &str| name.contains(secret);
        let method = format!("game/t{secret}");
        assert_eq!(m.method_label(&method, "ok", holds), OTHER);
        assert!(m.labels.lock().methods.is_empty(), "no label taken");
        let (_, count) = m.request(&method, "ok", holds);
        count.increment(1);
        assert_eq!(
            m.labels.lock().requests.keys().collect::<Vec<_>>(),
            vec![OTHER]
        );
        assert_eq!(m.channel_label(&format!("c/{secret}"), true), OTHER);
        assert!(m.labels.lock().channels.is_empty());
    }
}
