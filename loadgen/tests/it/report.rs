//! `gabp-loadgen run|call --report` pages checked in a real browser (headless, offline
//! Chromium: every chart rendered, a screenshot kept under the target dir), and `compare` of two
//! `--json` results, through the real binary. Without Chromium the browser checks fail as root
//! (set-up installs it) and print SKIPPED otherwise.

use std::path::Path;
use std::time::Duration;

use super::loadgen;
use gabp_report::browser::{self, artifact_dir, for_test};
use gabp_report::check;
use gabp_sim::{ModSim, ModSimConfig};

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// Loads `page` headless, checks every chart rendered, keeps a screenshot named `name`;
/// returns the charts' ids.
fn in_browser(chromium: &Path, page: &Path, name: &str) -> Vec<String> {
    let dom = browser::dump_dom(chromium, page).expect("the browser loads the page");
    let charts = check::check_dom(&dom).unwrap_or_else(|e| panic!("{name}: {e}"));
    let png = artifact_dir().join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    browser::screenshot(chromium, page, &png, (1200, 2600)).expect("screenshot");
    eprintln!("{name}: {charts:?}, screenshot {}", png.display());
    charts.into_iter().map(|c| c.chart).collect()
}

#[tokio::test]
async fn a_run_with_its_baseline_reports_every_chart_and_compares_figure_by_figure() {
    let chromium = for_test();
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("run.html");
    let out = loadgen(&[
        "run",
        "--bridges",
        "2",
        "--rate",
        "2000",
        "--warmup",
        "300ms",
        "--duration",
        "2s",
        "--baseline",
        "--json",
        "--report",
        path(&page),
    ])
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // The baseline forwarder's normal stop (SIGTERM from this run) is not an interruption.
    assert!(!err.contains("interrupted"), "{err}");
    let a = dir.path().join("a.json");
    std::fs::write(&a, &out.stdout).expect("write a.json");
    let html = std::fs::read_to_string(&page).expect("page written");
    assert!(
        html.contains("gabp-relay") && html.contains("baseline"),
        "both targets shown"
    );
    let outside = check::external_references(&html);
    assert!(outside.is_empty(), "self-contained: {outside:?}");
    if let Some(chromium) = &chromium {
        let charts = in_browser(chromium, &page, "loadgen-run");
        assert_eq!(charts, ["throughput", "latency", "cpu", "rss"]);
    }

    // B: the same result with the relay twice as fast.
    let mut doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON result");
    let eps = doc["relay"]["delivered_eps"].as_f64().expect("a figure");
    assert!(eps > 0.0);
    doc["relay"]["delivered_eps"] = serde_json::json!(eps * 2.0);
    let b = dir.path().join("b.json");
    std::fs::write(&b, serde_json::to_vec(&doc).expect("json")).expect("write b.json");
    let out = loadgen(&["compare", path(&a), path(&b)]).await;
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("relay.delivered_eps "))
        .unwrap_or_else(|| panic!("a row for the figure: {table}"));
    // Twice the throughput: higher is better, and one round each cannot say how large the
    // noise is.
    assert!(row.contains("×2 (+100 %)"), "{row}");
    assert!(row.contains(" higher "), "{row}");
    assert!(row.ends_with("better?"), "{row}");
    let unchanged = table
        .lines()
        .find(|l| l.starts_with("The same in both"))
        .expect("the figures that did not change");
    assert!(unchanged.contains("baseline.delivered_eps"), "{unchanged}");
    // The inputs are named by their files, and each says what it measured.
    assert!(table.starts_with("A = a: run, "), "{table}");
    assert!(table.contains("\nB = b: run, "), "{table}");
    assert!(table.contains("Settings: the same in both."), "{table}");
    let out = loadgen(&["compare", path(&a), path(&b), "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let figures = v["figures"].as_array().expect("figures");
    assert!(
        figures.len() > 20,
        "every numeric figure: {}",
        figures.len()
    );
    let f = figures
        .iter()
        .find(|f| f["figure"] == "relay.latency_us.p99")
        .expect("a latency figure");
    assert_eq!(f["change"], 0.0);
}

#[tokio::test]
async fn compare_refuses_unreadable_input_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"relay": {"delivered_eps": 1}}"#).expect("write");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "not json").expect("write");
    let missing = dir.path().join("missing.json");
    // An object holding no figures, and a result of another kind, are not results to compare.
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "{}").expect("write");
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"calls": 5}"#).expect("write");
    for (a, b) in [
        (&good, &missing),
        (&bad, &good),
        (&good, &empty),
        (&good, &other),
        (&good, &good),
    ] {
        let out = loadgen(&["compare", path(a), path(b)]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        if a == b {
            assert_eq!(out.status.code(), Some(0), "{err}");
            continue;
        }
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

#[tokio::test]
async fn a_call_run_reports_its_latency_curve() {
    let chromium = for_test();
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "t".into(),
            rate: Some(100.0),
            tool_latency: Duration::from_millis(1),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("call.html");
    let out = loadgen(&[
        "call",
        "--addr",
        &sim.addr().to_string(),
        "--token",
        "t",
        "--rate",
        "200",
        "--warmup",
        "0",
        "--duration",
        "1s",
        "--report",
        path(&page),
    ])
    .await;
    sim.stop();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("page written");
    assert!(html.contains("sim/echo"));
    if let Some(chromium) = &chromium {
        assert_eq!(in_browser(chromium, &page, "loadgen-call"), ["latency"]);
    }
}
