//! Named bridges through the real binary: each role and glob rule, the rate limit,
//! refusals that never reach the mod, names in status, stats and metrics, and no token in the
//! recording, the logs or /metrics.

use crate::support::identities::*;
use crate::support::*;
use serde_json::json;

const FORBIDDEN: i64 = -32006;
const SLOW_DOWN: i64 = -32007;

/// The answer to `method`, sent again after each "slow down" as long as its hint says, and
/// how many times it was slowed down.
async fn as_told(
    c: &mut Client,
    method: &str,
    params: serde_json::Value,
) -> (serde_json::Value, u64) {
    let mut slowed = 0;
    loop {
        let r = c.request(method, params.clone()).await.expect("answered");
        if r["error"]["code"] != SLOW_DOWN {
            return (r, slowed);
        }
        slowed += 1;
        let wait = r["error"]["data"]["retryAfterMs"].as_u64().expect("hint");
        tokio::time::sleep(Duration::from_millis(wait + 5)).await;
    }
}

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
    assert_eq!(
        welcome["capabilities"]["extensions"]["relay"]["methods"],
        json!(["relay/status", "relay/mark", "relay/ping"]),
        "an observer is offered no lease: {welcome}"
    );
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
    // Its tool rules restrict its writes: attention/ack is not its to call at all.
    let (code, m2, _) = refused(&mut planner, "attention/ack", json!({"attentionId": 7})).await;
    assert_eq!(code, FORBIDDEN, "{m2}");
    assert!(msg.contains("tools = [\"sim/*\"]"), "{msg}");
    assert!(!msg.contains(PLANNER), "{msg}");

    // The route's own token: control, unnamed, no rules.
    let (mut plain, welcome) = bridge(&relay.addr, BRIDGE_TOKEN).await;
    assert!(welcome["capabilities"]["extensions"]["relay"]["bridge"]["name"].is_null());
    // For a bridge that may call it, malformed params are just that.
    let (code, m2, _) = refused(&mut plain, "attention/ack", json!({"attentionId": 7})).await;
    assert_eq!(code, -32602, "{m2}");
    plain
        .call("tools/call", call("sim/fail"))
        .await
        .expect_err("the mod's own failure");

    // Rate: a burst of two, then "slow down" with a retry hint; the hint is right. Every
    // request after the hello counts, the relay's own included.
    let (mut slow, _) = bridge(&relay.addr, SLOW).await;
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
    let (code, msg, _) = refused(&mut slow, "relay/status", json!({})).await;
    assert_eq!(code, SLOW_DOWN, "the relay's own requests count too: {msg}");
    let (subscribed, slowed_1) = as_told(
        &mut slow,
        "events/subscribe",
        json!({"channels": ["world/tick"]}),
    )
    .await;
    assert!(
        subscribed["result"].is_object(),
        "one subscription: {subscribed}"
    );
    let (more, slowed_2) = as_told(
        &mut slow,
        "events/subscribe",
        json!({"channels": ["chat/message"]}),
    )
    .await;
    assert_eq!(
        more["error"]["code"], -32002,
        "its own max_subscriptions: {more}"
    );
    // A resume subscribes too: it may not name more channels than the identity's bound.
    let session = welcome["capabilities"]["extensions"]["relay"]["sessionId"].clone();
    let mut again = Client::connect(&relay.addr).await.expect("connect");
    let hello = json!({"token": SLOW, "bridgeVersion": "t", "platform": "linux", "launchId": "t",
        "relay": {"resume": {"session": session, "channels": {"world/tick": -1, "chat/message": -1}}}});
    let (code, msg, _) = refused(&mut again, "session/hello", hello).await;
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("at most 1"), "{msg}");

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
    assert_eq!(by("planner")["denied"], 3, "{v}");
    assert_eq!(
        by("slowpoke")["rateLimited"],
        2 + slowed_1 + slowed_2,
        "the call and the status refused, and each slow down on the way: {v}"
    );
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
    // The refusals `status` counted live are in the recording too.
    let recorded = |name: &str, field: &str| {
        st["bridges"]
            .as_array()
            .or_else(|| st[0]["bridges"].as_array())
            .expect("bridges")
            .iter()
            .filter(|b| b["name"] == name)
            .map(|b| b[field].as_u64().expect("a count"))
            .sum::<u64>()
    };
    assert_eq!(recorded("watcher", "denied"), 5, "{st}");
    assert_eq!(recorded("planner", "denied"), 3, "{st}");
    assert_eq!(
        recorded("slowpoke", "rateLimited"),
        2 + slowed_1 + slowed_2,
        "{st}"
    );
    let text = output(&[
        "stats",
        "--data-dir",
        data.to_str().expect("utf8"),
        "latest",
    ])
    .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("planner"), "{text}");
    assert!(
        text.contains("DENIED") && text.contains("LEASE REFUSED"),
        "{text}"
    );

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

/// A rate belongs to the identity: ten connections of a 5-per-second identity get no more
/// through together than one would, and reconnecting refills nothing.
#[tokio::test]
async fn an_identitys_rate_is_shared_by_its_connections_and_survives_reconnects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"slowpoke\"\ntoken = \"{SLOW}\"\ncalls_per_second = 5\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "", &bridges),
    );
    let file = dir.path().join("bridge.json");
    let relay = serve_config(&cfg, file.to_str().expect("utf8"), &["--no-record"]).await;
    let mut conns = Vec::new();
    for _ in 0..10 {
        conns.push(bridge(&relay.addr, SLOW).await.0);
    }
    let started = std::time::Instant::now();
    let answers = futures::future::join_all(conns.iter_mut().map(|c| async move {
        let mut ok = 0u64;
        for _ in 0..5 {
            let r = c
                .request("tools/call", call("sim/echo"))
                .await
                .expect("answered");
            if r["result"].is_object() {
                ok += 1;
            } else {
                assert_eq!(r["error"]["code"], SLOW_DOWN, "{r}");
            }
        }
        ok
    }))
    .await;
    let through: u64 = answers.iter().sum();
    // A burst of one second's worth, plus what refilled while the calls went on.
    let most = 5 + (started.elapsed().as_secs_f64() * 5.0).ceil() as u64;
    assert!(
        through <= most,
        "{through} calls through, at most {most}: {answers:?}"
    );
    assert_eq!(md.calls(), through);

    // A fresh connection starts with what the identity has left, not a full burst.
    drop(conns);
    let spent = std::time::Instant::now();
    let (mut again, _) = bridge(&relay.addr, SLOW).await;
    let mut through_again = 0;
    for _ in 0..10 {
        let r = again
            .request("tools/call", call("sim/echo"))
            .await
            .expect("answered");
        if r["result"].is_object() {
            through_again += 1;
        }
    }
    let refilled = (spent.elapsed().as_secs_f64() * 5.0).ceil() as u64;
    assert!(
        through_again <= 1 + refilled,
        "a reconnect refilled the burst: {through_again} of 10 through, {refilled} refilled"
    );
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
}

/// Tool rules restrict every write: an identity with `tools` may call, besides reads, only
/// `tools/call` of its tools, unless its `methods` allow more; deny wins there too.
#[tokio::test]
async fn tool_rules_restrict_every_method_bound_for_the_mod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"planner\"\ntoken = \"{PLANNER}\"\ntools = [\"sim/echo\"]\n\n\
         [[route.bridge]]\nname = \"acker\"\ntoken = \"{SLOW}\"\ntools = [\"sim/echo\"]\nmethods = [\"attention/*\", \"!state/get\"]\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "", &bridges),
    );
    let file = dir.path().join("bridge.json");
    let relay = serve_config(&cfg, file.to_str().expect("utf8"), &["--no-record"]).await;
    let (mut planner, _) = bridge(&relay.addr, PLANNER).await;
    for method in ["admin/exec", "game/teleport", "attention/ack"] {
        let (code, msg, _) = refused(&mut planner, method, json!({"x": 1})).await;
        assert_eq!(code, FORBIDDEN, "{method}: {msg}");
        assert!(
            msg.contains(method) && msg.contains("tools = [\"sim/echo\"]"),
            "{msg}"
        );
    }
    planner
        .call("tools/list", json!({}))
        .await
        .expect("reads need no rule");
    planner
        .call("tools/call", call("sim/echo"))
        .await
        .expect("its tool");
    let (mut acker, _) = bridge(&relay.addr, SLOW).await;
    let r = acker
        .request("attention/ack", json!({"attentionId": "a"}))
        .await
        .expect("answered");
    assert_ne!(r["error"]["code"], FORBIDDEN, "its methods allow it: {r}");
    let (code, msg, _) = refused(&mut acker, "admin/exec", json!({})).await;
    assert_eq!(code, FORBIDDEN, "{msg}");
    assert!(msg.contains("methods = [\"attention/*\"]"), "{msg}");
    let (code, msg, _) = refused(&mut acker, "state/get", json!({})).await;
    assert_eq!(code, FORBIDDEN, "a deny glob refuses even a read: {msg}");
    assert!(msg.contains("\"!state/get\""), "{msg}");
    assert_eq!(md.calls(), 1, "only the allowed tools/call reached the mod");
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
}

/// Marks are small and bounded: a mark over 2 KiB is refused (and, past the connection's
/// first few refusals, not even recorded), a session keeps at most `max_marks`, and marks
/// count against the identity's rate, so an observer cannot fill the disk with them.
#[tokio::test]
async fn marks_are_small_and_bounded_per_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "max_marks = 3", &bridges),
    );
    let data = dir.path().join("data");
    let file = dir.path().join("bridge.json");
    let relay = serve_config(
        &cfg,
        file.to_str().expect("utf8"),
        &["--data-dir", data.to_str().expect("utf8")],
    )
    .await;
    let (mut watcher, _) = bridge(&relay.addr, WATCHER).await;
    let big = json!({"label": "x", "data": {"blob": "y".repeat(200_000)}});
    for _ in 0..200 {
        let (code, msg, _) = refused(&mut watcher, "relay/mark", big.clone()).await;
        assert_eq!(code, -32602, "{msg}");
        assert!(msg.contains("2048"), "{msg}");
    }
    for i in 0..3 {
        watcher
            .call("relay/mark", json!({"label": "ep", "data": {"episode": i}}))
            .await
            .expect("a mark within the bound");
    }
    let (code, msg, _) = refused(&mut watcher, "relay/mark", json!({"label": "ep"})).await;
    assert_eq!(code, -32002, "{msg}");
    assert!(msg.contains("max_marks"), "{msg}");
    // Reconnecting buys no new room: what a session records of refusals is bounded for
    // all its connections together (16 MiB).
    for _ in 0..40 {
        let (mut again, _) = bridge(&relay.addr, WATCHER).await;
        for _ in 0..16 {
            let (code, _, _) = refused(&mut again, "relay/mark", big.clone()).await;
            assert_eq!(code, -32602);
        }
        let (code, _, _) = refused(&mut again, "tools/call", call("sim/echo")).await;
        assert_eq!(code, FORBIDDEN);
    }
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    // 840 refused 200 KB marks: what was recorded stays within the session's bound, not the
    // 168 MB they weigh.
    let size = dir_size(&data);
    assert!(size < 24 << 20, "the data dir holds {size} bytes");
    let out = output(&[
        "export",
        "--data-dir",
        data.to_str().expect("utf8"),
        "latest",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let marks = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"kind\":\"mark\""))
        .count();
    assert_eq!(marks, 3, "the three kept marks, and no refused one");
}

/// Bytes of the files under `dir`.
fn dir_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let meta = e.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}
