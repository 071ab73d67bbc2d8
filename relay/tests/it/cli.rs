//! The command-line contract, driven through the real `gabp-relay` binary as users run it:
//! exit codes, printed tokens, signals, a locked data dir, and a `kill -9` mid-recording.

use crate::support::*;

/// A `serve` with no mod behind it and nothing recorded, for flags that must be refused.
const SERVE_NO_MOD: [&str; 7] = [
    "serve",
    "--upstream",
    "127.0.0.1:1",
    "--listen",
    "127.0.0.1:0",
    "--no-record",
    "--no-bridge-file",
];

#[tokio::test]
async fn usage_errors_exit_2_with_one_line() {
    for args in [
        &["serve"][..],
        &["serve", "--upstream", "127.0.0.1:1"],
        &["bogus"],
        &["serve", "--upstream", "nowhere", "--listen", "127.0.0.1:0"],
    ] {
        let out = output(args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty());
    }
    let out = output(&[
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "0.0.0.0:0",
        "--no-record",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "a usage error, as in replay");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--allow-remote") && err.lines().count() == 1,
        "{err}"
    );
}

#[tokio::test]
async fn serve_prints_a_token_records_and_stops_on_sigterm() {
    let sim = start_mod(Some(2000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8 path");
    let mut s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ])
    .await;
    let token = s.token.clone().expect("generated token printed");
    assert_eq!(token.len(), 32);
    let (mut c, _) = Client::connect_hello(&s.addr, &token)
        .await
        .expect("hello with printed token");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    for _ in 0..50 {
        c.next_event().await.expect("event");
    }
    // A second relay on the same data dir is refused clearly.
    let out = output(&[
        "serve",
        "--upstream",
        &sim.addr().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another process"));
    // Reading while it records works (read-only).
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    assert!(out.status.success());
    sigterm(&s.child);
    let status = tokio::time::timeout(Duration::from_secs(15), s.child.wait())
        .await
        .expect("exits within the bound")
        .expect("status");
    assert_eq!(status.code(), Some(0));
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let sessions = v["sessions"].as_array().expect("list");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["end"], "relay_shutdown");
    assert!(sessions[0]["events"].as_u64().expect("events") >= 50);
    let out = output(&["stats", "latest", "--data-dir", data, "--json"]).await;
    assert!(out.status.success());
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(stats["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .any(|c| c["channel"] == "world/tick"));
    let out = output(&[
        "export",
        "latest",
        "--data-dir",
        data,
        "--channel",
        "world/tick",
    ])
    .await;
    assert!(out.status.success());
    let lines: Vec<&[u8]> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert!(lines.len() >= 50);
    for l in lines {
        let v: serde_json::Value = serde_json::from_slice(l).expect("every line is JSON");
        assert_eq!(v["channel"], "world/tick");
    }
    let out = output(&["sessions", "check", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    sim.stop();
}

#[tokio::test]
async fn kill_9_mid_recording_leaves_a_clean_prefix() {
    let sim = start_mod(None); // as fast as possible
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8 path");
    let mut s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--token",
        BRIDGE_TOKEN,
    ])
    .await;
    assert_eq!(s.token, None, "a given token is not printed");
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["world/tick", "player/move"])
        .await
        .expect("subscribe");
    for _ in 0..20_000 {
        c.next_event().await.expect("event");
    }
    // Kill once a synced batch is surely in (reads are read-only: they work while it records;
    // on a loaded machine the low-priority recorder may lag the bridge by a while).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = output(&["sessions", "--data-dir", data, "--json"]).await;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        if v["sessions"][0]["events"].as_u64().unwrap_or(0) > 1000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing recorded: {v}"
        );
    }
    s.child.start_kill().expect("kill -9");
    s.child.wait().await.expect("reaped");
    let out = output(&["sessions", "check", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], true, "{v}");
    assert!(out.status.success());
    let out = output(&["sessions", "--data-dir", data, "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let s0 = &v["sessions"][0];
    assert_eq!(s0["end"], "crash", "{v}");
    assert!(
        s0["events"].as_u64().expect("events") > 1000,
        "synced batches survived: {s0}"
    );
    sim.stop();
}

#[tokio::test]
async fn out_of_range_durations_are_usage_errors_not_panics() {
    let serve_with = |flag: &'static str, v: &'static str| {
        vec![
            "serve",
            "--upstream",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--no-record",
            "--no-bridge-file",
            flag,
            v,
        ]
    };
    let mut cases = Vec::new();
    for flag in ["--request-timeout", "--frame-timeout", "--shutdown-timeout"] {
        for v in [
            "0",
            "0ms",
            "99999999999999d",
            "1e400",
            "999999999999999999999999999999s",
            "-1s",
        ] {
            cases.push(serve_with(flag, v));
        }
    }
    cases.push(vec!["demo", "--duration", "99999999999999999999999999d"]);
    for rate in ["-1", "NaN", "inf", "1e300"] {
        cases.push(vec!["demo", "--rate", rate, "--no-record"]);
        cases.push(vec!["mod-sim", "--rate", rate]);
    }
    cases.push(vec![
        "mod-sim",
        "--tool-latency",
        "99999999999999999999999999d",
    ]);
    cases.push(vec![
        "export",
        "latest",
        "--from",
        "99999999999999999999999999d",
        "--data-dir",
        "/nonexistent/gabp",
    ]);
    cases.push(vec![
        "sessions",
        "prune",
        "--retain",
        "99999999999999999999999999d",
        "--data-dir",
        "/nonexistent/gabp",
    ]);
    for args in &cases {
        let out = output(args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn errors_are_one_line_said_once_and_usage_is_exit_2() {
    // A port in use: the cause once, not twice.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = taken.local_addr().expect("addr").to_string();
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
    let err = one_line(&out);
    assert_eq!(err.matches("in use").count(), 1, "{err}");
    for args in [
        // A command after -- without --upstream stdio would be silently ignored.
        &[
            "serve",
            "--upstream",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--no-record",
            "--",
            "mod",
        ][..],
        &[
            "export",
            "latest",
            "--from",
            "3s",
            "--to",
            "1s",
            "--data-dir",
            "/nonexistent/gabp",
        ],
        &[
            "replay",
            "latest",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            "/nonexistent/gabp",
        ],
    ] {
        let out = output(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        one_line(&out);
    }
}

#[tokio::test]
async fn useless_bounds_and_malformed_tokens_are_usage_errors() {
    let base = SERVE_NO_MOD;
    for extra in [
        &["--max-body", "0"][..],
        &["--max-body", "1023"],
        &["--outbox-frames", "0"],
        &["--outbox-bytes", "0"],
        &["--max-bridges", "0"],
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
    }
    for token in ["s3cret with space", "s3cret\n", "s3\u{7}cret"] {
        let args: Vec<&str> = base.iter().copied().chain(["--token", token]).collect();
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{token:?}");
        let err = one_line(&out);
        assert!(err.contains("--token") && !err.contains("s3"), "{err}");
    }
}

#[tokio::test]
async fn huge_bounds_are_usage_errors_and_short_tokens_are_warned_about_without_the_token() {
    let base = SERVE_NO_MOD;
    for (extra, expect) in [
        (&["--max-body", "1TiB"][..], "at most 64.0 MiB"),
        (&["--max-body", "65MiB"], "at most 64.0 MiB"),
        (&["--outbox-bytes", "100GiB"], "at most 1.0 GiB"),
        (&["--outbox-frames", "2000000"], "from 1 to 1048576"),
        (&["--max-bridges", "100000"], "from 1 to 65536"),
        (&["--retain", "2PiB"], "at most 1.0 PiB"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = one_line(&out);
        assert!(err.contains(expect), "{extra:?}: {err}");
    }
    // A short bridge token, given as a flag, in the environment or in the config file: the
    // relay starts, says once that it is guessable, and never repeats it. The mod's token is
    // the mod's choice: no warning.
    let short = "shortsecret0042";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(
        dir.path(),
        "short.toml",
        &route_toml("token = \"shortsecret0042\"\n"),
    );
    let config_args = ["serve", "--config", file.as_str(), "--no-bridge-file"];
    let flag_args: Vec<&str> = base.iter().copied().chain(["--token", short]).collect();
    let upstream_args: Vec<&str> = base
        .iter()
        .copied()
        .chain([
            "--token",
            "long-enough-bridge-token",
            "--upstream-token",
            "m",
        ])
        .collect();
    for (args, env, warned) in [
        (
            &flag_args[..],
            None,
            Some("--token is shorter than 16 characters"),
        ),
        (
            &base[..],
            Some(short),
            Some("--token is shorter than 16 characters"),
        ),
        (
            &config_args[..],
            None,
            Some("field token is shorter than 16 characters"),
        ),
        (&upstream_args[..], None, None),
    ] {
        let mut cmd = relay();
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(t) = env {
            cmd.env("GABP_RELAY_TOKEN", t);
        }
        let mut child = cmd.spawn().expect("spawn");
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
        // Started: it listens (the warning, if any, is logged before that).
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(l) = out.next_line().await.expect("stdout") {
                if l.contains(" listening on ") {
                    return;
                }
            }
            panic!("{args:?}: the relay did not start");
        })
        .await
        .expect("started in time");
        let _ = child.start_kill();
        let mut said = String::new();
        while let Ok(Ok(Some(l))) =
            tokio::time::timeout(Duration::from_secs(10), err.next_line()).await
        {
            said += &l;
            said.push('\n');
        }
        let _ = child.wait().await;
        assert!(!said.contains(short), "the token was echoed: {said}");
        match warned {
            Some(w) => assert_eq!(said.matches(w).count(), 1, "{args:?}: {said}"),
            None => assert!(!said.contains("shorter than"), "{args:?}: {said}"),
        }
    }
    // Sixteen characters are enough.
    let sim = start_mod(None);
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        "sixteen-chars-ok",
        "--no-record",
    ])
    .await;
    assert!(s.token.is_none(), "a given token is not printed");
    Client::connect_hello(&s.addr, "sixteen-chars-ok")
        .await
        .expect("hello with a 16-character token");
    drop(s);
    // A generated token is still 32 hex digits, printed.
    let s = serve(&[
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--no-record",
    ])
    .await;
    let generated = s.token.clone().expect("generated token printed");
    assert_eq!(generated.len(), 32, "{generated}");
    assert!(
        generated.chars().all(|c| c.is_ascii_hexdigit()),
        "{generated}"
    );
    drop(s);
    sim.stop();
}

#[tokio::test]
async fn config_files_have_the_same_bounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "outbox_bytes = \"100GiB\"\n".to_string(),
            "line 6: route \"a\", field outbox_bytes: \"100GiB\" is too large (at most 1.0 GiB)",
        ),
        (
            "max_body = \"1TiB\"\n".to_string(),
            "line 6: route \"a\", field max_body",
        ),
        (
            "max_bridges = 100000\n".to_string(),
            "line 6: route \"a\", field max_bridges",
        ),
    ];
    for (i, (extra, expect)) in cases.iter().enumerate() {
        let path = config_file(dir.path(), &format!("c{i}.toml"), &route_toml(extra));
        let out = output(&["serve", "--config", &path, "--no-bridge-file"]).await;
        assert_eq!(out.status.code(), Some(2), "{extra}");
        let err = one_line(&out);
        assert!(err.contains(expect), "{extra}: {err}");
    }
}

#[tokio::test]
async fn serve_help_states_the_maxima() {
    let out = output(&["serve", "--help"]).await;
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "1KiB to 64MiB",
        "1KiB to 1GiB",
        "1 to 1048576",
        "1 to 65536",
        "at most 1PiB",
        "shorter than 16 characters gets a warning",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

#[tokio::test]
async fn a_duplicate_route_name_is_reported_at_the_second_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Lines 1-5 the first route "a", 6 blank, 7-11 route "b", 12 blank, 13-17 "a" again.
    let text = format!(
        "{}\n{}\n{}",
        route_toml(""),
        route_toml("").replace("\"a\"", "\"b\""),
        route_toml("")
    );
    let path = config_file(dir.path(), "dup.toml", &text);
    let out = output(&["serve", "--config", &path, "--no-bridge-file"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = one_line(&out);
    assert!(
        err.ends_with(
            "dup.toml: line 14: route \"a\", field name: route names must be unique (the first is at line 1)\n"
        ),
        "{err}"
    );
}
