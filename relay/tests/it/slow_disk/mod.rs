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

mod rig;
mod slowfs;

use rig::*;

/// The cells run one at a time: each pushes a third of a GiB through the relay.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs one cell of the matrix: slow disk under `policy`, the recorder's queue bounded by
/// `queue` (`--record-queue`) or by default.
async fn slow_disk(policy: &str, queue: Option<(&str, f64)>) {
    let _one_at_a_time = SERIAL.lock().await;
    let budget = queue.map_or(QUEUE_BUDGET, |q| q.1);
    // What the mod has sent but is not recorded also sits outside the queue: in the sockets'
    // kernel buffers and the reader's batch (tens of MiB at most, measured 5–28 MiB).
    let held_most = (1.3 * budget).max(budget + 40.0 * 1048576.0);
    let Some(rig) = start(policy, queue.map(|q| q.0)).await else {
        return;
    };
    let honest = reader(&rig.listen).await;
    let mut watchers = Vec::new();
    for _ in 0..3 {
        watchers.push(
            Client::connect_hello(&rig.listen, BRIDGE_TOKEN)
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
                if since.elapsed() > Duration::from_secs(2) && b > 0.5 * budget {
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
        backlog > 0.8 * budget && backlog < held_most,
        "backlog when held: {:.0} MiB (queue budget {:.0} MiB)",
        backlog / 1048576.0,
        budget / 1048576.0
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
        // What a crash now would leave unrecorded is shown: about the queue's budget.
        let lag = s["recorderLagBytes"].as_f64().unwrap_or(0.0);
        assert!(
            lag > 0.5 * budget && lag <= budget,
            "recorderLagBytes {lag} while held at the budget"
        );
    }
    // A bridge joining now: its hello is recorded before it is welcomed, so it waits for
    // room in the recorder queue; measured, and it must be welcomed once the disk speeds up.
    let listen = rig.listen.clone();
    let late = tokio::spawn(async move {
        let t = Instant::now();
        let c = Client::connect_hello(&listen, BRIDGE_TOKEN)
            .await
            .map(|(c, _)| c);
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
        rig.sim.emitted() < EVENTS && now_backlog < held_most,
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
        "the honest bridge lost events silently: {} received, {} announced dropped, {} before \
         it subscribed; the mod accepted {} connections",
        honest.received.load(Ordering::Relaxed),
        honest.announced_dropped.load(Ordering::Relaxed),
        honest.before_subscribing.load(Ordering::Relaxed),
        rig.sim.accepted()
    );
    eprintln!(
        "{policy}: the honest bridge received {} events ({} announced dropped, {} before it \
         subscribed)",
        honest.received.load(Ordering::Relaxed),
        honest.announced_dropped.load(Ordering::Relaxed),
        honest.before_subscribing.load(Ordering::Relaxed)
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
    let lost = check["sessions"][0]["lostFrames"].as_u64().expect("lost");
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
    slow_disk("stall", None).await;
}

/// `--record-queue` bounds what the relay holds for the recorder, and so what a crash could
/// leave out of the recording: the mod is held at that bound, not at the default's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_disk_with_a_smaller_record_queue_holds_the_mod_at_that_bound() {
    slow_disk("stall", Some(("64MiB", 64.0 * 1024.0 * 1024.0))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_disk_under_continue_holds_the_mod_too_and_any_loss_is_an_announced_gap() {
    slow_disk("continue", None).await;
}
