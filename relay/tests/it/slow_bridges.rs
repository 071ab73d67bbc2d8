//! Regression tests for slow and busy bridges: the disconnect and block
//! policies, the write deadline, and mod order on a busy socket. Each failed against the code
//! before its fix.

use std::time::{Duration, Instant};

use futures::StreamExt;
use gabp_client::Client;
use gabp_engine::OnSlow;
use gabp_proto::GabpCodec;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

use crate::support::in_process::{
    big_mod, deaf_subscriber, drain_until_closed, emit, hello_wire, listed, raw, request_wire,
    runtime_busy, wait_until, Harness,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_policy_resets_the_slow_bridge_and_frees_it_at_once() {
    let h = Harness::start_with(big_mod(), |c| {
        c.routes[0].on_slow = OnSlow::Disconnect;
        c.routes[0].outbox_frames = 64;
    })
    .await;
    let mut honest = h.bridge().await;
    let (mut deaf, conn) = deaf_subscriber(&h).await;
    // 20 MB of events: more than any socket buffers, so the outbox fills.
    emit(&mut honest, "a", 5000).await;
    wait_until(
        "the slow bridge gone from relay/status",
        Duration::from_secs(10),
        || !listed(&h).contains(&conn),
    )
    .await;
    let end = drain_until_closed(&mut deaf, Duration::from_secs(10)).await;
    assert_eq!(
        end.expect_err("a reset, not an orderly close").kind(),
        std::io::ErrorKind::ConnectionReset
    );
    assert!(honest.call("tools/list", json!({})).await.is_ok());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_whose_socket_takes_nothing_is_cut_at_the_write_deadline() {
    let h = Harness::start_with(big_mod(), |c| {
        c.routes[0].write_deadline = Duration::from_millis(300);
    })
    .await;
    let mut honest = h.bridge().await;
    let (mut deaf, conn) = deaf_subscriber(&h).await;
    // Drop-oldest keeps its outbox bounded, but its writer used to wait forever.
    emit(&mut honest, "a", 5000).await;
    wait_until("the deaf bridge cut", Duration::from_secs(10), || {
        !listed(&h).contains(&conn)
    })
    .await;
    let end = drain_until_closed(&mut deaf, Duration::from_secs(10)).await;
    assert_eq!(
        end.expect_err("a reset").kind(),
        std::io::ErrorKind::ConnectionReset
    );
    honest.subscribe(&["a"]).await.expect("subscribe");
    emit(&mut honest, "a", 3).await;
    assert_eq!(honest.next_event().await.expect("event")["channel"], "a");
    h.shutdown().await;
}

/// A bridge that reads slowly but steadily is slow, not stuck: it keeps its connection past
/// many write deadlines and is told of its drops. The kernel reports a socket writable only
/// once much of its (autotuned, megabytes) send buffer has drained, which a slow peer takes
/// longer than the deadline to do; the relay used to cut it as if it read nothing. (The
/// deadline here is 300 ms, so "slow" is about 1 MB/s: what the relay sees of a peer's reads
/// is TCP's window opening, a segment of up to 64 KiB at a time on loopback.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_that_reads_slowly_but_steadily_is_not_cut_and_sees_its_drops() {
    use tokio::io::AsyncReadExt;
    let deadline = Duration::from_millis(300);
    let h = Harness::start_with(big_mod(), |c| {
        c.routes[0].write_deadline = deadline;
        c.routes[0].outbox_bytes = 1 << 20;
    })
    .await;
    let mut honest = h.bridge().await;
    let (mut slow, conn) = deaf_subscriber(&h).await;
    // 20 MB of events: more than the socket buffers and the outbox hold, so events are dropped.
    emit(&mut honest, "a", 5000).await;
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = Vec::new();
    let began = Instant::now();
    // At most 64 KiB per 50 ms, for ten write deadlines.
    while began.elapsed() < deadline * 10 {
        let n = slow.read(&mut buf).await.expect("still connected");
        assert!(n > 0, "closed after {:?}", began.elapsed());
        read.extend_from_slice(&buf[..n]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed(&h).contains(&conn), "the slow bridge was cut");
    // Reading at full speed now, it gets its events and a notice of what it missed.
    let mut frames = FramedRead::new(std::io::Cursor::new(read).chain(slow), GabpCodec::default());
    let notice = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(f) = frames.next().await {
            let v: Value = serde_json::from_slice(&f.expect("a frame").body).expect("json");
            if v["channel"] == "relay/dropped" {
                return v;
            }
        }
        panic!("the connection ended without a relay/dropped notice");
    })
    .await
    .expect("a relay/dropped notice");
    assert_eq!(notice["payload"]["channel"], "a");
    assert_eq!(notice["payload"]["policy"], "drop-oldest");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_policy_idles_while_blocked_and_never_holds_shutdown_hostage() {
    // The byte bound is reached long before the frame bound: the mod reader used to spin.
    let h = Harness::start_with(big_mod(), |c| {
        c.routes[0].on_slow = OnSlow::Block;
        c.routes[0].outbox_bytes = 16 * 1024;
        c.routes[0].write_deadline = Duration::from_secs(120);
        c.shutdown_timeout = Duration::from_secs(3);
    })
    .await;
    let mut honest = h.bridge().await;
    let (_deaf, conn) = deaf_subscriber(&h).await;
    let emitter = tokio::spawn(async move {
        // Never answered while the route is blocked.
        let _ = honest
            .request(
                "tools/call",
                json!({"name": "sim/emit", "arguments": {"count": 5000, "channel": "a"}}),
            )
            .await;
    });
    let route = h.relay().routes[0].clone();
    wait_until(
        "the route blocked on the deaf bridge",
        Duration::from_secs(10),
        || {
            route.status()["bridges"]
                .as_array()
                .expect("bridges")
                .iter()
                .any(|b| {
                    b["conn"].as_u64() == Some(conn) && b["queueBytes"].as_u64() > Some(8 * 1024)
                })
        },
    )
    .await;
    let (cpu0, t0) = (runtime_busy(), Instant::now());
    // A new bridge is welcomed while the route is blocked.
    let started = Instant::now();
    let (_c, _) = Client::connect_hello(&h.addr, &h.token)
        .await
        .expect("hello while blocked");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "hello took {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(t0.elapsed())).await;
    let busy = (runtime_busy() - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    assert!(
        busy < 0.5,
        "blocked relay used {:.0}% of a core",
        busy * 100.0
    );
    drop(route); // (it holds the recorder open)
    let started = Instant::now();
    h.shutdown().await; // asserts the shutdown finished within its 3 s bound
    assert!(started.elapsed() < Duration::from_secs(4));
    emitter.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mod_response_never_overtakes_events_sent_before_it() {
    let h = Harness::start_with(big_mod(), |c| {
        c.routes[0].outbox_frames = 1 << 20;
        c.routes[0].outbox_bytes = 256 << 20;
    })
    .await;
    let mut s = raw(&h).await;
    s.write_all(&hello_wire(&h.token)).await.expect("hello");
    s.write_all(&request_wire(
        "events/subscribe",
        json!({"channels": ["a"]}),
    ))
    .await
    .expect("subscribe");
    let emit_id = gabp_client::new_id();
    let emit = gabp_proto::frame_bytes(&gabp_proto::message::request(
        &emit_id,
        "tools/call",
        json!({"name": "sim/emit", "arguments": {"count": 6000, "channel": "a"}}),
    ));
    // Give the subscription time to land before the emit: wait for its upstream effect.
    let route = h.relay().routes[0].clone();
    wait_until("subscribed", Duration::from_secs(10), || {
        route.status()["bridges"]
            .as_array()
            .expect("b")
            .iter()
            .any(|b| b["subscriptions"].as_array().is_some_and(|s| !s.is_empty()))
    })
    .await;
    s.write_all(&emit).await.expect("emit");
    // Not reading: 24 MB of events fill the socket; the response arrives behind queued events,
    // in the outbox or (when the writer took the outbox whole after the last burst) in the
    // socket's own queue: either way the relay has read it once every event is out of the
    // outbox and the request is no longer pending.
    wait_until(
        "the response queued behind events",
        Duration::from_secs(20),
        || {
            route.status()["bridges"]
                .as_array()
                .expect("b")
                .iter()
                .any(|b| {
                    b["queueControl"].as_u64() >= Some(1)
                        || (b["pending"] == 0
                            && b["delivered"].as_u64() == Some(6000)
                            && b["unwrittenBytes"].as_u64() > Some(0))
                })
        },
    )
    .await;
    let mut frames = FramedRead::new(s, GabpCodec::default());
    let mut last_seq = None;
    let mut events_after = 0;
    let mut answered = false;
    while let Ok(Some(f)) = tokio::time::timeout(Duration::from_secs(10), frames.next()).await {
        let v: Value = serde_json::from_slice(&f.expect("frame").body).expect("json");
        match v["type"].as_str() {
            Some("event") if v["channel"] == "a" => {
                last_seq = v["seq"].as_u64();
                if answered {
                    events_after += 1;
                }
            }
            Some("response") if v["id"] == emit_id.as_str() => {
                answered = true;
                assert_eq!(last_seq, Some(5999), "all 6,000 events precede the answer");
                break;
            }
            _ => {}
        }
    }
    assert!(answered, "the emit was answered");
    assert_eq!(events_after, 0);
    drop(route); // (it holds the recorder open)
    h.shutdown().await;
}
