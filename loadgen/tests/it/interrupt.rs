//! Ctrl-C on `gabp-loadgen run` stops every process it started and removes its temp data dir.

use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gabp-loadgen");

/// Children of `parent` whose program name starts with `name`.
fn children(parent: u32, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …
        let Some((comm, rest)) = stat.split_once(") ") else {
            continue;
        };
        let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent)
            && comm
                .split_once('(')
                .is_some_and(|(_, c)| c.starts_with(name))
        {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.split_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

#[tokio::test]
async fn ctrl_c_on_run_stops_the_relay_and_removes_the_temp_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = tokio::process::Command::new(BIN)
        .args([
            "run",
            "--bridges",
            "1",
            "--rate",
            "1000",
            "--warmup",
            "0",
            "--duration",
            "10m",
        ])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn loadgen");
    let pid = child.id().expect("pid");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let relay = loop {
        if let Some(r) = children(pid, "gabp-relay").first() {
            break *r;
        }
        assert!(tokio::time::Instant::now() < deadline, "no relay started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        std::fs::read_dir(tmp.path()).expect("ls").count() > 0,
        "the run made its temp data dir"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("loadgen exited")
        .expect("status");
    assert_eq!(out.code(), Some(130));
    let gone = tokio::time::Instant::now() + Duration::from_secs(10);
    while alive(relay) {
        assert!(
            tokio::time::Instant::now() < gone,
            "relay {relay} outlived the load generator"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("ls")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "temp dirs left behind: {left:?}");
}
