//! `gabp-relay report` checked in a real browser: a session recorded through the real binary in
//! front of the simulated mod (events, tool calls with an error, marks), its report written by
//! the binary, then loaded headless and offline in Debian's Chromium; every chart must have
//! rendered at the page's full width with no two of its texts overlapping (the page's own check
//! and the DOM dump agree), and a screenshot PNG is kept under the target dir. A page with one
//! chart broken, or with two mark labels moved onto each other, must fail the same check. An
//! experiment (three tagged runs with episodes, named bridges, a refusal) is reported as one
//! page. Without Chromium the tests fail as root (set-up installs it) and print SKIPPED
//! otherwise.

use std::path::{Path, PathBuf};

use gabp_report::browser::{artifact_dir, for_test};

use crate::support::identities::{bridge, config_text, refused, serve_config, PLANNER, WATCHER};
use crate::support::*;
use gabp_report::{browser, check};
use serde_json::json;

/// Asserts every chart of a checked page took the page's full width.
fn full_width(charts: &[check::Rendered]) {
    for c in charts {
        assert!(
            c.page_width > 0 && c.width + 2 >= c.page_width,
            "chart {} is {} px wide on a {} px page",
            c.chart,
            c.width,
            c.page_width
        );
    }
}

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
        .find(|l| l.starts_with("<tr><td class=\"t\">tools/call</td>"))
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
    full_width(&charts);
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

/// One run of an experiment recorded through the binary: route tags `experiment=e1` and
/// `seed=SEED`, a `planner` (control) that marks three episodes (eight in the first run) 0.2 s
/// long, with the episode's number and a reward in their data and a checkpoint mark every
/// 50 ms in each, and a `watcher` (observe) whose tool call the relay refuses.
async fn record_run(dir: &Path, seed: u32) {
    let sim = start_mod(Some(2000.0));
    let bridges = format!(
        "[[route.bridge]]\nname = \"planner\"\ntoken = \"{PLANNER}\"\nrole = \"control\"\n\n\
         [[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let tags = format!("tags = {{ experiment = \"e1\", seed = \"{seed}\" }}");
    let cfg = config_file(
        dir,
        &format!("run-{seed}.toml"),
        &config_text(sim.addr(), &tags, &bridges),
    );
    let data = dir.join("data");
    let file = dir.join("bridge.json");
    let relay = serve_config(
        &cfg,
        file.to_str().expect("utf-8"),
        &["--data-dir", data.to_str().expect("utf-8")],
    )
    .await;
    let (mut planner, _) = bridge(&relay.addr, PLANNER).await;
    let (mut watcher, _) = bridge(&relay.addr, WATCHER).await;
    let (code, ..) = refused(
        &mut watcher,
        "tools/call",
        json!({"name": "sim/echo", "arguments": {}}),
    )
    .await;
    assert_eq!(code, -32006, "an observer may not call tools");
    // The first run is longer: its marks crowd its timeline.
    let episodes = if seed == 1 { 8 } else { 3 };
    for episode in 1..=episodes {
        planner
            .call(
                "relay/mark",
                json!({"label": "episode-start", "data": {"episode": episode}}),
            )
            .await
            .expect("mark");
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            planner
                .call("relay/mark", json!({"label": "checkpoint"}))
                .await
                .expect("mark");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let reward = f64::from(episode * seed) + 0.5;
        planner
            .call(
                "relay/mark",
                json!({"label": "episode-end", "data": {"episode": episode, "reward": reward}}),
            )
            .await
            .expect("mark");
    }
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    sim.stop();
}

/// The sessions in `data`, oldest first.
async fn session_ids(data: &Path) -> Vec<String> {
    let out = output(&[
        "sessions",
        "--json",
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    let list = json(&out);
    let list = list["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"));
    let mut ids: Vec<String> = list
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn an_experiment_is_one_page_with_every_session_and_episode_and_marks_never_collide() {
    let dir = tempfile::tempdir().expect("tempdir");
    for seed in 1..=3 {
        record_run(dir.path(), seed).await;
    }
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8");
    let ids = session_ids(&data).await;
    assert_eq!(ids.len(), 3);

    // The whole experiment, selected by its tag, as the other read commands select it.
    let page = dir.path().join("experiment.html");
    let out = output(&[
        "report",
        "--tag",
        "experiment=e1",
        "--data-dir",
        data_arg,
        "-o",
        page.to_str().expect("utf-8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", one_line(&out));
    assert!(
        one_line(&out).trim_end().ends_with("for 3 sessions"),
        "{}",
        one_line(&out)
    );
    let html = std::fs::read_to_string(&page).expect("page written");
    for id in &ids {
        assert!(html.contains(id.as_str()), "session {id} listed");
    }
    for seed in 1..=3 {
        assert!(
            html.contains(&format!("<td>seed={seed}</td>")),
            "seed {seed}"
        );
    }
    // Fourteen episodes, each with its start and end marks' data; the reward is charted.
    assert_eq!(
        html.matches("<td class=\"t\">{&quot;episode&quot;:")
            .count(),
        28,
        "every episode, both marks' data"
    );
    assert!(html.contains("{&quot;episode&quot;:3,&quot;reward&quot;:9.5}"));
    assert!(
        html.contains("episodes</dt><dd>14</dd>"),
        "fourteen episodes in the summary"
    );
    if let Some(chromium) = for_test() {
        let dom = browser::dump_dom(&chromium, &page).expect("the browser loads the page");
        let charts = check::check_dom(&dom).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<_> = charts.iter().map(|c| c.chart.as_str()).collect();
        assert_eq!(
            ids,
            ["episode-duration", "episode-events", "episode-data-1"]
        );
        full_width(&charts);
        let png = artifact_dir().join("experiment-report.png");
        let _ = std::fs::remove_file(&png);
        browser::screenshot(&chromium, &page, &png, (1400, 2600)).expect("screenshot");
        eprintln!("screenshot: {}", png.display());
    }

    // Ids select too, and a selection that matches nothing says so.
    let two = dir.path().join("two.html");
    let out = output(&[
        "report",
        &ids[0],
        &ids[2],
        "--data-dir",
        data_arg,
        "-o",
        two.to_str().expect("utf-8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", one_line(&out));
    assert!(
        one_line(&out).trim_end().ends_with("for 2 sessions"),
        "{}",
        one_line(&out)
    );
    let out = output(&["report", "--tag", "experiment=none", "--data-dir", data_arg]).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        one_line(&out).contains("no session matches"),
        "{}",
        one_line(&out)
    );

    // One run's own page: who did what, and 40 marks 50 ms apart (episodes' ends and starts
    // at the same instant) whose labels never overlap.
    let one = dir.path().join("one.html");
    let out = output(&[
        "report",
        &ids[0],
        "--data-dir",
        data_arg,
        "-o",
        one.to_str().expect("utf-8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", one_line(&out));
    let html = std::fs::read_to_string(&one).expect("page written");
    assert!(
        html.contains("<td>planner</td><td>control</td>"),
        "the planner's identity and role"
    );
    assert!(
        html.contains("<td>watcher</td><td>observe</td>"),
        "the watcher's identity and role"
    );
    assert!(
        html.contains("<td class=\"t\">1 forbidden (-32006)</td>"),
        "the watcher's refusal"
    );
    assert!(html.contains(" KiB</dd>"), "the size in binary units");
    let Some(chromium) = for_test() else { return };
    let dom = browser::dump_dom(&chromium, &one).expect("the browser loads the page");
    let charts = check::check_dom(&dom).unwrap_or_else(|e| panic!("{e}"));
    full_width(&charts);
    let png = artifact_dir().join("session-marks-report.png");
    let _ = std::fs::remove_file(&png);
    browser::screenshot(&chromium, &one, &png, (1400, 2400)).expect("screenshot");

    // The same page with the second mark's label moved onto the first's, as labels drawn at
    // their marks on one line collide: the check fails and says which texts.
    let first = html.find("<g class=\"mark\">").expect("a mark");
    let second = html[first + 1..]
        .find("<g class=\"mark\">")
        .expect("two marks")
        + first
        + 1;
    let text_at = |from: usize| -> (usize, usize) {
        let start = html[from..].find("<text x=\"").expect("a label") + from;
        let end = html[start..].find('>').expect("tag end") + start;
        (start, end)
    };
    let (a0, a1) = text_at(first);
    let (b0, b1) = text_at(second);
    assert!(a1 < b0, "the first label precedes the second mark");
    let collided = format!("{}{}{}", &html[..b0], &html[a0..a1], &html[b1..]);
    let bad = dir.path().join("collided.html");
    std::fs::write(&bad, collided).expect("write");
    let dom = browser::dump_dom(&chromium, &bad).expect("the browser loads the page");
    let err = check::check_dom(&dom).expect_err("overlapping labels fail the check");
    assert!(err.contains("text overlaps"), "{err}");
    assert!(err.contains("episode-"), "{err}");
}
