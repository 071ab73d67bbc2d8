//! `--report PATH`: a load run as one self-contained HTML page (drawn by `gabp-report`, the
//! same charts as `gabp-relay report`): the figures of every target side by side, delivered
//! events per second over the window, the latency percentile curve, and the target's CPU and
//! resident memory over the window when its process was sampled; the baseline (and any peers)
//! beside the relay in each chart.

use std::path::Path;

use anyhow::{Context, Result};
use gabp_report::{chart, Page, Series};

use crate::report::{Measurement, Percentiles};

fn lat(p: &Percentiles) -> Vec<String> {
    if p.count == 0 {
        return vec!["-".into(); 5];
    }
    [p.p50, p.p90, p.p99, p.p999, p.max]
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect()
}

/// Per-interval rates from cumulative samples: (t at the interval's end, change per second).
fn rates(
    m: &Measurement,
    value: impl Fn(&crate::report::Sample) -> Option<f64>,
) -> Vec<(f64, f64)> {
    m.timeline
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].t_s - w[0].t_s;
            let dv = value(&w[1])? - value(&w[0])?;
            (dt > 0.0).then(|| (w[1].t_s, dv / dt))
        })
        .collect()
}

/// The page of a `run` (relay, baseline, peers: whichever were measured).
pub fn run_page(title: &str, scenario: &[(&str, String)], ms: &[&Measurement]) -> Result<String> {
    let mut p = Page::new(title);
    p.heading("Scenario").summary(scenario);
    p.heading("Figures");
    let rows: Vec<Vec<String>> = ms
        .iter()
        .map(|m| {
            let mut row = vec![
                m.target.clone(),
                format!("{:.1}", m.duration_s),
                format!("{:.0}", m.published_eps),
                format!("{:.0}", m.delivered_eps),
            ];
            row.extend(lat(&m.latency_us));
            row.extend([
                m.dropped.to_string(),
                m.unannounced_gaps.to_string(),
                if m.unsampled {
                    "-".into()
                } else {
                    format!("{:.0}", m.cpu_percent)
                },
                if m.unsampled {
                    "-".into()
                } else {
                    format!("{:.1}", m.peak_rss_mib)
                },
                m.calls.to_string(),
                m.call_errors.to_string(),
            ]);
            row
        })
        .collect();
    p.table(
        &[
            "target",
            "window s#",
            "published/s#",
            "delivered/s#",
            "p50 µs#",
            "p90 µs#",
            "p99 µs#",
            "p99.9 µs#",
            "max µs#",
            "drops#",
            "gaps#",
            "CPU %#",
            "peak RSS MiB#",
            "calls#",
            "call errors#",
        ],
        &rows,
    );
    if let [relay, base, ..] = ms {
        if base.delivered_eps > 0.0 {
            p.note(&format!(
                "{} delivered / {} delivered: {:.3}",
                relay.target,
                base.target,
                relay.delivered_eps / base.delivered_eps
            ));
        }
    }
    let each = |f: &dyn Fn(&Measurement) -> Vec<(f64, f64)>| -> Vec<Series> {
        ms.iter()
            .map(|m| Series {
                name: m.target.clone(),
                points: f(m),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let throughput = each(&|m| rates(m, |s| Some(s.delivered as f64)));
    p.heading("Throughput over time").chart(
        "throughput",
        "Events delivered to all bridges per second, sampled every 250 ms over the measured window.",
        &chart::lines("time in window (s)", "delivered events/s", &throughput, &[])?,
    );
    let curves = each(&|m| m.latency_curve.clone());
    p.heading("Event latency").chart(
        "latency",
        "Event latency from each event's scheduled send time, by percentile (the tail stretched).",
        &chart::percentiles("latency (µs)", &curves)?,
    );
    let calls = each(&|m| m.call_curve.clone());
    if !calls.is_empty() {
        p.heading("tools/call latency").chart(
            "calls",
            "tools/call latency from each call's scheduled send time, by percentile.",
            &chart::percentiles("latency (µs)", &calls)?,
        );
    }
    let cpu = each(&|m| {
        rates(m, |s| s.cpu_s)
            .into_iter()
            .map(|(t, v)| (t, v * 100.0))
            .collect()
    });
    if !cpu.is_empty() {
        p.heading("CPU and memory").chart(
            "cpu",
            "The target process's CPU, percent of one core, per 250 ms interval.",
            &chart::lines("time in window (s)", "CPU %", &cpu, &[])?,
        );
        let rss = each(&|m| {
            m.timeline
                .iter()
                .filter_map(|s| Some((s.t_s, s.rss? as f64 / (1 << 20) as f64)))
                .collect()
        });
        p.chart(
            "rss",
            "The target process's resident memory.",
            &chart::lines("time in window (s)", "RSS (MiB)", &rss, &[])?,
        );
    }
    Ok(p.finish())
}

/// The page of a `call` run: its figures and latency curve.
pub fn call_page(
    title: &str,
    figures: &[(&str, String)],
    curve: Vec<(f64, f64)>,
) -> Result<String> {
    let mut p = Page::new(title);
    p.heading("Figures").summary(figures);
    let series = vec![Series {
        name: "tools/call".into(),
        points: curve,
    }];
    p.heading("Latency").chart(
        "latency",
        "Call latency from each call's scheduled send time, by percentile (the tail stretched).",
        &chart::percentiles("latency (µs)", &series)?,
    );
    Ok(p.finish())
}

/// Writes `html` to `path` (a temp file renamed on success).
pub fn write(path: &Path, html: &str) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".gabp-report-")
        .tempfile_in(dir)
        .with_context(|| format!("writing the report to {}", path.display()))?;
    std::io::Write::write_all(tmp.as_file_mut(), html.as_bytes())?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("writing the report to {}", path.display()))?;
    Ok(())
}
