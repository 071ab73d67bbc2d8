//! The bridge front's limits against a flood, and `replay`'s start-up, on the release binary:
//! idle connections that never say hello cannot lock a bridge with the right token out (of
//! `serve` or `replay`), one identity's bridges cannot lock another's out, and `replay` listens
//! and streams before its answers are indexed.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_rt::net::Addr;
use gabp_storage::{
    Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Child;
use tokio::task::JoinHandle;

use crate::support::{relay, serve, start_mod};

/// Twice the relay's bound on connections before hello (`MAX_PREHELLO_CONNS`, 128).
const FLOOD: usize = 256;
const TOKEN: &str = "front-limits-token";

/// Idle connections that never say hello: `FLOOD` held, and more opened in a loop (the oldest
/// dropped) until this is dropped.
struct Flood(JoinHandle<()>);

impl Drop for Flood {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn flood(addr: &Addr) -> Flood {
    let sa: std::net::SocketAddr = addr.to_string().parse().expect("tcp address");
    let mut held = std::collections::VecDeque::new();
    for _ in 0..FLOOD {
        held.push_back(TcpStream::connect(sa).await.expect("idle connection"));
    }
    Flood(tokio::spawn(async move {
        loop {
            if let Ok(s) = TcpStream::connect(sa).await {
                held.push_back(s);
            }
            if held.len() > FLOOD {
                held.pop_front();
            }
            tokio::task::yield_now().await;
        }
    }))
}

/// An honest bridge gets its welcome, several times in a row, while `addr` is flooded.
async fn honest_bridges_get_in(addr: &Addr, token: &str) {
    let _flood = flood(addr).await;
    for i in 0..5 {
        let (c, welcome) =
            tokio::time::timeout(Duration::from_secs(5), Client::connect_hello(addr, token))
                .await
                .unwrap_or_else(|_| panic!("hello {i} answered in time under the flood"))
                .unwrap_or_else(|e| panic!("hello {i} welcomed under the flood: {e}"));
        assert!(
            welcome["capabilities"]["extensions"]["relay"].is_object(),
            "{welcome}"
        );
        drop(c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_lock_bridges_out_of_serve() {
    let sim = start_mod(None);
    // Far fewer bridges than idle connections (256): only welcomed bridges count. Room for the
    // five honest bridges, since a closed bridge's place comes back only once the relay has
    // seen it go.
    let s = serve_capped(&sim, "8").await;
    honest_bridges_get_in(&s.addr, TOKEN).await;
}

/// `serve` in front of `sim`, not recording, with `--max-bridges max_bridges`.
async fn serve_capped(sim: &crate::support::ModSim, max_bridges: &str) -> crate::support::Serve {
    serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        crate::support::MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--no-record",
        "--max-bridges",
        max_bridges,
    ])
    .await
}

/// Writes one ended session of `events` events on one channel, with one recorded answer to a
/// `tools/call` at the very end, into a new data dir at `dir`.
fn synth(dir: &Path, events: u64) -> SessionMeta {
    let store = Store::open(dir, StoreOptions::default()).expect("create the data dir");
    let mut w = SessionWriter::new(store);
    let started_ns = gabp_rt::clock::now_ns() - 3_600_000_000_000;
    let meta = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "synth".into(),
        started_ns,
        welcome: Some(json!({"agentId": "synth", "capabilities": {"events": ["world/tick"]}})),
        relay_version: "test".into(),
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    w.define_channel(id, 0, "world/tick");
    let pad = "x".repeat(120);
    for i in 0..events {
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"event","channel":"world/tick","seq":{i},"payload":{{"pad":"{pad}"}}}}"#,
            uuid::Uuid::from_u128(u128::from(i)),
        );
        let rec = FrameRecord {
            dir: Direction::ModToRelay,
            conn: 0,
            time_ns: started_ns + 1_000 + i * 1_000,
            channel: Some(0),
            mod_seq: Some(i),
            relay_seq: Some(i),
            json_ok: true,
            body: body.into(),
        };
        w.append(id, &rec);
        if i % 50_000 == 49_999 {
            w.commit().expect("commit");
        }
    }
    let end_ns = started_ns + 2_000 + events * 1_000;
    let up = uuid::Uuid::new_v4().to_string();
    let req = json!({"v": "gabp/1", "id": up, "type": "request", "method": "tools/call",
        "params": {"name": "sim/echo"}});
    let resp = json!({"v": "gabp/1", "id": up, "type": "response", "result": {"echo": "last"}});
    for (dir, body) in [(Direction::RelayToMod, req), (Direction::ModToRelay, resp)] {
        let rec = FrameRecord::message(dir, 1, end_ns, true, body.to_string().into());
        w.append(id, &rec);
    }
    w.end(id, EndReason::Clean, end_ns + 1);
    w.commit().expect("commit");
    drop(w);
    // As a relay's next start leaves it: the write-ahead log recovered into table files.
    drop(Store::open(dir, StoreOptions::default()).expect("recover"));
    let store = Store::open_for_reading(dir).expect("reopen");
    store.resolve("latest").expect("the session")
}

/// A running replay (killed on drop), its address, and its stderr lines with their arrival.
async fn replay(data: &Path) -> (Child, Addr, tokio::sync::mpsc::Receiver<(Instant, String)>) {
    let mut child = relay()
        .args(["replay", "latest", "--speed", "max", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--token", TOKEN])
        .env("GABP_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn replay");
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = err.next_line().await {
            let _ = tx.send((Instant::now(), line)).await;
        }
    });
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
        .await
        .expect("replay started in time")
        .expect("stdout")
        .expect("a line");
    assert!(line.starts_with("replaying session "), "{line}");
    let addr = line
        .rsplit(" on ")
        .next()
        .and_then(|a| a.parse().ok())
        .expect("address");
    (child, addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_lock_bridges_out_of_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 1_000);
    let (_child, addr, _log) = replay(&data).await;
    honest_bridges_get_in(&addr, TOKEN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_listens_and_streams_before_its_answers_are_indexed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let events = 1_500_000;
    let t = Instant::now();
    synth(&data, events);
    eprintln!("wrote {events} events in {:?}", t.elapsed());
    let spawned = Instant::now();
    let (child, addr, mut log) = replay(&data).await;
    let listening = spawned.elapsed();
    let (mut c, _) = Client::connect_hello(&addr, TOKEN).await.expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    let first = tokio::time::timeout(Duration::from_secs(10), c.next_event())
        .await
        .expect("first event in time")
        .expect("event");
    let first_at = Instant::now();
    assert_eq!(first["channel"], "world/tick");
    // Asked before the index is ready: waits for it, then gets the recorded answer.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        c.request("tools/call", json!({"name": "sim/echo"})),
    )
    .await
    .expect("answer in time")
    .expect("answer");
    assert_eq!(r["result"]["echo"], "last", "{r}");
    let indexed_at = loop {
        let (at, line) = tokio::time::timeout(Duration::from_secs(60), log.recv())
            .await
            .expect("the index line in time")
            .expect("stderr open");
        if line.contains("recorded answers indexed") {
            eprintln!("{line}");
            break at;
        }
    };
    let pid = child.id().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("");
    eprintln!(
        "listening after {listening:?}; first event {:?} after spawn; indexed {:?} after spawn; {hwm}",
        first_at - spawned,
        indexed_at - spawned
    );
    assert!(
        first_at < indexed_at,
        "the first event came before the answers were indexed"
    );
}

/// Log lines any peer can cause are sampled: 200 wrong tokens and 40 connections that never say
/// hello each leave a handful of lines, not one per connection, while every one is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_wrong_tokens_and_silent_connections_are_logged_on_a_budget() {
    use crate::support::hostile;
    let sim = start_mod(None);
    let upstream = sim.addr().to_string();
    let r = hostile::serve(&[
        "--upstream",
        &upstream,
        "--upstream-token",
        crate::support::MOD_TOKEN,
        "--no-record",
        "--frame-timeout",
        "1s",
    ])
    .await;
    // Every wrong token is answered (after the per-source delay, at most 2 s): two waves of
    // 100 at once, within the 128 connections that may wait for their hello.
    for wave in 0..2 {
        let guesses: Vec<_> = (wave * 100..wave * 100 + 100)
        .map(|i| {
            let addr = r.addr.clone();
            tokio::spawn(async move {
                let mut c = Client::connect(&addr).await.expect("connect");
                c.set_wait(Duration::from_secs(20));
                let guess = json!({"token": format!("wrong-guess-{i:04}-xxxxxxxx"), "bridgeVersion": "x", "platform": "linux", "launchId": "x"});
                let r = c.request("session/hello", guess).await.expect("answered");
                assert_eq!(r["error"]["code"], -31000, "{r}");
            })
        })
        .collect();
        for g in guesses {
            g.await.expect("guess answered");
        }
    }
    // Silent connections, each closed by the relay after the frame timeout.
    let sa: std::net::SocketAddr = r.addr.to_string().parse().expect("tcp address");
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(sa).await.expect("connect"));
    }
    for mut s in silent {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
            .await
            .expect("closed by the relay")
            .ok();
    }
    let wrong = r.log_lines("wrong token");
    let silent = r.log_lines("not welcomed within");
    // One budget window is 5 (wrong tokens) and 10 (silent) lines; a slow machine may reach a
    // second window, never one line per connection.
    assert!(
        (1..=10).contains(&wrong),
        "{wrong} wrong-token lines: {:#?}",
        r.log.lock()
    );
    assert!(
        (1..=20).contains(&silent),
        "{silent} silent-connection lines"
    );
    // A bridge with the right token is still welcomed, and its attach is logged.
    let (c, _) = Client::connect_hello(&r.addr, hostile::TOKEN)
        .await
        .expect("welcomed");
    drop(c);
    r.wait_log("bridge attached", 1).await;
    let (code, _) = r.stop().await;
    assert_eq!(code, Some(0));
}

/// `gabp-relay status` must see a relay whose `--max-bridges` is full: relay-only hellos have
/// places of their own, a few per identity, that identity's oldest closed to make room; one
/// identity's churn never closes another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_bridge_cap_is_full_can_still_be_looked_at() {
    use crate::support::identities::{config_text, serve_config, WATCHER};
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = start_mod(None);
    let bridges = format!(
        "[[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let cfg = crate::support::config_file(
        dir.path(),
        "relay.toml",
        &config_text(sim.addr(), "max_bridges = 2\nrecord = false\n", &bridges),
    );
    let file = dir.path().join("bridge.json");
    let s = serve_config(&cfg, file.to_str().expect("utf-8"), &[]).await;
    let operator = crate::support::BRIDGE_TOKEN;
    let mut full = Vec::new();
    for _ in 0..2 {
        full.push(
            Client::connect_hello(&s.addr, operator)
                .await
                .expect("welcomed")
                .0,
        );
    }
    let mut third = Client::connect(&s.addr).await.expect("connect");
    let refused = third
        .request("session/hello", hello_params(operator, false))
        .await
        .expect("answered");
    assert_eq!(refused["error"]["code"], -32002, "{refused}");
    // The operator looks, and stays connected: the oldest relay-only connection of all.
    let (mut looking, welcome) = relay_only_hello(&s.addr, operator).await;
    assert!(welcome["result"].is_object(), "{welcome}");
    // Another identity takes its four places, each welcomed and served while the cap is full.
    let mut lookers = Vec::new();
    for i in 0..4 {
        let (mut c, welcome) = relay_only_hello(&s.addr, WATCHER).await;
        assert!(
            welcome["result"].is_object(),
            "relay-only hello {i}: {welcome}"
        );
        let status = c.call("relay/status", json!({})).await.expect("status");
        assert!(status["bridges"].is_array(), "{status}");
        lookers.push(c);
    }
    // Holding them locks nobody out: each newcomer is welcomed, and that identity's oldest
    // holder is closed to make room.
    for i in 0..8 {
        let (mut c, welcome) = relay_only_hello(&s.addr, WATCHER).await;
        assert!(welcome["result"].is_object(), "newcomer {i}: {welcome}");
        c.call("relay/status", json!({})).await.expect("status");
        let mut oldest = lookers.remove(0);
        assert!(
            matches!(oldest.next_frame().await, Ok(None) | Err(_)),
            "the watcher's oldest relay-only connection is closed"
        );
        lookers.push(c);
    }
    // The operator's connection was never closed by the watcher's churn, nor the full bridges.
    looking
        .call("relay/status", json!({}))
        .await
        .expect("the operator's status connection is still served");
    for c in &mut full {
        c.call("relay/status", json!({}))
            .await
            .expect("a full bridge still served");
    }
    drop(full);
    let (code, _) = s.stop().await;
    assert_eq!(code, Some(0));
}

/// One identity filling `max_bridges` keeps no other identity out: at a full route a hello of
/// an identity holding fewer takes the place of the newest bridge of the identity holding the
/// most, as long as that one still holds at least as many afterwards; then both are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_filling_the_bridge_cap_keeps_no_other_out() {
    use crate::support::identities::{config_text, serve_config, WATCHER};
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = start_mod(None);
    let bridges = format!(
        "[[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let cfg = crate::support::config_file(
        dir.path(),
        "relay.toml",
        &config_text(sim.addr(), "max_bridges = 4\nrecord = false\n", &bridges),
    );
    let file = dir.path().join("bridge.json");
    let s = serve_config(&cfg, file.to_str().expect("utf-8"), &[]).await;
    let mut watchers = Vec::new();
    for _ in 0..4 {
        watchers.push(
            Client::connect_hello(&s.addr, WATCHER)
                .await
                .expect("welcomed")
                .0,
        );
    }
    // Alone, the watcher is refused at the full route, as ever.
    let (_, refused) = hello(&s.addr, WATCHER).await;
    assert_eq!(refused["error"]["code"], -32002, "{refused}");
    // The operator gets in twice, each time in the place of the watcher's newest bridge.
    let operator = crate::support::BRIDGE_TOKEN;
    let mut operators = Vec::new();
    for i in 0..2 {
        let (mut c, welcome) = hello(&s.addr, operator).await;
        assert!(
            welcome["result"].is_object(),
            "operator hello {i}: {welcome}"
        );
        c.call("relay/status", json!({})).await.expect("served");
        operators.push(c);
        let mut newest = watchers.pop().expect("a watcher");
        closed(&mut newest, "the watcher's newest bridge").await;
    }
    s.wait_log("bridge closed to give its place to another identity's", 1)
        .await;
    // Two each: neither identity takes a place from the other any more.
    for token in [operator, WATCHER] {
        let (_c, refused) = hello(&s.addr, token).await;
        assert_eq!(refused["error"]["code"], -32002, "{refused}");
    }
    for c in watchers.iter_mut().chain(operators.iter_mut()) {
        c.call("relay/status", json!({}))
            .await
            .expect("the bridges holding their share are still served");
    }
    drop((watchers, operators));
    let (code, _) = s.stop().await;
    assert_eq!(code, Some(0));
}

/// Waits for the relay to close `c` (its end, or a reset), never for a timeout.
async fn closed(c: &mut Client, what: &str) {
    match c.next_frame().await {
        Ok(None) => {}
        Err(e) if !e.to_string().contains("no frame within") => {}
        other => panic!("{what} should be closed: {other:?}"),
    }
}

/// A `session/hello` of a bridge (not relay-only) and its answer.
async fn hello(addr: &Addr, token: &str) -> (Client, serde_json::Value) {
    let mut c = Client::connect(addr).await.expect("connect");
    let r = c
        .request("session/hello", hello_params(token, false))
        .await
        .expect("answered");
    (c, r)
}

/// A hello's params, relay-only (as `gabp-relay status` sends them) or not.
fn hello_params(token: &str, relay_only: bool) -> serde_json::Value {
    let mut p = json!({"token": token, "bridgeVersion": "t", "platform": "linux", "launchId": "l"});
    if relay_only {
        p["relay"] = json!({"withoutMod": true});
    }
    p
}

/// A `session/hello` as `gabp-relay status` sends it, and its answer.
async fn relay_only_hello(addr: &Addr, token: &str) -> (Client, serde_json::Value) {
    let mut c = Client::connect(addr).await.expect("connect");
    let r = c
        .request("session/hello", hello_params(token, true))
        .await
        .expect("answered");
    (c, r)
}
