//! What the fault tests (disk, emfile, race, health, accept_backoff, slow_disk) share: whether
//! they may do what needs root, a process's descriptors and CPU time, a metric scraped from the
//! relay's metrics port, an async condition polled with a deadline, a command run to its end,
//! a `serve`'s start-up lines, and the mod's seqs as recorded.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use super::{cpu_ticks, relay};

/// Whether the tests run as root (CI): there, a fault they cannot inject is a failure, not a skip.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The descriptors a process has open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The process's CPU time so far (user + system).
pub fn cpu_time(pid: u32) -> Duration {
    Duration::from_secs_f64(cpu_ticks(pid) as f64 / clock_ticks())
}

/// Clock ticks per second of /proc's times (USER_HZ).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The sum of every sample of the metric `name` (all its label sets) at `addr`'s `/metrics`.
pub async fn metric(addr: &str, name: &str) -> f64 {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("response");
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls the async condition `f` until it holds, within `secs` (the async form of
/// [`super::until`]).
pub async fn until_async<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the relay binary with `args` to its end: [`super::output`] with room for a slow disk
/// (killed if it takes two minutes).
pub async fn run(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(120), relay().args(args).output())
        .await
        .expect("finished")
        .expect("ran")
}

/// What a `serve` printed at start: its listen address and its metrics address, if any.
pub struct StartUp {
    pub listen: Option<String>,
    pub metrics: Option<String>,
    /// The rest of its stdout.
    pub lines: Lines<BufReader<ChildStdout>>,
}

/// Reads a `serve`'s start-up lines from its piped stdout, up to `recording …`, or until both
/// addresses are known when `both` is set (a `--no-record` relay prints `recording off` too).
pub async fn start_up(child: &mut Child, both: bool) -> StartUp {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut listen, mut metrics) = (None, None);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
    {
        if let Some(m) = line.strip_prefix("metrics on http://") {
            metrics = Some(m.trim_end_matches("/metrics").to_string());
        }
        if let Some(a) = line.split(" listening on ").nth(1) {
            listen = Some(a.split(' ').next().expect("addr").to_string());
        }
        if line.starts_with("recording") || (both && listen.is_some() && metrics.is_some()) {
            break;
        }
    }
    StartUp {
        listen,
        metrics,
        lines,
    }
}

/// The mod's seqs per channel in the latest recording, from `export`.
pub async fn recorded_seqs(data: &Path) -> BTreeMap<String, Vec<u64>> {
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seqs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).expect("jsonl");
        if v["dir"] == "mod->relay" {
            if let (Some(ch), Some(seq)) = (v["channel"].as_str(), v["modSeq"].as_u64()) {
                assert_eq!(v["msg"]["seq"].as_u64(), Some(seq));
                seqs.entry(ch.to_string()).or_default().push(seq);
            }
        }
    }
    seqs
}

/// A child's whole stderr, collected in the background until it closes.
pub fn stderr_text(child: &mut Child) -> tokio::task::JoinHandle<String> {
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(l)) = err.next_line().await {
            all += &l;
            all.push('\n');
        }
        all
    })
}

/// Keeps reading the rest of a child's stdout so it never blocks writing to it.
pub fn drain(mut lines: Lines<BufReader<ChildStdout>>) {
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}
