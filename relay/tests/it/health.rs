//! The metrics port of the release binary, over real HTTP: `/healthz` answers while the process
//! lives; `/readyz` is 503 (with its reason) until the mod's welcome, 200 while it is connected,
//! 503 again once it is gone; `/metrics` still names every metric; and a flood of idle
//! connections to the port neither stops nor delays a scrape: they make room for it.

use std::time::{Duration, Instant};

use gabp_sim::{ModSim, ModSimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Child;

use crate::support::{free_addr, serve, BRIDGE_TOKEN, MOD_TOKEN};

/// One request on its own connection: (status, body).
async fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: relay\r\n\r\n").as_bytes())
        .await?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).await?;
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `path` until its status is `want`, within `secs`; returns the body.
async fn until_status(addr: &str, path: &str, want: u16, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = tokio::time::timeout(Duration::from_secs(secs), get(addr, path)).await;
        if let Ok(Ok((status, body))) = &got {
            if *status == want {
                return body.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {want} (last: {got:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Relay {
    child: Child,
    metrics: String,
    _dir: tempfile::TempDir,
}

async fn start_relay(upstream: std::net::SocketAddr) -> Relay {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let s = serve(&[
        "--upstream",
        &upstream.to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--no-bridge-file",
        "--metrics",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    Relay {
        child: s.child,
        metrics: s.metrics.expect("metrics line"),
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_mod_and_healthz_the_process() {
    let mod_addr = free_addr();
    let mut relay = start_relay(mod_addr).await;
    let m = relay.metrics.clone();

    // No mod yet: alive, not ready, and the reason says which route waits for what.
    assert_eq!(get(&m, "/healthz").await.expect("healthz").0, 200);
    let why = until_status(&m, "/readyz", 503, 10).await;
    assert!(why.contains("mod not connected"), "reason: {why}");

    // The mod comes up: ready once its welcome is in.
    let sim = ModSim::start(
        &gabp_rt::net::Addr::Tcp(mod_addr),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let body = until_status(&m, "/readyz", 200, 20).await;
    assert_eq!(body, "ready\n");
    let (status, metrics) = get(&m, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for name in [
        "gabp_frames_total",
        "gabp_upstream_connected",
        "gabp_bridges_connected",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    assert!(metrics.contains("gabp_upstream_connected{route=\"default\"} 1"));
    assert_eq!(get(&m, "/nope").await.expect("404").0, 404);

    // The mod goes away: not ready again.
    sim.stop();
    let why = until_status(&m, "/readyz", 503, 10).await;
    assert!(why.contains("mod not connected"), "reason: {why}");
    assert_eq!(get(&m, "/healthz").await.expect("healthz").0, 200);

    relay.child.start_kill().expect("kill");
    let _ = relay.child.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_stop_metrics() {
    let mut relay = start_relay(free_addr()).await;
    let m = relay.metrics.clone();
    // Twice the connection bound, all connected and silent.
    let mut idle = Vec::new();
    for _ in 0..128 {
        idle.push(TcpStream::connect(&m).await.expect("idle connection"));
    }
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), get(&m, "/metrics"))
        .await
        .expect("/metrics answered despite the flood")
        .expect("/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("gabp_frames_total"));
    // Served at once: idle connections make room rather than making a probe wait for them.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered after {:?}",
        started.elapsed()
    );
    // The idle connections were closed by the relay, not left open forever.
    let mut closed = 0;
    for s in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, idle.len(), "every idle connection is closed");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    relay.child.start_kill().expect("kill");
    let _ = relay.child.wait().await;
}
