//! Named bridges through the real binary (issue 15): each role and glob rule, the rate limit,
//! refusals that never reach the mod, names in status, stats and metrics, and no token in the
//! recording, the logs or /metrics.

mod support;

use serde_json::json;
use support::identities::*;
use support::*;

const FORBIDDEN: i64 = -32006;
const SLOW_DOWN: i64 = -32007;

#[tokio::test]
async fn roles_globs_and_rates_are_enforced_and_names_shown_but_never_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let watcher_file = dir.path().join("watcher.token");
    std::fs::write(&watcher_file, format!("{WATCHER}\n")).expect("token file");
    let bridges = format!(
        "[[route.bridge]]\nname = \"planner\"\ntoken = \"{PLANNER}\"\nrole = \"control\"\ntools = [\"!sim/fail\", \"sim/*\"]\n\n\
         [[route.bridge]]\nname = \"watcher\"\ntoken_file = \"{}\"\nrole = \"observe\"\n\n\
         [[route.bridge]]\nname = \"slowpoke\"\ntoken = \"{SLOW}\"\ncalls_per_second = 2\nmax_subscriptions = 1\n",
        watcher_file.display()
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "", &bridges),
    );
    let data = dir.path().join("data");
    let file = dir.path().join("bridge.json");
    let metrics_addr = free_addr().to_string();
    let relay = serve_config(
        &cfg,
        file.to_str().expect("utf8"),
        &[
            "--data-dir",
            data.to_str().expect("utf8"),
            "--compression",
            "none",
            "--metrics",
            &metrics_addr,
        ],
    )
    .await;

    // Observe: reads, subscriptions and status; no tool calls, acks or lease.
    let (mut watcher, welcome) = bridge(&relay.addr, WATCHER).await;
    let me = &welcome["capabilities"]["extensions"]["relay"]["bridge"];
    assert_eq!(me["name"], "watcher", "{welcome}");
    assert_eq!(me["role"], "observe", "{welcome}");
    watcher
        .call("tools/list", json!({}))
        .await
        .expect("observe lists tools");
    watcher
        .subscribe(&["world/tick"])
        .await
        .expect("observe subscribes");
    watcher
        .call("relay/status", json!({}))
        .await
        .expect("observe reads status");
    let (code, msg, _) = refused(&mut watcher, "tools/call", call("sim/echo")).await;
    assert_eq!(code, FORBIDDEN);
    assert!(
        msg.contains("role observe") && msg.contains("tools/call"),
        "{msg}"
    );
    let (code, msg, _) = refused(&mut watcher, "attention/ack", json!({"attentionId": "x"})).await;
    assert_eq!(code, FORBIDDEN, "{msg}");
    // Malformed params do not hide that the method is not the role's to call at all.
    let (code, msg, _) = refused(&mut watcher, "attention/ack", json!({"attentionId": 7})).await;
    assert_eq!(code, FORBIDDEN, "{msg}");
    let (code, msg, _) = refused(&mut watcher, "tools/call", json!({"name": 5})).await;
    assert_eq!(code, FORBIDDEN, "{msg}");
    let (code, _, _) = refused(&mut watcher, "relay/lease", json!({"action": "acquire"})).await;
    assert_eq!(code, FORBIDDEN);

    // Control with globs: deny wins over a matching allow, whatever the order; anything
    // outside every allow glob is refused, naming the rule.
    let (mut planner, welcome) = bridge(&relay.addr, PLANNER).await;
    assert_eq!(
        welcome["capabilities"]["extensions"]["relay"]["bridge"]["role"],
        "control"
    );
    let echoed = planner
        .call("tools/call", call("sim/echo"))
        .await
        .expect("allowed");
    assert!(echoed.to_string().contains("\"x\""), "{echoed}");
    let (code, msg, _) = refused(&mut planner, "tools/call", call("sim/fail")).await;
    assert_eq!(code, FORBIDDEN);
    assert!(msg.contains("\"!sim/fail\""), "{msg}");
    let (code, msg, _) = refused(&mut planner, "tools/call", call("admin/kick")).await;
    assert_eq!(code, FORBIDDEN);
    // For a role that may call it, malformed params are just that.
    let (code, m2, _) = refused(&mut planner, "attention/ack", json!({"attentionId": 7})).await;
    assert_eq!(code, -32602, "{m2}");
    assert!(msg.contains("tools = [\"sim/*\"]"), "{msg}");
    assert!(!msg.contains(PLANNER), "{msg}");

    // The route's own token: control, unnamed, no rules.
    let (mut plain, welcome) = bridge(&relay.addr, BRIDGE_TOKEN).await;
    assert!(welcome["capabilities"]["extensions"]["relay"]["bridge"]["name"].is_null());
    plain
        .call("tools/call", call("sim/fail"))
        .await
        .expect_err("the mod's own failure");

    // Rate: a burst of two, then "slow down" with a retry hint; the hint is right.
    let (mut slow, _) = bridge(&relay.addr, SLOW).await;
    slow.subscribe(&["world/tick"])
        .await
        .expect("one subscription");
    let (code, _, _) = refused(
        &mut slow,
        "events/subscribe",
        json!({"channels": ["chat/message"]}),
    )
    .await;
    assert_eq!(code, -32002, "its own max_subscriptions");
    // A resume subscribes too: it may not name more channels than the identity's bound.
    let session = welcome["capabilities"]["extensions"]["relay"]["sessionId"].clone();
    let mut again = Client::connect(&relay.addr).await.expect("connect");
    let hello = json!({"token": SLOW, "bridgeVersion": "t", "platform": "linux", "launchId": "t",
        "relay": {"resume": {"session": session, "channels": {"world/tick": -1, "chat/message": -1}}}});
    let (code, msg, _) = refused(&mut again, "session/hello", hello).await;
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("at most 1"), "{msg}");
    slow.call("tools/call", call("sim/echo"))
        .await
        .expect("1st");
    slow.call("tools/call", call("sim/echo"))
        .await
        .expect("2nd");
    let (code, msg, hint) = refused(&mut slow, "tools/call", call("sim/echo")).await;
    assert_eq!(code, SLOW_DOWN, "{msg}");
    let wait = hint["retryAfterMs"].as_u64().expect("retryAfterMs");
    assert!((1..=500).contains(&wait), "{hint}");
    assert!(
        msg.contains("slowpoke") && msg.contains("2 calls per second"),
        "{msg}"
    );
    // Waiting as told is enough (the relay's clock and ours may differ by a few ms).
    tokio::time::sleep(Duration::from_millis(wait + 20)).await;
    slow.call("tools/call", call("sim/echo"))
        .await
        .expect("after the hint");

    // What reached the mod: planner's echo, the plain bridge's fail, slowpoke's three.
    assert_eq!(md.calls(), 5, "refused calls never reach the mod");

    // Status names every bridge and counts its refusals.
    let out = output(&[
        "status",
        "--bridge-file",
        file.to_str().expect("utf8"),
        "--json",
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    let bridges = v["relays"][0]["status"]["bridges"]
        .as_array()
        .expect("bridges")
        .clone();
    let by = |name: &str| {
        bridges
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))
            .clone()
    };
    assert_eq!(by("watcher")["denied"], 5, "{v}");
    assert_eq!(by("watcher")["role"], "observe", "{v}");
    assert_eq!(by("planner")["denied"], 2, "{v}");
    assert_eq!(by("slowpoke")["rateLimited"], 1, "{v}");
    let table = output(&["status", "--bridge-file", file.to_str().expect("utf8")]).await;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    for needle in ["NAME", "ROLE", "planner", "watcher", "observe", "slowpoke"] {
        assert!(table.contains(needle), "{needle}: {table}");
    }

    // Metrics: configured names (and `default`) as labels, with the refusals by reason.
    let m = metrics(&metrics_addr).await;
    for needle in [
        "bridge=\"planner\"",
        "bridge=\"watcher\"",
        "bridge=\"default\"",
        "reason=\"rate_limited\"",
    ] {
        assert!(m.contains(needle), "{needle} in /metrics");
    }
    let denied = m
        .lines()
        .find(|l| {
            l.starts_with("gabp_bridge_refusals_by_identity_total")
                && l.contains("bridge=\"watcher\"")
                && l.contains("reason=\"denied\"")
        })
        .expect("watcher's refusals");
    assert!(denied.ends_with(" 5"), "{denied}");

    for c in [watcher, planner, plain, slow] {
        c.close().await.expect("close");
    }
    let log = relay.log.clone();
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));

    // The recording names the bridges; stats shows the names.
    let out = output(&[
        "stats",
        "--data-dir",
        data.to_str().expect("utf8"),
        "latest",
        "--json",
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = json(&out);
    let names: Vec<String> = st["bridges"]
        .as_array()
        .or_else(|| st[0]["bridges"].as_array())
        .expect("bridges")
        .iter()
        .filter_map(|b| b["name"].as_str().map(String::from))
        .collect();
    for n in ["planner", "watcher", "slowpoke"] {
        assert!(names.iter().any(|x| x == n), "{n} in {st}");
    }
    let text = output(&[
        "stats",
        "--data-dir",
        data.to_str().expect("utf8"),
        "latest",
    ])
    .await;
    assert!(String::from_utf8_lossy(&text.stdout).contains("planner"));

    // No token anywhere: recording (uncompressed), logs, metrics.
    let log = log.lock().join("\n");
    assert!(
        log.contains("bridge=planner") || log.contains("bridge=\"planner\""),
        "{log}"
    );
    for t in [PLANNER, WATCHER, SLOW, BRIDGE_TOKEN] {
        assert_eq!(
            files_containing(&data, t),
            Vec::<String>::new(),
            "{t} recorded"
        );
        assert!(!log.contains(t), "token in the log");
        assert!(!m.contains(t), "token in /metrics");
    }
    // The recording is searchable at all: the bridge's names are in it.
    assert!(!files_containing(&data, "slowpoke").is_empty());
}

#[tokio::test]
async fn bad_bridge_tables_are_one_line_errors_with_their_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "name = \"default\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\n",
            "field name",
        ),
        (
            "name = \"x\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nrole = \"boss\"\n",
            "unknown role",
        ),
        (
            "name = \"x\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\ntools = [\"!\"]\n",
            "empty glob",
        ),
        (
            "name = \"x\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\ncalls_per_second = 0\n",
            "calls_per_second",
        ),
        (
            &format!("name = \"x\"\ntoken = \"{BRIDGE_TOKEN}\"\n"),
            "already another identity's",
        ),
        ("name = \"x\"\n", "set one of token and token_file"),
        (
            "name = \"x\"\ntoken_file = \"/nonexistent/t\"\n",
            "cannot read token file",
        ),
    ];
    for (table, want) in cases {
        let text = format!(
            "{}\n[[route.bridge]]\n{table}",
            route_toml(&format!("token = \"{BRIDGE_TOKEN}\""))
        );
        let cfg = config_file(dir.path(), "bad.toml", &text);
        let out = output(&[
            "serve",
            "--config",
            &cfg,
            "--no-bridge-file",
            "--data-dir",
            dir.path().to_str().expect("utf8"),
        ])
        .await;
        assert_eq!(out.status.code(), Some(2), "{table}");
        let line = one_line(&out);
        assert!(line.contains(want), "{want}: {line}");
        assert!(
            line.contains("bridge \"") && line.contains(": line "),
            "{line}"
        );
        assert!(!line.contains(BRIDGE_TOKEN), "{line}");
    }
}
