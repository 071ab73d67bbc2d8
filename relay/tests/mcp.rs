//! The MCP front driven by a client nobody here wrote: the official MCP Python SDK (`mcp` from
//! PyPI, installed into ~/.cache/gabp-relay/venv when missing) runs relay/tests/mcp/client.py
//! against `gabp-relay mcp` (stdio) and `serve --mcp-listen` (Streamable HTTP), with the relay in
//! front of the simulated mod and a plain GABP bridge on the same game.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_sim::{Addr, Client, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
/// The simulated mod's token (16+ characters: the relay warns about shorter bridge tokens).
const MOD_TOKEN: &str = "mod-token-for-tests";

/// The virtualenv's python with `mcp` importable; creates the venv and installs `mcp` if needed.
fn python() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    let venv = Path::new(&home).join(".cache/gabp-relay/venv");
    let py = venv.join("bin/python");
    let has_mcp = |py: &Path| {
        std::process::Command::new(py)
            .args(["-c", "import mcp.client.streamable_http"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_mcp(&py) {
        if !py.exists() {
            let ok = std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .expect("python3 runs");
            assert!(ok.success(), "python3 -m venv failed");
        }
        let ok = std::process::Command::new(&py)
            .args(["-m", "pip", "install", "-q", "mcp"])
            .status()
            .expect("pip runs");
        assert!(ok.success(), "pip install mcp failed");
        assert!(has_mcp(&py), "mcp still not importable after pip install");
    }
    py
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A running `gabp-relay serve` with its MCP HTTP endpoint.
struct Serve {
    _child: Child,
    addr: Addr,
    mcp_url: String,
    token: String,
    bridge_file: PathBuf,
    data_dir: PathBuf,
}

async fn serve(sim: &ModSim, dir: &Path) -> Serve {
    let token = token();
    let bridge_file = dir.join("bridge.json");
    let data_dir = dir.join("data");
    let mut child = Command::new(BIN)
        .arg("serve")
        .args([
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            MOD_TOKEN,
        ])
        .args(["--listen", "127.0.0.1:0", "--token", &token])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--bridge-file")
        .arg(&bridge_file)
        .args(["--mcp-listen", "127.0.0.1:0"])
        .env_remove("GABP_RELAY_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gabp-relay serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut mcp_url) = (None, None);
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(rest) = line.split(" listening on ").nth(1) {
                addr = rest.split(' ').next().and_then(|a| a.parse::<Addr>().ok());
            }
            if let Some(url) = line.strip_prefix("mcp on ") {
                mcp_url = Some(url.trim().to_string());
            }
            if line.starts_with("recording") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("relay printed its start-up lines");
    Serve {
        _child: child,
        addr: addr.expect("listening line"),
        mcp_url: mcp_url.expect("mcp line"),
        token,
        bridge_file,
        data_dir,
    }
}

fn sim(autostart: bool, rate: Option<f64>) -> ModSim {
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        autostart,
        rate,
        payload_bytes: 256,
        ..ModSimConfig::default()
    };
    ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}

/// A running client.py, its stdout as lines, its stderr in a file (shown when it fails).
struct Py {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
}

fn spawn_py(what: &str, mode: &str, name: &str, s: &Serve, dir: &Path, env: &[(&str, &str)]) -> Py {
    let stderr = dir.join(format!("{name}.stderr"));
    let mut cmd = Command::new(python());
    cmd.arg(client_script()).args([what, mode, name]);
    if mode == "stdio" {
        cmd.args(["--", BIN, "mcp", "--name", name, "--bridge-file"])
            .arg(&s.bridge_file);
    } else {
        cmd.arg(&s.mcp_url).env("GABP_TOKEN", &s.token);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .env_remove("GABP_RELAY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn python");
    let out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    Py { child, out, stderr }
}

impl Py {
    /// The next stdout line, within `wait`.
    async fn line(&mut self, wait: Duration) -> String {
        match tokio::time::timeout(wait, self.out.next_line()).await {
            Ok(Ok(Some(l))) => l,
            other => panic!(
                "client.py gave no line ({other:?}); its stderr:\n{}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            ),
        }
    }

    /// The result document and a successful exit.
    async fn finish(mut self, wait: Duration) -> Value {
        let line = self.line(wait).await;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("client.py exits")
            .expect("wait");
        assert!(
            status.success(),
            "client.py failed; its stderr:\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        serde_json::from_str(&line).expect("client.py printed JSON")
    }
}

fn check_scenario(r: &Value, name: &str) {
    assert_eq!(r["name"], name);
    assert_eq!(r["server"], "gabp-relay");
    assert_eq!(r["echo"], json!({"echo": {"hello": name}}));
    assert!(
        r["failText"]
            .as_str()
            .is_some_and(|t| t.contains("tool failed on purpose")),
        "the GABP error reaches the assistant: {}",
        r["failText"]
    );
    assert_eq!(r["events"]["count"], 500);
    assert_eq!(r["ack"]["attentionId"], "attn_1");
    assert_eq!(r["ack"]["acknowledged"], false);
    assert!(r["attention"]["attention"].is_null());
    assert_eq!(r["listChanged"], true);
    let resources: Vec<&str> = r["resources"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for want in [
        "/welcome",
        "/stats",
        "/channels/world/tick",
        "/channels/chat/message",
    ] {
        assert!(
            resources
                .iter()
                .any(|u| u.starts_with("gabp://default/") && u.ends_with(want)),
            "{want} missing from {resources:?}"
        );
    }
}

/// Two MCP clients (stdio and HTTP) and one plain bridge share one game; every check of the
/// scenario holds for both clients, and the recording names all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mcp_clients_and_a_bridge_share_one_game_and_are_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim(false, None);
    let s = serve(&sim, dir.path()).await;
    let (mut plain, _) = Client::connect_hello(&s.addr, &s.token)
        .await
        .expect("plain bridge hello");
    plain.subscribe(&["world/tick"]).await.expect("subscribe");

    let mut a = spawn_py("scenario", "stdio", "assistant-a", &s, dir.path(), &[]);
    let mut b = spawn_py("scenario", "http", "assistant-b", &s, dir.path(), &[]);
    for py in [&mut a, &mut b] {
        assert_eq!(py.line(Duration::from_secs(120)).await, "RESTART");
    }
    // Both assistants are bridges of the route, beside the plain one.
    let status = plain
        .call("relay/status", json!({}))
        .await
        .expect("relay/status");
    let versions: Vec<&str> = status["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .filter_map(|b| b["bridgeVersion"].as_str())
        .collect();
    assert_eq!(versions.len(), 3, "{versions:?}");
    assert_eq!(
        versions
            .iter()
            .filter(|v| v.starts_with("gabp-relay-mcp/"))
            .count(),
        2,
        "{versions:?}"
    );
    // The plain bridge shares the game with both assistants.
    let echoed = plain
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"from": "plain"}}),
        )
        .await
        .expect("plain bridge call");
    assert_eq!(echoed, json!({"echo": {"from": "plain"}}));
    // The mod restarts (a crash): the relay reconnects, a new session begins.
    sim.kill_connections();
    let ra = a.finish(Duration::from_secs(60)).await;
    let rb = b.finish(Duration::from_secs(60)).await;
    check_scenario(&ra, "assistant-a");
    check_scenario(&rb, "assistant-b");
    // The plain bridge was told and still works in the new session.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "no relay/session notice");
        let ev = plain.next_event().await.expect("event");
        if ev["channel"] == "relay/session" && ev["payload"]["state"] == "started" {
            break;
        }
    }
    let echoed = plain
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"from": "plain"}}),
        )
        .await
        .expect("plain bridge call after restart");
    assert_eq!(echoed, json!({"echo": {"from": "plain"}}));

    // The recording holds all three hellos, the assistants by name.
    let list = std::process::Command::new(BIN)
        .args(["sessions", "--json", "--data-dir"])
        .arg(&s.data_dir)
        .output()
        .expect("sessions");
    assert!(list.status.success());
    let list: Value = serde_json::from_slice(&list.stdout).expect("sessions json");
    let mut recorded = String::new();
    for sess in list["sessions"].as_array().expect("sessions") {
        let id = sess["id"].as_str().expect("id");
        let out = std::process::Command::new(BIN)
            .args(["export", id, "--data-dir"])
            .arg(&s.data_dir)
            .output()
            .expect("export");
        assert!(out.status.success(), "export {id}");
        recorded += &String::from_utf8_lossy(&out.stdout);
    }
    for who in [
        "assistant-a",
        "assistant-b",
        "gabp-sim/0.1",
        "gabp-relay-mcp/",
    ] {
        assert!(recorded.contains(who), "{who} not in the recording");
    }
    assert!(!recorded.contains(&s.token), "the token was recorded");
    // Each MCP client's `mark` is in the recording, and no mark reached the mod.
    for who in ["assistant-a", "assistant-b"] {
        let label = format!("episode-start-{who}");
        assert!(recorded.contains(&label), "{label} not in the recording");
    }
    assert!(
        !recorded
            .lines()
            .any(|l| l.contains("relay/mark") && l.contains("\"relay->mod\"")),
        "a mark reached the mod"
    );
}

/// The HTTP endpoint refuses requests without the route's bearer token.
#[tokio::test]
async fn mcp_http_needs_the_bearer_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim(false, None);
    let s = serve(&sim, dir.path()).await;
    let url = s.mcp_url.strip_prefix("http://").expect("http url");
    let (host, path) = url.split_once('/').expect("path");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    for auth in [
        "",
        "Authorization: Bearer wrongwrongwrongwrongwrongwrong00\r\n",
    ] {
        let req = format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut conn = tokio::net::TcpStream::connect(host).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut conn, req.as_bytes())
            .await
            .expect("write");
        let mut resp = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut resp),
        )
        .await
        .expect("answer in time")
        .expect("read");
        assert!(resp.starts_with("HTTP/1.1 401"), "{resp}");
    }
}

fn pct(h: &hdrhistogram::Histogram<u64>) -> Value {
    json!({"p50Ms": h.value_at_quantile(0.5) as f64 / 1e3, "p99Ms": h.value_at_quantile(0.99) as f64 / 1e3, "n": h.len()})
}

/// A plain bridge's tools/call latency: 100 calls/s open loop, then 8 bridges closed loop.
async fn plain_bench(addr: &Addr, token: &str, calls: u64, secs: u64) -> Value {
    let (mut c, _) = Client::connect_hello(addr, token).await.expect("hello");
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let t0 = Instant::now();
    for i in 0..calls {
        let due = t0 + Duration::from_millis(i * 10);
        tokio::time::sleep_until(due.into()).await;
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"i": i}}),
        )
        .await
        .expect("call");
        h.record(due.elapsed().as_micros() as u64).expect("record");
    }
    let rate100 = pct(&h);
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (addr, token) = (addr.clone(), token.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut c, _) = Client::connect_hello(&addr, &token).await.expect("hello");
            let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
            while Instant::now() < stop {
                let s = Instant::now();
                c.call(
                    "tools/call",
                    json!({"name": "sim/echo", "arguments": {"c": 8}}),
                )
                .await
                .expect("call");
                h.record(s.elapsed().as_micros() as u64).expect("record");
            }
            h
        }));
    }
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        all.add(t.await.expect("task")).expect("add");
    }
    let mut conc8 = pct(&all);
    conc8["callsPerS"] = json!(all.len() as f64 / secs as f64);
    json!({"rate100": rate100, "conc8": conc8})
}

/// Latency through MCP (stdio, HTTP) vs a plain bridge, and events_poll against the simulated
/// mod's 20,000 events/s. Prints the figures; run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about a minute): cargo test --release -p gabp-relay --test mcp -- --ignored --nocapture"]
async fn measure_mcp_latency_and_event_polling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quiet = sim(false, None);
    let s = serve(&quiet, dir.path()).await;
    let plain = plain_bench(&s.addr, &s.token, 500, 5).await;
    let env = [("BENCH_CALLS", "500"), ("BENCH_SECONDS", "5")];
    let stdio = spawn_py("bench", "stdio", "bench-stdio", &s, dir.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    let http = spawn_py("bench", "http", "bench-http", &s, dir.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    drop(s);

    let dir2 = tempfile::tempdir().expect("tempdir");
    let busy = sim(true, Some(20_000.0));
    let s2 = serve(&busy, dir2.path()).await;
    let env = [("BENCH_CALLS", "0"), ("BENCH_EVENTS_SECONDS", "10")];
    let events = spawn_py("bench", "stdio", "bench-events", &s2, dir2.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    let report =
        json!({"plain": plain, "mcpStdio": stdio, "mcpHttp": http, "eventsPoll": events["events"]});
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    let per_s = events["events"]["perS"].as_u64().expect("events/s");
    assert!(
        per_s >= 18_000,
        "events_poll kept up with {per_s} events/s only"
    );
    assert_eq!(events["events"]["missed"], 0, "events_poll missed events");
}
