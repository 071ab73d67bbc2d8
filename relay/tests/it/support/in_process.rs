//! Starts a simulated mod and a relay in front of it, both on 127.0.0.1 port 0, recording to a
//! temporary data dir. Everything started here stops when the harness is dropped or shut down.

use std::time::Duration;

use gabp_client::Client;
use gabp_engine::{Relay, RelayConfig, RouteConfig, Upstream};
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

pub use super::MOD_TOKEN;

pub struct Harness {
    pub sim: ModSim,
    pub relay: Option<Relay>,
    pub addr: Addr,
    pub token: String,
    pub dir: tempfile::TempDir,
}

pub fn loopback() -> Addr {
    "127.0.0.1:0".parse().expect("literal address")
}

/// A mod that only emits when asked (`sim/emit`), so tests control every event.
pub fn quiet_mod() -> ModSimConfig {
    ModSimConfig {
        token: MOD_TOKEN.into(),
        autostart: false,
        channels: vec!["a".into(), "b".into(), "world/tick".into()],
        ..ModSimConfig::default()
    }
}

pub fn relay_config(route: RouteConfig, dir: &std::path::Path) -> RelayConfig {
    RelayConfig::new(vec![route], dir.to_path_buf())
}

impl Harness {
    pub async fn start(mod_cfg: ModSimConfig) -> Harness {
        Harness::start_with(mod_cfg, |_| {}).await
    }

    pub async fn start_with(
        mod_cfg: ModSimConfig,
        tweak: impl FnOnce(&mut RelayConfig),
    ) -> Harness {
        // Relay logs show up in a failing test's output (GABP_LOG=debug for more).
        gabp_rt::log::init_for_tests();
        let sim = ModSim::start(&loopback(), mod_cfg).expect("start simulated mod");
        let dir = tempfile::tempdir().expect("tempdir");
        let token = gabp_engine::generate_token();
        let mut route = RouteConfig::new(
            "test",
            Upstream::Addr(sim.addr().clone()),
            loopback(),
            token.clone(),
        );
        route.upstream_token = MOD_TOKEN.into();
        route.hello_wait = Duration::from_secs(5);
        let mut cfg = relay_config(route, dir.path());
        tweak(&mut cfg);
        let relay = Relay::start(cfg).await.expect("start relay");
        let addr = relay.addrs[0].clone();
        Harness {
            sim,
            relay: Some(relay),
            addr,
            token,
            dir,
        }
    }

    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("relay running")
    }

    /// A bridge that has said hello.
    pub async fn bridge(&self) -> Client {
        Client::connect_hello(&self.addr, &self.token)
            .await
            .expect("bridge hello")
            .0
    }

    /// Waits (bounded) until the relay has a session with the mod.
    pub async fn wait_session(&self) -> String {
        let mut rx = self.relay().routes[0].sessions();
        let s = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.is_some()))
            .await
            .expect("session within 10s")
            .expect("watch open");
        s.as_ref().expect("some").id.to_string()
    }

    /// Waits (bounded) for a session other than `old`.
    pub async fn wait_new_session(&self, old: &str) -> String {
        let mut rx = self.relay().routes[0].sessions();
        let s = tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| s.as_ref().is_some_and(|s| s.id.to_string() != old)),
        )
        .await
        .expect("new session within 10s")
        .expect("watch open");
        s.as_ref().expect("some").id.to_string()
    }

    pub async fn shutdown(mut self) -> tempfile::TempDir {
        if let Some(r) = self.relay.take() {
            assert!(r.shutdown().await, "relay shut down within its bound");
        }
        self.sim.stop();
        self.dir
    }
}

/// Asks the simulated mod (through the relay) to emit `count` events on `channel`.
pub async fn emit(c: &mut Client, channel: &str, count: u64) {
    let r = c.call("tools/call", serde_json::json!({"name": "sim/emit", "arguments": {"count": count, "channel": channel}})).await.expect("emit");
    assert_eq!(r["emitted"], count);
}

pub fn error_code(resp: &Value) -> i64 {
    resp["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error response, got {resp}"))
}

/// Waits (bounded) until the relay's pending-request table is or is not empty. The table has
/// no change notification, so this yields between checks rather than sleeping.
pub async fn wait_pending(h: &Harness, empty: bool, what: &str) {
    let route = &h.relay().routes[0];
    tokio::time::timeout(Duration::from_secs(5), async {
        while route.pending().is_empty() != empty {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within 5 s"));
}

/// The relay's TCP address.
pub fn tcp_addr(h: &Harness) -> std::net::SocketAddr {
    match &h.addr {
        gabp_sim::Addr::Tcp(a) => *a,
        other => panic!("expected a TCP listener, got {other}"),
    }
}

/// A raw TCP connection to the relay (no hello): for peers that misbehave at the byte level.
pub async fn raw(h: &Harness) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(tcp_addr(h))
        .await
        .expect("connect")
}

/// A framed request.
pub fn request_wire(method: &str, params: Value) -> bytes::Bytes {
    gabp_proto::frame_bytes(&gabp_proto::message::request(
        &gabp_client::new_id(),
        method,
        params,
    ))
}

/// A framed, valid `session/hello`.
pub fn hello_wire(token: &str) -> bytes::Bytes {
    request_wire(
        "session/hello",
        serde_json::json!({"token": token, "bridgeVersion": "hostile/1", "platform": "linux", "launchId": "l"}),
    )
}

/// Waits (bounded) until `cond` holds, checking every few milliseconds.
pub async fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The connection numbers of the bridges the relay lists in `relay/status`.
pub fn listed(h: &Harness) -> Vec<u64> {
    h.relay().routes[0].status()["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .filter_map(|b| b["conn"].as_u64())
        .collect()
}

/// Reads and discards what the peer sends until the connection ends; returns how it ended
/// (`Ok(bytes)` for an orderly close, the error for a reset).
pub async fn drain_until_closed(
    s: &mut tokio::net::TcpStream,
    within: Duration,
) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(total),
                Ok(n) => total += n,
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("connection still open after {within:?}"))
}

/// Every frame of every recorded session in `dir`, after the relay has shut down.
pub fn recorded_frames(dir: &std::path::Path) -> Vec<gabp_storage::FrameRecord> {
    let store = gabp_storage::Store::open(dir, gabp_storage::StoreOptions::default())
        .expect("open the recording");
    let mut out = Vec::new();
    for meta in store.sessions().expect("sessions") {
        for item in store.frames(meta.id) {
            out.push(item.expect("frame").1);
        }
    }
    out
}

/// Every session of `dir` exported as JSONL, concatenated.
pub fn exported(dir: &std::path::Path) -> Vec<u8> {
    let store = gabp_storage::Store::open(dir, gabp_storage::StoreOptions::default())
        .expect("open the recording");
    let mut out = Vec::new();
    for meta in store.sessions().expect("sessions") {
        gabp_analysis::export::export(
            &store,
            &meta,
            &gabp_analysis::export::ExportFilter::default(),
            &mut out,
        )
        .expect("export");
    }
    out
}

/// Files under `dir` (RocksDB's SSTs, WAL, MANIFEST, logs) whose raw bytes contain `needle`.
pub fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(path);
                }
            }
        }
    }
    hits
}

/// Time the current runtime's workers (this test's relay and clients) have spent busy; other
/// tests running in the same process have runtimes of their own.
pub fn runtime_busy() -> Duration {
    let m = tokio::runtime::Handle::current().metrics();
    (0..m.num_workers())
        .map(|w| m.worker_total_busy_duration(w))
        .sum()
}

/// This process's resident memory.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// Events of 4 KiB, so a few thousand fill any socket's buffers.
pub fn big_mod() -> ModSimConfig {
    ModSimConfig {
        payload_bytes: 4096,
        ..quiet_mod()
    }
}

/// A hostile bridge on a raw socket: hello, subscribe to `a`, then it never reads.
pub async fn deaf_subscriber(h: &Harness) -> (tokio::net::TcpStream, u64) {
    let before = listed(h);
    let mut s = raw(h).await;
    s.write_all(&hello_wire(&h.token)).await.expect("hello");
    s.write_all(&request_wire(
        "events/subscribe",
        json!({"channels": ["a"]}),
    ))
    .await
    .expect("subscribe");
    let route = &h.relay().routes[0];
    let mut conn = 0;
    wait_until(
        "the deaf bridge subscribed",
        Duration::from_secs(10),
        || {
            let st = route.status();
            let found = st["bridges"].as_array().expect("bridges").iter().find(|b| {
                !before.contains(&b["conn"].as_u64().unwrap_or(0))
                    && b["subscriptions"].as_array().is_some_and(|s| !s.is_empty())
            });
            if let Some(b) = found {
                conn = b["conn"].as_u64().expect("conn");
            }
            found.is_some()
        },
    )
    .await;
    (s, conn)
}
