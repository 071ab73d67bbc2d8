//! `gabp-relay report` checked in a real browser: a session recorded through the real binary in
//! front of the simulated mod (events, tool calls with an error, marks), its report written by
//! the binary, then loaded headless and offline in Debian's Chromium; every chart must have
//! rendered (the page's own check and the DOM dump agree), and a screenshot PNG is kept under
//! the target dir. A page with one chart broken must fail the same check. Without Chromium the
//! tests fail as root (set-up installs it) and print SKIPPED otherwise.

use std::path::{Path, PathBuf};

use gabp_report::browser::{artifact_dir, for_test};

use crate::support::*;
use gabp_report::{browser, check};

/// Records a session with events, calls (one failing) and marks; returns the data dir.
async fn record(dir: &Path) -> PathBuf {
    let sim = start_mod(Some(2000.0));
    let data = dir.join("data");
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["world/tick", "player/move"])
        .await
        .expect("subscribe");
    c.call("relay/mark", serde_json::json!({"label": "episode-start"}))
        .await
        .expect("mark");
    for i in 0..40 {
        for _ in 0..10 {
            c.next_event().await.expect("event");
        }
        c.call(
            "tools/call",
            serde_json::json!({"name": "sim/echo", "arguments": {"i": i}}),
        )
        .await
        .expect("call");
    }
    let failed = c
        .call(
            "tools/call",
            serde_json::json!({"name": "sim/fail", "arguments": {}}),
        )
        .await;
    assert!(failed.is_err(), "sim/fail fails");
    c.call("relay/mark", serde_json::json!({"label": "episode-end"}))
        .await
        .expect("mark");
    s.stop_cleanly().await;
    sim.stop();
    data
}

/// Records a session and writes its report with the binary; returns the page's path.
async fn recorded_report(dir: &Path) -> PathBuf {
    let data = record(dir).await;
    let page = dir.join("report.html");
    let out = output(&[
        "report",
        "latest",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "-o",
        page.to_str().expect("utf-8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", one_line(&out));
    page
}

/// The page's longest call is the exact one `stats` reads from the same session, not the upper
/// end of its histogram bucket.
#[tokio::test]
async fn the_reports_latencies_are_stats_own_and_its_longest_call_is_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = recorded_report(dir.path()).await;
    let html = std::fs::read_to_string(&page).expect("page written");
    let data = dir.path().join("data");
    let out = output(&[
        "stats",
        "latest",
        "--json",
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    let stats = json(&out);
    let call = stats["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .find(|m| m["method"] == "tools/call")
        .unwrap_or_else(|| panic!("{stats}"));
    // p50, p90, p99 and max, as the page prints them.
    let stats_ms: Vec<String> = ["p50Ms", "p90Ms", "p99Ms", "maxMs"]
        .iter()
        .map(|k| format!("{:.3}", call[k].as_f64().expect("latency")))
        .collect();
    let row = html
        .lines()
        .find(|l| l.starts_with("<tr><td>tools/call</td>"))
        .expect("the page's tools/call row");
    let want: String = stats_ms
        .iter()
        .map(|v| format!("<td class=\"n\">{v}</td>"))
        .collect();
    assert!(
        row.ends_with(&format!("{want}</tr>")),
        "{row} ends with stats' {stats_ms:?}"
    );
}

#[tokio::test]
async fn a_recorded_session_reports_every_chart_in_a_real_browser() {
    let Some(chromium) = for_test() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let page = recorded_report(dir.path()).await;
    let html = std::fs::read_to_string(&page).expect("page written");
    // Offline by construction: nothing on the page points anywhere.
    let outside = check::external_references(&html);
    assert!(outside.is_empty(), "self-contained: {outside:?}");
    // Inline code runs only by hash (the charts' check below proves the hashes are right).
    assert!(
        html.contains("script-src 'sha256-"),
        "the policy names scripts by hash"
    );
    assert!(
        !html.contains("unsafe-inline"),
        "no 'unsafe-inline' in the policy"
    );
    for what in [
        "world/tick",
        "tools/call",
        "episode-start",
        "episode-end",
        "error",
    ] {
        assert!(html.contains(what), "the page shows {what}");
    }
    let dom = browser::dump_dom(&chromium, &page).expect("the browser loads the page");
    let charts = check::check_dom(&dom).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<_> = charts.iter().map(|c| c.chart.as_str()).collect();
    assert_eq!(ids, ["events", "latency", "calls"]);
    eprintln!("rendered: {charts:?}");
    let png = artifact_dir().join("session-report.png");
    let _ = std::fs::remove_file(&png);
    browser::screenshot(&chromium, &page, &png, (1100, 2400)).expect("screenshot");
    eprintln!("screenshot: {}", png.display());
}

#[tokio::test]
async fn a_page_with_a_broken_chart_fails_the_browser_check() {
    let Some(chromium) = for_test() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let page = recorded_report(dir.path()).await;
    let html = std::fs::read_to_string(&page).expect("page written");
    // Break the latency chart: its figure keeps its place, its drawing is gone.
    let at = html.find("data-chart=\"latency\"").expect("latency chart");
    let start = html[at..].find("<svg").expect("svg") + at;
    let end = html[start..].find("</svg>").expect("svg end") + start + "</svg>".len();
    let broken = format!("{}<svg></svg>{}", &html[..start], &html[end..]);
    let bad = dir.path().join("broken.html");
    std::fs::write(&bad, broken).expect("write");
    let dom = browser::dump_dom(&chromium, &bad).expect("the browser loads the page");
    let err = check::check_dom(&dom).expect_err("a broken chart fails");
    assert!(err.contains("latency"), "{err}");
    // An inline script the page did not bring (markup that got past escaping) never runs: the
    // policy allows the page's own two scripts only, by hash, and the block fails the check.
    let html = std::fs::read_to_string(&page).expect("page");
    let at = html.find("<h2>").expect("a heading");
    let injected = format!(
        "{}<script>document.body.setAttribute('data-injected','ran');undefinedFunction()</script>{}",
        &html[..at],
        &html[at..]
    );
    std::fs::write(&bad, injected).expect("write");
    let dom = browser::dump_dom(&chromium, &bad).expect("the browser loads the page");
    assert!(
        !dom.contains("data-injected=\"ran\""),
        "the injected script ran"
    );
    let err = check::check_dom(&dom).expect_err("a blocked script fails the check");
    assert!(err.contains("blocked inline"), "{err}");
    assert!(!err.contains("undefinedFunction"), "{err}");
    // And the intact page still passes in the same browser (the check can pass, too).
    let dom = browser::dump_dom(&chromium, &page).expect("the browser loads the page");
    check::check_dom(&dom).expect("the intact page passes");
}
