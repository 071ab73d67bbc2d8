//! A subscribe racing a mod reconnect under `--no-subscribe-all` reaches the new mod
//! connection. The relay publishes the new session before it collects the channels to
//! subscribe upstream (under the `upstream_channels` lock), so a bridge subscribing at any
//! moment around the reconnect either is in that collection or sends the subscribe itself.
//!
//! Driven many times: the mod's connection is killed, and from the moment the mod accepts the
//! relay's new connection (hello and welcome still under way) until after bridges are told the
//! session started, several bridges subscribe to fresh channels back to back, so subscribes
//! land before, inside and after the window. The simulated mod only emits events on channels
//! its current connection was asked for, so an event arriving on every one of those channels
//! proves each subscribe reached the new connection.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_sim::{Addr, Client, ModSim, ModSimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
const ROUNDS: usize = 16;
const SUBSCRIBERS: usize = 3;
const CHANNELS: usize = 3000;

/// Counts `relay/session` "started" notices, and events, on a bridge of its own.
async fn watch_starts(addr: &Addr) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
    let (mut c, _) = Client::connect_hello(addr, "t").await.expect("hello");
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
            token: "m".into(),
            channels,
            // Spread over every advertised channel, only subscribed ones are sent: a few
            // events a second on each.
            rate: Some(20_000.0),
            payload_bytes: 64,
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            "m",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t",
            "--no-bridge-file",
            "--no-record",
            "--no-subscribe-all",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut addr = None;
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(20), out.next_line()).await
    {
        if let Some(a) = line.split(" listening on ").nth(1) {
            addr = Some(a.split(' ').next().expect("addr").to_string());
            break;
        }
    }
    let addr: Addr = addr.expect("listen line").parse().expect("addr");
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    let (starts, watched) = watch_starts(&addr).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while watched.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no session streams to the watcher"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let mut inside = 0;
    for round in 0..ROUNDS {
        let mut bridges = Vec::new();
        for _ in 0..SUBSCRIBERS {
            bridges.push(Client::connect_hello(&addr, "t").await.expect("hello").0);
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
        let tasks: Vec<_> = bridges
            .into_iter()
            .map(|mut b| {
                let (next, starts) = (next.clone(), starts.clone());
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    let mut after = 0;
                    let mut before_start = 0;
                    // Until a few subscribes after bridges were told the session started.
                    while after < 3 && mine.len() < 200 {
                        let ch = format!("c/{}", next.fetch_add(1, Ordering::SeqCst));
                        let early = starts.load(Ordering::SeqCst) == started;
                        b.subscribe(&[&ch]).await.expect("subscribe");
                        if starts.load(Ordering::SeqCst) != started {
                            after += 1;
                        }
                        if early {
                            before_start += 1;
                        }
                        mine.push(ch);
                    }
                    (b, mine, before_start)
                })
            })
            .collect();
        let mut subscribed = Vec::new();
        for t in tasks {
            let (b, mine, early) = t.await.expect("subscriber");
            inside += early;
            subscribed.push((b, mine));
        }
        assert!(
            next.load(Ordering::SeqCst) < CHANNELS,
            "ran out of fresh channels"
        );
        // Every channel subscribed around the reconnect now streams from the new connection.
        for (b, mine) in &mut subscribed {
            let mut pending: HashSet<String> = mine.iter().cloned().collect();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !pending.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                let e = tokio::time::timeout(left, b.next_event()).await;
                let Ok(Ok(e)) = e else {
                    panic!(
                        "round {round}: no events on {} of {} channels subscribed around the \
                         reconnect (the subscribe never reached the new mod connection): {:?}",
                        pending.len(),
                        mine.len(),
                        pending.iter().take(5).collect::<Vec<_>>()
                    );
                };
                if let Some(ch) = e["channel"].as_str() {
                    pending.remove(ch);
                }
            }
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
        next.load(Ordering::SeqCst)
    );
    sim.stop();
}
