//! Measurements a performance engineer can trust, through the real binaries: `overhead` against
//! a simulated mod and a recording `gabp-relay` in front of it, `call --rounds` against both,
//! and `compare` of the two results. These check the shape and the logic of what is reported
//! (targets named, settings and context recorded, medians with their spread, verdicts), never
//! that anything is fast.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::{loadgen, BIN};
use gabp_sim::{ModSim, ModSimConfig};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

fn ok(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `gabp-relay` built beside this `gabp-loadgen`.
fn relay_bin() -> PathBuf {
    let bin = Path::new(BIN).with_file_name("gabp-relay");
    assert!(
        bin.exists(),
        "{} is missing (cargo build --release -p gabp-relay)",
        bin.display()
    );
    bin
}

/// A recording relay in front of `upstream`, and the address it listens on.
async fn relay(upstream: &str, data: &Path) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(relay_bin())
        .args([
            "serve",
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--no-bridge-file",
        ])
        .env("GABP_UPSTREAM_TOKEN", "modtok")
        .env("GABP_RELAY_TOKEN", "relaytok")
        .env("GABP_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("gabp-relay starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut addr = None;
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(rest) = l.strip_prefix("route default listening on ") {
                addr = rest.split_whitespace().next().map(String::from);
            }
            if l.starts_with("recording") && addr.is_some() {
                return;
            }
        }
    })
    .await;
    assert!(found.is_ok(), "the relay did not say where it listens");
    // Keep reading its stdout so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr.expect("an address"))
}

/// Whether `s` has a number in scientific notation (`1.3e-5`, `2e+9`).
fn scientific(s: &str) -> bool {
    s.as_bytes().windows(4).any(|w| {
        w[0].is_ascii_digit()
            && w[1] == b'e'
            && (w[2] == b'-' || w[2] == b'+')
            && w[3].is_ascii_digit()
    })
}

fn sim() -> ModSim {
    ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "modtok".into(),
            rate: Some(2_000.0),
            ..ModSimConfig::default()
        },
    )
    .expect("mod")
}

/// `overhead` between the mod and the relay, its measuring flags `extra` and its document
/// written to `out`; its table.
async fn overhead(the_mod: &str, relay: &str, out: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "overhead",
        "--mod",
        the_mod,
        "--mod-token",
        "modtok",
        "--relay",
        relay,
        "--relay-token",
        "relaytok",
        "--warmup",
        "0",
        "--duration",
        "300ms",
        "--output",
        out.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    ok(&loadgen(&args).await)
}

#[tokio::test]
async fn overhead_via_pipe_weighs_the_relay_against_a_byte_pipe_it_starts_and_stops() {
    let sim = sim();
    let data = tempfile::tempdir().expect("tempdir");
    let the_mod = sim.addr().to_string();
    let (mut relay, relay_addr) = relay(&the_mod, data.path()).await;
    let out_file = data.path().join("overhead.json");
    let table = overhead(
        &the_mod,
        &relay_addr,
        &out_file,
        &[
            "--via-pipe",
            "--concurrency",
            "1",
            "--readers",
            "1",
            "--rounds",
            "1",
        ],
    )
    .await;
    let _ = relay.kill().await;
    sim.stop();
    let header = table
        .lines()
        .find(|l| l.starts_with("FIGURE"))
        .unwrap_or_else(|| panic!("a header: {table}"));
    assert!(
        header.contains("THROUGH A BYTE PIPE") && header.contains("RELAY ÷ PIPE"),
        "{header}"
    );
    assert!(
        table.contains("pipe     gabp-loadgen pipe at 127.0.0.1:"),
        "{table}"
    );
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&out_file).expect("--output written")).expect("JSON");
    assert_eq!(doc["config"]["baseline"], "a byte pipe to the mod");
    for side in ["direct", "relay"] {
        let calls = &doc[side]["concurrency_1"];
        assert!(calls["calls"].as_f64().is_some_and(|c| c > 0.0), "{calls}");
        // The pipe's and the relay's CPU are counted with the mod's.
        assert!(calls["cpu_per_call_us"].as_f64().is_some(), "{calls}");
        let events = &doc[side]["events"];
        assert!(
            events["delivered"].as_f64().is_some_and(|e| e > 0.0),
            "{side}: {events}"
        );
    }
    // The pipe it started is gone when it returns.
    let pid = doc["targets"]["pipe"]["pid"]
        .as_u64()
        .expect("the pipe's pid");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the pipe {pid} still runs"
    );
}

#[tokio::test]
async fn overhead_compares_a_mod_with_the_relay_in_front_of_it_round_by_round() {
    let sim = sim();
    let data = tempfile::tempdir().expect("tempdir");
    let the_mod = sim.addr().to_string();
    let (mut relay, relay_addr) = relay(&the_mod, data.path()).await;
    let out_file = data.path().join("overhead.json");
    let table = overhead(
        &the_mod,
        &relay_addr,
        &out_file,
        &["--concurrency", "1,2", "--readers", "2", "--rounds", "2"],
    )
    .await;
    let _ = relay.kill().await;
    sim.stop();
    // The table names both targets, says the relay records, and has a row per figure.
    assert!(
        table.contains(&format!("mod SimGame 1.0.0 at {the_mod}")),
        "{table}"
    );
    assert!(
        table.contains("relay gabp-relay") && table.contains("(recording on"),
        "{table}"
    );
    assert!(
        table.contains("--relay-token ***"),
        "tokens redacted: {table}"
    );
    for row in [
        "calls/s, concurrency 1",
        "p50, concurrency 1",
        "p99, concurrency 2",
        "events/s delivered, 2 readers",
    ] {
        let line = table
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("a row {row:?}: {table}"));
        assert!(
            ["beyond noise", "within noise", "the same"]
                .iter()
                .any(|v| line.contains(v)),
            "a verdict: {line}"
        );
    }
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&out_file).expect("--output written")).expect("JSON");
    assert_eq!(doc["targets"]["mod"]["kind"], "mod");
    assert_eq!(doc["targets"]["relay"]["kind"], "relay");
    assert_eq!(doc["targets"]["relay"]["recording"], true);
    assert_eq!(doc["targets"]["relay"]["upstream"], the_mod.as_str());
    assert_eq!(doc["config"]["rounds"], 2);
    assert_eq!(doc["round_results"].as_array().map(Vec::len), Some(2));
    assert!(
        doc["context"]["machine"]["cores"].as_u64().is_some(),
        "{doc}"
    );
    assert!(doc["context"]["load_start"].is_array(), "{doc}");
    assert!(doc["context"]["busy"].is_boolean(), "{doc}");
    for side in ["direct", "relay"] {
        let calls = &doc[side]["concurrency_1"];
        // A median of two rounds' counts may fall between them.
        assert!(calls["calls"].as_f64().is_some_and(|c| c > 0.0), "{calls}");
        assert!(calls["latency_us"]["p50"].as_f64().is_some(), "{calls}");
        // The mod runs in this test's process and the relay beside it: both are local, so
        // their CPU per call is counted.
        assert!(calls["cpu_per_call_us"].as_f64().is_some(), "{calls}");
        let events = &doc[side]["events"];
        assert!(
            events["delivered"].as_f64().is_some_and(|e| e > 0.0),
            "{events}"
        );
        let s = &doc["spread"][format!("{side}.concurrency_1.calls_per_s")];
        assert_eq!(s["n"], 2, "{s}");
        assert!(s["min"].as_f64() <= s["max"].as_f64(), "{s}");
    }
    let rows = doc["comparison"].as_array().expect("rows");
    let calls = rows
        .iter()
        .find(|r| r["figure"] == "concurrency_1.calls_per_s")
        .expect("calls/s row");
    assert_eq!(calls["better"], "higher");
    assert_eq!(calls["ratio"]["n"], 2, "a ratio per round: {calls}");
    let p50 = rows
        .iter()
        .find(|r| r["figure"] == "concurrency_1.latency_us.p50")
        .expect("p50 row");
    assert_eq!(p50["better"], "lower");
    assert!(
        ["better", "worse", "within_noise", "same"]
            .contains(&p50["verdict"].as_str().unwrap_or("")),
        "{p50}"
    );
}

#[tokio::test]
async fn call_rounds_and_compare_say_what_differs_and_whether_it_is_noise() {
    let sim = sim();
    let data = tempfile::tempdir().expect("tempdir");
    let the_mod = sim.addr().to_string();
    let (mut relay, relay_addr) = relay(&the_mod, data.path()).await;
    let mut files = Vec::new();
    for (name, addr, token) in [
        ("direct", the_mod.as_str(), "modtok"),
        ("relayed", relay_addr.as_str(), "relaytok"),
    ] {
        let out = loadgen(&[
            "call",
            "--addr",
            addr,
            "--token",
            token,
            "--concurrency",
            "2",
            "--rounds",
            "3",
            "--warmup",
            "0",
            "--duration",
            "200ms",
            "--json",
        ])
        .await;
        let doc: Value = serde_json::from_str(&ok(&out)).expect("one JSON document");
        // The fields `call --json` always had, now the medians of the rounds.
        for k in [
            "tool",
            "mode",
            "calls",
            "calls_per_s",
            "errors",
            "unanswered",
        ] {
            assert!(!doc[k].is_null(), "{k}: {doc}");
        }
        assert_eq!(doc["round_results"].as_array().map(Vec::len), Some(3));
        assert_eq!(doc["spread"]["calls_per_s"]["n"], 3);
        assert_eq!(doc["target"]["address"], addr);
        assert_eq!(doc["config"]["concurrency"], 2);
        let cmd = doc["context"]["command_line"]
            .as_array()
            .expect("command line");
        assert_eq!(cmd[1], "call");
        assert!(cmd.iter().any(|w| w == "***") && !cmd.iter().any(|w| w == token));
        let path = data.path().join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec(&doc).expect("json")).expect("write");
        files.push(path);
    }
    let _ = relay.kill().await;
    sim.stop();
    let (a, b) = (
        files[0].to_str().expect("utf-8"),
        files[1].to_str().expect("utf-8"),
    );
    let table = ok(&loadgen(&["compare", a, b]).await);
    assert!(
        table.starts_with("A = direct: call, mod SimGame"),
        "{table}"
    );
    assert!(
        table.contains("B = relayed: call, relay gabp-relay"),
        "{table}"
    );
    // The settings that differ come before the figures: the target above all.
    let settings = table.find("Settings that differ").expect("settings");
    let figures = table.find("Figures, B against A").expect("figures");
    assert!(settings < figures, "{table}");
    let kind = table
        .lines()
        .find(|l| l.starts_with("target.kind "))
        .expect("target.kind differs");
    assert!(kind.contains("mod") && kind.contains("relay"), "{kind}");
    let header = table
        .lines()
        .find(|l| l.starts_with("FIGURE"))
        .expect("header");
    assert!(
        header.contains("direct") && header.contains("relayed"),
        "{header}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("calls_per_s "))
        .expect("calls/s row");
    assert!(row.contains(" higher "), "{row}");
    assert!(row.contains("/s ("), "median (min–max): {row}");
    assert!(
        ["better", "worse", "within noise"]
            .iter()
            .any(|v| row.trim_end().ends_with(v)),
        "three rounds each: a verdict without `?`: {row}"
    );
    assert!(!scientific(&table), "{table}");
    let labelled = ok(&loadgen(&["compare", a, b, "--label", "mod", "--label", "relay"]).await);
    assert!(labelled.starts_with("A = mod: "), "{labelled}");
    let json: Value =
        serde_json::from_str(&ok(&loadgen(&["compare", a, b, "--json"]).await)).expect("JSON");
    let f = json["figures"]
        .as_array()
        .expect("figures")
        .iter()
        .find(|f| f["figure"] == "calls_per_s")
        .expect("calls_per_s");
    assert_eq!(f["better"], "higher");
    assert_eq!(f["a_spread"]["n"], 3);
    assert!(
        f["beyond_noise"].is_boolean() || f["verdict"] == "same",
        "{f}"
    );
    assert!(json["settings"]
        .as_array()
        .expect("settings")
        .iter()
        .any(|s| s["setting"] == "target.kind"));
    assert_eq!(json["inputs"][1]["label"], "relayed");
    let too_many = loadgen(&[
        "compare", a, b, "--label", "x", "--label", "y", "--label", "z",
    ])
    .await;
    assert_eq!(too_many.status.code(), Some(2));
}
