//! The relay's backpressure policies (docs/concepts.md): a stalled bridge under
//! drop-oldest and disconnect, a bridge that pauses reading, and the lossless block policy.

use std::collections::HashSet;
use std::time::Duration;

use gabp_engine::OnSlow;
use serde_json::json;

use crate::support::in_process::{emit, quiet_mod, rss_bytes, Harness};

async fn stalled_bridge_case(policy: OnSlow) {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].on_slow = policy;
        // Room for one burst, so bridges that keep reading never drop; the stalled one must.
        c.routes[0].outbox_frames = 25_000;
        c.routes[0].record = false;
    })
    .await;
    let mut stalled = h.bridge().await;
    stalled.subscribe(&["a"]).await.expect("subscribe");
    let mut good = Vec::new();
    for _ in 0..2 {
        let mut c = h.bridge().await;
        c.subscribe(&["a"]).await.expect("subscribe");
        good.push(c);
    }
    let before = rss_bytes();
    let mut driver = h.bridge().await;
    const N: u64 = 200_000;
    const BURST: u64 = 20_000;
    let mut progress = Vec::new();
    let readers: Vec<_> = good
        .into_iter()
        .map(|mut c| {
            let (tx, rx) = tokio::sync::watch::channel(0u64);
            progress.push(rx);
            tokio::spawn(async move {
                for want in 0..N {
                    let e = c.next_event().await.expect("event");
                    assert_eq!(e["seq"], want, "healthy bridges lose nothing");
                    if (want + 1) % 1000 == 0 {
                        let _ = tx.send(want + 1);
                    }
                }
            })
        })
        .collect();
    for burst in 1..=(N / BURST) {
        emit(&mut driver, "a", BURST).await;
        // Healthy bridges read as fast as they can; the next burst waits for them.
        for rx in &mut progress {
            tokio::time::timeout(
                Duration::from_secs(30),
                rx.wait_for(|n| *n >= burst * BURST),
            )
            .await
            .expect("reader progress")
            .expect("reader alive");
        }
    }
    for r in readers {
        r.await.expect("reader");
    }
    let growth = rss_bytes().saturating_sub(before);
    assert!(
        growth < 150 << 20,
        "relay memory grew by {} MiB",
        growth >> 20
    );
    // Now the stalled bridge reads what it has.
    let mut last = None;
    let mut notices = 0u64;
    let mut dropped_total = 0u64;
    let mut received = 0u64;
    stalled.set_wait(Duration::from_secs(2));
    loop {
        let msg = match stalled.next_message().await {
            Ok(Some(m)) => m,
            _ => break,
        };
        if msg["type"] != "event" {
            continue;
        }
        if msg["channel"] == "relay/dropped" {
            notices += 1;
            dropped_total += msg["payload"]["count"].as_u64().expect("count");
            let from = msg["payload"]["fromSeq"].as_u64().expect("from");
            assert_eq!(
                Some(from),
                last.map_or(Some(0), |l: u64| Some(l + 1)),
                "notice starts right after the last delivered seq"
            );
            last = msg["payload"]["toSeq"].as_u64();
            continue;
        }
        let seq = msg["seq"].as_u64().expect("seq");
        assert_eq!(
            Some(seq),
            last.map_or(Some(0), |l| Some(l + 1)),
            "every gap is announced"
        );
        last = Some(seq);
        received += 1;
        if seq == N - 1 {
            break;
        }
    }
    match policy {
        OnSlow::DropOldest => {
            assert!(notices > 0, "drops are announced");
            assert_eq!(
                received + dropped_total,
                N,
                "delivered + dropped = published"
            );
        }
        OnSlow::Disconnect => assert!(received < N, "the slow bridge was cut off"),
        OnSlow::Block => unreachable!("not used here"),
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bridge_under_drop_oldest_sees_announced_gaps_and_costs_nobody() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(
        module_path!(),
        "a_stalled_bridge_under_drop_oldest_sees_announced_gaps_and_costs_nobody",
    )
    .await
    {
        return;
    }
    stalled_bridge_case(OnSlow::DropOldest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bridge_under_disconnect_is_cut_off() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(
        module_path!(),
        "a_stalled_bridge_under_disconnect_is_cut_off",
    )
    .await
    {
        return;
    }
    stalled_bridge_case(OnSlow::Disconnect).await;
}

/// A bridge that stops reading while its events and its own answers pile up: the mod reader's
/// direct writes fill the socket and leave the rest to the bridge's writer task (and the outbox
/// drops the oldest events once it is full). When the bridge reads again, every answer is there
/// exactly once and the events come in order, every gap announced by `relay/dropped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_that_pauses_reading_gets_every_answer_and_ordered_events() {
    let h = Harness::start(quiet_mod()).await;
    let mut slow = h.bridge().await;
    slow.subscribe(&["a"]).await.expect("subscribe");
    let mut driver = h.bridge().await;
    let mut asked = HashSet::new();
    // ~12 MB of events, more than loopback socket buffers and the outbox hold, interleaved
    // with requests the bridge sends without reading anything back.
    for _ in 0..10 {
        emit(&mut driver, "a", 4_000).await;
        for _ in 0..10 {
            let id = uuid::Uuid::new_v4().to_string();
            slow.send_body(&gabp_proto::message::request(
                &id,
                "tools/call",
                json!({"name": "sim/echo", "arguments": {"id": id}}),
            ))
            .await
            .expect("send");
            asked.insert(id);
        }
    }
    let (mut next_seq, mut received, mut dropped) = (0u64, 0u64, 0u64);
    let mut answered = HashSet::new();
    while answered.len() < asked.len() || next_seq < 40_000 {
        let m = slow
            .next_message()
            .await
            .expect("a frame")
            .expect("still open");
        match (m["type"].as_str(), m["channel"].as_str()) {
            (Some("response"), _) => {
                let id = m["id"].as_str().expect("id").to_string();
                assert!(asked.contains(&id), "an answer to a request of ours");
                assert_eq!(m["result"]["echo"]["id"], id.as_str(), "its own answer");
                assert!(answered.insert(id), "answered once");
            }
            (Some("event"), Some("a")) => {
                assert_eq!(m["seq"], next_seq, "in order, gaps only where announced");
                next_seq += 1;
                received += 1;
            }
            (Some("event"), Some("relay/dropped")) => {
                let p = &m["payload"];
                assert_eq!(p["channel"], "a");
                assert_eq!(p["fromSeq"], next_seq, "the notice stands where the gap is");
                next_seq = p["toSeq"].as_u64().expect("toSeq") + 1;
                dropped += p["count"].as_u64().expect("count");
            }
            _ => {}
        }
    }
    assert_eq!(
        received + dropped,
        40_000,
        "every event delivered or announced"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_policy_is_lossless() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].on_slow = OnSlow::Block;
        c.routes[0].outbox_frames = 100;
    })
    .await;
    let mut slow = h.bridge().await;
    slow.subscribe(&["a"]).await.expect("subscribe");
    let mut driver = h.bridge().await;
    let emitting = tokio::spawn(async move {
        emit(&mut driver, "a", 20_000).await;
        driver
    });
    for want in 0..20_000u64 {
        let e = slow.next_event().await.expect("event");
        assert_eq!(e["seq"], want);
        if want % 5000 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await; // read slower than the mod writes
        }
    }
    emitting.await.expect("emitter");
    h.shutdown().await;
}
