//! Running out of file descriptors while recording (EMFILE when RocksDB opens its next
//! write-ahead log or table file) is survived under both `--on-record-error` policies: the
//! failure is logged, and once descriptors are free again the recorder reopens the data dir and
//! goes on. Under `stall` the mod is held meanwhile and the recording then holds every event the
//! mod sent; under `continue` the mod keeps going and what could not be recorded is an announced
//! gap: `sessions check` passes, and recorded plus announced lost is exactly what the mod sent.
//!
//! The relay runs under `prlimit --nofile`; idle TCP connections (which it accepts and keeps
//! until `--frame-timeout`) take up every remaining descriptor until recording needs a new file.

use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_sim::{ModSim, ModSimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::faults::{is_root, open_fds, recorded_seqs, run, start_up};
use crate::support::{BIN, BRIDGE_TOKEN, MOD_TOKEN};

/// Enough that the mod is still sending when the idle connections have taken every descriptor
/// and recording fails (40,000, five seconds at 8,000 events/s, ran out first once on a
/// machine loaded by other work, where taking the descriptors is slow).
const EVENTS: u64 = 100_000;
const NOFILE: usize = 96;

#[tokio::test]
async fn descriptors_running_out_then_coming_back_loses_nothing() {
    descriptors_run_out("stall").await;
}

#[tokio::test]
async fn descriptors_running_out_under_continue_lose_only_announced_gaps() {
    descriptors_run_out("continue").await;
}

/// The cells run one at a time: the descriptor count of one relay is what is measured.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn descriptors_run_out(policy: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(!is_root(), "no prlimit(1) although running as root (CI)");
        eprintln!("SKIPPED: no prlimit(1): EMFILE test NOT RUN");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(8000.0),
            payload_bytes: 4096,
            max_events: Some(EVENTS),
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
            "--frame-timeout",
            "120s",
            "--on-record-error",
            policy,
            // Plain chunks: the write-ahead log fills (and a new file is needed) within the
            // wait below; LZ4 chunks would take three times as many frames.
            "--compression",
            "none",
            "--data-dir",
        ])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let pid = child.id().expect("pid");
    // Its stdout stays open (`_stdout`) for the whole test.
    let up = start_up(&mut child, false).await;
    let (addr, _stdout) = (up.listen.expect("listen line"), up.lines);
    let (log_tx, mut log_rx) = tokio::sync::mpsc::channel::<String>(100_000);
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        while let Ok(Some(l)) = err.next_line().await {
            let _ = log_tx.send(l).await;
        }
    });
    let mut log = String::new();
    // Take every free descriptor with idle connections.
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_fds(pid) < NOFILE && Instant::now() < deadline {
        let before = open_fds(pid);
        held.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
        // Wait until the relay has accepted it (or cannot: then the table is full).
        let t = Instant::now();
        while open_fds(pid) == before && t.elapsed() < Duration::from_millis(300) {
            tokio::task::yield_now().await;
        }
    }
    assert!(
        open_fds(pid) >= NOFILE - 1,
        "could not use up the descriptors"
    );
    // Recording needs a new file within 64 MiB of frames (the next write-ahead log).
    let failed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = log_rx.recv().await {
            log += &l;
            log.push('\n');
            if l.contains("recording failed") {
                return;
            }
        }
    })
    .await;
    assert!(
        failed.is_ok(),
        "recording never failed for lack of descriptors: {log}"
    );
    assert!(
        log.contains("Too many open files") || log.contains("os error 24"),
        "{log}"
    );
    let emitted_at_failure = sim.emitted();
    assert!(emitted_at_failure < EVENTS);
    if policy == "continue" {
        // Not held: the mod goes on while the frames it sends cannot be recorded.
        let t = Instant::now();
        while sim.emitted() < emitted_at_failure + 2000 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the mod was held under continue"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(held);
    let recovered = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(l) = log_rx.recv().await {
            log += &l;
            log.push('\n');
            if l.contains("recording works again") {
                return;
            }
        }
    })
    .await;
    assert!(recovered.is_ok(), "never recovered: {log}");
    let t = Instant::now();
    while sim.emitted() < EVENTS {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the mod never finished"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Wait until everything is recorded or announced lost (read-only reads work while the
    // relay records).
    let d = data.to_str().expect("utf8");
    let t = Instant::now();
    loop {
        let o = run(&["sessions", "--json", "--data-dir", d]).await;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let s = &v["sessions"][0];
        let accounted = s["events"].as_u64().unwrap_or(0) + s["lostFrames"].as_u64().unwrap_or(0);
        if accounted >= EVENTS {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "not all recorded: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "{log}");
    let check = run(&["sessions", "check", "--json", "--data-dir", d]).await;
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).expect("json");
    assert!(check.status.success(), "{report}");
    let lost = report["sessions"][0]["lostFrames"].as_u64().expect("lost");
    let gaps = report["sessions"][0]["gaps"].as_u64().expect("gaps");
    let seqs = recorded_seqs(&data).await;
    let total = seqs.values().map(Vec::len).sum::<usize>() as u64;
    if policy == "stall" {
        assert_eq!((lost, gaps), (0, 0), "{report}");
        assert_eq!(total, EVENTS);
        for (ch, v) in &seqs {
            assert_eq!(*v, (0..v.len() as u64).collect::<Vec<_>>(), "channel {ch}");
        }
    } else {
        assert!(lost > 0 && gaps >= 1, "the loss is announced: {report}");
        assert_eq!(total + lost, EVENTS, "recorded + announced lost = sent");
        // In order, and the seqs missing are exactly the frames the gaps announce (the
        // descriptors came back before the mod finished, so every loss is inside).
        let mut missing = 0;
        for (ch, v) in &seqs {
            assert!(v.windows(2).all(|w| w[0] < w[1]), "channel {ch} in order");
            missing += v.last().map_or(0, |l| l + 1) - v.len() as u64;
        }
        assert_eq!(missing, lost, "every hole is an announced gap");
        eprintln!("continue: {lost} frames lost in {gaps} announced gaps, {total} recorded");
    }
    sim.stop();
}
