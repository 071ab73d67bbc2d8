//! Metrics: names, per-route handles, and the Prometheus text endpoint.
//!
//! Hot-path counters are registered once per route and kept as handles, so counting a frame is
//! one atomic add. The exporter serves `GET /metrics` from a tiny HTTP responder on the
//! relay's own runtime; that keeps hyper and TLS out of the dependency tree.

use std::net::SocketAddr;

use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    "gabp_auth_failures_total",
    "gabp_recorded_frames_total",
    "gabp_record_errors_total",
    "gabp_record_lost_frames_total",
    "gabp_record_commit_seconds",
    "gabp_recorder_lag",
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
    /// Failed hellos.
    pub auth_failures: Counter,
    /// Recorder queue depth.
    pub recorder_lag: Gauge,
    route: String,
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
            auth_failures: metrics::counter!("gabp_auth_failures_total", "route" => r.clone()),
            recorder_lag: metrics::gauge!("gabp_recorder_lag", "route" => r.clone()),
            route: r,
        }
    }

    /// The events counter of one channel.
    pub fn channel_events(&self, channel: &str) -> Counter {
        metrics::counter!("gabp_events_total", "route" => self.route.clone(), "channel" => channel.to_string())
    }

    /// The latency histogram and the outcome counter of one method.
    pub fn request(&self, method: &str, outcome: &'static str) -> (Histogram, Counter) {
        (
            metrics::histogram!("gabp_request_duration_seconds", "route" => self.route.clone(), "method" => method.to_string()),
            metrics::counter!("gabp_requests_total", "route" => self.route.clone(), "method" => method.to_string(), "outcome" => outcome),
        )
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

/// Serves `GET /metrics` until cancelled.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle, cancel: CancellationToken) {
    loop {
        let (mut sock, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut req = [0u8; 2048];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut req))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let head = String::from_utf8_lossy(&req[..n]);
            let (status, body) = if head.starts_with("GET /metrics") || head.starts_with("GET / ") {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
