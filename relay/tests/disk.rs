//! A disk that fills up while recording, on a real (tiny) tmpfs: the failure is never silent,
//! and the configured policy applies. `continue` keeps relaying and counts the loss; `stall`
//! holds the mod (nothing more is read, so nothing is lost) while bridges stay served.
//!
//! Mounting needs root, which CI and the development machines have; elsewhere the test says it
//! could not mount and checks nothing else.

use std::process::Stdio;
use std::time::Duration;

use gabp_sim::{Addr, Client, ModSim, ModSimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn tiny_fs(dir: &std::path::Path) -> Option<Mount> {
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("cannot mount a tmpfs here (not root?): disk-full test not run");
    }
    ok.then(|| Mount(dir.to_path_buf()))
}

async fn metric(addr: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("response");
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn run(policy: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(_mount) = tiny_fs(dir.path()) else {
        return;
    };
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse::<Addr>().expect("addr"),
        ModSimConfig {
            token: "m".into(),
            rate: None,
            payload_bytes: 512,
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            "m",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t",
            "--no-bridge-file",
        ])
        .args([
            "--metrics",
            "127.0.0.1:0",
            "--on-record-error",
            policy,
            "--data-dir",
        ])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut metrics) = (None, None);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await
    {
        if let Some(a) = line.split(" listening on ").nth(1) {
            addr = Some(
                a.split(' ')
                    .next()
                    .expect("addr")
                    .parse::<Addr>()
                    .expect("addr"),
            );
        }
        if let Some(m) = line.strip_prefix("metrics on http://") {
            metrics = Some(m.trim_end_matches("/metrics").to_string());
        }
        if line.starts_with("recording") {
            break;
        }
    }
    let (addr, metrics) = (addr.expect("listen line"), metrics.expect("metrics line"));
    let (mut c, _) = Client::connect_hello(&addr, "t").await.expect("hello");
    c.subscribe(&["world/tick", "player/move", "chat/message"])
        .await
        .expect("subscribe");
    // Read until the recorder has failed at least once (6 MiB fill up within ~20k frames).
    let mut read = 0u64;
    let failed = tokio::time::timeout(Duration::from_secs(60), async {
        c.set_wait(Duration::from_secs(3));
        loop {
            if c.next_event().await.is_err() {
                // Events stopped: under `stall` that is the policy at work, after a failure.
                return metric(&metrics, "gabp_record_errors_total").await > 0.0;
            }
            read += 1;
            if read.is_multiple_of(5000) && metric(&metrics, "gabp_record_errors_total").await > 0.0
            {
                return true;
            }
        }
    })
    .await
    .expect("the disk fills in time");
    assert!(failed, "events stopped before the recorder failed");
    match policy {
        "continue" => {
            // Relaying goes on past the full disk.
            for _ in 0..50_000 {
                c.next_event()
                    .await
                    .expect("events keep flowing under continue");
            }
            assert!(
                metric(&metrics, "gabp_record_lost_frames_total").await > 0.0,
                "the loss is counted"
            );
        }
        _ => {
            // Stall: the mod is no longer read, so events stop; the relay still answers.
            c.set_wait(Duration::from_millis(1500));
            let mut drained = 0;
            while c.next_event().await.is_ok() {
                drained += 1;
                assert!(drained < 1_000_000, "events never stopped under stall");
            }
            c.set_wait(Duration::from_secs(5));
            let status = c
                .call("relay/status", serde_json::json!({}))
                .await
                .expect("status while stalled");
            assert_eq!(status["recording"], true);
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().expect("pid").to_string()])
        .status();
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("recording failed"),
        "the failure is logged: {stderr}"
    );
    sim.stop();
}

#[tokio::test]
async fn full_disk_under_continue_keeps_relaying_and_counts_the_loss() {
    run("continue").await;
}

#[tokio::test]
async fn full_disk_under_stall_holds_the_mod() {
    run("stall").await;
}
