//! The chaos run's report and its table: per phase, what the honest bridges and the caller got,
//! what the hostile clients did, and how the relay's memory, descriptors, `/metrics` and data
//! dir grew. Reads measurements only; runs nothing.

use serde_json::{json, Value};

use crate::procstat;
use crate::report::Measurement;

use super::{ChaosOptions, Phase, METRICS_SLACK};

pub(super) fn report(
    o: &ChaosOptions,
    quiet: Phase,
    hostile: Phase,
    metrics_at_start: u64,
) -> Value {
    // No ratio where either phase measured nothing (e.g. the relay delivered nothing at all).
    let ratio = |a: f64, b: f64| (a > 0.0 && b > 0.0).then(|| b / a);
    let (q, h) = (&quiet.honest, &hostile.honest);
    let unharmed = |m: &Measurement| {
        m.unannounced_gaps == 0
            && m.dropped == 0
            && m.disconnects == 0
            && m.calls_unanswered == 0
            && m.errors.is_empty()
            && m.delivered > 0
    };
    // Labels come from bounded sets: the hostile mix may add a few series, not thousands.
    let metrics_bounded = match (quiet.after.metrics_lines, hostile.after.metrics_lines) {
        (Some(a), Some(b)) => b <= a + METRICS_SLACK,
        _ => false,
    };
    let ok = unharmed(q)
        && unharmed(h)
        && !quiet.rss_limit_hit
        && !hostile.rss_limit_hit
        && metrics_bounded;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let phase = |p: &Phase| {
        json!({
            "honest": p.honest,
            "relay_rss_start_mib": mib(p.samples.rss_start),
            "relay_rss_peak_mib": mib(p.samples.rss_peak),
            "relay_rss_end_mib": mib(p.samples.rss_end),
            "relay_fds_start": p.samples.fds_start,
            "relay_fds_peak": p.samples.fds_peak,
            "relay_fds_end": p.samples.fds_end,
            "relay_samples": p.samples.n,
            "rss_limit_hit": p.rss_limit_hit,
            "metrics_lines": p.after.metrics_lines,
            "data_dir_mib": mib(p.after.data_bytes),
            "relay_log_lines": p.after.log_lines,
        })
    };
    json!({
        "tool": "gabp-loadgen chaos",
        "version": env!("CARGO_PKG_VERSION"),
        "machine": procstat::machine(),
        "settings": {
            "phase_s": o.phase.as_secs_f64(),
            "warmup_s": o.warmup.as_secs_f64(),
            "bridges": o.bridges,
            "rate": o.rate,
            "payload_bytes": o.payload_bytes,
            "calls_per_s": o.calls_per_s,
            "max_body": o.max_body,
            "policy": "drop-oldest",
            "record": o.record,
            "hostile_workers_per_kind": o.workers,
            "hostile_kinds": o.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "rss_limit_mib": o.rss_limit_mib,
            "seed": o.seed,
        },
        "quiet": phase(&quiet),
        "hostile": phase(&hostile),
        "ratio": {
            "p50": ratio(q.latency_us.p50, h.latency_us.p50),
            "p99": ratio(q.latency_us.p99, h.latency_us.p99),
            "max": ratio(q.latency_us.max, h.latency_us.max),
            "call_p50": ratio(q.call_latency_us.p50, h.call_latency_us.p50),
            "call_p99": ratio(q.call_latency_us.p99, h.call_latency_us.p99),
            "delivered_per_s": ratio(q.delivered_eps, h.delivered_eps),
        },
        "metrics_lines_at_start": metrics_at_start,
        "hostile_actors": hostile.hostile,
        "metrics_bounded": metrics_bounded,
        "ok": ok,
    })
}

/// The human table of a chaos report.
pub fn table(doc: &Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let s = &doc["settings"];
    let _ = writeln!(
        o,
        "chaos: {} honest bridges at {} events/s ({} B), {} calls/s, {} s per phase (+{} s warm-up), max body {} B, {} hostile actors per kind",
        s["bridges"], s["rate"], s["payload_bytes"], s["calls_per_s"], s["phase_s"], s["warmup_s"], s["max_body"], s["hostile_workers_per_kind"]
    );
    let _ = writeln!(
        o,
        "{:<8} {:>11} {:>11} {:>9} {:>9} {:>10} {:>6} {:>5} {:>5} {:>10} {:>10} {:>6} {:>9} {:>8} {:>8} {:>9} {:>7}",
        "PHASE", "PUBLISHED/S", "DELIVERED/S", "P50 µs", "P99 µs", "MAX µs", "DROPS", "GAPS", "DISC",
        "CALL P50", "CALL P99", "UNANS", "RSS MiB", "FDS", "METRICS", "DATA MiB", "LOG"
    );
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    // serde_json's Display ignores widths: numbers are formatted as numbers.
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    for name in ["quiet", "hostile"] {
        let p = &doc[name];
        let m = &p["honest"];
        let _ = writeln!(
            o,
            "{:<8} {:>11.0} {:>11.0} {:>9.1} {:>9.1} {:>10.1} {:>6} {:>5} {:>5} {:>10.1} {:>10.1} {:>6} {:>9.1} {:>8} {:>8} {:>9.1} {:>7}",
            name,
            f(&m["published_eps"]),
            f(&m["delivered_eps"]),
            f(&m["latency_us"]["p50"]),
            f(&m["latency_us"]["p99"]),
            f(&m["latency_us"]["max"]),
            u(&m["dropped"]),
            u(&m["unannounced_gaps"]),
            u(&m["disconnects"]),
            f(&m["call_latency_us"]["p50"]),
            f(&m["call_latency_us"]["p99"]),
            u(&m["calls_unanswered"]),
            f(&p["relay_rss_peak_mib"]),
            u(&p["relay_fds_peak"]),
            p["metrics_lines"].as_u64().map_or("-".into(), |n| n.to_string()),
            f(&p["data_dir_mib"]),
            u(&p["relay_log_lines"]),
        );
        for e in m["errors"].as_array().into_iter().flatten() {
            let _ = writeln!(o, "{:<8} error: {}", "", e.as_str().unwrap_or_default());
        }
        if p["rss_limit_hit"] == true {
            let _ = writeln!(
                o,
                "{:<8} relay RSS passed {} MiB: hostile actors called off",
                "", s["rss_limit_mib"]
            );
        }
    }
    let r = &doc["ratio"];
    let x = |v: &Value| v.as_f64().map_or("-".into(), |v| format!("{v:.2}"));
    let _ = writeln!(
        o,
        "ratio hostile/quiet: p50 {}, p99 {}, max {}, call p50 {}, call p99 {}, delivered/s {}",
        x(&r["p50"]),
        x(&r["p99"]),
        x(&r["max"]),
        x(&r["call_p50"]),
        x(&r["call_p99"]),
        x(&r["delivered_per_s"])
    );
    let _ = writeln!(
        o,
        "{:<15} {:>7} {:>7} {:>7} {:>10} {:>9} {:>7} {:>7} {:>7} {:>7} {:>10} {:>7}",
        "HOSTILE",
        "WORKERS",
        "RUNS",
        "CONNS",
        "FRAMES",
        "MiB SENT",
        "CLOSED",
        "BLOCKED",
        "REFUSED",
        "UNANS",
        "SLOWEST ms",
        "CUT"
    );
    for a in doc["hostile_actors"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "{:<15} {:>7} {:>7} {:>7} {:>10} {:>9.1} {:>7} {:>7} {:>7} {:>7} {:>10} {:>7}",
            a["kind"].as_str().unwrap_or_default(),
            u(&a["workers"]),
            u(&a["runs"]),
            u(&a["connections"]),
            u(&a["frames"]),
            f(&a["bytes"]) / (1 << 20) as f64,
            u(&a["closed_by_relay"]),
            u(&a["writes_blocked"]),
            u(&a["connect_errors"]),
            u(&a["unanswered"]),
            u(&a["slowest_reply_ms"]),
            u(&a["cut_short"]),
        );
    }
    let _ = writeln!(
        o,
        "relay exited cleanly after SIGTERM: {} (exit code {}); ok: {}",
        doc["relay_exit_clean"], doc["relay_exit_code"], doc["ok"]
    );
    o
}
