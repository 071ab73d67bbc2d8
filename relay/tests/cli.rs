//! The command-line contract, driven through the real `gabp-relay` binary as users run it:
//! exit codes, printed tokens, signals, a locked data dir, and a `kill -9` mid-recording.

use std::process::Stdio;
use std::time::Duration;

use gabp_sim::{Addr, Client, ModSim, ModSimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");

fn relay() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .kill_on_drop(true);
    c
}

/// A running `serve` with what it printed at start.
struct Serve {
    child: Child,
    addr: Addr,
    token: Option<String>,
}

async fn serve(args: &[&str]) -> Serve {
    let mut child = relay()
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gabp-relay");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut token) = (None, None);
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
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
            if line.starts_with("recording") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("relay printed its start-up lines");
    Serve {
        child,
        addr: addr.expect("listening line"),
        token,
    }
}

async fn output(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(60), relay().args(args).output())
        .await
        .expect("command finished")
        .expect("ran")
}

fn sigterm(child: &Child) {
    let pid = child.id().expect("running") as i32;
    // kill(1), as an operator or a service manager would send it.
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill -TERM");
}

fn start_mod(rate: Option<f64>) -> ModSim {
    let cfg = ModSimConfig {
        token: "modtok".into(),
        rate,
        payload_bytes: 256,
        ..ModSimConfig::default()
    };
    ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}

#[tokio::test]
async fn usage_errors_exit_2_with_one_line() {
    for args in [
        &["serve"][..],
        &["serve", "--upstream", "127.0.0.1:1"],
        &["bogus"],
        &["serve", "--upstream", "nowhere", "--listen", "127.0.0.1:0"],
    ] {
        let out = output(args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty());
    }
    let out = output(&[
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "0.0.0.0:0",
        "--no-record",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--allow-remote") && err.lines().count() == 1,
        "{err}"
    );
}

#[tokio::test]
async fn serve_prints_a_token_records_and_stops_on_sigterm() {
    let sim = start_mod(Some(2000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8 path");
    let mut s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        "modtok",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ])
    .await;
    let token = s.token.clone().expect("generated token printed");
    assert_eq!(token.len(), 32);
    let (mut c, _) = Client::connect_hello(&s.addr, &token)
        .await
        .expect("hello with printed token");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..50 {
        c.next_event().await.expect("event");
    }
    // A second relay on the same data dir is refused clearly.
    let out = output(&[
        "serve",
        "--upstream",
        &sim.addr().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another process"));
    // Reading while it records works (read-only).
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    assert!(out.status.success());
    sigterm(&s.child);
    let status = tokio::time::timeout(Duration::from_secs(15), s.child.wait())
        .await
        .expect("exits within the bound")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let sessions = v["sessions"].as_array().expect("list");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["end"], "relay_shutdown");
    assert!(sessions[0]["events"].as_u64().expect("events") >= 50);
    let out = output(&["stats", "latest", "--data-dir", data, "--json"]).await;
    assert!(out.status.success());
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(stats["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .any(|c| c["channel"] == "world/tick"));
    let out = output(&[
        "export",
        "latest",
        "--data-dir",
        data,
        "--channel",
        "world/tick",
    ])
    .await;
    assert!(out.status.success());
    let lines: Vec<&[u8]> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert!(lines.len() >= 50);
    for l in lines {
        let v: serde_json::Value = serde_json::from_slice(l).expect("every line is JSON");
        assert_eq!(v["channel"], "world/tick");
    }
    let out = output(&["sessions", "check", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    sim.stop();
}

#[tokio::test]
async fn kill_9_mid_recording_leaves_a_clean_prefix() {
    let sim = start_mod(None); // as fast as possible
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8 path");
    let mut s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        "modtok",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--token",
        "tok",
    ])
    .await;
    assert_eq!(s.token, None, "a given token is not printed");
    let (mut c, _) = Client::connect_hello(&s.addr, "tok").await.expect("hello");
    c.subscribe(&["world/tick", "player/move"])
        .await
        .expect("subscribe");
    for _ in 0..20_000 {
        c.next_event().await.expect("event");
    }
    // Kill once a synced batch is surely in (reads are read-only: they work while it records;
    // on a loaded machine the low-priority recorder may lag the bridge by a while).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = output(&["sessions", "--data-dir", data, "--json"]).await;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        if v["sessions"][0]["events"].as_u64().unwrap_or(0) > 1000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing recorded: {v}"
        );
    }
    s.child.start_kill().expect("kill -9");
    s.child.wait().await.expect("reaped");
    let out = output(&["sessions", "check", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], true, "{v}");
    assert!(out.status.success());
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let s0 = &v["sessions"][0];
    assert_eq!(s0["end"], "crash", "{v}");
    assert!(
        s0["events"].as_u64().expect("events") > 1000,
        "synced batches survived: {s0}"
    );
    sim.stop();
}

/// Reads stdout lines until one contains `needle`; returns that line.
async fn line_with(
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

#[tokio::test]
async fn wrap_is_invisible_to_a_launcher_and_a_legacy_bridge() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let mut child = relay()
        .args([
            "wrap",
            "--data-dir",
            data,
            "--",
            BIN,
            "mod-sim",
            "--rate",
            "100",
        ])
        .env("GABP_SERVER_PORT", port.to_string())
        .env("GABP_TOKEN", "launcher-token")
        .env("GABS_GAME_ID", "game-one")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn wrap");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // The game (mod-sim) prints where it listens: a fresh port, not the launcher's.
    let game_line = line_with(&mut lines, "simulated mod listening on").await;
    assert!(
        !game_line.ends_with(&format!(":{port}")),
        "the game got its own port"
    );
    // The launcher's bridge: only Content-Length headers, legacy `parameters`.
    let addr: Addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut c = Client::connect(&addr)
        .await
        .expect("connect where the launcher expects the game");
    c.length_only_headers = true;
    let welcome = c
        .hello("launcher-token")
        .await
        .expect("hello with the launcher's token");
    assert_eq!(
        welcome["capabilities"]["extensions"]["relay"]["route"],
        "game-one"
    );
    let r = c
        .call(
            "tools/call",
            serde_json::json!({"name": "sim/echo", "parameters": {"k": 7}}),
        )
        .await
        .expect("call");
    assert_eq!(r["echo"]["k"], 7);
    drop(c);
    sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("wrap exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "wrap exits with the game's code");
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["sessions"][0]["route"], "game-one");
}

#[tokio::test]
async fn wrap_without_a_launcher_environment_is_a_usage_error() {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        relay()
            .args(["wrap", "--", "true"])
            .env_remove("GABP_SERVER_PORT")
            .output(),
    )
    .await
    .expect("done")
    .expect("ran");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GABP_SERVER_PORT"));
}

#[tokio::test]
async fn stdio_upstream_unix_listener_discovery_file_and_metrics() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("relay.sock");
    let bridge_file = dir.path().join("bridge.json");
    let listen = format!("unix:{}", sock.display());
    let data = dir.path().join("data");
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            "stdio",
            "--upstream-token",
            "st",
            "--listen",
            &listen,
            "--token",
            "tok",
            "--metrics",
            "127.0.0.1:0",
        ])
        .args([
            "--data-dir",
            data.to_str().expect("utf8"),
            "--bridge-file",
            bridge_file.to_str().expect("utf8"),
        ])
        .args([
            "--", BIN, "mod-sim", "--stdio", "--token", "st", "--rate", "500",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let metrics_line = line_with(&mut lines, "metrics on http://").await;
    line_with(&mut lines, "recording to").await;
    assert_eq!(
        std::fs::metadata(&sock)
            .expect("socket")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&bridge_file)
            .expect("bridge file")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let discovered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bridge_file).expect("read")).expect("json");
    assert_eq!(discovered["token"], "tok");
    assert_eq!(discovered["transport"]["type"], "unix");
    let addr: Addr = discovered["transport"]["address"]
        .as_str()
        .expect("address")
        .parse()
        .expect("addr");
    let (mut c, _) = Client::connect_hello(&addr, "tok")
        .await
        .expect("hello over the unix socket");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..10 {
        c.next_event().await.expect("events from the stdio mod");
    }
    // Metrics in Prometheus text format.
    let maddr = metrics_line
        .split("http://")
        .nth(1)
        .expect("url")
        .trim_end_matches("/metrics")
        .to_string();
    let mut s = tokio::net::TcpStream::connect(&maddr)
        .await
        .expect("metrics port");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("response");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for name in [
        "gabp_frames_total",
        "gabp_events_total",
        "gabp_bridges_connected",
    ] {
        assert!(body.contains(name), "metrics lack {name}");
    }
    drop(c);
    sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "socket removed on exit");
    assert!(!bridge_file.exists(), "bridge file removed on exit");
}

#[tokio::test]
async fn tokens_never_reach_logs_or_recordings() {
    let sim = start_mod(Some(1000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let bridge_token = "b1d9e7secret0token0value0aa55";
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            "modtok",
            "--listen",
            "127.0.0.1:0",
            "--token",
            bridge_token,
            "--data-dir",
            data,
            "--no-bridge-file",
        ])
        .env("GABP_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr: Addr = line_with(&mut lines, " listening on ")
        .await
        .split(" listening on ")
        .nth(1)
        .expect("addr")
        .split(' ')
        .next()
        .expect("addr")
        .parse()
        .expect("addr");
    // Wrong tokens (logged as security events) and a right one.
    let mut c = Client::connect(&addr).await.expect("connect");
    for guess in ["nope", "b1d9e7secret0token0value0aa56"] {
        let r = c.request("session/hello", serde_json::json!({"token": guess, "bridgeVersion": "x", "platform": "linux", "launchId": "l"})).await.expect("answer");
        assert_eq!(r["error"]["code"], -31000);
    }
    c.hello(bridge_token).await.expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    c.next_event().await.expect("event");
    drop(c);
    sigterm(&child);
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(
        logs.contains("security: rejected session/hello"),
        "failed hellos are logged"
    );
    for secret in [bridge_token, "modtok", "b1d9e7secret0token0value0aa56"] {
        assert!(!logs.contains(secret), "a token reached the logs");
    }
    let export = output(&["export", "latest", "--data-dir", data]).await;
    assert!(export.status.success());
    let recorded = String::from_utf8_lossy(&export.stdout);
    assert!(
        recorded.contains("[redacted]"),
        "hellos are recorded with the token redacted"
    );
    for secret in [bridge_token, "modtok"] {
        assert!(!recorded.contains(secret), "a token reached the recording");
    }
    sim.stop();
}
