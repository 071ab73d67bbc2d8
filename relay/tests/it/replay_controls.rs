//! Playback controls of `replay` (`relay/replay`, `replay --paused`, the range flags and
//! `replay-control`): bridges attached to one replay follow one playhead, so through seeks,
//! steps, speed changes and the end they see the same events and notices in the same order;
//! bad params and an observer are refused; a live route says it is no replay, and each welcome
//! names exactly the relay's methods that route answers; a seek into the middle of a long
//! session answers at once, in bounded memory.
//!
//! Sessions are written with the storage writer directly; the replays run as the release
//! binary, except where a test needs identities (in process).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_engine::identity::{Identity, Role};
use gabp_engine::replay::{Recording, ReplayOptions, Speed};
use gabp_rt::net::{Addr, Listener};
use gabp_storage::{
    Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::support::{replay_address, BIN};

const CHANNELS: [&str; 3] = ["world/tick", "player/move", "chat/message"];
const TOKEN: &str = "replay-controls-token-for-tests";
const WATCHER: &str = "replay-controls-watcher-token-0123";
/// Event `i` is recorded this far after the previous one.
const STEP_NS: u64 = 10_000;

/// The offset of event `i` from the session's start.
fn offset_ns(i: u64) -> u64 {
    1_000 + i * STEP_NS
}

fn ms(ns: u64) -> f64 {
    (ns / 1_000) as f64 / 1_000.0
}

/// Writes one ended session of `events` events (round robin over [`CHANNELS`], so event `i`
/// is on channel `i % 3` with recorded seq `i / 3`), with each `(i, label)` of `marks` marked
/// halfway between events `i - 1` and `i`.
fn synth(dir: &Path, events: u64, marks: &[(u64, &str)]) -> SessionMeta {
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
    for i in 0..events {
        for (_, label) in marks.iter().filter(|(at, _)| *at == i) {
            let body = json!({"v": "gabp/1", "id": uuid::Uuid::new_v4().to_string(),
                "type": "request", "method": "relay/mark", "params": {"label": label}});
            w.append(
                id,
                &FrameRecord::message(
                    Direction::BridgeToRelay,
                    1,
                    started_ns + offset_ns(i) - STEP_NS / 2,
                    true,
                    body.to_string().into(),
                ),
            );
        }
        let c = (i % CHANNELS.len() as u64) as usize;
        let seq = i / CHANNELS.len() as u64;
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"event","channel":"{}","seq":{seq},"payload":{{"i":{i},"pad":"{pad}"}}}}"#,
            uuid::Uuid::from_u128(u128::from(i)),
            CHANNELS[c],
        );
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: started_ns + offset_ns(i),
                channel: Some(c as u32),
                mod_seq: Some(seq),
                relay_seq: Some(seq),
                json_ok: true,
                body: body.into(),
            },
        );
        if i % 50_000 == 49_999 {
            w.commit().expect("commit");
        }
    }
    let end_ns = started_ns + offset_ns(events);
    w.end(id, EndReason::Clean, end_ns);
    w.commit().expect("commit");
    drop(w);
    // Recovered into table files, as a relay's next start leaves it (see `replay.rs`).
    drop(Store::open(dir, StoreOptions::default()).expect("recover"));
    let store = Store::open_for_reading(dir).expect("reopen");
    store.resolve("latest").expect("the session")
}

/// A running `gabp-relay replay`, killed on drop.
struct Replay {
    child: tokio::process::Child,
    addr: Addr,
}

async fn replay(data: &Path, extra: &[&str]) -> Replay {
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
    let addr = replay_address(&mut lines, Duration::from_secs(60)).await;
    // The rest of stdout (the paused line) is read and dropped.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Replay { child, addr }
}

async fn bridge(addr: &Addr, channels: &[&str]) -> Client {
    let mut c = Client::connect_hello(addr, TOKEN).await.expect("hello").0;
    c.subscribe(channels).await.expect("subscribe");
    c
}

/// What a bridge saw: events as `(channel, seq, i)` and notices as their payload.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Event(String, u64, u64),
    Notice(Value),
}

async fn next(c: &mut Client) -> Seen {
    let e = tokio::time::timeout(Duration::from_secs(30), c.next_event())
        .await
        .expect("an event in time")
        .expect("event");
    if e["channel"] == "relay/replay" {
        return Seen::Notice(e["payload"].clone());
    }
    Seen::Event(
        e["channel"].as_str().expect("channel").to_string(),
        e["seq"].as_u64().expect("seq"),
        e["payload"]["i"].as_u64().expect("i"),
    )
}

/// Reads until a notice in `state`; returns everything read, that notice last.
async fn until_state(c: &mut Client, state: &str) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        let s = next(c).await;
        let done = matches!(&s, Seen::Notice(n) if n["state"] == state);
        seen.push(s);
        if done {
            return seen;
        }
    }
}

/// The events' `i` in `seen` (checking each carries its recorded channel and seq).
fn played(seen: &[Seen]) -> Vec<u64> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Event(c, seq, i) => {
                assert_eq!(
                    (c.as_str(), *seq),
                    (CHANNELS[(*i % 3) as usize], *i / 3),
                    "seq as recorded"
                );
                Some(*i)
            }
            Seen::Notice(_) => None,
        })
        .collect()
}

fn notices(seen: &[Seen]) -> Vec<Value> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Notice(n) => Some(n.clone()),
            Seen::Event(..) => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_follow_one_playhead_through_seeks_steps_and_speed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let meta = synth(
        &data,
        30_000,
        &[
            (10_000, "episode-start"),
            (12_000, "note"),
            (20_000, "episode-end"),
        ],
    );
    let r = replay(&data, &["--paused"]).await;
    let mut a = bridge(&r.addr, &CHANNELS).await;
    let mut b = bridge(&r.addr, &CHANNELS).await;
    // Paused from the start: nothing plays until asked.
    let state = a
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("state");
    assert_eq!(
        (state["state"].as_str(), state["atMs"].as_f64()),
        (Some("paused"), Some(0.0)),
        "{state}"
    );
    assert_eq!(state["sessionId"], meta.id.to_string());
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Seek to a mark: both bridges are told, and stay paused there.
    let mark_ms = ms(offset_ns(10_000) - STEP_NS / 2);
    let s = a
        .call(
            "relay/replay",
            json!({"action": "seek", "toMark": "episode-start"}),
        )
        .await
        .expect("seek");
    assert_eq!(
        (s["state"].as_str(), s["atMs"].as_f64()),
        (Some("paused"), Some(mark_ms)),
        "{s}"
    );
    // Step 100 events: played at once by both, then paused.
    let s = b
        .call("relay/replay", json!({"action": "step", "events": 100}))
        .await
        .expect("step");
    assert_eq!(s["untilMs"].as_f64(), Some(ms(offset_ns(10_099))), "{s}");
    let mut seen_a = until_state(&mut a, "paused").await;
    let mut seen_b = until_state(&mut b, "paused").await;
    assert_eq!(played(&seen_a), (10_000..10_100).collect::<Vec<_>>());
    assert_eq!(
        notices(&seen_a),
        vec![
            json!({"state": "seeked", "fromMs": 0.0, "toMs": mark_ms}),
            json!({"state": "stepping", "atMs": mark_ms, "untilMs": ms(offset_ns(10_099)), "events": 100}),
            json!({"state": "paused", "atMs": ms(offset_ns(10_099))}),
        ]
    );
    let state = a
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("state");
    assert_eq!(state["state"], "paused", "{state}");

    // Speed, a seek to a channel's recorded seq, a step to the next mark with that label.
    let s = b
        .call("relay/replay", json!({"action": "speed", "speed": 4}))
        .await
        .expect("speed");
    assert_eq!(
        (s["state"].as_str(), s["speed"].as_f64()),
        (Some("paused"), Some(4.0))
    );
    let s = a
        .call(
            "relay/replay",
            json!({"action": "seek", "channel": "player/move", "toSeq": 5000}),
        )
        .await
        .expect("seek to a seq");
    assert_eq!(s["atMs"].as_f64(), Some(ms(offset_ns(15_001))), "{s}");
    a.call(
        "relay/replay",
        json!({"action": "step", "toMark": "episode-end"}),
    )
    .await
    .expect("step to a mark");
    let more_a = until_state(&mut a, "paused").await;
    let more_b = until_state(&mut b, "paused").await;
    assert_eq!(played(&more_a), (15_001..20_000).collect::<Vec<_>>());
    seen_a.extend(more_a);
    seen_b.extend(more_b);

    // Play on to the end, at 4x.
    a.call("relay/replay", json!({"action": "resume"}))
        .await
        .expect("resume");
    let t = Instant::now();
    let last_a = until_state(&mut a, "ended").await;
    let took = t.elapsed();
    let last_b = until_state(&mut b, "ended").await;
    assert_eq!(played(&last_a), (20_000..30_000).collect::<Vec<_>>());
    // 100 ms of recording at 4x: paced, not all at once (and not at 1x).
    assert!(
        took >= Duration::from_millis(15),
        "the rest played in {took:?}"
    );
    seen_a.extend(last_a);
    seen_b.extend(last_b);
    assert_eq!(
        notices(&seen_a)
            .iter()
            .map(|n| n["state"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>(),
        [
            "seeked", "stepping", "paused", "speed", "seeked", "stepping", "paused", "resumed",
            "ended"
        ]
    );
    assert_eq!(
        seen_a, seen_b,
        "both bridges saw the same, in the same order"
    );
    let state = b
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("state");
    assert_eq!(state["state"], "ended", "{state}");

    // A bridge that joins now stands at the end with the others; a seek brings all back.
    let mut late = bridge(&r.addr, &["chat/message"]).await;
    b.call("relay/replay", json!({"action": "seek", "toMs": mark_ms}))
        .await
        .expect("seek after the end");
    for c in [&mut a, &mut late] {
        let first = next(c).await;
        let Seen::Notice(n) = &first else {
            panic!("a notice first: {first:?}")
        };
        assert_eq!(n["state"], "seeked", "{n}");
    }
    let Seen::Event(ch, seq, i) = next(&mut late).await else {
        panic!("an event")
    };
    assert_eq!((ch.as_str(), seq, i), ("chat/message", 3_333, 10_001));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_range_flags_cut_where_export_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(
        &data,
        3_000,
        &[
            (500, "episode-start"),
            (900, "episode-end"),
            (1_500, "episode-start"),
            (1_700, "goal"),
            (2_000, "episode-end"),
        ],
    );
    let whole = |from: u64, to: u64| (from..to).collect::<Vec<_>>();
    for (args, want) in [
        (vec!["--episode", "2"], whole(1_500, 2_000)),
        (vec!["--from-mark", "goal"], whole(1_700, 3_000)),
        (
            vec!["--from-mark", "episode-start", "--to-mark", "episode-end"],
            whole(500, 900),
        ),
        (
            vec!["--from", "15ms", "--to-mark", "goal"],
            whole(1_500, 1_700),
        ),
        (vec!["--from", "10ms", "--to", "12ms"], whole(1_000, 1_200)),
    ] {
        let mut full = vec!["--speed", "max"];
        full.extend(&args);
        let r = replay(&data, &full).await;
        let mut c = bridge(&r.addr, &CHANNELS).await;
        let seen = until_state(&mut c, "ended").await;
        let got = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Event(_, _, i) => Some(*i),
                Seen::Notice(_) => None,
            })
            .collect::<Vec<_>>();
        assert_eq!(got, want, "{args:?}");
    }
    // What cannot be cut is said in one line (exit 1); clashing flags are usage (exit 2).
    for (args, code, says) in [
        (&["--episode", "3"][..], 1, "no episode 3"),
        (&["--from-mark", "nope"], 1, "no mark labelled \"nope\""),
        (
            &["--from-mark", "goal", "--to-mark", "goal"],
            1,
            "after the start",
        ),
        (
            &["--episode", "1", "--from", "1ms"],
            2,
            "cannot be used with",
        ),
        (&["--from", "5ms", "--to", "5ms"], 2, "--to must be later"),
        (
            &["--from-mark", "goal", "--to", "1ms"],
            1,
            "is not after where the replay starts",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["replay", "latest", "--data-dir"])
            .arg(&data)
            .args(["--listen", "127.0.0.1:0", "--token", TOKEN])
            .args(args)
            .env_remove("GABP_RELAY_DATA_DIR")
            .output()
            .await
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_control_drives_a_replay_from_the_shell() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 3_000, &[(1_000, "episode-start")]);
    let r = replay(&data, &["--paused"]).await;
    let mut c = bridge(&r.addr, &["world/tick"]).await;
    let addr = r.addr.to_string();
    let control = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("replay-control")
            .args(args)
            .args(["--address", &addr, "--token", TOKEN]);
        cmd
    };
    let out = control(&["seek", "--to-mark", "episode-start", "--json"])
        .output()
        .await
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(state["state"], "paused", "{state}");
    let out = control(&["step", "--events", "3"])
        .output()
        .await
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("playing at "), "{text}");
    let seen = until_state(&mut c, "paused").await;
    // Three events over every channel: one of them on world/tick.
    let got = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Event(_, seq, i) => Some((*seq, *i)),
            Seen::Notice(_) => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(got, vec![(334, 1_002)]);
    let out = control(&["state"]).output().await.expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("paused at 10.021 ms (speed 1x)"), "{text}");
    // A refusal is one line, exit 1.
    let out = control(&["seek", "--to-mark", "nope"])
        .output()
        .await
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("-32602") && err.contains("no mark"), "{err}");
    let out = Command::new(BIN)
        .args(["replay-control", "pause", "--token", TOKEN])
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "no address: usage");
    drop(r);
}

/// An in-process replay of the latest session in `data`, with an `observe` identity beside the
/// route's token.
async fn in_process(data: &Path) -> (Addr, CancellationToken) {
    gabp_rt::log::init_for_tests();
    let store = Store::open_for_reading(data).expect("open");
    let meta = store.resolve("latest").expect("session");
    let opts = ReplayOptions::new(TOKEN, Speed::Max);
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
        |cfg| {
            cfg.identities = vec![Identity::named(
                "watcher".into(),
                WATCHER.into(),
                Role::Observe,
            )];
        },
    ));
    (addr, cancel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_params_and_observers_are_refused_and_a_live_route_is_no_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 300, &[]);
    let (addr, cancel) = in_process(&data).await;
    let mut control = Client::connect_hello(&addr, TOKEN).await.expect("hello").0;
    for (params, says) in [
        (json!({}), "needs an action"),
        (json!({"action": "rewind"}), "no action"),
        (json!({"action": "seek"}), "one target"),
        (
            json!({"action": "seek", "toMs": 1e12}),
            "outside the replayed range",
        ),
        (
            json!({"action": "seek", "toMark": "none"}),
            "no mark labelled",
        ),
        (
            json!({"action": "seek", "channel": "nope", "toSeq": 1}),
            "no channel",
        ),
        (
            json!({"action": "seek", "channel": "world/tick", "toSeq": 1000}),
            "no seq 1000",
        ),
        (json!({"action": "step", "events": 0}), "events must be"),
        (
            json!({"action": "speed", "speed": -2}),
            "from 0.001 to 1000000",
        ),
        // Slower than the slowest pace would stand still while saying it plays.
        (
            json!({"action": "speed", "speed": 1e-9}),
            "from 0.001 to 1000000",
        ),
        (json!({"action": "pause", "at": 1}), "takes no"),
    ] {
        let r = control
            .request("relay/replay", params.clone())
            .await
            .expect("answered");
        assert_eq!(r["error"]["code"], -32602, "{params}: {r}");
        let msg = r["error"]["message"].as_str().expect("message");
        assert!(msg.contains(says) && !msg.contains('\n'), "{params}: {msg}");
    }
    // An observer may ask where the replay is, not move it.
    let mut watcher = Client::connect_hello(&addr, WATCHER)
        .await
        .expect("hello")
        .0;
    let state = watcher
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("an observer reads the state");
    assert_eq!(state["controlled"], false, "{state}");
    for params in [
        json!({"action": "pause"}),
        json!({"action": "seek", "toMs": 1}),
    ] {
        let r = watcher
            .request("relay/replay", params)
            .await
            .expect("answered");
        assert_eq!(r["error"]["code"], -32006, "{r}");
    }
    let state = control
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("state");
    assert_eq!(
        state["controlled"], false,
        "refusals changed nothing: {state}"
    );
    cancel.cancel();

    // A live route answers that relay/replay is for replays.
    let h =
        crate::support::in_process::Harness::start(crate::support::in_process::quiet_mod()).await;
    h.wait_session().await;
    let mut c = h.bridge().await;
    let r = c
        .request("relay/replay", json!({"action": "pause"}))
        .await
        .expect("answered");
    assert_eq!(r["error"]["code"], -32601, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("live mod")),
        "{r}"
    );
    h.shutdown().await;
}

/// Every `relay/*` method a bridge could try, with params it accepts, and one no relay has.
const RELAY_METHODS: [(&str, &str); 6] = [
    ("relay/status", "{}"),
    ("relay/ping", "{}"),
    ("relay/mark", r#"{"label": "probe"}"#),
    ("relay/lease", r#"{"action": "release"}"#),
    ("relay/replay", r#"{"action": "state"}"#),
    ("relay/none-such", "{}"),
];

/// The relay's methods `c` gets answered: those not refused as unknown (-32601) or as
/// forbidden to its role (-32006).
async fn answered_relay_methods(c: &mut Client) -> Vec<String> {
    let mut answered = Vec::new();
    for (method, params) in RELAY_METHODS {
        let params: Value = serde_json::from_str(params).expect("params");
        let r = c.request(method, params).await.expect("answered");
        if ![-32601, -32006].contains(&r["error"]["code"].as_i64().unwrap_or(0)) {
            answered.push(method.to_string());
        }
    }
    answered
}

/// The relay's methods a welcome names, in [`RELAY_METHODS`]' order.
fn offered(welcome: &Value) -> Vec<String> {
    let named: Vec<String> =
        serde_json::from_value(welcome["capabilities"]["extensions"]["relay"]["methods"].clone())
            .expect("relay.methods is a list of names");
    let known: Vec<String> = RELAY_METHODS
        .iter()
        .map(|(m, _)| m.to_string())
        .filter(|m| named.contains(m))
        .collect();
    assert_eq!(known.len(), named.len(), "a method no test asks: {named:?}");
    known
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_welcome_names_exactly_the_relay_methods_answered_on_a_replay_and_a_live_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    synth(&data, 300, &[]);
    let (addr, cancel) = in_process(&data).await;
    for token in [TOKEN, WATCHER] {
        let (mut c, welcome) = Client::connect_hello(&addr, token).await.expect("hello");
        let methods = offered(&welcome);
        assert!(
            methods.iter().any(|m| m == "relay/replay"),
            "a replay offers its controls: {welcome}"
        );
        assert_eq!(methods, answered_relay_methods(&mut c).await, "replay");
    }
    cancel.cancel();

    let h =
        crate::support::in_process::Harness::start(crate::support::in_process::quiet_mod()).await;
    h.wait_session().await;
    let (mut c, welcome) = Client::connect_hello(&h.addr, &h.token)
        .await
        .expect("hello");
    let methods = offered(&welcome);
    assert!(
        !methods.iter().any(|m| m == "relay/replay"),
        "a live route has no playback: {welcome}"
    );
    assert_eq!(methods, answered_relay_methods(&mut c).await, "live");
    h.shutdown().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_into_a_long_session_answers_at_once_in_bounded_memory() {
    // Larger runs for benchmarks: GABP_REPLAY_SEEK_EVENTS=9000000.
    let events: u64 = std::env::var("GABP_REPLAY_SEEK_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mid = events / 2;
    let t = Instant::now();
    synth(&data, events, &[(mid + 1, "middle")]);
    eprintln!("wrote {events} events in {:?}", t.elapsed());
    let r = replay(&data, &["--speed", "max"]).await;
    let pid = r.child.id().expect("running");
    let mut c = bridge(&r.addr, &CHANNELS).await;
    // Playing at full speed from the start; then a seek by time into the middle.
    next(&mut c).await;
    let mut ctl = Client::connect_hello(&r.addr, TOKEN)
        .await
        .expect("hello")
        .0;
    let to_ms = ms(offset_ns(mid));
    let t = Instant::now();
    let s = ctl
        .call("relay/replay", json!({"action": "seek", "toMs": to_ms}))
        .await
        .expect("seek");
    let answered = t.elapsed();
    assert_eq!(s["state"], "playing", "{s}");
    loop {
        if let Seen::Notice(n) = next(&mut c).await {
            assert_eq!(n["state"], "seeked", "{n}");
            break;
        }
    }
    let Seen::Event(_, _, i) = next(&mut c).await else {
        panic!("an event after the seek")
    };
    let first = t.elapsed();
    assert_eq!(i, mid, "the first event at the time sought");
    // A seek to a mark reads the marks once (one pass), then answers from them.
    let t = Instant::now();
    ctl.call(
        "relay/replay",
        json!({"action": "seek", "toMark": "middle"}),
    )
    .await
    .expect("seek to a mark");
    let to_mark = t.elapsed();
    let t = Instant::now();
    ctl.call(
        "relay/replay",
        json!({"action": "seek", "toMark": "middle"}),
    )
    .await
    .expect("seek to a mark");
    let to_mark_again = t.elapsed();
    let peak = peak_rss(pid);
    eprintln!(
        "{events} events: seek answered in {answered:?}, first event after it {first:?}; \
         first seek to a mark {to_mark:?}, the next {to_mark_again:?}; replay peak RSS {} MiB",
        peak >> 20
    );
    assert!(
        answered < Duration::from_secs(1),
        "seek answered in {answered:?}"
    );
    assert!(
        first < Duration::from_secs(1),
        "first event after {first:?}"
    );
    assert!(to_mark_again < Duration::from_secs(1), "{to_mark_again:?}");
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
}

/// Bridges of a replay nobody controlled yet play on their own timelines; the first change puts
/// them on one playhead where the furthest one is: the one behind jumps there (told by a
/// `seeked` notice), and from the next change on both see the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_change_puts_free_timelines_on_one_playhead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // 3 s of recording at 1x.
    synth_spaced(&data, 3_000, 1_000_000);
    let r = replay(&data, &[]).await;
    let mut ahead = bridge(&r.addr, &CHANNELS).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut behind = bridge(&r.addr, &CHANNELS).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = behind
        .call("relay/replay", json!({"action": "state"}))
        .await
        .expect("state");
    assert_eq!(
        (state["controlled"].as_bool(), state["timelines"].as_u64()),
        (Some(false), Some(2)),
        "{state}"
    );
    let paused = behind
        .call("relay/replay", json!({"action": "pause"}))
        .await
        .expect("pause");
    assert_eq!(paused["state"], "paused", "{paused}");
    let at = paused["atMs"].as_f64().expect("atMs");
    assert!(at >= 500.0, "paused where the one ahead was: {paused}");
    let seen_ahead = until_state(&mut ahead, "paused").await;
    let seen_behind = until_state(&mut behind, "seeked").await;
    let last = |seen: &[Seen]| {
        seen.iter().rev().find_map(|s| match s {
            Seen::Event(_, _, i) => Some(*i),
            Seen::Notice(_) => None,
        })
    };
    let (a, b) = (last(&seen_ahead), last(&seen_behind));
    assert!(a > b, "one was ahead: {a:?} {b:?}");
    let Some(Seen::Notice(seeked)) = seen_behind.last() else {
        unreachable!()
    };
    assert_eq!(
        seeked["fromMs"].as_f64().map(|f| f < at),
        Some(true),
        "{seeked}"
    );
    behind
        .call("relay/replay", json!({"action": "speed", "speed": "max"}))
        .await
        .expect("speed");
    behind
        .call("relay/replay", json!({"action": "resume"}))
        .await
        .expect("resume");
    let rest_ahead = until_state(&mut ahead, "ended").await;
    let rest_behind = until_state(&mut behind, "ended").await;
    let tail = |seen: Vec<Seen>| -> Vec<Seen> {
        seen.into_iter()
            .filter(|s| !matches!(s, Seen::Notice(n) if n["state"] == "ended"))
            .collect()
    };
    let (rest_ahead, rest_behind) = (tail(rest_ahead), tail(rest_behind));
    assert_eq!(rest_ahead, rest_behind, "the same from the first change on");
    assert_eq!(
        rest_ahead.first(),
        Some(&Seen::Notice(
            json!({"state": "speed", "atMs": at, "speed": "max"})
        ))
    );
    let first_event = played(&rest_ahead)[0];
    assert_eq!(
        Some(first_event),
        a.map(|i| i + 1),
        "nothing skipped, nothing twice"
    );
}

/// [`synth`] with events `step_ns` apart instead of [`STEP_NS`].
fn synth_spaced(dir: &Path, events: u64, step_ns: u64) -> SessionMeta {
    let store = Store::open(dir, StoreOptions::default()).expect("create the data dir");
    let mut w = SessionWriter::new(store);
    let started_ns = gabp_rt::clock::now_ns() - 3_600_000_000_000;
    let meta = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "synth".into(),
        started_ns,
        welcome: Some(json!({"capabilities": {"events": CHANNELS}})),
        relay_version: "test".into(),
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    for (i, c) in CHANNELS.iter().enumerate() {
        w.define_channel(id, i as u32, c);
    }
    for i in 0..events {
        let c = (i % 3) as usize;
        let seq = i / 3;
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"event","channel":"{}","seq":{seq},"payload":{{"i":{i}}}}}"#,
            uuid::Uuid::from_u128(u128::from(i)),
            CHANNELS[c],
        );
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: started_ns + 1_000 + i * step_ns,
                channel: Some(c as u32),
                mod_seq: Some(seq),
                relay_seq: Some(seq),
                json_ok: true,
                body: body.into(),
            },
        );
    }
    w.end(id, EndReason::Clean, started_ns + 1_000 + events * step_ns);
    w.commit().expect("commit");
    drop(w);
    drop(Store::open(dir, StoreOptions::default()).expect("recover"));
    let store = Store::open_for_reading(dir).expect("reopen");
    store.resolve("latest").expect("the session")
}
