//! The MCP front's bounds, attacked with real processes on loopback: idle HTTP sessions expire
//! and free their bridge, sessions and connections are capped, wrong bearer tokens are
//! throttled, counted and logged once per burst, `gabp-relay mcp` stops on SIGINT / SIGTERM,
//! malformed input gets a JSON-RPC error on stdio and HTTP, a call too large for the relay is
//! refused unsent, `events_poll` counts against the identity's rate, and a front whose
//! connection is cut resumes it with no event lost.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::support::{BIN, MOD_TOKEN};

struct Serve {
    _child: Child,
    addr: Addr,
    /// host:port of the MCP endpoint.
    mcp: String,
    metrics: Option<String>,
    token: String,
    bridge_file: std::path::PathBuf,
    stderr: std::path::PathBuf,
}

impl Serve {
    /// Kills the relay and waits for its exit (its discovery file stays, as after a crash).
    async fn stop(mut self) {
        let _ = self._child.start_kill();
        let _ = self._child.wait().await;
    }

    /// Stops the relay with SIGTERM (its recording closed) and waits for exit 0.
    async fn terminate(mut self) {
        let pid = self._child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self._child.wait())
            .await
            .expect("the relay stops")
            .expect("wait");
        assert_eq!(status.code(), Some(0));
    }
}

fn sim() -> ModSim {
    sim_with(ModSimConfig::default())
}

/// A mod with one channel, `a/b`, that sends events only when asked (`sim/emit`).
fn quiet_sim() -> ModSim {
    sim_with(ModSimConfig {
        channels: vec!["a/b".into()],
        autostart: false,
        ..ModSimConfig::default()
    })
}

/// A plain bridge on the relay `s`, beside the front.
async fn plain_bridge(s: &Serve) -> Client {
    Client::connect_hello(&s.addr, &s.token)
        .await
        .expect("plain bridge")
        .0
}

fn sim_with(cfg: ModSimConfig) -> ModSim {
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        ..cfg
    };
    ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}

async fn serve(sim: &ModSim, dir: &Path, env: &[(&str, &str)]) -> Serve {
    serve_with(sim, dir, env, &["--no-record"]).await
}

/// `serve_with` under the config file `text` (written private, as the relay requires of a
/// file holding tokens), `args` added.
async fn serve_with_config(sim: &ModSim, dir: &Path, text: &str, args: &[&str]) -> Serve {
    use std::os::unix::fs::PermissionsExt;
    let cfg = dir.join("relay.toml");
    std::fs::write(&cfg, text).expect("config");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let cfg = cfg.to_str().expect("utf-8").to_string();
    let mut all = vec!["--config", cfg.as_str()];
    all.extend_from_slice(args);
    serve_with(sim, dir, &[], &all).await
}

/// `serve` with the MCP endpoint, `env` set and `args` added (recording or not).
async fn serve_with(sim: &ModSim, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Serve {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let bridge_file = dir.join("bridge.json");
    let stderr = dir.join("serve.stderr");
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .args([
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            MOD_TOKEN,
        ])
        .args(["--listen", "127.0.0.1:0", "--token", &token])
        .args(args)
        .arg("--bridge-file")
        .arg(&bridge_file)
        .args(["--mcp-listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .env_remove("GABP_RELAY_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gabp-relay serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut mcp, mut metrics) = (None, None, None);
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(rest) = line.split(" listening on ").nth(1) {
                addr = rest.split(' ').next().and_then(|a| a.parse::<Addr>().ok());
            }
            if let Some(url) = line.strip_prefix("mcp on http://") {
                mcp = url.split('/').next().map(String::from);
            }
            if let Some(url) = line.strip_prefix("metrics on http://") {
                metrics = url.split('/').next().map(String::from);
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
        mcp: mcp.expect("mcp line"),
        metrics,
        token,
        bridge_file,
        stderr,
    }
}

/// One HTTP/1.1 request on its own connection: (status, headers and body as text).
async fn http(host: &str, method: &str, headers: &[String], body: &str) -> (u16, String) {
    let mut req = format!("{method} /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        req += h;
        req += "\r\n";
    }
    req += "\r\n";
    req += body;
    let mut conn = TcpStream::connect(host).await.expect("connect");
    // A body the front refuses (413) may be answered, and the connection closed, before it is
    // all sent: the rest of the write then fails, and the answer is still there to read.
    let cut = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        )
    };
    if let Err(e) = conn.write_all(req.as_bytes()).await {
        assert!(cut(&e), "write: {e}");
    }
    let mut resp = Vec::new();
    let read = async {
        let mut buf = [0u8; 8192];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => resp.extend_from_slice(&buf[..n]),
                Err(e) if cut(&e) && !resp.is_empty() => break,
                Err(e) => panic!("read: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("answer in time");
    let resp = String::from_utf8(resp).expect("utf-8 answer");
    let status = resp
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {resp:?}"));
    (status, resp)
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"limits","version":"1"}}}"#;

fn bearer(s: &Serve) -> String {
    format!("Authorization: Bearer {}", s.token)
}

/// Initializes an HTTP session; returns its id and the initialize answer.
async fn open_session(s: &Serve) -> (u16, Option<String>, String) {
    let (status, resp) = http(&s.mcp, "POST", &[bearer(s)], INIT).await;
    let id = resp.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("mcp-session-id")
            .then(|| v.trim().to_string())
    });
    (status, id, resp)
}

async fn mcp_bridges(plain: &mut Client) -> usize {
    let status = plain.call("relay/status", json!({})).await.expect("status");
    status["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .filter(|b| {
            b["bridgeVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("gabp-relay-mcp/"))
        })
        .count()
}

async fn wait_for(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP client that calls a tool right after `initialize` (no `notifications/initialized`
/// yet) attaches a bridge named after its `clientInfo.name`, as the recording's hello shows.
/// Before, the name was taken from that notification, so such a bridge was recorded as "mcp".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_is_recorded_under_its_own_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8");
    let s = serve_with(&sim, dir.path(), &[], &["--data-dir", data_arg]).await;
    let (status, id, resp) = open_session(&s).await;
    assert_eq!(status, 200, "{resp}");
    let sid = id.expect("a session id");
    let mark = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"mark","arguments":{"label":"named"}}});
    let (status, resp) = http(
        &s.mcp,
        "POST",
        &[bearer(&s), format!("mcp-session-id: {sid}")],
        &mark.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert!(resp.contains("marked"), "{resp}");
    // The mark is recorded after the bridge's hello: once it is in the recording, so is that.
    let mut hello = None;
    wait_for(
        "the mark is recorded",
        Duration::from_secs(20),
        async || {
            let out = Command::new(BIN)
                .args(["export", "latest", "--data-dir", data_arg])
                .output()
                .await
                .expect("export");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            hello = text
                .lines()
                .find(|l| l.contains("session/hello") && l.contains("gabp-relay-mcp/"))
                .map(String::from);
            text.contains("\"named\"")
        },
    )
    .await;
    let hello = hello.expect("the MCP bridge's hello is recorded");
    assert!(
        hello.contains(r#""clientInfo":{"name":"limits""#),
        "{hello}"
    );
    s.stop().await;
}

/// An MCP client (`gabp-relay mcp` on stdio) takes the lease with its `relay_lease` tool and
/// then calls a leased tool; a plain bridge of the same identity is refused meanwhile. Before,
/// the MCP front had no way to take the lease, so every leased tool failed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_takes_the_lease_with_its_relay_lease_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    // The flags' route is `default`: this file route of that name (its own listen, upstream and
    // token overridden by the flags) adds the leased tools.
    let text = format!(
        "[[route]]\nname = \"default\"\nupstream = \"{}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"file-token-0123456789abcdef\"\nleased = [\"sim/echo\"]\n",
        sim.addr()
    );
    let s = serve_with_config(&sim, dir.path(), &text, &["--no-record"]).await;
    let mut m = stdio(&s).await;
    assert!(m.tool_names(2).await.iter().any(|n| n == "relay_lease"));
    let (failed, text) = result_text(&m.call(3, "sim_echo", json!({"x": 1})).await);
    assert!(failed && text.contains("-32008"), "{text}");
    let (failed, text) = result_text(&m.call(4, "relay_lease", json!({"action": "acquire"})).await);
    assert!(!failed, "{text}");
    let lease: Value = serde_json::from_str(&text).expect("the lease as JSON");
    assert_eq!(lease["held"], true, "{lease}");
    let (failed, text) = result_text(&m.call(5, "sim_echo", json!({"x": 1})).await);
    assert!(!failed, "the holder calls the leased tool: {text}");
    let mut other = plain_bridge(&s).await;
    let echo = json!({"name": "sim/echo", "arguments": {"x": 1}});
    let r = other.request("tools/call", echo).await.expect("answered");
    assert_eq!(r["error"]["code"], -32008, "{r}");
    let (failed, text) = result_text(&m.call(6, "relay_lease", json!({"action": "release"})).await);
    assert!(!failed, "{text}");
    let lease = other
        .call("relay/lease", json!({"action": "acquire"}))
        .await
        .expect("free once the MCP client released it");
    assert_eq!(lease["held"], true, "{lease}");
    s.stop().await;
}

/// An HTTP session nobody closes expires after the idle timeout, and its bridge with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_sessions_expire_and_free_their_bridge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[("GABP_RELAY_MCP_IDLE_MS", "1500")]).await;
    let (mut plain, _) = Client::connect_hello(&s.addr, &s.token)
        .await
        .expect("hello");
    let (status, id, resp) = open_session(&s).await;
    assert_eq!(status, 200, "{resp}");
    assert!(
        resp.contains(r#""title":"gabp-relay MCP front (default)""#),
        "serverInfo.title names the route: {resp}"
    );
    let id = id.expect("a session id");
    let session = format!("Mcp-Session-Id: {id}");
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _) = http(&s.mcp, "POST", &[bearer(&s), session.clone()], note).await;
    assert_eq!(status, 202);
    wait_for(
        "the session's bridge",
        Duration::from_secs(20),
        async || mcp_bridges(&mut plain).await == 1,
    )
    .await;
    wait_for(
        "the idle session's bridge to go",
        Duration::from_secs(30),
        async || mcp_bridges(&mut plain).await == 0,
    )
    .await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let headers = [
        bearer(&s),
        session,
        "MCP-Protocol-Version: 2025-06-18".into(),
    ];
    let (status, resp) = http(&s.mcp, "POST", &headers, list).await;
    assert_eq!(status, 404, "the expired session is gone: {resp}");
}

/// At most 8 sessions per identity and 32 at once: the next initialize gets a clear 503, and an
/// identity holding its share keeps no other identity out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sessions_are_capped_per_identity_and_in_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let names = ["a", "b", "c", "d", "e"];
    let token = |n: &str| format!("{n}-token-0123456789abcdef0123");
    let mut text = format!(
        "[[route]]\nname = \"default\"\nupstream = \"{}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"file-token-0123456789abcdef\"\n",
        sim.addr()
    );
    for n in names {
        let role = if n == "a" { "observe" } else { "control" };
        text.push_str(&format!(
            "\n[[route.bridge]]\nname = \"{n}\"\ntoken = \"{}\"\nrole = \"{role}\"\n",
            token(n)
        ));
    }
    let s = serve_with_config(&sim, dir.path(), &text, &[]).await;
    // An observe identity takes its 8, then is refused; a control identity still gets in.
    for i in 0..8 {
        let (status, _, resp) = open_session_as(&s, &token("a"), "obs").await;
        assert_eq!(status, 200, "session {i}: {resp}");
    }
    let (status, _, resp) = open_session_as(&s, &token("a"), "obs").await;
    assert_eq!(status, 503, "{resp}");
    assert!(resp.contains("as many as one identity may"), "{resp}");
    for n in ["b", "c", "d"] {
        for i in 0..8 {
            let (status, _, resp) = open_session_as(&s, &token(n), n).await;
            assert_eq!(status, 200, "{n} session {i}: {resp}");
        }
    }
    // 32 in all: the next one is refused whoever asks.
    let (status, _, resp) = open_session_as(&s, &token("e"), "e").await;
    assert_eq!(status, 503, "{resp}");
    assert!(resp.contains("too many MCP sessions (32)"), "{resp}");
}

/// Wrong tokens wait longer each time, are counted in gabp_auth_failures_total and logged once
/// per burst; the scheme is matched in any case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bearer_tokens_are_throttled_counted_and_logged_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let wrong = "Authorization: Bearer 0123456789abcdef0123456789abcdef".to_string();
    let mut took = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let (status, _) = http(&s.mcp, "POST", std::slice::from_ref(&wrong), INIT).await;
        assert_eq!(status, 401);
        took.push(t.elapsed());
    }
    assert!(
        took[5] >= Duration::from_millis(300) && took[5] > took[0],
        "failures are slowed down: {took:?}"
    );
    let lower = format!("authorization: bearer {}", s.token);
    let (status, resp) = http(&s.mcp, "POST", &[lower], INIT).await;
    assert_eq!(status, 200, "a lowercase scheme is accepted: {resp}");
    let metrics = s.metrics.as_deref().expect("metrics line");
    let mut conn = TcpStream::connect(metrics).await.expect("metrics");
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {metrics}\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.expect("write");
    let mut text = String::new();
    conn.read_to_string(&mut text).await.expect("read");
    assert!(
        text.lines()
            .any(|l| l.starts_with("gabp_auth_failures_total") && l.ends_with(" 6")),
        "six failures counted: {text}"
    );
    let log = std::fs::read_to_string(&s.stderr).expect("stderr");
    let warned = log.matches("without a bridge token of the route").count();
    assert_eq!(warned, 1, "one line per burst: {log}");
    assert!(!log.contains(&s.token) && !log.contains("0123456789abcdef0123"));
}

/// Requests a client chooses to fail (unknown methods with long names) do not grow the log:
/// the MCP library's own line per failed request, with the client's text in it, is off (the
/// README's log budget), and the client's text never reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_requests_do_not_grow_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let (status, id, resp) = open_session(&s).await;
    assert_eq!(status, 200, "{resp}");
    let session = format!("Mcp-Session-Id: {}", id.expect("session id"));
    let headers = [bearer(&s), session];
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    http(&s.mcp, "POST", &headers, initialized).await;
    let before = std::fs::metadata(&s.stderr).expect("stderr").len();
    let name = format!("chosen-by-the-client-{}", "x".repeat(32 * 1024));
    for i in 0..40 {
        let body = json!({"jsonrpc": "2.0", "id": i + 10, "method": name}).to_string();
        let (status, resp) = http(&s.mcp, "POST", &headers, &body).await;
        assert!(resp.contains("-32601") || status != 200, "{status} {resp}");
    }
    let log = std::fs::read_to_string(&s.stderr).expect("stderr");
    let grew = log.len() as u64 - before;
    assert!(grew < 16 * 1024, "the log grew by {grew} bytes");
    assert!(
        !log.contains("chosen-by-the-client"),
        "client text in the log"
    );
}

/// One HTTP/1.1 request on its own connection, or why it got no answer (closed unanswered,
/// or nothing within `wait`).
async fn try_http(
    host: &str,
    headers: &[String],
    method: &str,
    body: &str,
    wait: Duration,
) -> Result<(u16, String), String> {
    let mut req = format!("{method} /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        req += h;
        req += "\r\n";
    }
    req += "\r\n";
    req += body;
    let exchange = async {
        let mut conn = TcpStream::connect(host).await.map_err(|e| e.to_string())?;
        conn.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut resp = Vec::new();
        conn.read_to_end(&mut resp)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8_lossy(&resp).into_owned())
    };
    let resp = tokio::time::timeout(wait, exchange)
        .await
        .map_err(|_| "no answer in time".to_string())??;
    let status = resp
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("closed without an answer: {resp:?}"))?;
    Ok((status, resp))
}

/// One MCP client's whole visit: initialize, call a tool, close the session.
async fn visit(s: &Serve, wait: Duration) -> Result<(), String> {
    let (status, resp) = try_http(&s.mcp, &[bearer(s)], "POST", INIT, wait).await?;
    let sid = resp
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_string())
        })
        .ok_or_else(|| format!("initialize: {status} {resp}"))?;
    let headers = [bearer(s), format!("mcp-session-id: {sid}")];
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"relay_status","arguments":{}}});
    let (status, resp) = try_http(&s.mcp, &headers, "POST", &call.to_string(), wait).await?;
    if status != 200 || !resp.contains("\"route\"") {
        return Err(format!("relay_status: {status} {resp}"));
    }
    let (status, resp) = try_http(&s.mcp, &headers, "DELETE", "", wait).await?;
    if !(200..300).contains(&status) {
        return Err(format!("close: {status} {resp}"));
    }
    Ok(())
}

/// Holds `n` idle connections (no byte sent) to `host`, opening a new one 100 ms after each
/// is closed, until dropped; counts the connections opened.
struct IdleFlood {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl IdleFlood {
    fn start(host: &str, n: usize) -> IdleFlood {
        IdleFlood::sending(host, n, String::new())
    }

    /// The same, each connection sending `first` (and nothing after it) once connected.
    fn sending(host: &str, n: usize, first: String) -> IdleFlood {
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks = (0..n)
            .map(|_| {
                let (host, opened, first) = (host.to_string(), opened.clone(), first.clone());
                tokio::spawn(async move {
                    loop {
                        if let Ok(mut c) = TcpStream::connect(&host).await {
                            if !first.is_empty() && c.write_all(first.as_bytes()).await.is_err() {
                                continue;
                            }
                            opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let mut buf = [0u8; 64];
                            while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                })
            })
            .collect();
        IdleFlood { tasks, opened }
    }

    fn opened(&self) -> usize {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for IdleFlood {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// 200 idle connections (no byte sent, each opened again when closed) never keep out a client
/// with the token: 50 of 50 visits (initialize, a tool call, close) over 5 s succeed, each
/// within 5 s, and a request already being answered is not cut. An idle connection is still closed after
/// the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_keep_out_a_client_with_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    // A long poll in flight on its own connection while the flood arrives: once its stream
    // has begun, the relay is answering it.
    let (_, sid, _) = open_session(&s).await;
    let poll = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"events_poll","arguments":{"channels":["none/such"],"waitMs":3000}}}).to_string();
    let mut polling = TcpStream::connect(&s.mcp).await.expect("connect");
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\n{}\r\nmcp-session-id: {}\r\nContent-Length: {}\r\n\r\n{poll}",
        s.mcp,
        bearer(&s),
        sid.expect("session"),
        poll.len()
    );
    polling.write_all(req.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("retry:") {
        let n = tokio::time::timeout(Duration::from_secs(10), polling.read(&mut buf))
            .await
            .expect("the poll's stream begins")
            .expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }

    let flood = IdleFlood::start(&s.mcp, 200);
    wait_for(
        "200 idle connections",
        Duration::from_secs(30),
        async || flood.opened() >= 200,
    )
    .await;
    let (mut ok, mut slowest, mut failures) = (0, Duration::ZERO, Vec::new());
    // Spread over 5 s of the flood's churn (each connection it loses is opened again).
    let mut visits = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..50 {
        visits.tick().await;
        let t = Instant::now();
        match visit(&s, Duration::from_secs(5)).await {
            Ok(()) => {
                ok += 1;
                slowest = slowest.max(t.elapsed());
            }
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{ok} of 50 visits, the slowest {slowest:?}; {} idle connections opened",
        flood.opened()
    );
    assert_eq!(ok, 50, "{failures:?}");
    tokio::time::timeout(Duration::from_secs(10), polling.read_to_end(&mut answer))
        .await
        .expect("the poll ends")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("\"isError\":false") && answer.contains("cursor"),
        "the poll is answered: {answer}"
    );
    drop(flood);

    let mut idle = TcpStream::connect(&s.mcp).await.expect("connect");
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(20), idle.read(&mut buf))
        .await
        .expect("an idle connection is closed after the header timeout");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(t.elapsed() < Duration::from_secs(15));
}

/// A client with a good token that sends a request's headers and then holds its body back
/// keeps no one out: its connection counts as authenticated only once the request is whole
/// (and is answered 408 after 10 s), so 200 such connections from the same address are closed
/// to make room for clients that send whole requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holder_holding_back_a_body_keeps_no_one_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let held = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{}\r\nContent-Length: 4000000\r\n\r\n{{",
        s.mcp,
        bearer(&s)
    );
    let flood = IdleFlood::sending(&s.mcp, 200, held);
    wait_for(
        "200 connections holding a body back",
        Duration::from_secs(30),
        async || flood.opened() >= 200,
    )
    .await;
    let mut failures = Vec::new();
    for _ in 0..20 {
        if let Err(e) = visit(&s, Duration::from_secs(5)).await {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 20 visits failed: {failures:?}",
        failures.len()
    );
    drop(flood);
}

/// A keep-alive connection from `local` (a loopback address) that has sent one request with
/// `token` and read its whole answer; `None` if the front closed it unanswered.
async fn authenticated_connection(host: &str, local: [u8; 4], token: &str) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((local, 0)))
        .expect("bind a loopback address");
    let mut conn = socket
        .connect(host.parse().expect("host:port"))
        .await
        .expect("connect");
    // Not a JSON-RPC message: answered 400 at once, the connection kept alive and counted as
    // authenticated (its token was good and its request whole).
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    conn.write_all(req.as_bytes()).await.ok()?;
    answer_on(&mut conn).await.map(|_| conn)
}

/// One whole HTTP answer on a kept-alive connection (headers, then `Content-Length` bytes);
/// `None` if the connection ends first.
async fn answer_on(conn: &mut TcpStream) -> Option<String> {
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                });
                if len.is_some_and(|n| body.len() >= n) {
                    return Some(text);
                }
            }
            match conn.read(&mut buf).await {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => return None,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer or the end within 10 s")
}

/// One identity holding many authenticated keep-alive connections (an `observe` one, from two
/// loopback addresses, more than the front's 128 places and than one address's 64) keeps no
/// other identity out: it holds at most 32, its oldest closed as each newer one authenticates,
/// and another identity's client, from the same address, initializes: a connection that sent
/// authenticated requests is never closed for another identity, so without the per-identity
/// cap the observer would fill every place and close every other identity's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_holding_many_connections_keeps_no_other_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve_identities(&sim, dir.path(), &["--no-record"]).await;
    let mut held = Vec::new();
    for i in 0..140 {
        let local = if i % 2 == 0 {
            [127, 0, 0, 1]
        } else {
            [127, 0, 0, 2]
        };
        held.push(authenticated_connection(&s.mcp, local, WATCHER).await);
    }
    let planner = format!("Authorization: Bearer {PLANNER}");
    let answer = try_http(&s.mcp, &[planner], "POST", INIT, Duration::from_secs(10)).await;
    let (status, resp) = answer.unwrap_or_else(|e| panic!("the planner is kept out: {e}"));
    assert_eq!(status, 200, "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("mcp-session-id"),
        "{resp}"
    );
    // Every connection was answered; all but the newest 32 were closed since, and the newest
    // is still served.
    let mut held: Vec<TcpStream> = held
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.unwrap_or_else(|| panic!("connection {i} closed unanswered")))
        .collect();
    let mut kept = held.split_off(140 - 32);
    for (i, c) in held.iter_mut().enumerate() {
        assert!(answer_on(c).await.is_none(), "connection {i} is closed");
    }
    let newest = kept.last_mut().expect("kept");
    let again = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {WATCHER}\r\nContent-Length: 2\r\n\r\n{{}}",
        s.mcp
    );
    newest.write_all(again.as_bytes()).await.expect("write");
    let answer = answer_on(newest).await.expect("the newest is still served");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

/// A malformed body gets a short JSON-RPC parse error, without the parser's internals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http_bodies_get_a_short_json_rpc_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let (status, resp) = http(&s.mcp, "POST", &[bearer(&s)], "{not json").await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp.contains(r#""code":-32700"#), "{resp}");
    assert!(
        !resp.contains("column") && !resp.contains("expected"),
        "{resp}"
    );
    let (status, resp) = http(&s.mcp, "POST", &[bearer(&s)], r#"{"id":7,"x":1}"#).await;
    assert_eq!(status, 400, "{resp}");
    assert!(
        resp.contains(r#""code":-32600"#) && resp.contains(r#""id":7"#),
        "{resp}"
    );
}

/// A running `gabp-relay mcp` on pipes, initialized.
struct Stdio_ {
    child: Child,
    stdin: tokio::process::ChildStdin,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

async fn stdio(s: &Serve) -> Stdio_ {
    let file = s.bridge_file.to_str().expect("utf-8 path");
    stdio_with(&["--bridge-file", file]).await
}

/// `gabp-relay mcp --name limits ARGS`, initialized.
async fn stdio_with(args: &[&str]) -> Stdio_ {
    stdio_named("limits", args).await
}

/// `gabp-relay mcp --name NAME ARGS`, initialized.
async fn stdio_named(name: &str, args: &[&str]) -> Stdio_ {
    stdio_logged(name, args, Stdio::null()).await
}

/// `gabp-relay mcp --name NAME ARGS`, initialized, its log written to `log`.
async fn stdio_logged(name: &str, args: &[&str], log: impl Into<Stdio>) -> Stdio_ {
    let mut child = Command::new(BIN)
        .args(["mcp", "--name", name])
        .args(args)
        .env_remove("GABP_RELAY_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gabp-relay mcp");
    let stdin = child.stdin.take().expect("stdin");
    let out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut m = Stdio_ { child, stdin, out };
    m.send(INIT).await;
    let init = m.answer().await;
    assert_eq!(
        init["result"]["serverInfo"]["title"],
        "gabp-relay MCP front (default)"
    );
    m.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    m
}

impl Stdio_ {
    async fn send(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.write_all(b"\n").await.expect("write");
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.out.next_line())
            .await
            .expect("an answer in time")
            .expect("read")
            .expect("a line");
        serde_json::from_str(&line).expect("JSON")
    }

    /// The answer to request `id` (answers to anything else in between are skipped).
    async fn answer_to(&mut self, id: u64) -> Value {
        loop {
            let a = self.answer().await;
            if a["id"] == id {
                return a;
            }
        }
    }

    /// The tools `tools/list` gives (empty when it fails).
    async fn tools(&mut self, id: u64) -> Vec<Value> {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/list"}).to_string())
            .await;
        let a = self.answer_to(id).await;
        a["result"]["tools"].as_array().cloned().unwrap_or_default()
    }

    /// The names `tools/list` gives (empty when it fails).
    async fn tool_names(&mut self, id: u64) -> Vec<String> {
        self.tools(id)
            .await
            .iter()
            .filter_map(|t| t["name"].as_str())
            .map(String::from)
            .collect()
    }

    /// Calls tool `name`; its result (answers to anything else in between are skipped).
    async fn call(&mut self, id: u64, name: &str, arguments: Value) -> Value {
        let req = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}});
        self.send(&req.to_string()).await;
        let a = self.answer_to(id).await;
        assert!(a["error"].is_null(), "{name}: {a}");
        a["result"].clone()
    }
}

/// The text of a tool result, parsed as JSON when it is.
fn result_text(r: &Value) -> (bool, String) {
    let text = r["content"][0]["text"].as_str().unwrap_or_default();
    (r["isError"] == true, text.to_string())
}

/// SIGINT and SIGTERM stop `gabp-relay mcp` within a second, with an events_poll waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_stops_promptly_on_sigint_and_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    for sig in ["INT", "TERM"] {
        let mut m = stdio(&s).await;
        let poll = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"events_poll","arguments":{"channels":["none/such"],"waitMs":30000}}});
        m.send(&poll.to_string()).await;
        let pid = m.child.id().expect("running").to_string();
        let t = Instant::now();
        let killed = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        let status = tokio::time::timeout(Duration::from_secs(5), m.child.wait())
            .await
            .unwrap_or_else(|_| panic!("SIG{sig} did not stop gabp-relay mcp"))
            .expect("wait");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "SIG{sig}: {:?}",
            t.elapsed()
        );
        assert_eq!(status.code(), Some(0), "SIG{sig}");
    }
}

/// On stdio a line that is not JSON gets -32700 and an over-long line -32600, and the session
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_answers_malformed_and_overlong_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    m.send("{this is not json").await;
    let a = m.answer().await;
    assert_eq!(a["error"]["code"], -32700, "{a}");
    assert!(a["id"].is_null());
    let long = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"x","params":"{}"}}"#,
        "y".repeat(17 << 20)
    );
    m.send(&long).await;
    let a = m.answer().await;
    assert_eq!(a["error"]["code"], -32600, "{a}");
    m.send(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).await;
    let a = m.answer().await;
    assert_eq!(a["id"], 3, "still served: {a}");
    assert!(a["result"].is_object(), "{a}");
}

/// A tool call larger than the relay's `--max-body` is refused by the front, unsent, with a
/// message saying so; the front's connection stays up and the next call is answered. (The
/// relay closes a bridge that sends such a frame, which used to break the front for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_tool_call_is_refused_unsent_and_the_front_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut plain = plain_bridge(&s).await;
    let mut m = stdio(&s).await;
    let big = "a".repeat(1100 * 1024);
    let r = m.call(2, "sim_echo", json!({ "big": big })).await;
    let (is_error, text) = result_text(&r);
    assert!(is_error, "{text}");
    assert!(
        text.contains("over the relay's --max-body of 1048576 bytes; it was not sent"),
        "{text}"
    );
    let r = m.call(3, "sim_echo", json!({ "small": 1 })).await;
    let (is_error, text) = result_text(&r);
    assert!(!is_error && text.contains("\"small\":1"), "{text}");
    let r = m.call(4, "relay_status", json!({})).await;
    assert!(!result_text(&r).0, "{r}");
    assert_eq!(mcp_bridges(&mut plain).await, 1);
}

/// A TCP proxy on loopback whose connections can all be cut at once.
struct Proxy {
    addr: String,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(to: &Addr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let to = to.to_string();
        let conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
            std::sync::Arc::default();
        let held = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut front, _)) = listener.accept().await {
                let to = to.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut back) = TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut front, &mut back).await;
                    }
                });
                held.lock().expect("proxy lock").push(task);
            }
        });
        Proxy {
            addr,
            conns,
            _accept: accept,
        }
    }

    /// Closes every connection made so far (both sides).
    fn cut(&self) {
        for t in self.conns.lock().expect("proxy lock").drain(..) {
            t.abort();
        }
    }
}

/// Polls `channel` from `cursor` until `n` events have come; returns (seqs, missed, sessions).
async fn poll_until(
    m: &mut Stdio_,
    id: &mut u64,
    channel: &str,
    from: u64,
    n: usize,
) -> (Vec<u64>, Vec<Value>, Vec<String>) {
    let (mut seqs, mut missed, mut sessions) = (Vec::new(), Vec::new(), Vec::new());
    let mut cursor = from;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seqs.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {seqs:?} of {n} events came"
        );
        *id += 1;
        let args = json!({"channels": [channel], "cursor": {channel: cursor}, "waitMs": 2000});
        let r = m.call(*id, "events_poll", args).await;
        let (is_error, text) = result_text(&r);
        assert!(!is_error, "{text}");
        let v: Value = serde_json::from_str(&text).expect("poll JSON");
        missed.extend(v["missed"].as_array().cloned().unwrap_or_default());
        sessions.push(v["session"].as_str().unwrap_or_default().to_string());
        for e in v["events"].as_array().expect("events") {
            seqs.push(e["seq"].as_u64().expect("seq"));
        }
        cursor = v["cursor"][channel].as_u64().unwrap_or(cursor);
    }
    (seqs, missed, sessions)
}

/// When the front's connection to the relay is cut, its next request connects again and
/// resumes the subscription: the events sent meanwhile come in order, none missed or repeated,
/// in the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_front_resumes_without_losing_or_repeating_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = quiet_sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut plain = plain_bridge(&s).await;
    let proxy = Proxy::start(&s.addr).await;
    let mut m = stdio_with(&["--connect", &proxy.addr, "--token", &s.token]).await;
    let mut id = 10;
    let emit = json!({"name": "sim/emit", "arguments": {"channel": "a/b", "count": 5}});
    plain.call("tools/call", emit).await.expect("emit");
    let (seqs, missed, before) = poll_until(&mut m, &mut id, "a/b", 0, 5).await;
    assert_eq!(seqs, (0..5).collect::<Vec<u64>>());
    assert!(missed.is_empty(), "{missed:?}");

    proxy.cut();
    wait_for(
        "the relay saw the front go",
        Duration::from_secs(10),
        async || mcp_bridges(&mut plain).await == 0,
    )
    .await;
    let emit = json!({"name": "sim/emit", "arguments": {"channel": "a/b", "count": 7}});
    plain.call("tools/call", emit).await.expect("emit");

    let (seqs, missed, after) = poll_until(&mut m, &mut id, "a/b", 5, 7).await;
    assert_eq!(
        seqs,
        (5..12).collect::<Vec<u64>>(),
        "in order, none lost or repeated"
    );
    assert!(missed.is_empty(), "{missed:?}");
    assert!(
        after.iter().all(|x| *x == before[0]),
        "{before:?} {after:?}"
    );
    // One front again (the relay-only probe that read the session leaves at once).
    wait_for("one MCP bridge", Duration::from_secs(10), async || {
        mcp_bridges(&mut plain).await == 1
    })
    .await;
}

/// `events_poll` arguments of the wrong type or outside the schema's ranges are refused by name
/// (an `isError` result), never read as absent or clamped: `channels: "a/b"` used to poll every
/// channel, and `max: 0` returned one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_poll_refuses_arguments_of_the_wrong_type() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    let bad = [
        (json!({"channels": "a/b"}), "`channels`"),
        (json!({"channels": ["a/b", 7]}), "`channels`"),
        (json!({"cursor": [1, 2]}), "`cursor`"),
        (json!({"cursor": {"a/b": -1}}), "`cursor`"),
        (json!({"session": 5}), "`session`"),
        (json!({"max": "10"}), "`max`"),
        (json!({"max": 0}), "`max` must be an integer from 1 to 5000"),
        (json!({"max": 5001}), "`max`"),
        (json!({"waitMs": -5}), "`waitMs`"),
        (
            json!({"waitMs": 30001}),
            "`waitMs` must be an integer from 0 to 30000",
        ),
    ];
    for (i, (args, field)) in bad.into_iter().enumerate() {
        let r = m.call(10 + i as u64, "events_poll", args.clone()).await;
        let (is_error, text) = result_text(&r);
        assert!(is_error && text.contains(field), "{args}: {text}");
    }
    let r = m
        .call(30, "events_poll", json!({"channels": [], "max": 1}))
        .await;
    let (is_error, text) = result_text(&r);
    assert!(!is_error, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert!(v["events"].is_array(), "{v}");
}

/// `events_poll` answers from the front's own buffer, yet counts against the identity's
/// `calls_per_second` like every other call: polls past the rate come back as `isError` results
/// carrying the relay's -32007 and its `retryAfterMs`, and show in the bridge's `rateLimited`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_poll_counts_against_the_identitys_rate() {
    const POLLER: &str = "poller-token-0123456789abcdef000";
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let text = format!(
        "[[route]]\nname = \"default\"\nupstream = \"{}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"file-token-0123456789abcdef\"\n\n\
         [[route.bridge]]\nname = \"poller\"\ntoken = \"{POLLER}\"\nrole = \"observe\"\ncalls_per_second = 2\n",
        sim.addr()
    );
    let s = serve_with_config(&sim, dir.path(), &text, &["--no-record"]).await;
    let addr = s.addr.to_string();
    let mut m = stdio_named("poller", &["--connect", &addr, "--token", POLLER]).await;
    // The hello and subscribe took the bucket's second's worth: let it fill again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut answered, mut refused) = (0, 0);
    for id in 10..30 {
        let r = m.call(id, "events_poll", json!({"max": 1})).await;
        let (is_error, text) = result_text(&r);
        if !is_error {
            answered += 1;
            continue;
        }
        refused += 1;
        assert!(text.contains("-32007"), "{text}");
        let retry = &r["structuredContent"]["error"]["data"]["retryAfterMs"];
        assert!(retry.as_u64().is_some_and(|ms| ms > 0), "{r}");
    }
    assert!(
        answered >= 1 && refused >= 10,
        "{answered} polls answered, {refused} refused at 2 calls per second"
    );
    let (bridges, _) = status_bridges(&s).await;
    let b = labelled(&bridges, "poller");
    assert!(
        b["rateLimited"].as_u64().is_some_and(|n| n >= refused),
        "{b}"
    );
}

/// With the mod gone, `tools/list` still lists the relay's own tools, and calling a mod tool
/// is an `isError` result carrying the relay's GABP error, not a JSON-RPC "unknown tool".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_mod_down_own_tools_are_listed_and_mod_tools_fail_as_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    let r = m.call(2, "sim_echo", json!({ "x": 1 })).await;
    assert!(!result_text(&r).0, "{r}");
    sim.stop();
    let mut id = 100;
    let mut names = Vec::new();
    wait_for(
        "tools/list with the mod down",
        Duration::from_secs(20),
        async || {
            id += 1;
            names = m.tool_names(id).await;
            !names.is_empty() && !names.iter().any(|n| n.starts_with("sim_"))
        },
    )
    .await;
    for own in ["events_poll", "relay_status", "attention_get", "mark"] {
        assert!(names.iter().any(|n| n == own), "{own} in {names:?}");
    }
    let r = m.call(3, "sim_echo", json!({ "x": 1 })).await;
    let (is_error, text) = result_text(&r);
    assert!(is_error && text.contains("-32000"), "{text}");
}

/// A standard request whose params do not fit its method gets -32602 saying why, on stdio and
/// over HTTP; rmcp alone answered -32601 "method not found" (`tools/call` with string
/// `arguments`, a numeric or missing `name`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misshapen_params_of_a_standard_method_are_invalid_params() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    let bad = [
        json!({"name": "relay_status", "arguments": "str"}),
        json!({"name": 5}),
        json!({"arguments": {}}),
    ];
    for (i, params) in bad.iter().enumerate() {
        let id = 40 + i as u64;
        let req = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params});
        m.send(&req.to_string()).await;
        let a = m.answer().await;
        assert_eq!(a["id"], id, "{a}");
        assert_eq!(a["error"]["code"], -32602, "{params}: {a}");
        let msg = a["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.starts_with("Invalid params for tools/call: "), "{msg}");
    }
    // The session goes on, and a custom method is still "not found".
    let r = m.call(50, "relay_status", json!({})).await;
    assert!(!result_text(&r).0, "{r}");
    m.send(r#"{"jsonrpc":"2.0","id":51,"method":"no/such","params":{}}"#)
        .await;
    let a = m.answer().await;
    assert_eq!(a["error"]["code"], -32601, "{a}");
    // Over HTTP too, as a JSON-RPC answer (status 200).
    let (_, sid, _) = open_session(&s).await;
    let sid = sid.expect("a session id");
    let body = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"relay_status","arguments":"str"}});
    let (status, text) = http(
        &s.mcp,
        "POST",
        &[bearer(&s), format!("mcp-session-id: {sid}")],
        &body.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let a: Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(a["error"]["code"], -32602, "{a}");
}

/// A relay restarted while the front is attached: the next request reconnects to the new
/// relay (its discovery file re-read) and the new session is delivered from its seq 0, so a
/// poll carrying the old session's cursor gets every event of the new one, none skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_relay_restart_the_front_delivers_the_new_session_from_its_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = quiet_sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    let mut plain = plain_bridge(&s).await;
    let emit = |n: u64| json!({"name": "sim/emit", "arguments": {"channel": "a/b", "count": n}});
    plain.call("tools/call", emit(3)).await.expect("emit");
    let mut id = 10;
    let (seqs, _, first) = poll_until(&mut m, &mut id, "a/b", 0, 3).await;
    assert_eq!(seqs, [0, 1, 2]);
    drop(plain);
    s.stop().await;
    let s = serve(&sim, dir.path(), &[]).await;
    let mut plain = plain_bridge(&s).await;
    plain.call("tools/call", emit(6)).await.expect("emit");
    // The poll names the old session and cursor, as a client continuing would.
    let args =
        json!({"channels": ["a/b"], "cursor": {"a/b": 3}, "session": first[0], "waitMs": 2000});
    let (mut seqs, mut missed, mut session) = (Vec::new(), Vec::new(), String::new());
    let mut args = args;
    wait_for("the new session's events", Duration::from_secs(30), async || {
        id += 1;
        let r = m.call(id, "events_poll", args.clone()).await;
        let (is_error, text) = result_text(&r);
        if is_error {
            return false; // the relay is still starting
        }
        let v: Value = serde_json::from_str(&text).expect("JSON");
        missed.extend(v["missed"].as_array().cloned().unwrap_or_default());
        for e in v["events"].as_array().expect("events") {
            seqs.push(e["seq"].as_u64().expect("seq"));
        }
        session = v["session"].as_str().unwrap_or_default().to_string();
        args = json!({"channels": ["a/b"], "cursor": v["cursor"], "session": session, "waitMs": 2000});
        seqs.len() >= 6
    })
    .await;
    assert_ne!(session, first[0], "a new session");
    assert_eq!(seqs, (0..6).collect::<Vec<u64>>(), "from its first event");
    assert!(missed.is_empty(), "{missed:?}");
}

/// With the relay itself gone, the front still lists its own tools and answers calls with an
/// `isError` result (it answered -32603 to both); once the relay is back, calls work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_relay_down_own_tools_are_listed_and_calls_fail_as_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let mut m = stdio(&s).await;
    let r = m.call(2, "relay_status", json!({})).await;
    assert!(!result_text(&r).0, "{r}");
    s.stop().await;
    let mut id = 100;
    let mut failed = String::new();
    wait_for(
        "a call fails as a result with the relay down",
        Duration::from_secs(20),
        async || {
            id += 1;
            let r = m.call(id, "relay_status", json!({})).await;
            let (is_error, text) = result_text(&r);
            failed = text;
            // (A call on the connection as it dies is "closed before the answer".)
            is_error && failed.contains("cannot be reached")
        },
    )
    .await;
    assert!(failed.contains("cannot be reached"), "{failed}");
    id += 1;
    let names = m.tool_names(id).await;
    assert!(
        ["events_poll", "relay_status"]
            .iter()
            .all(|own| names.iter().any(|n| n == own)),
        "{names:?}"
    );
    let s = serve(&sim, dir.path(), &[]).await;
    let r = m.call(id + 1, "relay_status", json!({})).await;
    assert!(!result_text(&r).0, "back: {r}");
    drop(s);
}

/// A named control identity's token in [`serve_identities`].
const PLANNER: &str = "planner-token-0123456789abcdef00";
/// A named observe identity's token in [`serve_identities`].
const WATCHER: &str = "watcher-token-0123456789abcdef00";

/// `serve` whose route `default` (from a config file; its token set by the flags) has two named
/// identities besides its own token: `planner` (control) and `watcher` (observe).
async fn serve_identities(sim: &ModSim, dir: &Path, args: &[&str]) -> Serve {
    let text = format!(
        "[[route]]\nname = \"default\"\nupstream = \"{}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"file-token-0123456789abcdef\"\n\n\
         [[route.bridge]]\nname = \"planner\"\ntoken = \"{PLANNER}\"\nrole = \"control\"\n\n\
         [[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n",
        sim.addr()
    );
    serve_with_config(sim, dir, &text, args).await
}

/// Initializes an HTTP session with `token`, the client calling itself `client`; returns the
/// status, the session id and the answer.
async fn open_session_as(s: &Serve, token: &str, client: &str) -> (u16, Option<String>, String) {
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":client,"version":"1"}}});
    let auth = format!("Authorization: Bearer {token}");
    let (status, resp) = http(&s.mcp, "POST", &[auth], &init.to_string()).await;
    let id = resp.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("mcp-session-id")
            .then(|| v.trim().to_string())
    });
    (status, id, resp)
}

/// Calls tool `name` in HTTP session `sid` with `token`; the status and the JSON-RPC answer.
async fn http_call(s: &Serve, token: &str, sid: &str, name: &str, args: Value) -> (u16, Value) {
    let body = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":name,"arguments":args}});
    let headers = [
        format!("Authorization: Bearer {token}"),
        format!("mcp-session-id: {sid}"),
        "MCP-Protocol-Version: 2025-06-18".into(),
    ];
    let (status, resp) = http(&s.mcp, "POST", &headers, &body.to_string()).await;
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // A JSON answer, or an SSE stream whose `data:` line holds it.
    let answer = serde_json::from_str(body).unwrap_or_else(|_| {
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v["id"] == 9)
            .unwrap_or(Value::Null)
    });
    (status, answer)
}

/// `gabp-relay status --json` for the relay `s`: its bridges.
async fn status_bridges(s: &Serve) -> (Vec<Value>, String) {
    let file = s.bridge_file.to_str().expect("utf-8");
    let out = Command::new(BIN)
        .args(["status", "--bridge-file", file, "--json"])
        .env_remove("GABP_RELAY_TOKEN")
        .output()
        .await
        .expect("status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let bridges = v["relays"][0]["status"]["bridges"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("bridges in {v}"));
    let table = Command::new(BIN)
        .args(["status", "--bridge-file", file])
        .env_remove("GABP_RELAY_TOKEN")
        .output()
        .await
        .expect("status");
    (bridges, String::from_utf8_lossy(&table.stdout).into_owned())
}

/// The bridge whose label is `label`.
fn labelled<'a>(bridges: &'a [Value], label: &str) -> &'a Value {
    bridges
        .iter()
        .find(|b| b["label"] == label)
        .unwrap_or_else(|| panic!("no bridge labelled {label} in {bridges:?}"))
}

/// Any identity's token opens an HTTP session, whose bridge is that identity: an `observe`
/// assistant's tool calls are refused as for any observe bridge, a named control identity's go
/// through, and each shows under its identity's name with its client's name as the label in
/// `status`, `stats` and the recording. A session opened by one identity is unknown to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_assistant_is_the_identity_whose_token_it_presents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("utf-8");
    let s = serve_identities(&sim, dir.path(), &["--data-dir", data_arg]).await;

    let (status, watch, resp) = open_session_as(&s, WATCHER, "asst-watch").await;
    assert_eq!(
        status, 200,
        "the observe identity's token opens a session: {resp}"
    );
    let watch = watch.expect("session id");
    let (_, a) = http_call(&s, WATCHER, &watch, "sim_echo", json!({"x": 1})).await;
    let (failed, text) = result_text(&a["result"]);
    assert!(failed, "an observe assistant's tool call is refused: {a}");
    assert!(
        text.contains("-32006") && text.contains("role observe"),
        "{text}"
    );
    let (_, a) = http_call(&s, WATCHER, &watch, "relay_status", json!({})).await;
    assert!(!result_text(&a["result"]).0, "observe reads status: {a}");

    let (status, plan, resp) = open_session_as(&s, PLANNER, "asst-plan").await;
    assert_eq!(status, 200, "{resp}");
    let plan = plan.expect("session id");
    let (_, a) = http_call(&s, PLANNER, &plan, "sim_echo", json!({"x": 2})).await;
    let (failed, text) = result_text(&a["result"]);
    assert!(!failed && text.contains("\"x\":2"), "{a}");
    let mark = json!({"label": "planned"});
    let (_, a) = http_call(&s, PLANNER, &plan, "mark", mark).await;
    assert!(!result_text(&a["result"]).0, "{a}");

    // The route's own token still works; another identity cannot use the planner's session.
    let (status, own, resp) = open_session_as(&s, &s.token, "asst-route").await;
    assert_eq!(status, 200, "{resp}");
    let (_, a) = http_call(
        &s,
        &s.token,
        &own.expect("session id"),
        "sim_echo",
        json!({}),
    )
    .await;
    assert!(!result_text(&a["result"]).0, "{a}");
    let (status, a) = http_call(&s, WATCHER, &plan, "sim_echo", json!({})).await;
    assert_eq!(status, 404, "{a}");
    let (status, _) = http(
        &s.mcp,
        "POST",
        &["Authorization: Bearer nobody-0123456789abcdef0123".into()],
        INIT,
    )
    .await;
    assert_eq!(status, 401);

    let (bridges, table) = status_bridges(&s).await;
    let w = labelled(&bridges, "asst-watch");
    assert_eq!(
        (&w["name"], &w["role"]),
        (&json!("watcher"), &json!("observe")),
        "{w}"
    );
    let p = labelled(&bridges, "asst-plan");
    assert_eq!(
        (&p["name"], &p["role"]),
        (&json!("planner"), &json!("control")),
        "{p}"
    );
    assert!(labelled(&bridges, "asst-route")["name"].is_null());
    for needle in ["LABEL", "asst-watch", "asst-plan", "watcher", "planner"] {
        assert!(table.contains(needle), "{needle} in {table}");
    }
    s.terminate().await;

    let stats = Command::new(BIN)
        .args(["stats", "--data-dir", data_arg, "latest", "--json"])
        .output()
        .await
        .expect("stats");
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let st: Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    let bridges = st["bridges"].as_array().cloned().unwrap_or_default();
    assert_eq!(labelled(&bridges, "asst-plan")["name"], "planner", "{st}");
    assert_eq!(labelled(&bridges, "asst-watch")["name"], "watcher", "{st}");
    let table = Command::new(BIN)
        .args(["stats", "--data-dir", data_arg, "latest"])
        .output()
        .await
        .expect("stats");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("LABEL") && table.contains("asst-plan"),
        "{table}"
    );
}

/// `gabp-relay mcp --name X` shows as the label X beside its identity in `status`, each
/// assistant under its own name; a name carrying a terminal escape and a text-direction override
/// is kept without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stdio_assistant_shows_under_the_name_it_gave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let file = s.bridge_file.to_str().expect("utf-8");
    let mut a = stdio_named("asst-A", &["--bridge-file", file]).await;
    let mut b = stdio_named("asst-B\u{1b}[2J\u{202e}!", &["--bridge-file", file]).await;
    // A call makes sure each is attached.
    assert!(!result_text(&a.call(2, "relay_status", json!({})).await).0);
    assert!(!result_text(&b.call(2, "relay_status", json!({})).await).0);
    let (bridges, table) = status_bridges(&s).await;
    for label in ["asst-A", "asst-B[2J!"] {
        let br = labelled(&bridges, label);
        assert_eq!(br["role"], "control", "{br}");
        assert!(br["bridgeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("gabp-relay-mcp/")));
    }
    assert!(
        table.contains("asst-A") && table.contains("asst-B[2J!"),
        "{table}"
    );
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{202e}'),
        "{table:?}"
    );
}

/// The mod of these tests, listing `sim/hostile` too.
fn hostile_sim() -> ModSim {
    sim_with(ModSimConfig {
        hostile_tool: true,
        app_name: "Sim\u{202e}\u{200b}\u{1b}[2JGame\u{e0041}".to_string(),
        channels: vec!["world/tick".into(), "c/\u{202e}evil\u{1b}[2J\u{85}".into()],
        ..ModSimConfig::default()
    })
}

/// The tool list an assistant gets carries none of a hostile mod's control, bidirectional or
/// invisible characters and no text past its bound (title 128 characters, description 1 KiB),
/// and annotations keep MCP's known hints only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_mods_tool_texts_reach_the_assistant_cleaned_and_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = hostile_sim();
    let s = serve(&sim, dir.path(), &[]).await;
    let file = s.bridge_file.to_str().expect("utf-8");
    let mut m = stdio_named("clean", &["--bridge-file", file]).await;
    let tools = m.tools(2).await;
    let hostile = tools
        .iter()
        .find(|t| t["name"] == "sim_hostile")
        .unwrap_or_else(|| panic!("sim_hostile in {tools:?}"));
    let title = hostile["title"].as_str().expect("title");
    assert!(
        title.chars().count() <= 128,
        "{} characters",
        title.chars().count()
    );
    assert!(
        title.contains("IGNORE PREVIOUS INSTRUCTIONS"),
        "the text is kept, cleaned: {title}"
    );
    let description = hostile["description"].as_str().expect("description");
    assert!(
        description.len() <= 1024 + 64,
        "{} bytes",
        description.len()
    );
    let area = hostile["inputSchema"]["properties"]["area"]["description"]
        .as_str()
        .expect("a schema text");
    assert!(area.len() <= 1024, "{} bytes", area.len());
    assert_eq!(
        hostile["annotations"]
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["readOnlyHint".to_string(), "title".to_string()]),
        "{}",
        hostile["annotations"]
    );
    let listing = serde_json::to_string(&tools).expect("JSON");
    for c in [
        '\u{1b}',
        '\u{202e}',
        '\u{200b}',
        '\u{2066}',
        '\u{2069}',
        '\u{feff}',
        '\u{e0041}',
        '\u{85}',
        '\u{0}',
        '\r',
    ] {
        assert!(!listing.contains(c), "{c:?} reached the assistant");
    }
    assert!(
        listing.len() < 16 * 1024,
        "the listing is {} bytes",
        listing.len()
    );
    let (failed, text) = result_text(&m.call(3, "sim_hostile", json!({"area": "a"})).await);
    assert!(
        !failed && text.contains("\"area\":\"a\""),
        "still callable: {text}"
    );
    // The welcome resource (the mod's app name, its texts) is cleaned the same way.
    m.send(&json!({"jsonrpc":"2.0","id":4,"method":"resources/list"}).to_string())
        .await;
    let listed = m.answer_to(4).await;
    let uri = listed["result"]["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "welcome"))
        .and_then(|r| r["uri"].as_str())
        .unwrap_or_else(|| panic!("a welcome resource in {listed}"))
        .to_string();
    m.send(
        &json!({"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri": uri}})
            .to_string(),
    )
    .await;
    let read = m.answer_to(5).await;
    let text = read["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("the welcome's text in {read}"));
    let welcome: Value = serde_json::from_str(text).expect("the welcome is JSON");
    assert_eq!(welcome["app"]["name"], "Sim[2JGame", "{text}");
    for c in ['\u{1b}', '\u{202e}', '\u{200b}', '\u{e0041}'] {
        assert!(
            !text.contains(c),
            "{c:?} reached the assistant in the welcome"
        );
    }
    // The mod's channel names: escaped in resource URIs, stripped in names and titles, and the
    // escaped URI reads that channel.
    let listing = listed["result"]["resources"].to_string();
    for c in ['\u{1b}', '\u{202e}', '\u{85}'] {
        assert!(
            !listing.contains(c),
            "{c:?} reached the assistant: {listing}"
        );
    }
    let evil = listed["result"]["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "channel c/evil[2J"))
        .unwrap_or_else(|| panic!("the hostile channel, cleaned, in {listing}"));
    let uri = evil["uri"].as_str().expect("uri").to_string();
    assert!(
        uri.ends_with("/channels/c/%E2%80%AEevil%1B%5B2J%C2%85"),
        "{uri}"
    );
    m.send(
        &json!({"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri": uri}})
            .to_string(),
    )
    .await;
    let read = m.answer_to(6).await;
    assert!(read["result"]["contents"][0]["text"].is_string(), "{read}");
}

/// A mod whose tool list is larger than the relay accepts (`--max-body`): the assistant still
/// gets the relay's own tools, and the front's log says why the game's are missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_tool_list_is_logged_and_the_relays_own_tools_stay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = hostile_sim();
    let s = serve_with(
        &sim,
        dir.path(),
        &[],
        &["--no-record", "--max-body", "128KiB"],
    )
    .await;
    let file = s.bridge_file.to_str().expect("utf-8");
    let log = dir.path().join("mcp.stderr");
    let mut m = stdio_logged(
        "big",
        &["--bridge-file", file],
        std::fs::File::create(&log).expect("log file"),
    )
    .await;
    m.send(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}).to_string())
        .await;
    let listed = m.answer_to(2).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"events_poll") && names.contains(&"mark"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("sim_")), "{names:?}");
    // The listing itself says why the game's tools are missing.
    let why = listed["result"]["_meta"]["gabp-relay/gameToolsMissing"]
        .as_str()
        .unwrap_or_else(|| panic!("a reason in the listing: {listed}"));
    assert!(why.contains("--max-body"), "{why}");
    wait_for(
        "the front to log why",
        Duration::from_secs(10),
        async || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("the game's tools cannot be listed") && text.contains("--max-body")
        },
    )
    .await;
}

/// `--mcp-tools` narrows the mod's tools (listed and callable; the relay's own stay) and
/// `--mcp-strip-output-schema` leaves output schemas out (passed on otherwise), on stdio and
/// over HTTP; on `serve` they need `--mcp-listen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_and_strip_output_schema_choose_what_is_offered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = hostile_sim();
    let s = serve_with(
        &sim,
        dir.path(),
        &[],
        &[
            "--no-record",
            "--mcp-tools",
            "sim/echo,sim/hostile",
            "--mcp-strip-output-schema",
        ],
    )
    .await;
    let file = s.bridge_file.to_str().expect("utf-8");
    // `gabp-relay mcp --mcp-tools`: only the allowed mod tools are listed and callable.
    let mut narrow = stdio_named(
        "narrow",
        &[
            "--bridge-file",
            file,
            "--mcp-tools",
            "sim/*,!sim/fail,!sim/hostile",
        ],
    )
    .await;
    let names = narrow.tool_names(2).await;
    assert!(
        names.iter().any(|n| n == "sim_echo") && names.iter().any(|n| n == "sim_emit"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "sim_fail" || n == "sim_hostile"),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "events_poll"),
        "the relay's own tools stay: {names:?}"
    );
    let call = json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sim_fail","arguments":{}}});
    narrow.send(&call.to_string()).await;
    let a = narrow.answer_to(3).await;
    assert_eq!(
        a["error"]["code"], -32602,
        "a tool not offered is not callable: {a}"
    );
    let echo = narrow.tools(4).await;
    let echo = echo
        .iter()
        .find(|t| t["name"] == "sim_echo")
        .expect("sim_echo");
    assert_eq!(
        echo["outputSchema"],
        json!({"type": "object"}),
        "passed on by default: {echo}"
    );

    // `serve --mcp-tools sim/echo,sim/hostile --mcp-strip-output-schema`, over HTTP.
    let (status, sid, resp) = open_session(&s).await;
    assert_eq!(status, 200, "{resp}");
    let sid = sid.expect("session id");
    let list = json!({"jsonrpc":"2.0","id":5,"method":"tools/list"});
    let headers = [
        bearer(&s),
        format!("mcp-session-id: {sid}"),
        "MCP-Protocol-Version: 2025-06-18".into(),
    ];
    let (status, resp) = http(&s.mcp, "POST", &headers, &list.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    for want in ["\"sim_echo\"", "\"sim_hostile\"", "\"events_poll\""] {
        assert!(resp.contains(want), "{want} in {resp}");
    }
    for gone in [
        "\"sim_fail\"",
        "\"sim_emit\"",
        "outputSchema",
        "\\u001b",
        "\\u202e",
    ] {
        assert!(!resp.contains(gone), "{gone} in {resp}");
    }
    // The offer flags need the MCP endpoint.
    let out = Command::new(BIN)
        .args([
            "serve",
            "--upstream",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--no-record",
            "--mcp-tools",
            "sim/*",
        ])
        .env_remove("GABP_RELAY_TOKEN")
        .output()
        .await
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("need --mcp-listen"), "{err}");
}

/// What the HTTP front refuses, whoever asks: no token, a wrong one or a Basic one (401), a
/// foreign Host (403), an unknown session (404), a body over 4 MiB (413), nesting no parser
/// takes (-32700); and `--mcp-listen` on a non-loopback address without `--allow-remote`.
/// An observe identity's session is refused every write: tool calls, acks and the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_front_refuses_what_it_must_for_every_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let s = serve_identities(&sim, dir.path(), &["--no-record"]).await;
    let basic = format!("Authorization: Basic {}", s.token);
    for headers in [
        vec![],
        vec!["Authorization: Bearer 0123456789abcdef0123456789abcdef".into()],
        vec![basic],
    ] {
        let (status, resp) = http(&s.mcp, "POST", &headers, INIT).await;
        assert_eq!(status, 401, "{headers:?}: {resp}");
    }
    for token in [s.token.as_str(), PLANNER, WATCHER] {
        let auth = format!("Authorization: Bearer {token}");
        // A foreign Host: the request is not served (DNS rebinding).
        let req = format!("POST /mcp HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{INIT}", INIT.len());
        let mut conn = TcpStream::connect(&s.mcp).await.expect("connect");
        conn.write_all(req.as_bytes()).await.expect("write");
        let mut resp = String::new();
        conn.read_to_string(&mut resp).await.expect("read");
        assert!(resp.starts_with("HTTP/1.1 403"), "{token}: {resp}");
        let unknown = [auth.clone(), "mcp-session-id: no-such-session".into()];
        let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        let (status, resp) = http(&s.mcp, "POST", &unknown, list).await;
        assert_eq!(status, 404, "{resp}");
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"ping","params":{{"x":"{}"}}}}"#,
            "y".repeat(5 << 20)
        );
        let (status, resp) = http(&s.mcp, "POST", std::slice::from_ref(&auth), &big).await;
        assert_eq!(status, 413, "{resp}");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let (status, resp) = http(&s.mcp, "POST", std::slice::from_ref(&auth), &deep).await;
        assert_eq!(status, 400, "{resp}");
        assert!(resp.contains(r#""code":-32700"#), "{resp}");
    }
    let (status, watch, resp) = open_session_as(&s, WATCHER, "asst-watch").await;
    assert_eq!(status, 200, "{resp}");
    let watch = watch.expect("session id");
    for (tool, args) in [
        ("sim_echo", json!({})),
        ("sim_emit", json!({"count": 1})),
        ("attention_ack", json!({"attentionId": "attn_1"})),
        ("relay_lease", json!({"action": "acquire"})),
    ] {
        let (_, a) = http_call(&s, WATCHER, &watch, tool, args).await;
        let (failed, text) = result_text(&a["result"]);
        assert!(failed && text.contains("-32006"), "{tool}: {a}");
    }
    let out = Command::new(BIN)
        .args([
            "serve",
            "--upstream",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--no-record",
            "--mcp-listen",
            "0.0.0.0:0",
        ])
        .env_remove("GABP_RELAY_TOKEN")
        .output()
        .await
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--mcp-listen must be a loopback address"),
        "{err}"
    );
}
