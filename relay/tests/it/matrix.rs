//! The hostile-client matrix ("close the classes"): for every connection state
//! (before hello, welcomed, subscribed, mid-request) and every misbehaviour (flood, never read,
//! half-close, trickle, garbage, huge frames, huge arrays), all at once against one relay, the
//! same three properties hold: each connection's memory stays bounded, honest bridges are
//! unaffected (their round trips measured alongside, against a generous bound), and nothing
//! secret or unbounded is written to the recording or to `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_sim::ModSimConfig;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::in_process::{
    hello_wire, quiet_mod, raw, recorded_frames, request_wire, rss_bytes, Harness,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    PreHello,
    Welcomed,
    Subscribed,
    MidRequest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misbehaviour {
    Flood,
    NeverRead,
    HalfClose,
    Trickle,
    Garbage,
    HugeFrames,
    HugeArrays,
}

const ALL: [Misbehaviour; 7] = [
    Misbehaviour::Flood,
    Misbehaviour::NeverRead,
    Misbehaviour::HalfClose,
    Misbehaviour::Trickle,
    Misbehaviour::Garbage,
    Misbehaviour::HugeFrames,
    Misbehaviour::HugeArrays,
];

/// How long each misbehaviour goes on.
const RUN: Duration = Duration::from_millis(1500);
const OUTBOX_BYTES: usize = 4 << 20;
const MAX_BODY: usize = 1 << 20;

/// A raw connection brought into `state` (it never reads what the relay sends).
async fn enter(h: &Harness, state: State) -> TcpStream {
    let mut s = raw(h).await;
    if state == State::PreHello {
        return s;
    }
    let _ = s.write_all(&hello_wire(&h.token)).await;
    if state == State::Welcomed {
        return s;
    }
    let _ = s
        .write_all(&request_wire(
            "events/subscribe",
            json!({"channels": ["a", "b"]}),
        ))
        .await;
    if state == State::MidRequest {
        let pad = "p".repeat(100 * 1024);
        let _ = s
            .write_all(&request_wire(
                "tools/call",
                json!({"name": "sim/echo", "arguments": {"pad": pad}}),
            ))
            .await;
    }
    s
}

/// Writes `bytes` until the relay stops taking them or `RUN` is over.
async fn write_for(s: &mut TcpStream, bytes: &[u8], until: Instant, sent: &AtomicU64) {
    while Instant::now() < until {
        match tokio::time::timeout_at(until.into(), s.write_all(bytes)).await {
            Ok(Ok(())) => {
                sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// Runs one misbehaviour for [`RUN`], adding what it managed to write to `sent`.
async fn misbehave(mut s: TcpStream, m: Misbehaviour, seed: u64, sent: &AtomicU64) {
    let until = Instant::now() + RUN;
    match m {
        Misbehaviour::Flood => {
            let one = request_wire("tools/list", json!({}));
            let many: Vec<u8> = one.iter().copied().cycle().take(one.len() * 256).collect();
            write_for(&mut s, &many, until, sent).await;
        }
        Misbehaviour::NeverRead => {
            tokio::time::sleep_until(until.into()).await;
        }
        Misbehaviour::HalfClose => {
            let one = request_wire("tools/list", json!({}));
            if s.write_all(&one).await.is_ok() {
                sent.fetch_add(one.len() as u64, Ordering::Relaxed);
            }
            let _ = s.shutdown().await;
            tokio::time::sleep_until(until.into()).await;
        }
        Misbehaviour::Trickle => {
            let frame = request_wire("tools/list", json!({}));
            for b in frame.iter().cycle() {
                if Instant::now() >= until || s.write_all(&[*b]).await.is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }
        Misbehaviour::Garbage => {
            // Framed garbage (error replies), then unframed garbage (a close).
            let mut x = seed | 1;
            let mut junk = vec![0u8; 64 * 1024];
            for b in junk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let framed = gabp_proto::frame_bytes(&junk[..4096]);
            let many: Vec<u8> = framed
                .iter()
                .copied()
                .cycle()
                .take(framed.len() * 64)
                .collect();
            write_for(&mut s, &many, Instant::now() + RUN / 2, sent).await;
            write_for(&mut s, &junk, until, sent).await;
        }
        Misbehaviour::HugeFrames => {
            // A body of exactly the limit (an error reply), then one over it (a close).
            let body = vec![b'x'; MAX_BODY];
            let limit = gabp_proto::frame_bytes(&body);
            if s.write_all(&limit).await.is_ok() {
                sent.fetch_add(limit.len() as u64, Ordering::Relaxed);
            }
            let _ = s
                .write_all(format!("Content-Length: {}\r\n\r\n", 64 * MAX_BODY).as_bytes())
                .await;
            write_for(&mut s, &body, until, sent).await;
        }
        Misbehaviour::HugeArrays => {
            let zeros: Vec<u8> = vec![0; 200_000];
            let channels: Vec<String> = (0..90_000).map(|i| format!("c{i}")).collect();
            let mut nested = "[".repeat(200_000);
            nested.push_str(&"]".repeat(200_000));
            let frames = [
                request_wire(
                    "tools/call",
                    json!({"name": "sim/echo", "arguments": {"a": zeros}}),
                ),
                request_wire("events/subscribe", json!({ "channels": channels })),
                gabp_proto::frame_bytes(nested.as_bytes()),
            ];
            for f in frames.iter().cycle() {
                if Instant::now() >= until {
                    break;
                }
                match tokio::time::timeout_at(until.into(), s.write_all(f)).await {
                    Ok(Ok(())) => {
                        sent.fetch_add(f.len() as u64, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Honest traffic measured while the hostile clients run: an emitter subscribed to `a`
/// (its call returns after the events it caused, so its round trip covers event delivery) and
/// a caller doing `tools/list` round trips. Returns (round trips, slowest).
async fn honest(h: &Harness, stop: Arc<AtomicBool>) -> (u64, Duration) {
    let mut emitter = h.bridge().await;
    emitter.subscribe(&["a"]).await.expect("subscribe");
    let mut caller = h.bridge().await;
    let (n, worst) = (AtomicU64::new(0), Worst::default());
    let emit = async {
        while !stop.load(Ordering::Acquire) {
            let t = Instant::now();
            emitter
                .call(
                    "tools/call",
                    json!({"name": "sim/emit", "arguments": {"count": 100, "channel": "a"}}),
                )
                .await
                .expect("honest emit");
            worst.observe(t.elapsed());
            n.fetch_add(1, Ordering::Relaxed);
            // Consume the events it caused (they came before the answer).
            for _ in 0..100 {
                emitter.next_event().await.expect("honest event");
            }
        }
    };
    let call = async {
        while !stop.load(Ordering::Acquire) {
            let t = Instant::now();
            caller
                .call("tools/list", json!({}))
                .await
                .expect("honest call");
            worst.observe(t.elapsed());
            n.fetch_add(1, Ordering::Relaxed);
        }
    };
    tokio::join!(emit, call);
    (n.load(Ordering::Relaxed), worst.get())
}

/// The slowest duration seen (nanoseconds in an atomic).
#[derive(Default)]
struct Worst(AtomicU64);

impl Worst {
    fn observe(&self, d: Duration) {
        self.0.fetch_max(d.as_nanos() as u64, Ordering::Relaxed);
    }
    fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// Checks every bridge's queues against their bounds; returns the largest seen.
fn check_bounds(h: &Harness) -> usize {
    let route = &h.relay().routes[0];
    let mut largest = 0;
    for b in route.bridges().iter() {
        let event_bytes = b.outbox.depth().event_bytes;
        let control = b.outbox.control_bytes();
        assert!(
            event_bytes <= OUTBOX_BYTES + 8192,
            "conn {} holds {event_bytes} event bytes",
            b.conn
        );
        assert!(
            control <= OUTBOX_BYTES + MAX_BODY + 8192,
            "conn {} holds {control} control bytes",
            b.conn
        );
        largest = largest.max(event_bytes + control);
    }
    let held = route.pending().bytes.used();
    assert!(
        held <= gabp_engine::pending::ROUTE_BYTES + MAX_BODY,
        "{held} request bytes held"
    );
    largest
}

async fn run_state(state: State) {
    let mod_cfg = ModSimConfig {
        payload_bytes: 4096,
        ..quiet_mod()
    };
    let h = Harness::start_with(mod_cfg, |c| {
        let r = &mut c.routes[0];
        r.write_deadline = Duration::from_millis(500);
        r.frame_timeout = Duration::from_secs(1);
        r.outbox_bytes = OUTBOX_BYTES;
        r.max_body = MAX_BODY;
    })
    .await;
    h.wait_session().await;
    let rss_before = rss_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = AtomicU64::new(0);
    let mut hostile = Vec::new();
    for (i, m) in ALL.iter().enumerate() {
        hostile.push((enter(&h, state).await, *m, i as u64 + 1));
    }
    let attack = futures::future::join_all(
        hostile
            .into_iter()
            .map(|(s, m, seed)| misbehave(s, m, seed, &sent)),
    );
    let watch = async {
        let mut largest = 0;
        while !stop.load(Ordering::Acquire) {
            largest = largest.max(check_bounds(&h));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        largest
    };
    let attack = async {
        attack.await;
        stop.store(true, Ordering::Release);
    };
    let ((), largest, (round_trips, worst)) = tokio::join!(attack, watch, honest(&h, stop.clone()));
    let grown = rss_bytes().saturating_sub(rss_before);
    eprintln!(
        "{state:?}: honest round trips {round_trips}, slowest {worst:?}; largest queue {largest} B; RSS +{} MiB",
        grown >> 20
    );
    assert!(
        round_trips >= 5,
        "honest bridges starved ({round_trips} round trips)"
    );
    assert!(
        worst < Duration::from_secs(3),
        "an honest round trip took {worst:?}"
    );
    // Every test in this process shares the RSS; the unbounded cases grew it by ~600 MiB.
    assert!(grown < 512 << 20, "RSS grew {} MiB", grown >> 20);
    let token = h.token.clone();
    let dir = h.shutdown().await;
    let frames = recorded_frames(dir.path());
    // What the bridges caused to be written: everything but the mod's own frames, whose volume
    // depends on how long the run took on a busy machine, not on what the hostile clients did.
    let bridge_bytes: usize = frames
        .iter()
        .filter(|f| f.dir != gabp_storage::Direction::ModToRelay)
        .map(|f| f.body.len())
        .sum();
    // Recording is lossless for what welcomed bridges send, so what a flood leaves on disk grows
    // with how fast the machine takes it: the bound is no amplification. Each byte a hostile
    // client got accepted is recorded at most twice (as received, and as forwarded to the mod),
    // plus the honest bridges' own calls; error replies are smaller than what caused them.
    let sent = sent.load(Ordering::Relaxed) as usize;
    eprintln!(
        "{state:?}: hostile clients wrote {sent} B; bridge traffic recorded {bridge_bytes} B"
    );
    assert!(
        bridge_bytes < 2 * sent + (16 << 20),
        "{bridge_bytes} bytes of bridge traffic recorded for {sent} bytes written"
    );
    for f in &frames {
        assert!(
            !String::from_utf8_lossy(&f.body).contains(&token),
            "token recorded"
        );
        assert!(
            !String::from_utf8_lossy(&f.body).contains("send session/hello first"),
            "pre-hello traffic recorded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_before_hello() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(module_path!(), "hostile_clients_before_hello").await
    {
        return;
    }
    run_state(State::PreHello).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_welcomed() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(module_path!(), "hostile_clients_welcomed").await {
        return;
    }
    run_state(State::Welcomed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_subscribed() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(module_path!(), "hostile_clients_subscribed").await {
        return;
    }
    run_state(State::Subscribed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_mid_request() {
    // It measures this process's memory.
    if !crate::support::alone::in_own_process(module_path!(), "hostile_clients_mid_request").await {
        return;
    }
    run_state(State::MidRequest).await;
}

/// Untrusted names never become metric labels (the one test in this process that installs
/// the metrics recorder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_labels_stay_bounded_whatever_bridges_and_mods_send() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.metrics = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let addr = h.relay().metrics_addr.expect("metrics served");
    let scrape = || async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .expect("get");
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
            .await
            .expect("read");
        out
    };
    let mut c = h.bridge().await;
    assert!(c.call("tools/list", json!({})).await.is_ok());
    let before = scrape().await.lines().count();
    // 500 distinct unknown methods (each used to add ~21 lines), and channels with escape
    // sequences, control characters and absurd lengths from the mod.
    for i in 0..500 {
        let r = c
            .request(&format!("junk/m{i}"), json!({}))
            .await
            .expect("answer");
        assert!(r.get("error").is_some());
    }
    let long = "x".repeat(5000);
    for ch in ["bad\u{1b}[31m\r\nname\0", long.as_str(), "ok/channel"] {
        crate::support::in_process::emit(&mut c, ch, 1).await;
    }
    for i in 0..300 {
        crate::support::in_process::emit(&mut c, &format!("many/{i}"), 1).await;
    }
    let text = scrape().await;
    let after = text.lines().count();
    assert!(
        !text.contains("junk/m"),
        "bridge-chosen method names in labels"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\0'),
        "control characters in labels"
    );
    assert!(!text.contains(&long), "a 5,000-character label");
    assert!(text.contains("gabp_unauthenticated_frames_total"));
    // Generous: 256 channel labels plus `other`, a few lines each.
    assert!(
        after - before < 1500,
        "/metrics grew from {before} to {after} lines"
    );
    h.shutdown().await;
}
