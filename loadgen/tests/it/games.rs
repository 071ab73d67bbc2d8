//! `gabp-loadgen games`: every layout (one relay with a route per game, a relay per game, no
//! relay) measured at 1 and 2 games through the real binaries, on loopback; the result's
//! shape, events delivered without gaps and calls answered in each, the checks computed, and
//! nothing left behind (no relay process, no temp dir).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gabp-loadgen");

/// Processes whose command line mentions `dir` (the relays' data dirs and config are there).
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect()
}

#[tokio::test]
async fn every_layout_delivers_and_answers_and_nothing_is_left_behind() {
    let relay = Path::new(BIN).with_file_name("gabp-relay");
    assert!(
        relay.exists(),
        "{} is missing (cargo build --release -p gabp-relay)",
        relay.display()
    );
    // The command's temp dirs go here, so the test can see that none is left.
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = tokio::process::Command::new(BIN)
        .args([
            "games",
            "--routes",
            "1,2",
            "--rate",
            "2000",
            "--warmup",
            "500ms",
            "--duration",
            "1s",
            "--json",
        ])
        .env("TMPDIR", tmp.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("finished in time")
        .expect("ran");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");

    assert_eq!(doc["config"]["routes"], serde_json::json!([1, 2]), "{doc}");
    assert_eq!(doc["scenario"]["name"], "many-games");
    assert_eq!(doc["scenario"]["bridges"], 2);
    assert!(doc["context"]["machine"]["cores"].as_u64().is_some());
    for layout in ["one_relay", "relay_per_game", "direct"] {
        for n in [1u64, 2] {
            let m = &doc["results"][layout][format!("routes_{n}")];
            let what = format!("{layout}, {n} games: {m}");
            assert_eq!(m["routes"], n, "{what}");
            let num = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k} in {what}"));
            // Two bridges a game, 2,000 events/s each, for about a second.
            assert!(num("delivered") > 1000.0 * n as f64, "{what}");
            assert_eq!(m["unannounced_gaps"], 0, "{what}");
            assert_eq!(m["disconnects"], 0, "{what}");
            assert!(m["dropped"].is_u64(), "{what}");
            assert!(num("calls") > 0.0, "{what}");
            assert_eq!(m["call_errors"], 0, "{what}");
            assert_eq!(m["unanswered"], 0, "{what}");
            assert!(num("per_agent_min_calls_per_s") > 0.0, "{what}");
            assert!(
                num("per_agent_min_calls_per_s") <= num("per_agent_median_calls_per_s"),
                "{what}"
            );
            assert!(
                m["call_latency_us"]["p99"]
                    .as_f64()
                    .is_some_and(|p| p > 0.0),
                "{what}"
            );
            assert!(num("loadgen_cpu_cores") > 0.0, "{what}");
            if layout == "direct" {
                assert_eq!(m["relay_processes"], 0, "{what}");
                assert!(m.get("relay_cpu_cores").is_none(), "{what}");
            } else {
                let procs = if layout == "one_relay" { 1 } else { n };
                assert_eq!(m["relay_processes"], procs, "{what}");
                assert!(num("relay_cpu_cores") > 0.0, "{what}");
                assert!(num("relay_rss_per_route_mib") > 0.0, "{what}");
                // The mods wrote to the relays for the whole run: more than what the bridges
                // counted in the window, over two each.
                assert!(num("events_recorded") > num("delivered") / 2.0, "{what}");
                assert!(num("disk_bytes_per_event") > 0.0, "{what}");
            }
        }
    }
    let checks = doc["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 2, "{doc}");
    for c in checks {
        assert_eq!(c["routes"], 2, "{c}");
        assert!(c["pass"].is_boolean(), "{c}");
    }

    assert!(
        processes_under(tmp.path()).is_empty(),
        "left running: {:?}",
        processes_under(tmp.path())
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
