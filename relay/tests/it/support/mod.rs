//! What the relay integration tests share: the binary, a running `serve` and its start-up lines,
//! commands run to completion, a simulated mod, signals, bounded waits, stdout lines, config
//! files, JSON output; `hostile` holds the hostile-mod tests' scripted mod and logged `serve`.
#![allow(dead_code, unused_imports)]

// What most tests name, so each test module needs only `use crate::support::*;`.
pub use std::process::Stdio;
pub use std::time::Duration;

pub use gabp_client::Client;
pub use gabp_sim::{Addr, ModSim, ModSimConfig};
pub use tokio::io::{AsyncBufReadExt, BufReader};
pub use tokio::process::{Child, Command};

pub mod alone;
pub mod faults;
pub mod hostile;
pub mod identities;
pub mod in_process;
pub mod mcp;
pub mod storage;

pub const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");

/// The token the simulated mods expect from the relay (`--upstream-token`; the relay refuses
/// tokens shorter than 16 characters).
pub const MOD_TOKEN: &str = "mod-token-for-tests";
/// A bridge token fixed by the test (`--token`).
pub const BRIDGE_TOKEN: &str = "bridge-token-for-tests";

pub fn relay() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .kill_on_drop(true);
    c
}

/// A running `serve` with what it printed at start.
pub struct Serve {
    pub child: Child,
    pub addr: Addr,
    pub token: Option<String>,
    /// host:port of its metrics endpoint (`--metrics`), if it has one.
    pub metrics: Option<String>,
    /// The lines it printed at start, up to its `recording` line.
    pub start_up: Vec<String>,
}

pub async fn serve(args: &[&str]) -> Serve {
    // Tests run side by side: none may touch the user's default discovery file.
    let own_file = args.iter().any(|a| a.ends_with("bridge-file"));
    let mut child = relay()
        .arg("serve")
        .args(args)
        .args(if own_file {
            None
        } else {
            Some("--no-bridge-file")
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gabp-relay");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut token, mut metrics, mut start_up) = (None, None, None, Vec::new());
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(m) = line.strip_prefix("metrics on http://") {
                metrics = Some(m.trim_end_matches("/metrics").to_string());
            }
            if let Some(rest) = line.split(" listening on ").nth(1) {
                addr = Some(
                    rest.split(' ')
                        .next()
                        .expect("address")
                        .parse::<Addr>()
                        .expect("valid address"),
                );
            }
            if let Some(t) = line.split(" token ").nth(1) {
                token = Some(t.trim().to_string());
            }
            let last = line.starts_with("recording");
            start_up.push(line);
            if last {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("relay printed its start-up lines");
    // The rest of stdout is read too, so that the relay never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Serve {
        child,
        addr: addr.expect("listening line"),
        token,
        metrics,
        start_up,
    }
}

pub async fn output(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(60), relay().args(args).output())
        .await
        .expect("command finished")
        .expect("ran")
}

impl Serve {
    /// Stops the relay as an operator or a service manager would (SIGTERM) and asserts that
    /// it exits cleanly (status 0) within 30 s.
    pub async fn stop_cleanly(mut self) {
        sigterm(&self.child);
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("relay stops")
            .expect("wait");
        assert!(status.success(), "relay exit: {status}");
    }
}

pub fn sigterm(child: &Child) {
    let pid = child.id().expect("running") as i32;
    // kill(1), as an operator or a service manager would send it.
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill -TERM");
}

pub fn start_mod(rate: Option<f64>) -> ModSim {
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        rate,
        payload_bytes: 256,
        ..ModSimConfig::default()
    };
    ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}

/// Exactly one line on stderr, returned.
pub fn one_line(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    err
}

/// Sends `sig` (a name such as INT) to the child, as kill(1) would.
pub fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("running");
    std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill");
}

/// Waits (bounded) until `cond` holds.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parses a command's stdout as one JSON document.
pub fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Reads stdout lines until one contains `needle`; returns that line.
pub async fn line_with(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    needle: &str,
) -> String {
    let find = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if line.contains(needle) {
                return line;
            }
        }
        panic!("stdout ended before {needle:?}");
    };
    tokio::time::timeout(Duration::from_secs(20), find)
        .await
        .expect("line in time")
}

/// A config file with mode 0600 (as an operator would keep one that holds tokens).
pub fn config_file(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write config");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p.to_str().expect("utf8").to_string()
}

pub fn route_toml(extra: &str) -> String {
    format!(
        "[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\nrecord = false\n{extra}"
    )
}

/// Collects a child's stderr in the background.
pub fn collect_stderr(child: &mut Child) -> std::sync::Arc<parking_lot::Mutex<String>> {
    let log = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let mut s = sink.lock();
            s.push_str(&l);
            s.push('\n');
        }
    });
    log
}

/// CPU time (user + system, in clock ticks) a process has used so far.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the `(comm)`; utime and stime are the 14th and 15th of the whole line.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// A free loopback address (bound, then released for a mod to take later).
pub fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// `serve` in front of the mod at `upstream` (the test tokens, any free port), recording to
/// `data`, with `extra` flags.
pub async fn serve_recording(upstream: &Addr, data: &std::path::Path, extra: &[&str]) -> Serve {
    let upstream = upstream.to_string();
    let mut args = vec![
        "--upstream",
        &upstream,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--data-dir",
        data.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    serve(&args).await
}

/// Records a short session through `serve` with a bridge attached; returns the data dir.
pub async fn record_a_session() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = start_mod(Some(2000.0));
    let data = dir.path().join("data");
    let s = serve_recording(sim.addr(), &data, &[]).await;
    let (mut c, _) = gabp_client::Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..20 {
        c.next_event().await.expect("event");
    }
    c.call(
        "tools/call",
        serde_json::json!({"name": "sim/echo", "arguments": {}}),
    )
    .await
    .expect("call");
    sigterm(&s.child);
    let mut child = s.child;
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("stopped")
        .expect("status");
    assert!(st.success());
    sim.stop();
    dir
}

/// Reads `replay`'s first stdout line, `replaying session … on ADDR`, within `wait`: the
/// address bridges connect to.
pub async fn replay_address(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    wait: Duration,
) -> Addr {
    let line = tokio::time::timeout(wait, lines.next_line())
        .await
        .expect("replay started in time")
        .expect("stdout")
        .expect("a line");
    assert!(line.starts_with("replaying session "), "{line}");
    line.rsplit(" on ")
        .next()
        .and_then(|a| a.parse().ok())
        .expect("address")
}
