//! Accept errors on the metrics listener back off instead of spinning. The relay runs under
//! `prlimit --nofile`; idle bridge connections take every free descriptor, then clients keep
//! connecting to `/metrics`: the kernel completes their handshakes into the listen backlog, so
//! the listener stays readable while every `accept` fails with EMFILE. The relay's CPU time
//! (utime + stime from /proc/PID/stat) must stay low meanwhile (a spinning loop burns a whole
//! core), and `/metrics` must answer again once descriptors are free.
//!
//! Black-box: it holds for any accept loop that backs off on errors.

use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_sim::{ModSim, ModSimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::support::faults::{cpu_time, drain, is_root, open_fds, start_up};
use crate::support::{BIN, BRIDGE_TOKEN, MOD_TOKEN};

const NOFILE: usize = 64;

/// One GET /metrics; the response's status line, if it answered within `wait`.
async fn get_metrics(addr: &str, wait: Duration) -> Option<String> {
    tokio::time::timeout(wait, async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut body = Vec::new();
        s.read_to_end(&mut body).await.ok()?;
        let text = String::from_utf8_lossy(&body).to_string();
        Some(text.lines().next().unwrap_or("").to_string())
    })
    .await
    .ok()
    .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_accept_errors_back_off_and_recover() {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(!is_root(), "no prlimit(1) although running as root (CI)");
        eprintln!("SKIPPED: no prlimit(1): accept back-off test NOT RUN");
        return;
    }
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(20.0),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(BIN)
        .args([
            "serve",
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            MOD_TOKEN,
            "--listen",
            "127.0.0.1:0",
            "--token",
            BRIDGE_TOKEN,
            "--no-bridge-file",
            "--no-record",
            "--frame-timeout",
            "120s",
            "--metrics",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let pid = child.id().expect("pid");
    let up = start_up(&mut child, true).await;
    drain(up.lines);
    let (addr, metrics) = (
        up.listen.expect("listen line"),
        up.metrics.expect("metrics line"),
    );
    let first = get_metrics(&metrics, Duration::from_secs(5)).await;
    assert!(
        first.as_deref().is_some_and(|l| l.contains("200")),
        "/metrics answers at first: {first:?}"
    );

    // Take every free descriptor with idle bridge connections.
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_fds(pid) < NOFILE && Instant::now() < deadline {
        let before = open_fds(pid);
        held.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
        let t = Instant::now();
        while open_fds(pid) == before && t.elapsed() < Duration::from_millis(300) {
            tokio::task::yield_now().await;
        }
    }
    assert!(
        open_fds(pid) >= NOFILE - 1,
        "could not use up the descriptors ({} open)",
        open_fds(pid)
    );

    // Clients keep knocking on /metrics; their connections wait in the backlog, unaccepted.
    let mut knocking = Vec::new();
    for _ in 0..8 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(&metrics),
        )
        .await
        {
            knocking.push(s);
        }
    }
    assert!(!knocking.is_empty(), "the backlog took no connection");
    let cpu0 = cpu_time(pid);
    let t0 = Instant::now();
    let mut unanswered = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        // Short waits: nothing can be accepted now.
        if get_metrics(&metrics, Duration::from_millis(300))
            .await
            .is_none()
        {
            unanswered += 1;
        }
    }
    let wall = t0.elapsed();
    let cpu = cpu_time(pid) - cpu0;
    assert!(
        unanswered > 0,
        "every /metrics request was answered: the descriptors were not used up"
    );
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!(
        "while accept failed: {cpu:?} CPU in {wall:?} ({:.0}% of a core), {unanswered} requests unanswered",
        share * 100.0
    );
    assert!(
        share < 0.10,
        "the relay burned {:.0}% of a core while accept failed: its accept loop spins",
        share * 100.0
    );

    // Descriptors come back: /metrics answers again.
    drop(held);
    drop(knocking);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(l) = get_metrics(&metrics, Duration::from_secs(2)).await {
            assert!(l.contains("200"), "{l}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics never answered again once descriptors were free"
        );
    }
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    sim.stop();
}
