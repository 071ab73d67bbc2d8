//! The peer comparison end to end: `gabp-loadgen baseline --peers redis,nats` starts real
//! `redis-server` and `nats-server` processes (scripts/setup installs them), publishes the
//! simulated mod's events to them on a closed-loop pace, and reads them back with the same
//! tally as the relay's bridges: every reader gets every event, in order.

use std::process::Command;

#[test]
fn redis_and_nats_are_measured_with_the_same_readers() {
    let out = Command::new(env!("CARGO_BIN_EXE_gabp-loadgen"))
        .args([
            "baseline",
            "--peers",
            "redis,nats",
            "--bridges",
            "3",
            "--warmup",
            "0.3",
            "--duration",
            "1",
            "--window",
            "2048",
            "--json",
        ])
        .output()
        .expect("running gabp-loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gabp-loadgen failed: {stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let peers = doc["peers"].as_array().expect("peers");
    assert_eq!(peers.len(), 2);
    for (p, name) in peers.iter().zip(["redis-", "nats-"]) {
        let target = p["target"].as_str().expect("target");
        assert!(target.starts_with(name), "{target}");
        let published = p["published"].as_u64().expect("published");
        let delivered = p["delivered"].as_u64().expect("delivered");
        assert!(published > 1000, "{target}: {p}");
        assert_eq!(p["unannounced_gaps"], 0, "{target}: {p}");
        assert_eq!(p["disconnects"], 0, "{target}: {p}");
        assert!(p["errors"].as_array().is_some_and(Vec::is_empty), "{p}");
        // Paced and lossless: 3 readers get every event published in the window, give or
        // take what is in flight at its two edges: per reader at most one window, plus the
        // publisher's counter trailing by up to one batch (256) and the readers reporting
        // late by up to 32.
        let lag = (3 * 2 * (2048 + 256 + 32)) as u64;
        assert!(
            delivered + lag >= 3 * published && delivered <= 3 * published + lag,
            "{target}: published {published}, delivered {delivered}"
        );
    }
}
