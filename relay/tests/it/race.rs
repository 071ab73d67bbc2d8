//! A subscribe racing a mod reconnect under `--no-subscribe-all` reaches the new mod
//! connection. The relay publishes the new session before it collects the channels to
//! subscribe upstream (under the `upstream_channels` lock), so a bridge subscribing at any
//! moment around the reconnect either is in that collection or sends the subscribe itself.
//!
//! Driven many times: the mod's connection is killed, and from the moment the mod accepts the
//! relay's new connection (hello and welcome still under way) until after bridges are told the
//! session started, several bridges pipeline subscribes to fresh channels, so the relay handles
//! one every few microseconds before, inside and after the window. The simulated mod only emits events on channels
//! its current connection was asked for, so an event arriving on every one of those channels
//! proves each subscribe reached the new connection.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::json;

use crate::support::{serve, BRIDGE_TOKEN, MOD_TOKEN};

const ROUNDS: usize = 16;
const SUBSCRIBERS: usize = 3;
/// Subscribes each bridge keeps in flight.
const DEPTH: usize = 8;
/// Advertised channels (within the relay's 4096 per session), two halves used in turn.
const CHANNELS: usize = 4000;

/// Counts `relay/session` "started" notices, and events, on a bridge of its own.
async fn watch_starts(addr: &Addr) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
    let (mut c, _) = Client::connect_hello(addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    // Notices go to bridges with a subscription.
    c.subscribe(&["c/watch"]).await.expect("subscribe");
    let starts = Arc::new(AtomicU64::new(0));
    let events = Arc::new(AtomicU64::new(0));
    let (s, e) = (starts.clone(), events.clone());
    tokio::spawn(async move {
        while let Ok(Some(m)) = c.next_message().await {
            if m["channel"] == "relay/session" && m["payload"]["state"] == "started" {
                s.fetch_add(1, Ordering::SeqCst);
            } else if m["channel"] == "c/watch" {
                e.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (starts, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_racing_a_mod_reconnect_reaches_the_new_connection() {
    let mut channels: Vec<String> = (0..CHANNELS).map(|i| format!("c/{i}")).collect();
    channels.push("c/watch".into());
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            channels,
            // Spread over every advertised channel, only subscribed ones are sent: a few
            // events a second on each.
            rate: Some(20_000.0),
            payload_bytes: 64,
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let relay = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--no-bridge-file",
        "--no-record",
        "--no-subscribe-all",
    ])
    .await;
    let addr = relay.addr.clone();
    let (starts, watched) = watch_starts(&addr).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while watched.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no session streams to the watcher"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (mut inside, mut total) = (0, 0);
    for round in 0..ROUNDS {
        let mut bridges = Vec::new();
        for _ in 0..SUBSCRIBERS {
            bridges.push(
                Client::connect_hello(&addr, BRIDGE_TOKEN)
                    .await
                    .expect("hello")
                    .0,
            );
        }
        let accepted = sim.accepted();
        let started = starts.load(Ordering::SeqCst);
        sim.kill_connections();
        // The relay reconnects after its backoff; start subscribing once the mod has accepted
        // the new connection, while its hello and welcome are under way.
        let deadline = Instant::now() + Duration::from_secs(30);
        while sim.accepted() == accepted {
            assert!(Instant::now() < deadline, "round {round}: no reconnect");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Each bridge keeps DEPTH subscribes to fresh channels in flight (a new one as each is
        // answered), so the relay handles one every few microseconds all through the
        // session's set-up, until a few after bridges were told the session started. Rounds
        // alternate between two halves of the channels, so the last round's (now unsubscribed)
        // ones had time to go. Every channel must then stream from the new connection.
        let base = (round % 2) * (CHANNELS / 2);
        let per_bridge = CHANNELS / 2 / SUBSCRIBERS;
        let tasks: Vec<_> = bridges
            .into_iter()
            .enumerate()
            .map(|(j, mut b)| {
                let starts = starts.clone();
                tokio::spawn(async move {
                    let first = base + j * per_bridge;
                    let (mut sent, mut answers, mut after, mut early) = (0, 0, 0, 0);
                    let mut pending = HashSet::new();
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while answers < sent || !pending.is_empty() || sent == 0 {
                        while after < 5 && sent < per_bridge && sent - answers < DEPTH {
                            if starts.load(Ordering::SeqCst) == started {
                                early += 1;
                            } else {
                                after += 1;
                            }
                            let ch = format!("c/{}", first + sent);
                            let body = gabp_proto::message::request(
                                &gabp_client::new_id(),
                                "events/subscribe",
                                json!({ "channels": [&ch] }),
                            );
                            b.send_body(&body).await.expect("subscribe");
                            pending.insert(ch);
                            sent += 1;
                        }
                        let left = deadline.saturating_duration_since(Instant::now());
                        let m = tokio::time::timeout(left, b.next_message()).await;
                        let Ok(Ok(Some(m))) = m else {
                            panic!(
                                "round {round}: {answers} of {sent} subscribes answered; no \
                                 events on {} of the channels (their subscribe never reached \
                                 the new mod connection): {:?}",
                                pending.len(),
                                pending.iter().take(5).collect::<Vec<_>>()
                            );
                        };
                        match m["type"].as_str() {
                            Some("response") => {
                                assert!(m["error"].is_null(), "{m}");
                                answers += 1;
                            }
                            Some("event") => {
                                if let Some(ch) = m["channel"].as_str() {
                                    pending.remove(ch);
                                }
                            }
                            _ => {}
                        }
                    }
                    (b, sent, early)
                })
            })
            .collect();
        let mut subscribed = Vec::new();
        for t in tasks {
            let (b, sent, early) = t.await.expect("subscriber");
            inside += early;
            total += sent;
            subscribed.push(b);
        }
        // Closing the bridges unsubscribes their channels, so each round starts from fresh ones.
        drop(subscribed);
    }
    // The subscribes did land while the session was being set up, not only after it.
    assert!(
        inside >= ROUNDS,
        "only {inside} subscribes were sent before bridges heard the session start"
    );
    eprintln!(
        "{ROUNDS} reconnects, {} channels subscribed around them ({inside} before the start notice)",
        total
    );
    sim.stop();
}
