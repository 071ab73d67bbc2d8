//! The command line's wrap, upstream and listener shapes: `wrap` under a launcher, stdio
//! upstreams, unix listeners, discovery files and metrics.

use crate::support::*;

#[tokio::test]
async fn wrap_is_invisible_to_a_launcher_and_a_legacy_bridge() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let mut child = relay()
        .args([
            "wrap",
            "--data-dir",
            data,
            "--",
            BIN,
            "mod-sim",
            "--rate",
            "100",
        ])
        .env("GABP_SERVER_PORT", port.to_string())
        .env("GABP_TOKEN", "launcher-token")
        .env("GABS_GAME_ID", "game-one")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn wrap");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // The game (mod-sim) prints where it listens: a fresh port, not the launcher's.
    let game_line = line_with(&mut lines, "simulated mod listening on").await;
    assert!(
        !game_line.ends_with(&format!(":{port}")),
        "the game got its own port"
    );
    // The launcher's bridge: only Content-Length headers, legacy `parameters`.
    let addr: Addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut c = Client::connect(&addr)
        .await
        .expect("connect where the launcher expects the game");
    c.length_only_headers = true;
    let welcome = c
        .hello("launcher-token")
        .await
        .expect("hello with the launcher's token");
    assert_eq!(
        welcome["capabilities"]["extensions"]["relay"]["route"],
        "game-one"
    );
    let r = c
        .call(
            "tools/call",
            serde_json::json!({"name": "sim/echo", "parameters": {"k": 7}}),
        )
        .await
        .expect("call");
    assert_eq!(r["echo"]["k"], 7);
    drop(c);
    sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("wrap exits")
        .expect("status");
    assert_eq!(status.code(), Some(0), "wrap exits with the game's code");
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["sessions"][0]["route"], "game-one");
}

#[tokio::test]
async fn wrap_without_a_launcher_environment_is_a_usage_error() {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        relay()
            .args(["wrap", "--", "true"])
            .env_remove("GABP_SERVER_PORT")
            .output(),
    )
    .await
    .expect("done")
    .expect("ran");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GABP_SERVER_PORT"));
    // Nor is a port the launcher cannot connect to.
    for port in ["0", "65536", "x"] {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            relay()
                .args(["wrap", "--no-record", "--", "true"])
                .env("GABP_SERVER_PORT", port)
                .env("GABP_TOKEN", "launcher-token-0123456789")
                .output(),
        )
        .await
        .expect("done")
        .expect("ran");
        assert_eq!(out.status.code(), Some(2), "GABP_SERVER_PORT={port}");
        assert!(one_line(&out).contains("from 1 to 65535"), "{port}");
    }
}

/// A game that exits passes its code through; one killed by a signal gives 128 + the signal,
/// as a shell would, and stderr names the signal (not a silent exit 1).
#[tokio::test]
async fn wrap_reports_a_game_killed_by_a_signal_as_a_shell_does() {
    for (script, code, says) in [
        ("exit 7", 7, None),
        ("kill -9 $$", 137, Some("killed by SIGKILL")),
        ("kill -TERM $$", 143, Some("killed by SIGTERM")),
    ] {
        let port = free_addr().port().to_string();
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            relay()
                .args(["wrap", "--no-record", "--", "sh", "-c", script])
                .env("GABP_SERVER_PORT", &port)
                .env("GABP_TOKEN", "launcher-token-0123456789")
                .output(),
        )
        .await
        .expect("done")
        .expect("ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{script}: {err}");
        if let Some(says) = says {
            assert!(err.contains(says), "{script}: {err}");
        }
    }
}

#[tokio::test]
async fn wrap_refuses_an_empty_launcher_token() {
    for token in [None, Some(""), Some("  ")] {
        let mut cmd = relay();
        cmd.args(["wrap", "--no-record", "--", "true"])
            .env("GABP_SERVER_PORT", "1");
        match token {
            Some(t) => cmd.env("GABP_TOKEN", t),
            None => cmd.env_remove("GABP_TOKEN"),
        };
        let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
            .await
            .expect("done")
            .expect("ran");
        assert_eq!(out.status.code(), Some(2), "GABP_TOKEN={token:?}");
        assert!(one_line(&out).contains("GABP_TOKEN"));
    }
}

#[tokio::test]
async fn stdio_upstream_unix_listener_discovery_file_and_metrics() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("relay.sock");
    let bridge_file = dir.path().join("bridge.json");
    let listen = format!("unix:{}", sock.display());
    let data = dir.path().join("data");
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            "stdio",
            "--upstream-token",
            MOD_TOKEN,
            "--listen",
            &listen,
            "--token",
            BRIDGE_TOKEN,
            "--metrics",
            "127.0.0.1:0",
        ])
        .args([
            "--data-dir",
            data.to_str().expect("utf8"),
            "--bridge-file",
            bridge_file.to_str().expect("utf8"),
        ])
        .args([
            "--", BIN, "mod-sim", "--stdio", "--token", MOD_TOKEN, "--rate", "500",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let metrics_line = line_with(&mut lines, "metrics on http://").await;
    line_with(&mut lines, "recording to").await;
    assert_eq!(
        std::fs::metadata(&sock)
            .expect("socket")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&bridge_file)
            .expect("bridge file")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let discovered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bridge_file).expect("read")).expect("json");
    assert_eq!(discovered["token"], BRIDGE_TOKEN);
    assert_eq!(discovered["transport"]["type"], "unix");
    let addr: Addr = discovered["transport"]["address"]
        .as_str()
        .expect("address")
        .parse()
        .expect("addr");
    let (mut c, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
        .await
        .expect("hello over the unix socket");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..10 {
        c.next_event().await.expect("events from the stdio mod");
    }
    // Metrics in Prometheus text format.
    let maddr = metrics_line
        .split("http://")
        .nth(1)
        .expect("url")
        .trim_end_matches("/metrics")
        .to_string();
    let mut s = tokio::net::TcpStream::connect(&maddr)
        .await
        .expect("metrics port");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("response");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for name in [
        "gabp_frames_total",
        "gabp_events_total",
        "gabp_bridges_connected",
    ] {
        assert!(body.contains(name), "metrics lack {name}");
    }
    drop(c);
    sigterm(&child);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "socket removed on exit");
    assert!(!bridge_file.exists(), "bridge file removed on exit");
}

#[tokio::test]
async fn listen_unix_replaces_only_a_stale_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A config file given as the socket path by mistake is refused and left alone.
    let conf = dir.path().join("myconf.toml");
    std::fs::write(&conf, "precious = true\n").expect("write");
    let listen = format!("unix:{}", conf.display());
    let args = [
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        &listen,
        "--no-record",
        "--no-bridge-file",
    ];
    let out = output(&args).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line(&out).contains("not a socket"));
    assert_eq!(
        std::fs::read_to_string(&conf).expect("still there"),
        "precious = true\n"
    );
    let out = output(&["mod-sim", "--listen", &listen]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line(&out).contains("not a socket"));
    assert!(conf.exists(), "mod-sim left the file alone too");
    // A live socket is refused and keeps working.
    let live = dir.path().join("live.sock");
    let live_listener = std::os::unix::net::UnixListener::bind(&live).expect("bind");
    let listen = format!("unix:{}", live.display());
    let out = output(&[
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        &listen,
        "--no-record",
        "--no-bridge-file",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line(&out).contains("in use"));
    std::os::unix::net::UnixStream::connect(&live).expect("the live socket still answers");
    drop(live_listener);
    // Now it is stale (nothing listens, the file remains): replaced.
    assert!(live.exists());
    let s = serve(&[
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        &listen,
        "--no-record",
        "--no-bridge-file",
    ])
    .await;
    assert_eq!(s.addr, Addr::Unix(live.clone()));
    Client::connect(&s.addr)
        .await
        .expect("the relay listens on the replaced socket");
    s.stop_cleanly().await;
}

#[tokio::test]
async fn discovery_file_of_a_dead_relay_is_replaced_a_live_one_never() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bridge_file = dir.path().join("bridge.json");
    let bf = bridge_file.to_str().expect("utf8");
    // A file left by a relay killed with SIGKILL: its pid no longer runs.
    let mut dead = std::process::Command::new("true").spawn().expect("spawn");
    let dead_pid = dead.id();
    dead.wait().expect("reaped");
    std::fs::write(
        &bridge_file,
        serde_json::json!({"token": "old", "metadata": {"pid": dead_pid, "route": "default"}})
            .to_string(),
    )
    .expect("write");
    let base = [
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--no-record",
        "--token",
        BRIDGE_TOKEN,
        "--bridge-file",
        bf,
    ];
    let mut first = serve(&base).await;
    let pid = first.child.id().expect("running");
    let holder = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).expect("discovery file")).expect("json")
    };
    assert_eq!(holder(&bridge_file)["metadata"]["pid"], pid, "replaced");
    // A second relay for the same file is refused and leaves the first one's file alone.
    let mut args = vec!["serve"];
    args.extend(base);
    let out = output(&args).await;
    assert_eq!(out.status.code(), Some(1));
    let err = one_line(&out);
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert_eq!(holder(&bridge_file)["metadata"]["pid"], pid, "untouched");
    assert_eq!(holder(&bridge_file)["token"], BRIDGE_TOKEN);
    sigterm(&first.child);
    let status = tokio::time::timeout(Duration::from_secs(15), first.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    assert!(!bridge_file.exists());
}
