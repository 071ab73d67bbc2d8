//! The slow-disk rig: the matrix cell's sizes, the slow disk mounted under a data dir, the mod
//! and the relay recording onto it, a bridge that checks and counts what it reads, metrics,
//! bounded polls and the recording's seqs from `export`.
#![allow(unused_imports)]

pub use std::collections::BTreeMap;
pub use std::path::{Path, PathBuf};
pub use std::process::Stdio;
pub use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

pub use gabp_client::Client;
pub use gabp_sim::{ModSim, ModSimConfig};
pub use serde_json::json;
pub use tokio::io::{AsyncBufReadExt, BufReader};
pub use tokio::process::{Child, Command};

use super::slowfs;

pub use crate::support::faults::{
    is_root, metric, recorded_seqs, run, start_up, stderr_text, until_async as until,
};
pub use crate::support::{BIN, BRIDGE_TOKEN, MOD_TOKEN};

/// Event body size: large, so the recorder's 256 MiB byte budget is the queue bound reached.
pub const PAYLOAD: usize = 4096;
/// Events the mod sends in all: about 1.25 times the queue's byte budget.
pub const EVENTS: u64 = 80_000;
/// What the relay may hold for the recorder by default: its byte budget
/// (recorder::DEFAULT_BUDGET, `--record-queue`).
pub const QUEUE_BUDGET: f64 = 256.0 * 1024.0 * 1024.0;
/// The slow disk: 2 MiB/s and 40 ms per fsync.
pub const SLOW_BW: u64 = 2 << 20;
pub const SLOW_FSYNC: Duration = Duration::from_millis(40);

/// A bridge that reads every event, checking each channel's seqs only grow, and counting the
/// events the relay announced it dropped for it (`relay/dropped`), if it fell behind.
pub struct Reader {
    pub received: Arc<AtomicU64>,
    pub announced_dropped: Arc<AtomicU64>,
    /// Events published before this bridge subscribed: the relay numbers each channel from 0,
    /// so the first seq seen on a channel (event or drop notice) counts those it never got.
    pub before_subscribing: Arc<AtomicU64>,
    pub disordered: Arc<AtomicBool>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// Events accounted for: received, announced dropped, or published before it subscribed
    /// (with subscribe-all the mod streams from the session's start, and a bridge gets what is
    /// published after its subscription).
    pub fn seen(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
            + self.announced_dropped.load(Ordering::Relaxed)
            + self.before_subscribing.load(Ordering::Relaxed)
    }
}

pub async fn reader(addr: &gabp_sim::Addr) -> Reader {
    let (mut c, _) = Client::connect_hello(addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    // While the mod is held no event may come for a while: that is not the end.
    c.set_wait(Duration::from_secs(600));
    c.subscribe(&["world/tick", "player/move", "chat/message"])
        .await
        .expect("subscribe");
    let received = Arc::new(AtomicU64::new(0));
    let announced_dropped = Arc::new(AtomicU64::new(0));
    let before_subscribing = Arc::new(AtomicU64::new(0));
    let disordered = Arc::new(AtomicBool::new(false));
    let (r, a, b, d) = (
        received.clone(),
        announced_dropped.clone(),
        before_subscribing.clone(),
        disordered.clone(),
    );
    let task = tokio::spawn(async move {
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        let mut first_seen = std::collections::BTreeSet::new();
        let mut first = |ch: &str, seq: Option<u64>| {
            if let Some(seq) = seq {
                if first_seen.insert(ch.to_string()) {
                    b.fetch_add(seq, Ordering::Relaxed);
                }
            }
        };
        while let Ok(e) = c.next_event().await {
            if e["channel"] == "relay/dropped" {
                if let Some(ch) = e["payload"]["channel"].as_str() {
                    first(ch, e["payload"]["fromSeq"].as_u64());
                }
                a.fetch_add(
                    e["payload"]["count"].as_u64().unwrap_or(0),
                    Ordering::Relaxed,
                );
                continue;
            }
            // The relay's own notices (relay/session, ...) are not the mod's events.
            if e["channel"]
                .as_str()
                .is_some_and(|c| c.starts_with("relay/"))
            {
                continue;
            }
            if let (Some(ch), Some(seq)) = (e["channel"].as_str(), e["seq"].as_u64()) {
                first(ch, Some(seq));
                if last.insert(ch.to_string(), seq).is_some_and(|p| p >= seq) {
                    d.store(true, Ordering::Relaxed);
                }
                r.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Reader {
        received,
        announced_dropped,
        before_subscribing,
        disordered,
        task,
    }
}

pub struct Rig {
    pub _dirs: (tempfile::TempDir, tempfile::TempDir),
    pub disk: slowfs::Mounted,
    pub data: PathBuf,
    pub sim: ModSim,
    pub child: Child,
    pub metrics: String,
    pub listen: gabp_sim::Addr,
    pub stderr: tokio::task::JoinHandle<String>,
}

/// Mounts the slow disk (already slow) and starts the mod and the relay recording onto it,
/// with `--record-queue` set when `queue` is.
pub async fn start(policy: &str, queue: Option<&str>) -> Option<Rig> {
    let backing = tempfile::tempdir().expect("tempdir");
    let mnt = tempfile::tempdir().expect("tempdir");
    let disk = match slowfs::mount(backing.path(), mnt.path()) {
        Ok(d) => d,
        Err(e) => {
            assert!(
                !is_root(),
                "cannot mount the FUSE slow disk although running as root: {e}"
            );
            eprintln!("SKIPPED: cannot mount a FUSE file system ({e}): slow-disk tests NOT RUN");
            return None;
        }
    };
    // The mount answers before the relay touches it.
    assert!(
        std::fs::read_dir(mnt.path()).is_ok(),
        "the slow disk is mounted"
    );
    disk.dev.set(SLOW_BW, SLOW_FSYNC);
    let data = mnt.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(12_000.0),
            payload_bytes: PAYLOAD,
            max_events: Some(EVENTS),
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
            MOD_TOKEN,
            "--listen",
            "127.0.0.1:0",
            "--token",
            BRIDGE_TOKEN,
            "--no-bridge-file",
            "--metrics",
            "127.0.0.1:0",
            "--on-record-error",
            policy,
            // Plain chunks: the disk's speed above is set against what the recorder writes
            // uncompressed (LZ4 chunks would let it keep up and never reach the queue bound).
            "--compression",
            "none",
            "--data-dir",
        ])
        .arg(&data)
        .args(queue.map(|q| ["--record-queue", q]).into_iter().flatten())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let up = start_up(&mut child, false).await;
    let (metrics, listen) = (up.metrics, up.listen);
    let stderr = stderr_text(&mut child);
    let (Some(metrics), Some(listen)) = (metrics, listen) else {
        let _ = child.start_kill();
        let _ = child.wait().await;
        panic!(
            "the relay did not start on the slow disk: {}",
            stderr.await.expect("stderr")
        );
    };
    Some(Rig {
        _dirs: (backing, mnt),
        disk,
        data,
        sim,
        child,
        metrics,
        listen: listen.parse().expect("listen addr"),
        stderr,
    })
}

/// Bytes one event takes in the recorder's budget (its body, which the mod pads to PAYLOAD).
pub fn frame_bytes() -> f64 {
    PAYLOAD as f64
}
