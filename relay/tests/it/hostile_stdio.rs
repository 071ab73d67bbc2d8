//! Hostile and broken stdio mods (small shell scripts) in front of real `gabp-relay serve`
//! processes: stderr floods, exits and back-off, two routes with their own mods, and a prompt
//! SIGTERM in every upstream state.

use crate::support::hostile::*;

#[tokio::test]
async fn a_stdio_mods_stderr_flood_is_drained_with_bounded_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let done = dir.path().join("done");
    // A non-UTF-8 byte, a control sequence, 256 MiB without a newline, then 20,000 short lines:
    // the mod must be able to write all of it (no SIGPIPE, no stall) and say so.
    let mod_cmd = script(
        dir.path(),
        "flood.sh",
        &format!(
            "printf 'bad \\377 byte \\033[2J\\n' >&2\nhead -c 268435456 /dev/zero >&2\nprintf '\\n' >&2\nseq 20000 >&2\necho ok > {}\nexec sleep 30",
            done.display()
        ),
    );
    let relay = serve(&["--no-record", "--upstream", "stdio", "--", &mod_cmd]).await;
    until("the mod wrote all its stderr", || done.exists()).await;
    relay.wait_log("bad \u{fffd} byte \\u{1b}[2J", 1).await;
    relay
        .wait_log("more bytes of this line not logged", 1)
        .await;
    relay
        .wait_log("stderr lines of the mod not logged", 1)
        .await;
    let peak = relay.peak_rss_mib();
    assert!(
        peak < 100,
        "peak RSS {peak} MiB while draining 256 MiB of stderr"
    );
    assert!(
        relay.log_lines("mod_command") < 1000,
        "stderr lines are rate-limited"
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn stdio_mod_exits_are_logged_backed_off_and_a_missing_one_fails_at_start() {
    let out = run(&[
        "serve",
        "--no-record",
        "--no-bridge-file",
        "--listen",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--upstream",
        "stdio",
        "--",
        "/nonexistent/game-mod",
    ])
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/nonexistent/game-mod") && err.trim().lines().count() == 1,
        "{err}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let starts = dir.path().join("starts");
    let mod_cmd = script(
        dir.path(),
        "dies.sh",
        &format!("date +%s%N >> {}\nexit 3", starts.display()),
    );
    let relay = serve(&["--no-record", "--upstream", "stdio", "--", &mod_cmd]).await;
    relay.wait_log("exited (exit status: 3)", 1).await;
    let times = || -> Vec<u64> {
        std::fs::read_to_string(&starts)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    until("five starts", || times().len() >= 5).await;
    // 50 ms doubling: five starts take at least 50+100+200+400 ms.
    let t = times();
    let took = Duration::from_nanos(t[4] - t[0]);
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert_eq!(
        relay.log_lines("exited (exit status: 3)"),
        1,
        "{:#?}",
        relay.log.lock()
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn two_stdio_routes_keep_their_own_mods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a_starts, b_starts) = (dir.path().join("a"), dir.path().join("b"));
    let a = script(
        dir.path(),
        "a.sh",
        &format!("echo x >> {}\nexit 1", a_starts.display()),
    );
    let b = script(
        dir.path(),
        "b.sh",
        &format!(
            "echo x >> {}\nexec {BIN} mod-sim --stdio --token {MOD_TOKEN} --rate 50",
            b_starts.display()
        ),
    );
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "[[route]]\nname = \"a\"\nupstream_command = [\"{a}\"]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
             [[route]]\nname = \"b\"\nupstream_command = [\"{b}\"]\nupstream_token = \"{MOD_TOKEN}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"
        ),
    )
    .expect("config");
    let data = dir.path().join("data");
    let relay = serve_args(&[
        "--data-dir",
        data.to_str().expect("utf8"),
        "--config",
        config.to_str().expect("utf8"),
    ])
    .await;
    let count = |p: &std::path::Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
    until("route a restarted its mod four times", || {
        count(&a_starts) >= 4
    })
    .await;
    assert_eq!(
        count(&b_starts),
        1,
        "route a's restarts killed route b's mod"
    );
    assert_eq!(
        relay.log_lines("session ended"),
        0,
        "{:#?}",
        relay.log.lock()
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn sigterm_is_prompt_in_every_upstream_state() {
    // Waiting for the welcome (the mod read the hello and says nothing).
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    let m = accept(&listener).await;
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(2),
        "waiting for the welcome: {took:?}"
    );
    drop(m);
    // Backing off (nothing listens upstream).
    drop(listener);
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    relay.wait_log("mod not reachable", 1).await;
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(2), "backing off: {took:?}");
    // Running, mid-stream.
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&["--upstream", &up, "--data-dir", data]).await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    // The mod never pauses: it writes until the relay goes away.
    let ModConn { write, frames, .. } = m;
    let flood = tokio::spawn(async move {
        let mut write = write;
        let batch: Vec<u8> = {
            let mut wire = BytesMut::new();
            for i in 0..1000 {
                gabp_proto::encode_frame(event("c", Some(i), "{}").as_bytes(), &mut wire);
            }
            wire.to_vec()
        };
        let mut sent = 0u64;
        while write.write_all(&batch).await.is_ok() {
            sent += 1000;
        }
        drop(frames);
        sent
    });
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    next_on(&mut c, "c").await; // the flood is flowing
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(2), "running: {took:?}");
    assert!(flood.await.expect("flood") > 0);
    assert_eq!(checked_session(data).await["end"], "relay_shutdown");
}
