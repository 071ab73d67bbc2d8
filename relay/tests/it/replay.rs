//! `replay` behind the bridge front: it streams (a session of millions of frames is served at
//! once, in bounded memory, losslessly, with its recorded answers), it announces the end and
//! every `--loop` restart on `relay/replay`, and the front's limits hold for its bridges (the
//! pre-hello limit, wrong-token throttling, the write deadline for a bridge that never reads).
//!
//! Sessions are written with the storage writer directly (millions of frames in seconds); the
//! replays run as the release binary (to measure its memory) or in process (to set limits).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gabp_client::Client;
use gabp_engine::replay::{Recording, ReplayOptions, Speed};
use gabp_proto::{frame_bytes, message, GabpCodec};
use gabp_rt::net::{Addr, Listener};
use gabp_storage::{
    Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::support::{replay_address, BIN};

const CHANNELS: [&str; 3] = ["world/tick", "player/move", "chat/message"];
const TOKEN: &str = "replay-token-for-tests";

/// Writes one ended session of `events` events (round robin over [`CHANNELS`], 1 µs apart,
/// ~220 B each) into a new data dir at `dir`, with two recorded answers to one `tools/call`
/// (one near the start, one at the very end) and one to another.
fn synth(dir: &Path, events: u64) -> SessionMeta {
    let store = Store::open(dir, StoreOptions::default()).expect("create the data dir");
    let mut w = SessionWriter::new(store);
    let started_ns = gabp_rt::clock::now_ns() - 3_600_000_000_000;
    let meta = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "synth".into(),
        started_ns,
        app_name: Some("SynthGame".into()),
        welcome: Some(
            json!({"agentId": "synth", "app": {"name": "SynthGame", "version": "1"},
            "capabilities": {"events": CHANNELS, "methods": ["tools/call"]}}),
        ),
        relay_version: "test".into(),
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    for (i, c) in CHANNELS.iter().enumerate() {
        w.define_channel(id, i as u32, c);
    }
    let pad = "x".repeat(120);
    let mut seqs = [0u64; CHANNELS.len()];
    let frame = |w: &mut SessionWriter, dir, time_ns, body: String| {
        w.append(
            id,
            &FrameRecord::message(dir, 1, time_ns, true, body.into()),
        );
    };
    let ask = |w: &mut SessionWriter, t: u64, q: u64, n: u64| {
        let up = uuid::Uuid::new_v4().to_string();
        let req = json!({"v": "gabp/1", "id": up, "type": "request", "method": "tools/call",
            "params": {"name": "sim/echo", "arguments": {"q": q}}});
        let resp =
            json!({"v": "gabp/1", "id": up, "type": "response", "result": {"echo": q, "n": n}});
        frame(w, Direction::RelayToMod, t, req.to_string());
        frame(w, Direction::ModToRelay, t + 1, resp.to_string());
    };
    ask(&mut w, started_ns, 1, 1);
    ask(&mut w, started_ns, 2, 1);
    for i in 0..events {
        let c = (i % CHANNELS.len() as u64) as usize;
        let time_ns = started_ns + 1_000 + i * 1_000;
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"event","channel":"{}","seq":{},"payload":{{"i":{i},"pad":"{pad}"}}}}"#,
            uuid::Uuid::from_u128(u128::from(i)),
            CHANNELS[c],
            seqs[c] + 7,
        );
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns,
                channel: Some(c as u32),
                mod_seq: Some(seqs[c] + 7),
                relay_seq: Some(seqs[c]),
                json_ok: true,
                body: body.into(),
            },
        );
        seqs[c] += 1;
        if i % 50_000 == 49_999 {
            w.commit().expect("commit");
        }
    }
    let end_ns = started_ns + 2_000 + events * 1_000;
    ask(&mut w, end_ns, 1, 2);
    w.end(id, EndReason::Clean, end_ns + 1);
    w.commit().expect("commit");
    drop(w);
    // As a relay's next start (or `repair`) leaves it: the write-ahead log recovered into table
    // files. A read-only open otherwise replays up to a few memtables of log first (bounded by
    // RocksDB's buffers, not by the session: ~1 s here), before `replay` can listen.
    drop(Store::open(dir, StoreOptions::default()).expect("recover"));
    let t = Instant::now();
    let store = Store::open_for_reading(dir).expect("reopen");
    eprintln!("read-only open: {:?}", t.elapsed());
    store.resolve("latest").expect("the session")
}

/// A running `gabp-relay replay`, killed on drop.
struct Replay {
    child: tokio::process::Child,
    addr: Addr,
    spawned: Instant,
}

async fn replay(data: &Path, extra: &[&str]) -> Replay {
    let spawned = Instant::now();
    let mut child = Command::new(BIN)
        .args(["replay", "latest", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--token", TOKEN])
        .args(extra)
        .env_remove("GABP_RELAY_DATA_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn replay");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = replay_address(&mut lines, Duration::from_secs(20)).await;
    Replay {
        child,
        addr,
        spawned,
    }
}

/// Peak resident memory of a process, from /proc.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Reads events until the `relay/replay` notice; returns (events per channel, the notice).
async fn until_notice(c: &mut Client) -> (Vec<Value>, Value) {
    let mut events = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), c.next_event())
            .await
            .expect("an event in time")
            .expect("event");
        if e["channel"] == "relay/replay" {
            return (events, e);
        }
        events.push(e);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_millions_of_frames_replays_at_once_in_bounded_memory() {
    // Larger runs for benchmarks: GABP_REPLAY_TEST_EVENTS=9000000.
    let events: u64 = std::env::var("GABP_REPLAY_TEST_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let t = Instant::now();
    let meta = synth(&data, events);
    eprintln!("wrote {} frames in {:?}", meta.frames, t.elapsed());
    assert_eq!(meta.events, events);
    let r = replay(&data, &["--speed", "max"]).await;
    let pid = r.child.id().expect("running");
    let (mut c, welcome) = Client::connect_hello(&r.addr, TOKEN).await.expect("hello");
    assert_eq!(welcome["app"]["name"], "SynthGame");
    assert_eq!(
        welcome["capabilities"]["extensions"]["replay"]["sessionId"],
        meta.id.to_string()
    );
    c.subscribe(&CHANNELS).await.expect("subscribe");
    let first = c.next_event().await.expect("first event");
    let to_first = r.spawned.elapsed();
    eprintln!("first event {to_first:?} after the replay was started");
    assert!(
        to_first < Duration::from_secs(1),
        "first event after {to_first:?}"
    );
    assert_eq!(
        (first["seq"].as_u64(), first["payload"]["i"].as_u64()),
        (Some(0), Some(0))
    );
    // Answers come from the index, built while events already flow: in recorded order, the
    // last one repeating; a request never recorded gets an error. (Asked on a bridge of its
    // own, so the events streaming meanwhile are not buffered in this test.)
    let mut asker = Client::connect_hello(&r.addr, TOKEN)
        .await
        .expect("hello")
        .0;
    let echo = json!({"name": "sim/echo", "arguments": {"q": 1}});
    let mut answers = Vec::new();
    for _ in 0..3 {
        let a = asker.call("tools/call", echo.clone()).await;
        answers.push(a.expect("a recorded answer")["n"].clone());
    }
    assert_eq!(answers, vec![json!(1), json!(2), json!(2)]);
    let miss = asker
        .request(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"q": 9}}),
        )
        .await
        .expect("answer");
    assert_eq!(miss["error"]["code"], -32004);
    // Every event, in order, then the end notice.
    let mut n = 1u64;
    let mut seqs = [0u64; CHANNELS.len()];
    seqs[0] = 1;
    let notice = loop {
        let e = c.next_event().await.expect("event");
        if e["channel"] == "relay/replay" {
            break e;
        }
        let ch = CHANNELS
            .iter()
            .position(|x| e["channel"] == *x)
            .expect("channel");
        assert_eq!(e["seq"].as_u64(), Some(seqs[ch]), "{e}");
        seqs[ch] += 1;
        n += 1;
    };
    assert_eq!(n, events, "lossless");
    assert_eq!(notice["payload"]["state"], "ended");
    assert_eq!(notice["payload"]["events"].as_u64(), Some(events));
    let peak = peak_rss(pid);
    eprintln!(
        "replay of {} frames ({} MiB of bodies): peak RSS {} MiB",
        meta.frames,
        meta.bytes >> 20,
        peak >> 20
    );
    // The whole session's bodies are ~440 MiB: what stays resident is a small part of it.
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_and_every_loop_are_announced_and_from_and_channel_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 30);
    // No loop: ten events per channel, then "ended".
    let r = replay(&data, &["--speed", "max", "--channel", "world/tick"]).await;
    let mut c = Client::connect_hello(&r.addr, TOKEN)
        .await
        .expect("hello")
        .0;
    c.subscribe(&CHANNELS).await.expect("subscribe");
    let (events, end) = until_notice(&mut c).await;
    assert_eq!(events.len(), 10);
    assert!(events.iter().all(|e| e["channel"] == "world/tick"));
    assert_eq!(end["payload"]["state"], "ended");
    drop(r);
    // --loop: each restart is marked, and seqs go on.
    let r = replay(&data, &["--speed", "100", "--loop", "--from", "20us"]).await;
    let mut c = Client::connect_hello(&r.addr, TOKEN)
        .await
        .expect("hello")
        .0;
    c.subscribe(&["player/move"]).await.expect("subscribe");
    for pass in 1..=3u64 {
        let (events, mark) = until_notice(&mut c).await;
        // Events 19..29 are at or after 20 µs; player/move is every third from 1.
        let payloads: Vec<u64> = events
            .iter()
            .filter_map(|e| e["payload"]["i"].as_u64())
            .collect();
        assert_eq!(payloads, vec![19, 22, 25, 28], "pass {pass}");
        let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        let base = (pass - 1) * 4;
        assert_eq!(seqs, (base..base + 4).collect::<Vec<_>>());
        assert_eq!(mark["payload"]["state"], "restarted");
        assert_eq!(mark["payload"]["loop"].as_u64(), Some(pass));
        assert_eq!(mark["seq"].as_u64(), Some(pass - 1));
    }
}

/// Replay records nothing, so a mark is answered `"marked": false` with the reason, not
/// confirmed as if an export would show it (it was `"marked": true`).
#[tokio::test]
async fn a_mark_in_a_replay_is_answered_as_kept_nowhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 30);
    let r = replay(&data, &["--speed", "max"]).await;
    let mut c = Client::connect_hello(&r.addr, TOKEN)
        .await
        .expect("hello")
        .0;
    let answer = c
        .call("relay/mark", json!({"label": "episode-start"}))
        .await
        .expect("answered");
    assert_eq!(answer["marked"], false, "{answer}");
    assert_eq!(answer["label"], "episode-start", "{answer}");
    assert!(
        answer["why"]
            .as_str()
            .is_some_and(|w| w.contains("record nothing")),
        "{answer}"
    );
    let bad = c
        .request("relay/mark", json!({"label": ""}))
        .await
        .expect("answered");
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// An in-process replay of `meta`'s session with the front's limits adjusted.
async fn in_process(
    data: &Path,
    tweak: impl FnOnce(&mut gabp_engine::RouteConfig) + Send + 'static,
) -> (Addr, CancellationToken) {
    gabp_rt::log::init_for_tests();
    let store = Store::open_for_reading(data).expect("open");
    let meta = store.resolve("latest").expect("session");
    let opts = ReplayOptions {
        looping: true,
        ..ReplayOptions::new(TOKEN, Speed::Max)
    };
    let rec = Arc::new(Recording::open(store, meta, &opts).expect("open the recording"));
    let listener = Listener::bind(&"127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cancel = CancellationToken::new();
    tokio::spawn(gabp_engine::replay::serve_with(
        listener,
        rec,
        opts,
        cancel.clone(),
        tweak,
    ));
    (addr, cancel)
}

fn wire(method: &str, params: Value) -> bytes::Bytes {
    frame_bytes(&message::request(&gabp_client::new_id(), method, params))
}

fn tcp(addr: &Addr) -> std::net::SocketAddr {
    match addr {
        Addr::Tcp(a) => *a,
        other => panic!("expected TCP, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fronts_limits_hold_for_replay_bridges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 30_000);
    let (addr, cancel) = in_process(&data, |c| {
        c.write_deadline = Duration::from_millis(300);
        c.outbox_bytes = 256 * 1024;
    })
    .await;
    let mut honest = Client::connect_hello(&addr, TOKEN).await.expect("hello").0;

    // A flood without hello: a few error replies, then the connection is closed.
    let mut s = tokio::net::TcpStream::connect(tcp(&addr))
        .await
        .expect("connect");
    let one = wire("tools/list", json!({}));
    let flood: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(one.len() * 20_000)
        .collect();
    let (mut r, mut w) = s.split();
    let write = async {
        let _ = w.write_all(&flood).await;
    };
    let read = async {
        let mut frames = FramedRead::new(&mut r, GabpCodec::default());
        let mut replies = 0;
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(_)) = frames.next().await {
                replies += 1;
            }
        })
        .await
        .expect("the replay closed the connection");
        replies
    };
    let ((), replies) = tokio::join!(write, read);
    assert!(
        replies <= gabp_engine::bridge::MAX_PREHELLO_ERRORS as usize,
        "{replies} replies"
    );

    // Wrong tokens are refused (-31000) after a growing delay.
    let mut guesser = Client::connect(&addr).await.expect("connect");
    let mut delays = Vec::new();
    for i in 0..3 {
        let t = Instant::now();
        let r = guesser
            .request("session/hello", json!({"token": format!("guess-{i}"), "bridgeVersion": "x", "platform": "linux", "launchId": "x"}))
            .await
            .expect("answer");
        assert_eq!(r["error"]["code"], -31000);
        delays.push(t.elapsed());
    }
    assert!(delays[2] > delays[0], "throttled: {delays:?}");

    deaf_bridge_is_cut(&addr, &mut honest).await;
    honest
        .subscribe(&["chat/message"])
        .await
        .expect("subscribe");
    for _ in 0..100 {
        assert_eq!(
            honest.next_event().await.expect("event")["channel"],
            "chat/message"
        );
    }
    let status = honest
        .call("relay/status", json!({}))
        .await
        .expect("status");
    assert_eq!(
        status["recording"], false,
        "a replay records nothing: {status}"
    );
    assert_eq!(status["policy"]["onSlow"], "block");
    cancel.cancel();
}

/// A bridge that subscribes and never reads is cut (its connection reset, its state freed),
/// while `honest` is served meanwhile.
async fn deaf_bridge_is_cut(addr: &Addr, honest: &mut Client) {
    // A bridge that subscribes and never reads is cut at the write deadline (reset), while
    // another bridge's timeline plays on.
    let mut deaf = tokio::net::TcpStream::connect(tcp(addr))
        .await
        .expect("connect");
    let hello =
        json!({"token": TOKEN, "bridgeVersion": "deaf", "platform": "linux", "launchId": "d"});
    deaf.write_all(&wire("session/hello", hello))
        .await
        .expect("hello");
    // The welcome is read byte by byte (nothing beyond it is taken off the socket): once it
    // is here the relay has listed the bridge, so its leaving the list later is the cut.
    let welcome = read_one_frame(&mut deaf).await;
    assert!(welcome.contains("\"result\""), "welcomed: {welcome}");
    let deaf_listed = |st: &Value| {
        st["bridges"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["bridgeVersion"] == "deaf"))
    };
    let st = honest
        .call("relay/status", json!({}))
        .await
        .expect("status");
    assert!(deaf_listed(&st), "the welcomed deaf bridge is listed: {st}");
    deaf.write_all(&wire("events/subscribe", json!({"channels": CHANNELS})))
        .await
        .expect("subscribe");
    // Generous: the cut itself comes 300 ms after the socket buffers fill, but a loaded
    // machine may take long to fill them.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "the deaf bridge was not cut in time"
        );
        let st = honest
            .call("relay/status", json!({}))
            .await
            .expect("status");
        if !deaf_listed(&st) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut buf = vec![0u8; 256 * 1024];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match deaf.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("closed");
    assert_eq!(
        end.expect_err("a reset").kind(),
        std::io::ErrorKind::ConnectionReset
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_bridge_that_never_reads_is_cut_under_every_policy() {
    use gabp_engine::OnSlow;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // About 30 MB of events: far more than the kernel's buffers for one socket hold, so the
    // timeline cannot end (and the bridge be closed in order) before a deaf bridge is cut.
    synth(&data, 150_000);
    for policy in [OnSlow::Block, OnSlow::DropOldest, OnSlow::Disconnect] {
        let (addr, cancel) = in_process(&data, move |c| {
            c.on_slow = policy;
            c.write_deadline = Duration::from_millis(300);
            // Under `disconnect` the honest bridge is cut too if its outbox fills before it
            // reads its first event (a max-speed replay fills 256 KiB in about a millisecond,
            // and a loaded machine can deschedule it longer): 4 MiB is still far below the
            // 30 MB that cut the deaf one.
            c.outbox_bytes = if matches!(policy, OnSlow::Disconnect) {
                4 << 20
            } else {
                256 * 1024
            };
        })
        .await;
        let mut honest = Client::connect_hello(&addr, TOKEN).await.expect("hello").0;
        deaf_bridge_is_cut(&addr, &mut honest).await;
        honest.subscribe(&["world/tick"]).await.expect("subscribe");
        let e = honest.next_event().await.expect("event");
        assert_eq!(
            (e["channel"].as_str(), e["seq"].as_u64()),
            (Some("world/tick"), Some(0)),
            "{policy:?}"
        );
        cancel.cancel();
    }
}

/// Reads exactly one `Content-Length` frame off `s`, one byte at a time for the header so
/// nothing after the frame is consumed; returns its body as text.
async fn read_one_frame(s: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.expect("frame header");
        head.push(byte[0]);
        assert!(head.len() < 1024, "a header of sane size");
    }
    let head = String::from_utf8(head).expect("ascii header");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length:"))
        .expect("Content-Length")
        .trim()
        .parse()
        .expect("a length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.expect("frame body");
    String::from_utf8(body).expect("utf-8 body")
}
