//! Signals and resource pressure through the real binary: SIGHUP keeps serving, every stop
//! signal ends cleanly, replay backs off when out of descriptors.

use crate::support::*;

#[tokio::test]
async fn sighup_keeps_serving_and_every_stop_signal_ends_cleanly() {
    let sim = start_mod(Some(1000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf8");
    for stop in ["TERM", "INT"] {
        let bridge_file = dir.path().join(format!("bridge-{stop}.json"));
        let mut child = relay()
            .args(["serve", "--upstream", &sim.addr().to_string()])
            .args(["--upstream-token", MOD_TOKEN, "--listen", "127.0.0.1:0"])
            .args([
                "--token",
                BRIDGE_TOKEN,
                "--data-dir",
                data,
                "--shutdown-timeout",
                "5s",
            ])
            .args(["--bridge-file", bridge_file.to_str().expect("utf8")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let log = collect_stderr(&mut child);
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let addr: Addr = line_with(&mut lines, " listening on ")
            .await
            .split(" listening on ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .expect("address")
            .parse()
            .expect("addr");
        line_with(&mut lines, "recording to").await;
        assert!(bridge_file.exists());
        let (mut c, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        c.subscribe(&["world/tick"]).await.expect("subscribe");
        c.next_event().await.expect("event");
        signal(&child, "HUP");
        // SIGHUP reloads the bridge identities; with no config file there is nothing to
        // re-read, and the log says so (the relay goes on serving).
        until("the SIGHUP's reload is logged", || {
            log.lock()
                .contains("reload: the relay was started without --config")
        })
        .await;
        assert!(
            child.try_wait().expect("poll").is_none(),
            "alive after SIGHUP"
        );
        for _ in 0..50 {
            tokio::time::timeout(Duration::from_secs(10), c.next_event())
                .await
                .expect("still relaying after SIGHUP")
                .expect("event");
        }
        assert!(bridge_file.exists(), "discovery file kept while serving");
        signal(&child, stop);
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("exits within the shutdown bound")
            .expect("status");
        assert_eq!(status.code(), Some(0), "SIG{stop}: {}", log.lock());
        assert!(
            !bridge_file.exists(),
            "SIG{stop} removed the discovery file"
        );
    }
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let sessions = v["sessions"].as_array().expect("list");
    assert_eq!(sessions.len(), 2);
    for s in sessions {
        assert_eq!(s["end"], "relay_shutdown", "{s}");
    }
    // A reader that closes the pipe early ends the command quietly (no panic, exit 0).
    for args in [&["sessions", "--data-dir", data][..], &["token"]] {
        let mut child = relay()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("exits")
            .expect("output");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    sim.stop();
}

#[tokio::test]
async fn replay_backs_off_when_out_of_descriptors() {
    // A short recording to replay.
    let sim = start_mod(Some(2000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--data-dir",
        data,
    ])
    .await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..20 {
        c.next_event().await.expect("event");
    }
    drop(c);
    s.stop_cleanly().await;
    sim.stop();
    // The replay gets few descriptors; the test then holds every one it could accept.
    let mut child = Command::new("prlimit")
        .args([
            "--nofile=40:40",
            "--",
            BIN,
            "replay",
            "latest",
            "--data-dir",
            data,
        ])
        .args(["--listen", "127.0.0.1:0", "--token", BRIDGE_TOKEN])
        .env_remove("GABP_RELAY_DATA_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn replay under prlimit");
    let log = collect_stderr(&mut child);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr: Addr = line_with(&mut lines, "replaying session")
        .await
        .rsplit(" on ")
        .next()
        .expect("address")
        .parse()
        .expect("addr");
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(
            Client::connect(&addr)
                .await
                .expect("connect (queued at worst)"),
        );
    }
    until("the replay runs out of descriptors", || {
        log.lock().contains("cannot accept")
    })
    .await;
    // A rate over a fixed window: the process must idle, not spin on the failing accept.
    let pid = child.id().expect("running");
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks(pid) - before;
    eprintln!("replay out of descriptors: {used} CPU ticks in 1 s");
    assert!(
        used < 30,
        "the replay used {used} ticks of CPU in 1 s while out of descriptors"
    );
    assert_eq!(
        log.lock().matches("cannot accept").count(),
        1,
        "logged once"
    );
    // Descriptors free again: new bridges are served.
    drop(held);
    let (mut c, _) = tokio::time::timeout(
        Duration::from_secs(10),
        Client::connect_hello(&addr, BRIDGE_TOKEN),
    )
    .await
    .expect("served again in time")
    .expect("hello after descriptors came back");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    signal(&child, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0));
}

/// A stop signal that arrives while a long-running command is still starting, before its
/// handlers are installed, ends it cleanly once they are: the stop signals are held pending
/// from the first line of `main`. Reproduced exactly by starting the process with them blocked
/// and the signal already pending (without the fix it would never be seen: the command ran on).
#[tokio::test]
async fn a_stop_signal_sent_while_starting_ends_cleanly() {
    let dir = record_a_session().await;
    let data = dir.path().join("data");
    let (d, fresh, archive) = (
        data.to_str().expect("utf8").to_string(),
        dir.path().join("fresh").to_str().expect("utf8").to_string(),
        dir.path()
            .join("archive")
            .to_str()
            .expect("utf8")
            .to_string(),
    );
    let nowhere = format!("nats://127.0.0.1:{}", free_addr().port());
    let cases: [&[&str]; 4] = [
        &[
            "replay",
            "latest",
            "--data-dir",
            &d,
            "--listen",
            "127.0.0.1:0",
        ],
        &[
            "collect",
            "--from",
            &nowhere,
            "--data-dir",
            &archive,
            "--insecure-unsigned",
        ],
        &[
            "serve",
            "--upstream",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--no-bridge-file",
            "--data-dir",
            &fresh,
        ],
        &["mod-sim", "--listen", "127.0.0.1:0"],
    ];
    // Python blocks the signals, makes one pending, and execs the relay in its place.
    const LAUNCH: &str = "import os, signal, sys
stop = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
signal.pthread_sigmask(signal.SIG_BLOCK, stop)
os.kill(os.getpid(), getattr(signal, sys.argv[1]))
os.execv(sys.argv[2], sys.argv[2:])";
    for args in cases {
        for name in ["SIGINT", "SIGTERM"] {
            let mut cmd = Command::new("python3");
            cmd.args(["-c", LAUNCH, name, BIN])
                .args(args)
                .env_remove("GABP_RELAY_TOKEN")
                .env_remove("GABP_RELAY_DATA_DIR")
                .kill_on_drop(true)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
                .await
                .unwrap_or_else(|_| panic!("{args:?} never saw the {name} sent while it started"))
                .expect("ran");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{args:?} {name}: {err}");
            assert!(
                err.contains(name),
                "{args:?} says it stopped on {name}: {err}"
            );
        }
    }
}

/// `--shutdown-timeout` bounds the whole stop even with bridges that read nothing and calls the
/// mod never answers: what each leaving bridge may still take is cut to fit the bound (it was a
/// fixed half second, whatever the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_bound_holds_with_bridges_that_never_read() {
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(20_000.0),
            payload_bytes: 256,
            tool_latency: Duration::from_secs(60),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let up = sim.addr().to_string();
    let Serve {
        mut child, addr, ..
    } = serve(&[
        "--upstream",
        &up,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--no-record",
        "--on-slow",
        "block",
        "--shutdown-timeout",
        "100ms",
    ])
    .await;
    // Three bridges subscribe and never read again; one has calls the mod never answers.
    let mut stuck = Vec::new();
    for _ in 0..3 {
        let (mut c, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        c.subscribe(&["world/tick"]).await.expect("subscribe");
        stuck.push(c);
    }
    let (mut caller, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    for i in 0..5 {
        let call = serde_json::json!({"v":"gabp/1","id":format!("c{i}"),"type":"request",
            "method":"tools/call","params":{"name":"sim/echo","arguments":{}}});
        caller
            .send_body(call.to_string().as_bytes())
            .await
            .expect("send");
    }
    // Held: every stuck bridge has a queue its socket does not take.
    let (mut watch, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    until_async_ok("the bridges are stuck", async || {
        let s = watch
            .call("relay/status", serde_json::json!({}))
            .await
            .expect("status");
        let bridges = s["bridges"].as_array().cloned().unwrap_or_default();
        let full = bridges
            .iter()
            .filter(|b| b["queueEvents"].as_u64().unwrap_or(0) >= 1000)
            .count();
        full == 3
    })
    .await;
    let t = std::time::Instant::now();
    signal(&child, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits")
        .expect("status");
    let took = t.elapsed();
    // 100 ms, and room for the process to start and end (it overran the bound before).
    assert!(took < Duration::from_millis(350), "stopped after {took:?}");
    // Within its bound the stop is clean: the stuck bridges were cut, as promised.
    assert_eq!(status.code(), Some(0));
    drop(stuck);
}

/// Waits, with a timeout, for an async condition that needs a mutable borrow.
async fn until_async_ok(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
