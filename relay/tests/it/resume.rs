//! Resume after a drop (`relay.resume` in `session/hello`), end to end: a scripted mod, the
//! release `gabp-relay serve`, and bridges over real sockets. A bridge that reconnects within
//! the session gets every missed event exactly once, in order, with the same relay seq, then
//! the live stream: from the in-memory window, from the recording while the mod keeps
//! publishing at full rate, or a `relay/dropped` notice for exactly what neither holds. A
//! resume naming an older session gets the new epoch's `relay/session` notice and no old
//! events; bogus resumes get a clear error and cost nothing.

use crate::support::hostile::*;

const TOKEN_T: &str = "resume-bridge-token-0123456789";

/// A relay in front of the scripted mod listening at `up`, configured by a route table with
/// `extra` keys.
async fn relay(dir: &std::path::Path, up: &str, extra: &str) -> Relay {
    let cfg = format!(
        "[[route]]\nname = \"r\"\nupstream = \"{up}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN_T}\"\n{extra}\n"
    );
    let path = crate::support::config_file(dir, "relay.toml", &cfg);
    let data = dir.join("data");
    serve_args(&[
        "--config",
        &path,
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await
}

/// Event `n` of the mod's stream on `channel` (the mod numbers from 1; the relay from 0).
fn ev(channel: &str, n: u64) -> String {
    event(channel, Some(n + 1), &format!(r#"{{"n":{n}}}"#))
}

/// A bridge that said hello (with `params` merged in) and got `(client, welcome or error)`.
async fn hello(addr: &Addr, extra: Value) -> (Client, Value) {
    hello_on(Client::connect(addr).await.expect("connect"), extra).await
}

/// [`hello`] on a connection already made.
async fn hello_on(mut c: Client, extra: Value) -> (Client, Value) {
    let mut params = json!({"token": TOKEN_T, "bridgeVersion": "resume-test", "platform": "linux", "launchId": "resume-test"});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let resp = c.request("session/hello", params).await.expect("answer");
    assert_eq!(
        c.buffered(),
        0,
        "an event or notice came before the welcome"
    );
    (c, resp)
}

fn session_of(resp: &Value) -> String {
    resp["result"]["capabilities"]["extensions"]["relay"]["sessionId"]
        .as_str()
        .expect("session id in the welcome")
        .to_string()
}

/// Reads events on `channel` until seq `last`, checking each is the next one and carries the
/// mod's event of that number; notices are returned. Fails on a gap or a duplicate.
async fn expect_seqs(c: &mut Client, channel: &str, from: u64, last: u64) -> Vec<Value> {
    let mut notices = Vec::new();
    let mut want = from;
    while want <= last {
        let e = c.next_event().await.expect("event");
        if e["channel"] != channel {
            notices.push(e);
            continue;
        }
        assert_eq!(e["seq"].as_u64(), Some(want), "no gap, no duplicate: {e}");
        assert_eq!(
            e["payload"]["n"].as_u64(),
            Some(want),
            "the same event: {e}"
        );
        want += 1;
    }
    notices
}

/// A relay (route keys `extra`) before the scripted mod, welcomed offering `channels`, and an
/// observer bridge on `c`: (the relay, the mod, the observer).
async fn relay_with_observer(
    dir: &std::path::Path,
    extra: &str,
    channels: &[&str],
) -> (Relay, ModConn, Client) {
    let (listener, up) = bind().await;
    let relay = relay(dir, &up, extra).await;
    let mut m = accept(&listener).await;
    m.welcome(channels).await;
    m.subscribed().await;
    let o = observer(&relay.addr).await;
    (relay, m, o)
}

/// An observer bridge subscribed to `c`, to know when the relay has published up to a seq.
async fn observer(addr: &Addr) -> Client {
    let (mut o, r) = hello(addr, json!({})).await;
    assert!(r["result"].is_object(), "{r}");
    o.subscribe(&["c"]).await.expect("subscribe");
    o
}

async fn wait_published(o: &mut Client, last: u64) {
    loop {
        let e = o.next_event().await.expect("event");
        if e["channel"] == "c" && e["seq"].as_u64() == Some(last) {
            return;
        }
    }
}

#[tokio::test]
async fn a_bridge_resumes_from_memory_with_no_gap_and_no_duplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(dir.path(), "", &["c"]).await;
    let (mut a, w) = hello(&relay.addr, json!({})).await;
    let session = session_of(&w);
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["window"]["frames"], 16384,
        "the window's default is announced"
    );
    a.subscribe(&["c"]).await.expect("subscribe");
    m.send_all((0..50).map(|n| ev("c", n))).await;
    expect_seqs(&mut a, "c", 0, 49).await;
    drop(a); // the connection drops
    m.send_all((50..200).map(|n| ev("c", n))).await;
    wait_published(&mut o, 199).await;

    let resume = json!({"relay": {"resume": {"session": session, "channels": {"c": 49}}}});
    let (mut b, w) = hello(&relay.addr, resume).await;
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"], true,
        "{w}"
    );
    // Missed ones, then live ones, as one contiguous stream (no events/subscribe needed).
    let notices = expect_seqs(&mut b, "c", 50, 199).await;
    assert!(notices.is_empty(), "nothing was lost: {notices:?}");
    m.send_all((200..210).map(|n| ev("c", n))).await;
    expect_seqs(&mut b, "c", 200, 209).await;
    relay.wait_log("from_memory=150", 1).await;
    assert_eq!(relay.log_lines("from_recording=0"), 1);
}

#[tokio::test]
async fn a_bridge_resumes_100k_missed_events_from_the_recording_while_the_mod_publishes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (listener, up) = bind().await;
    // A small window and outbox: most history comes from the recording, in batches no larger
    // than the outbox.
    let relay = relay(
        dir.path(),
        &up,
        "resume_window_frames = 2000\noutbox_frames = 4096",
    )
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let mut o = observer(&relay.addr).await;
    let (mut a, w) = hello(&relay.addr, json!({})).await;
    let session = session_of(&w);
    a.subscribe(&["c"]).await.expect("subscribe");
    m.send_all((0..10).map(|n| ev("c", n))).await;
    expect_seqs(&mut a, "c", 0, 9).await;
    drop(a);
    const MISSED: u64 = 100_000;
    m.send_all((10..10 + MISSED).map(|n| ev("c", n))).await;
    wait_published(&mut o, 9 + MISSED).await;
    drop(o);

    // The mod keeps publishing at full rate during the whole catch-up.
    const DURING: u64 = 50_000;
    let first_live = 10 + MISSED;
    let mod_task = tokio::spawn(async move {
        let mut n = first_live;
        while n < first_live + DURING {
            let batch: Vec<String> = (n..n + 1000).map(|k| ev("c", k)).collect();
            m.send_all(batch).await;
            n += 1000;
            tokio::task::yield_now().await;
        }
        m
    });
    let resume = json!({"relay": {"resume": {"session": session, "channels": {"c": 9}}}});
    let (mut b, w) = hello(&relay.addr, resume).await;
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"],
        true
    );
    let started = Instant::now();
    let notices = expect_seqs(&mut b, "c", 10, first_live + DURING - 1).await;
    assert!(notices.is_empty(), "nothing was lost: {notices:?}");
    eprintln!(
        "resumed {} events in {:?}",
        MISSED + DURING,
        started.elapsed()
    );
    let mut m = mod_task.await.expect("mod task");
    // And it is live: one more event arrives right after.
    m.send_all([ev("c", first_live + DURING)]).await;
    expect_seqs(&mut b, "c", first_live + DURING, first_live + DURING).await;
    relay.wait_log("bridge resumed", 1).await;
    let line = relay
        .log
        .lock()
        .iter()
        .find(|l| l.contains("bridge resumed"))
        .cloned()
        .expect("resume logged");
    let from_recording: u64 = line
        .split("from_recording=")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("count in the log");
    assert!(
        from_recording >= MISSED - 4096,
        "most history came from the recording: {line}"
    );
    assert!(line.contains("not_retained=0"), "{line}");
}

/// History read from the recording into a small byte-bounded outbox: events of very different
/// sizes on two channels, every one delivered, no drop notice (a read that ran one event past
/// the room made the outbox drop its oldest under drop-oldest).
#[tokio::test]
async fn history_from_the_recording_fits_a_small_outbox_without_a_drop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(
        dir.path(),
        "resume_window_frames = 100\noutbox_frames = 300\noutbox_bytes = \"64KiB\"",
        &["a", "b"],
    )
    .await;
    let (mut a, w) = hello(&relay.addr, json!({})).await;
    let session = session_of(&w);
    a.subscribe(&["a", "b"]).await.expect("subscribe");
    drop(a);
    const EACH: u64 = 1500;
    let pad = |n: u64| "x".repeat([5, 300, 2000][(n % 3) as usize]);
    let body = |ch: &str, n: u64| event(ch, Some(n), &format!(r#"{{"n":{n},"pad":"{}"}}"#, pad(n)));
    m.send_all((0..EACH).flat_map(|n| [body("a", n), body("b", n)]))
        .await;
    // `c` last: the observer's channel, so that everything before it is published.
    m.send_all([event("c", Some(0), "{}")]).await;
    wait_published(&mut o, 0).await;
    let resume = json!({"relay": {"resume": {"session": session, "channels": {"a": -1, "b": -1}}}});
    let (mut b, w) = hello(&relay.addr, resume).await;
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"], true,
        "{w}"
    );
    let mut want = [0u64; 2];
    while want != [EACH; 2] {
        let e = b.next_event().await.expect("event");
        let i = match e["channel"].as_str() {
            Some("a") => 0,
            Some("b") => 1,
            _ => panic!("no notice, only history: {e}"),
        };
        assert_eq!(
            e["seq"].as_u64(),
            Some(want[i]),
            "no gap, no duplicate: {e}"
        );
        assert_eq!(
            e["payload"]["n"].as_u64(),
            Some(want[i]),
            "the same event: {e}"
        );
        assert_eq!(
            e["payload"]["pad"].as_str().map(str::len),
            Some(pad(want[i]).len())
        );
        want[i] += 1;
    }
}

#[tokio::test]
async fn a_bridge_that_does_not_read_is_sent_no_more_history_than_its_outbox_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(
        dir.path(),
        "resume_window_frames = 1000\noutbox_frames = 1000\noutbox_bytes = \"1MiB\"",
        &["c"],
    )
    .await;
    let session = session_of(&hello(&relay.addr, json!({})).await.1);
    // Big events, so the socket buffers fill after a few thousand.
    let big = "x".repeat(2000);
    let body = |n: u64| event("c", Some(n), &format!(r#"{{"n":{n},"pad":"{big}"}}"#));
    m.send_all((0..20_000).map(body)).await;
    wait_published(&mut o, 19_999).await;
    let resume = json!({"relay": {"resume": {"session": session, "channels": {"c": -1}}}});
    let (mut b, _) = hello(&relay.addr, resume).await;
    // It reads nothing for a while: the relay holds no more of its history than its outbox
    // bounds, in events queued and in bytes queued or taken and not yet written.
    let held = |v: &Value| -> Option<(u64, u64)> {
        let bridges = v["result"]["bridges"].as_array()?;
        let most = |f: &dyn Fn(&Value) -> u64| bridges.iter().map(f).max().unwrap_or(0);
        Some((
            most(&|b| b["queueEvents"].as_u64().unwrap_or(0)),
            most(&|b| {
                let field = |k: &str| b[k].as_u64().unwrap_or_else(|| panic!("{k}: {b}"));
                field("queueBytes") + field("unwrittenBytes")
            }),
        ))
    };
    let (mut st, _) = hello(&relay.addr, json!({})).await;
    // Until history fills its outbox (its socket is full by then), and a while longer.
    let (mut peak, mut samples) = ((0, 0), 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while samples < 200 {
        let s = st.request("relay/status", json!({})).await.expect("status");
        let (events, bytes) = held(&s).unwrap_or_else(|| panic!("bridges: {s}"));
        peak = (peak.0.max(events), peak.1.max(bytes));
        if peak.1 > 0 {
            samples += 1;
        }
        assert!(Instant::now() < deadline, "history never queued: {s}");
    }
    eprintln!("held at most {} events, {} bytes", peak.0, peak.1);
    assert!(
        peak.0 <= 1000,
        "queued {} events for a bridge that reads nothing",
        peak.0
    );
    // One event past the room at most (a read always takes its first).
    assert!(
        peak.1 <= (1 << 20) + 2100,
        "held {} bytes of history for a bridge that reads nothing",
        peak.1
    );
    // Then it reads: everything arrives, once and in order.
    let mut want = 0;
    while want < 20_000 {
        let e = b.next_event().await.expect("event");
        if e["channel"] == "c" {
            assert_eq!(e["seq"].as_u64(), Some(want));
            want += 1;
        }
    }
}

/// A live bridge that reads nothing holds at most its outbox bound queued and at most one
/// take of it in its socket's queue (the README's promise), never a take on top of what the
/// mod reader's direct write left there: measured from outside at 1.09-1.23 outbox-fulls
/// unwritten before the writer flushed that leftover first.
#[tokio::test]
async fn a_live_bridge_that_does_not_read_holds_at_most_one_take_beside_its_outbox() {
    const BOUND: u64 = 1 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(
        dir.path(),
        "record = false\noutbox_bytes = \"1MiB\"\nwrite_deadline = \"1h\"",
        &["c"],
    )
    .await;
    // A small receive buffer, so the relay's side fills within a few takes.
    let Addr::Tcp(at) = &relay.addr else {
        panic!("the relay listens on TCP")
    };
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = socket.connect(*at).await.expect("connect");
    let conn = Client::from_conn(gabp_sim::Conn::tcp(stream));
    let (mut stuck, w) = hello_on(conn, json!({})).await;
    assert!(w["result"].is_object(), "{w}");
    stuck.subscribe(&["c"]).await.expect("subscribe");
    let (mut st, _) = hello(&relay.addr, json!({})).await;
    let big = "x".repeat(2000);
    let body = |n: u64| event("c", Some(n), &format!(r#"{{"n":{n},"pad":"{big}"}}"#));
    let (mut queued, mut unwritten, mut samples) = (0u64, 0u64, 0u32);
    let sending = async {
        for chunk in 0..40u64 {
            m.send_all((chunk * 500..(chunk + 1) * 500).map(body)).await;
        }
        wait_published(&mut o, 19_999).await;
    };
    tokio::pin!(sending);
    let mut sent = false;
    // While the mod publishes, and a while after.
    while samples < 100 {
        tokio::select! {
            _ = &mut sending, if !sent => sent = true,
            s = st.request("relay/status", json!({})) => {
                let s = s.expect("status");
                let bridges = s["result"]["bridges"].as_array().expect("bridges").clone();
                for b in &bridges {
                    queued = queued.max(b["queueBytes"].as_u64().expect("queueBytes"));
                    unwritten = unwritten.max(b["unwrittenBytes"].as_u64().expect("unwrittenBytes"));
                }
                if sent {
                    samples += 1;
                }
            }
        }
    }
    eprintln!("held at most {queued} bytes queued and {unwritten} unwritten");
    assert!(unwritten > 0, "the bridge's socket never filled");
    // One event past the bound at most, and for the take the drop notices staged with it.
    assert!(queued <= BOUND + 2100, "queued {queued} bytes");
    assert!(
        unwritten <= BOUND + 2100 + 4096,
        "{unwritten} bytes taken and unwritten"
    );
}

#[tokio::test]
async fn without_a_recording_history_beyond_the_window_is_an_exact_dropped_notice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(
        dir.path(),
        "record = false\nresume_window_frames = 100",
        &["c"],
    )
    .await;
    let (mut a, w) = hello(&relay.addr, json!({})).await;
    let session = session_of(&w);
    a.subscribe(&["c"]).await.expect("subscribe");
    m.send_all((0..10).map(|n| ev("c", n))).await;
    expect_seqs(&mut a, "c", 0, 9).await;
    drop(a);
    m.send_all((10..1000).map(|n| ev("c", n))).await;
    wait_published(&mut o, 999).await;
    let resume = json!({"relay": {"resume": {"session": session, "channels": {"c": 9}}}});
    let (mut b, _) = hello(&relay.addr, resume).await;
    // The observer also holds events: the window is the route's last 100 (seqs 900..999).
    let first = b.next_event().await.expect("notice");
    assert_eq!(first["channel"], "relay/dropped", "{first}");
    assert_eq!(
        first["payload"],
        json!({"channel": "c", "fromSeq": 10, "toSeq": 899, "count": 890, "policy": "not-retained"})
    );
    expect_seqs(&mut b, "c", 900, 999).await;
    m.send_all((1000..1005).map(|n| ev("c", n))).await;
    let notices = expect_seqs(&mut b, "c", 1000, 1004).await;
    assert!(notices.is_empty(), "{notices:?}");
    relay.wait_log("not_retained=890", 1).await;
}

#[tokio::test]
async fn a_resume_across_a_mod_restart_gets_the_new_epoch_and_no_old_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (listener, up) = bind().await;
    let relay = relay(dir.path(), &up, "").await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let (mut a, w) = hello(&relay.addr, json!({})).await;
    let old = session_of(&w);
    a.subscribe(&["c"]).await.expect("subscribe");
    m.send_all((0..20).map(|n| ev("c", n))).await;
    expect_seqs(&mut a, "c", 0, 4).await;
    drop(a);
    // The mod restarts: a new session whose events say so.
    drop(m);
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let new_ev = |n: u64| event("c", Some(n + 1), &format!(r#"{{"n":{n},"new":true}}"#));
    let (mut o, w) = hello(&relay.addr, json!({})).await;
    let new = session_of(&w);
    assert_ne!(old, new);
    o.subscribe(&["c"]).await.expect("subscribe");
    m.send_all((0..5).map(new_ev)).await;
    wait_published(&mut o, 4).await;

    let resume = json!({"relay": {"resume": {"session": old, "channels": {"c": 4}}}});
    let (mut b, w) = hello(&relay.addr, resume).await;
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"],
        false
    );
    let notice = b.next_event().await.expect("notice");
    assert_eq!(notice["channel"], "relay/session", "{notice}");
    assert_eq!(notice["payload"]["state"], "started");
    assert_eq!(notice["payload"]["sessionId"], new.as_str());
    assert_eq!(notice["payload"]["previousSessionId"], old.as_str());
    // Live events of the new session only: seq 5 on (what it had before the resume is not
    // replayed, and nothing of the old session is).
    m.send_all((5..10).map(new_ev)).await;
    for want in 5..10 {
        let e = next_on(&mut b, "c").await;
        assert_eq!(e["seq"].as_u64(), Some(want), "{e}");
        assert_eq!(e["payload"]["new"], true, "{e}");
    }
}

#[tokio::test]
async fn bogus_resumes_get_a_clear_error_and_cost_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (relay, mut m, mut o) = relay_with_observer(dir.path(), "", &["c"]).await;
    let session = session_of(&hello(&relay.addr, json!({})).await.1);
    m.send_all((0..10).map(|n| ev("c", n))).await;
    wait_published(&mut o, 9).await;
    let huge: serde_json::Map<String, Value> =
        (0..5000).map(|i| (format!("ch{i}"), json!(0))).collect();
    let cases = [
        (json!("yes"), "relay.resume must be"),
        (json!({"session": session}), "relay.resume must be"),
        (
            json!({"session": session, "channels": ["c"]}),
            "relay.resume must be",
        ),
        (
            json!({"session": session, "channels": {"c": 1}, "x": 1}),
            "relay.resume must be",
        ),
        (
            json!({"session": "not-an-id", "channels": {"c": 1}}),
            "not a session id",
        ),
        (
            json!({"session": session, "channels": {"c": "5"}}),
            "whole number from -1",
        ),
        (
            json!({"session": session, "channels": {"c": -2}}),
            "whole number from -1",
        ),
        (
            json!({"session": session, "channels": {"c": 1.5}}),
            "whole number from -1",
        ),
        (
            json!({"session": session, "channels": {"": 1}}),
            "channel names",
        ),
        // Seq in the future, on a known channel and on one that never had an event.
        (
            json!({"session": session, "channels": {"c": 10}}),
            "seq 10 was never sent in this session (the last is 9)",
        ),
        (
            json!({"session": session, "channels": {"nope": 0}}),
            "seq 0 was never sent in this session (the last is -1)",
        ),
        (
            json!({"session": session, "channels": huge}),
            "too many channels",
        ),
    ];
    for (resume, says) in cases {
        let (mut c, r) = hello(&relay.addr, json!({"relay": {"resume": resume}})).await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        let msg = r["error"]["message"].as_str().expect("message");
        assert!(msg.contains(says), "{msg:?} should say {says:?}");
        // The connection stays usable: a hello without the resume is welcomed.
        let ok = c
            .hello(TOKEN_T)
            .await
            .expect("plain hello after a refused resume");
        assert!(ok["capabilities"].is_object());
    }
    // A channel that had no event yet, with -1 (nothing seen): subscribed, live from seq 0.
    let resume =
        json!({"relay": {"resume": {"session": session, "channels": {"later": -1, "c": 9}}}});
    let (mut b, w) = hello(&relay.addr, resume).await;
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"], true,
        "{w}"
    );
    m.send_all([event("later", Some(1), r#"{"n":0}"#)]).await;
    let e = next_on(&mut b, "later").await;
    assert_eq!(e["seq"], 0);
    // Still serving, and small.
    let s = o.request("relay/status", json!({})).await.expect("status");
    assert!(s["result"]["session"].is_object());
    assert!(relay.peak_rss_mib() < 200, "{} MiB", relay.peak_rss_mib());
}
