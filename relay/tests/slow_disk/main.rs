//! The recorder fault matrix's "slow disk" cell, under both `--on-record-error` policies, on a
//! real slow disk: the data dir is on a FUSE passthrough file system (served by this test
//! process, `slowfs`) whose writes cost their bytes over a small bandwidth and whose fsyncs
//! cost 40 ms, while the simulated mod sends far faster than that. A slow disk is not a failing
//! one, so under either policy the recorder queue fills to its bound and then holds the mod (the
//! lossless backpressure); honest bridges keep receiving and are answered meanwhile; once the
//! disk speeds up everything is recorded: `sessions check` passes and the export holds every
//! event the mod sent, frame for frame. Under `continue` any loss would have to be an announced
//! gap; the test checks that accounting and that, with no write failing, there is none.
//!
//! Mounting needs root and /dev/fuse, which CI and the development machines have. Without them
//! the tests fail as root (something is wrong) and print a loud SKIPPED otherwise.

mod slowfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_sim::{Client, ModSim, ModSimConfig};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
/// Event body size: large, so the recorder's 256 MiB byte budget is the queue bound reached.
const PAYLOAD: usize = 4096;
/// Events the mod sends in all: about 1.25 times the queue's byte budget.
const EVENTS: u64 = 80_000;
/// What the relay may hold for the recorder: its byte budget (recorder::BUDGET_KIB).
const QUEUE_BUDGET: f64 = 256.0 * 1024.0 * 1024.0;
/// The slow disk: 2 MiB/s and 40 ms per fsync.
const SLOW_BW: u64 = 2 << 20;
const SLOW_FSYNC: Duration = Duration::from_millis(40);

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

async fn metric(addr: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("response");
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `f` until it holds, within `secs`.
async fn until<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(BIN).args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("finished")
    .expect("ran")
}

/// A bridge that reads every event, checking each channel's seqs only grow, and counting the
/// events the relay announced it dropped for it (`relay/dropped`), if it fell behind.
struct Reader {
    received: Arc<AtomicU64>,
    announced_dropped: Arc<AtomicU64>,
    disordered: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// Events accounted for: received or announced dropped.
    fn seen(&self) -> u64 {
        self.received.load(Ordering::Relaxed) + self.announced_dropped.load(Ordering::Relaxed)
    }
}

async fn reader(addr: &gabp_sim::Addr) -> Reader {
    let (mut c, _) = Client::connect_hello(addr, "t").await.expect("hello");
    // While the mod is held no event may come for a while: that is not the end.
    c.set_wait(Duration::from_secs(600));
    c.subscribe(&["world/tick", "player/move", "chat/message"])
        .await
        .expect("subscribe");
    let received = Arc::new(AtomicU64::new(0));
    let announced_dropped = Arc::new(AtomicU64::new(0));
    let disordered = Arc::new(AtomicBool::new(false));
    let (r, a, d) = (
        received.clone(),
        announced_dropped.clone(),
        disordered.clone(),
    );
    let task = tokio::spawn(async move {
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        while let Ok(e) = c.next_event().await {
            if e["channel"] == "relay/dropped" {
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
        disordered,
        task,
    }
}

struct Rig {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    disk: slowfs::Mounted,
    data: PathBuf,
    sim: ModSim,
    child: Child,
    metrics: String,
    listen: gabp_sim::Addr,
    stderr: tokio::task::JoinHandle<String>,
}

/// Mounts the slow disk (already slow) and starts the mod and the relay recording onto it.
async fn start(policy: &str) -> Option<Rig> {
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
            token: "m".into(),
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
            "m",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t",
            "--no-bridge-file",
            "--metrics",
            "127.0.0.1:0",
            "--on-record-error",
            policy,
            "--data-dir",
        ])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut metrics, mut listen) = (None, None);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
    {
        if let Some(m) = line.strip_prefix("metrics on http://") {
            metrics = Some(m.trim_end_matches("/metrics").to_string());
        }
        if let Some(a) = line.split(" listening on ").nth(1) {
            listen = Some(a.split(' ').next().expect("addr").to_string());
        }
        if line.starts_with("recording") {
            break;
        }
    }
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let stderr = tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(l)) = err.next_line().await {
            all += &l;
            all.push('\n');
        }
        all
    });
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

/// The mod's seqs per channel in the recording, from `export`.
async fn recorded_seqs(data: &Path) -> BTreeMap<String, Vec<u64>> {
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seqs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).expect("jsonl");
        if v["dir"] == "mod->relay" {
            if let (Some(ch), Some(seq)) = (v["channel"].as_str(), v["mod_seq"].as_u64()) {
                assert_eq!(v["msg"]["seq"].as_u64(), Some(seq));
                seqs.entry(ch.to_string()).or_default().push(seq);
            }
        }
    }
    seqs
}

/// Bytes one event takes in the recorder's budget (its body, which the mod pads to PAYLOAD).
fn frame_bytes() -> f64 {
    PAYLOAD as f64
}

/// The cells run one at a time: each pushes a third of a GiB through the relay.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs one cell of the matrix: slow disk under `policy`.
async fn slow_disk(policy: &str) {
    let _one_at_a_time = SERIAL.lock().await;
    let Some(rig) = start(policy).await else {
        return;
    };
    let honest = reader(&rig.listen).await;
    let mut watchers = Vec::new();
    for _ in 0..3 {
        watchers.push(
            Client::connect_hello(&rig.listen, "t")
                .await
                .expect("hello")
                .0,
        );
    }
    let m = rig.metrics.clone();
    let recorded = || {
        let m = m.clone();
        async move { metric(&m, "gabp_recorded_frames_total").await }
    };

    // 1. The queue fills to its bound, then the mod is held: what it has sent stops running
    //    ahead of what is recorded, far short of everything.
    let t0 = Instant::now();
    let mut plateau: Option<(f64, Instant)> = None;
    let backlog = loop {
        let emitted = rig.sim.emitted() as f64;
        let b = (emitted - recorded().await) * frame_bytes();
        match plateau {
            // Held: the backlog has stopped growing (within 4 MiB) for two seconds.
            Some((at, since)) if (b - at).abs() < 4.0 * 1048576.0 => {
                if since.elapsed() > Duration::from_secs(2) && b > 0.5 * QUEUE_BUDGET {
                    break b;
                }
            }
            _ => plateau = Some((b, Instant::now())),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the recorder queue never filled and held the mod: backlog {:.0} MiB",
            b / 1048576.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let held_at = Instant::now();
    let emitted_held = rig.sim.emitted();
    assert!(
        emitted_held < EVENTS,
        "the mod finished: the slow disk never held it"
    );
    // The bound that held it is the recorder's byte budget, not a smaller one nor none.
    assert!(
        backlog > 0.8 * QUEUE_BUDGET && backlog < 1.3 * QUEUE_BUDGET,
        "backlog when held: {:.0} MiB (queue budget 256 MiB)",
        backlog / 1048576.0
    );
    eprintln!(
        "{policy}: held after {:?} with {:.0} MiB queued, {} of {EVENTS} events sent",
        held_at - t0,
        backlog / 1048576.0,
        emitted_held
    );

    // 2. While held, honest bridges keep receiving and their status requests are answered
    //    (a bridge's reader waits for the recorder like the mod's, so each bridge gets one
    //    answer before its own request must be recorded; its output never waits).
    let mut worst = Duration::ZERO;
    for (i, b) in watchers.iter_mut().enumerate() {
        let t = Instant::now();
        let s = tokio::time::timeout(Duration::from_secs(5), b.call("relay/status", json!({})))
            .await
            .unwrap_or_else(|_| panic!("relay/status {i} unanswered while the mod is held"))
            .expect("status");
        worst = worst.max(t.elapsed());
        assert_eq!(s["session"]["state"], "connected", "{s}");
        // Slow is not failing: the recorder reports itself healthy throughout.
        assert_eq!(s["recorderHealth"]["ok"], true, "{s}");
    }
    // A bridge joining now: its hello is recorded before it is welcomed, so it waits for
    // room in the recorder queue; measured, and it must be welcomed once the disk speeds up.
    let listen = rig.listen.clone();
    let late = tokio::spawn(async move {
        let t = Instant::now();
        let c = Client::connect_hello(&listen, "t").await.map(|(c, _)| c);
        (c, t.elapsed())
    });
    // The recorder holds the route, never a bridge's output: every event the relay has read
    // reaches the honest bridge (or is announced dropped to it) while the mod is held.
    until(
        30,
        "the honest bridge gets every event the relay read",
        || {
            let m = m.clone();
            let seen = honest.seen();
            async move { seen as f64 >= metric(&m, "gabp_events_total").await }
        },
    )
    .await;
    // Still held at the bound: the mod advances only as the slow disk takes frames.
    let now_backlog = (rig.sim.emitted() as f64 - recorded().await) * frame_bytes();
    assert!(
        rig.sim.emitted() < EVENTS && now_backlog < 1.3 * QUEUE_BUDGET,
        "the mod was not held: {:.0} MiB queued",
        now_backlog / 1048576.0
    );
    assert!(
        worst < Duration::from_secs(2),
        "relay/status took {worst:?}"
    );
    eprintln!(
        "{policy}: while held: {:.0} MiB queued, worst relay/status {worst:?}",
        now_backlog / 1048576.0
    );

    // 3. The disk speeds up (fsyncs still cost 20 ms): everything gets recorded.
    rig.disk.dev.set(0, Duration::from_millis(20));
    let (late, join) = tokio::time::timeout(Duration::from_secs(120), late)
        .await
        .expect("the late bridge is welcomed once the disk speeds up")
        .expect("late");
    late.expect("late hello");
    eprintln!("{policy}: a bridge joining while the mod was held waited {join:?} for its welcome");
    until(180, "the mod finishes", || {
        let n = rig.sim.emitted();
        async move { n == EVENTS }
    })
    .await;
    until(180, "every event is recorded", || {
        let rec = recorded();
        async move { rec.await >= EVENTS as f64 }
    })
    .await;
    until(60, "the honest bridge got the tail", || {
        let n = honest.seen();
        async move { n >= EVENTS }
    })
    .await;
    assert!(
        !honest.disordered.load(Ordering::Relaxed),
        "the honest bridge saw seqs out of order"
    );
    assert_eq!(
        honest.seen(),
        EVENTS,
        "the honest bridge lost events silently: {} received, {} announced dropped; the mod \
         accepted {} connections",
        honest.received.load(Ordering::Relaxed),
        honest.announced_dropped.load(Ordering::Relaxed),
        rig.sim.accepted()
    );
    eprintln!(
        "{policy}: the honest bridge received {} events ({} announced dropped)",
        honest.received.load(Ordering::Relaxed),
        honest.announced_dropped.load(Ordering::Relaxed)
    );
    let errors = metric(&rig.metrics, "gabp_record_errors_total").await;
    let lost_metric = metric(&rig.metrics, "gabp_record_lost_frames_total").await;
    honest.task.abort();

    let Rig {
        mut child,
        data,
        stderr,
        disk,
        sim,
        _dirs: dirs,
        ..
    } = rig;
    let pid = child.id().expect("running").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("exits")
        .expect("status");
    let stderr = stderr.await.expect("stderr");
    assert_eq!(status.code(), Some(0), "{stderr}");
    sim.stop();

    // 4. `sessions check` and the export, frame for frame, against what the mod sent.
    let out = run(&[
        "sessions",
        "check",
        "--json",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(0), "{check}");
    let lost = check["sessions"][0]["lost_frames"].as_u64().expect("lost");
    let gaps = check["sessions"][0]["gaps"].as_u64().expect("gaps");
    let seqs = recorded_seqs(&data).await;
    let total: u64 = seqs.values().map(|v| v.len() as u64).sum();
    let mut missing = 0;
    for (ch, v) in &seqs {
        assert!(v.windows(2).all(|w| w[0] < w[1]), "channel {ch} in order");
        missing += v.last().map_or(0, |l| l + 1) - v.len() as u64;
    }
    // Whatever the policy: what is recorded plus what is announced lost is what was sent, and
    // the only holes are announced ones.
    assert_eq!(total + lost, EVENTS, "recorded + announced lost = sent");
    assert_eq!(missing, lost, "every hole is an announced gap");
    assert_eq!(gaps > 0, lost > 0, "{check}");
    assert_eq!(lost as f64, lost_metric);
    // And a slow disk is not a failing one: no write failed, so nothing was lost.
    assert_eq!(errors, 0.0, "{stderr}");
    assert_eq!(lost, 0, "{check}");
    for (ch, v) in &seqs {
        assert_eq!(*v, (0..v.len() as u64).collect::<Vec<_>>(), "channel {ch}");
    }
    eprintln!(
        "{policy}: disk wrote {} MiB, {} fsyncs, {:.1} s of delay",
        disk.dev.written.load(Ordering::Relaxed) >> 20,
        disk.dev.fsyncs.load(Ordering::Relaxed),
        disk.dev.delayed_us.load(Ordering::Relaxed) as f64 / 1e6
    );
    // Unmount before the mount point and the backing dir are removed.
    drop(disk);
    drop(dirs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_disk_under_stall_holds_the_mod_at_the_queue_bound_and_loses_nothing() {
    slow_disk("stall").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_disk_under_continue_holds_the_mod_too_and_any_loss_is_an_announced_gap() {
    slow_disk("continue").await;
}
