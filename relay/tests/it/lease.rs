//! The controller lease through the real binary: contention between two
//! controllers, "held by <name> until <time>", release, expiry, the holder leaving, and the
//! `relay/lease` events a subscriber sees, in order.

use crate::support::identities::*;
use crate::support::*;
use serde_json::{json, Value};

const LEASE_HELD: i64 = -32008;
const ALPHA: &str = "alpha-token-0123456789abcdef";
const BETA: &str = "beta-token-0123456789abcdef";

/// The next `relay/lease` event's payload.
async fn lease_event(c: &mut Client) -> Value {
    loop {
        let e = c.next_event().await.expect("event");
        if e["channel"] == "relay/lease" {
            return e["payload"].clone();
        }
    }
}

#[tokio::test]
async fn one_controller_at_a_time_calls_leased_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"alpha\"\ntoken = \"{ALPHA}\"\n\n[[route.bridge]]\nname = \"beta\"\ntoken = \"{BETA}\"\n\n[[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "leased = [\"sim/echo\"]", &bridges),
    );
    let data = dir.path().join("data");
    let file = dir.path().join("bridge.json");
    let relay = serve_config(
        &cfg,
        file.to_str().expect("utf8"),
        &[
            "--data-dir",
            data.to_str().expect("utf8"),
            "--compression",
            "none",
        ],
    )
    .await;
    let (mut watcher, _) = bridge(&relay.addr, WATCHER).await;
    watcher
        .subscribe(&["world/tick"])
        .await
        .expect("subscribed");
    let (mut alpha, _) = bridge(&relay.addr, ALPHA).await;
    let (mut beta, _) = bridge(&relay.addr, BETA).await;

    // Nobody holds it: a leased tool needs the lease; others are free.
    let (code, msg, _) = refused(&mut alpha, "tools/call", call("sim/echo")).await;
    assert_eq!(code, LEASE_HELD);
    assert!(msg.contains("acquire"), "{msg}");

    let got = alpha
        .call("relay/lease", json!({"action": "acquire", "ttlMs": 60000}))
        .await
        .expect("acquired");
    assert_eq!(got["held"], true);
    assert_eq!(got["holder"], "alpha");
    let e = lease_event(&mut watcher).await;
    assert_eq!(
        (e["change"].as_str(), e["holder"].as_str()),
        (Some("acquired"), Some("alpha")),
        "{e}"
    );

    // Contention: beta is told who holds it and until when.
    let (code, msg, held) = refused(&mut beta, "relay/lease", json!({"action": "acquire"})).await;
    assert_eq!(code, LEASE_HELD);
    assert!(
        msg.contains("held by alpha") && msg.contains(" until 20"),
        "{msg}"
    );
    assert_eq!(held["holder"], "alpha");
    let (code, msg, _) = refused(&mut beta, "tools/call", call("sim/echo")).await;
    assert_eq!(code, LEASE_HELD);
    assert!(msg.contains("held by alpha"), "{msg}");
    let (code, _, _) = refused(&mut beta, "relay/lease", json!({"action": "release"})).await;
    assert_eq!(code, LEASE_HELD, "only the holder releases");
    let calls = md.calls();
    alpha
        .call("tools/call", call("sim/echo"))
        .await
        .expect("the holder calls");
    assert_eq!(md.calls(), calls + 1, "refused calls never reached the mod");
    let renewed = alpha
        .call("relay/lease", json!({"action": "renew", "ttlMs": 60000}))
        .await
        .expect("renewed");
    assert_eq!(renewed["held"], true);
    assert_eq!(lease_event(&mut watcher).await["change"], "renewed");

    // Status shows the holder.
    let out = output(&[
        "status",
        "--bridge-file",
        file.to_str().expect("utf8"),
        "--json",
    ])
    .await;
    let v = json(&out);
    assert_eq!(v["relays"][0]["status"]["lease"]["holder"], "alpha", "{v}");

    // Release, then beta takes it for a short time and lets it expire.
    alpha
        .call("relay/lease", json!({"action": "release"}))
        .await
        .expect("released");
    assert_eq!(lease_event(&mut watcher).await["change"], "released");
    beta.call("relay/lease", json!({"action": "acquire", "ttlMs": 300}))
        .await
        .expect("beta acquires");
    let e = lease_event(&mut watcher).await;
    assert_eq!(
        (e["change"].as_str(), e["holder"].as_str()),
        (Some("acquired"), Some("beta")),
        "{e}"
    );
    let e = lease_event(&mut watcher).await;
    assert_eq!(
        (e["change"].as_str(), e["holder"].as_str()),
        (Some("expired"), Some("beta")),
        "{e}"
    );
    let (code, msg, _) = refused(&mut beta, "tools/call", call("sim/echo")).await;
    assert_eq!(code, LEASE_HELD, "expired: {msg}");

    // Alpha takes it again and leaves: the lease ends with it.
    alpha
        .call("relay/lease", json!({"action": "acquire"}))
        .await
        .expect("alpha again");
    assert_eq!(lease_event(&mut watcher).await["change"], "acquired");
    alpha.close().await.expect("close");
    let e = lease_event(&mut watcher).await;
    assert_eq!(
        (e["change"].as_str(), e["holder"].as_str()),
        (Some("holder-left"), Some("alpha")),
        "{e}"
    );
    beta.call("relay/lease", json!({"action": "acquire"}))
        .await
        .expect("free again");
    assert_eq!(lease_event(&mut watcher).await["change"], "acquired");

    // Bad requests are parameter errors, and observers get no lease.
    let (code, _, _) = refused(&mut beta, "relay/lease", json!({"action": "steal"})).await;
    assert_eq!(code, -32602);
    let (code, _, _) = refused(
        &mut beta,
        "relay/lease",
        json!({"action": "acquire", "ttlMs": 0}),
    )
    .await;
    assert_eq!(code, -32602);
    let (code, _, _) = refused(&mut watcher, "relay/lease", json!({"action": "acquire"})).await;
    assert_eq!(code, -32006);

    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    // Lease changes are recorded (the uncompressed recording holds their events).
    assert!(!files_containing(&data, "holder-left").is_empty());
    assert!(files_containing(&data, ALPHA).is_empty());
}

/// Only an identity that may call a leased tool may take the lease (one that could call none
/// of them would only keep it from those who can), for at most the route's `lease_max_ttl`.
#[tokio::test]
async fn only_an_identity_that_may_call_a_leased_tool_holds_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"alpha\"\ntoken = \"{ALPHA}\"\ntools = [\"sim/*\"]\n\n[[route.bridge]]\nname = \"squatter\"\ntoken = \"{BETA}\"\ntools = [\"inventory/*\", \"!sim/*\"]\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(
            md.addr(),
            "leased = [\"sim/echo\"]\nlease_max_ttl = \"1m\"",
            &bridges,
        ),
    );
    let file = dir.path().join("bridge.json");
    let relay = serve_config(&cfg, file.to_str().expect("utf8"), &["--no-record"]).await;
    let (mut squatter, _) = bridge(&relay.addr, BETA).await;
    for action in ["acquire", "renew"] {
        let (code, msg, _) = refused(
            &mut squatter,
            "relay/lease",
            json!({"action": action, "ttlMs": 60000}),
        )
        .await;
        assert_eq!(code, -32006, "{msg}");
        assert!(
            msg.contains("squatter") && msg.contains("none of the leased tools"),
            "{msg}"
        );
    }
    let (mut alpha, _) = bridge(&relay.addr, ALPHA).await;
    let (code, msg, _) = refused(
        &mut alpha,
        "relay/lease",
        json!({"action": "acquire", "ttlMs": 60001}),
    )
    .await;
    assert_eq!(code, -32602, "{msg}");
    assert!(
        msg.contains("60000") && msg.contains("lease_max_ttl"),
        "{msg}"
    );
    let held = alpha
        .call("relay/lease", json!({"action": "acquire", "ttlMs": 60000}))
        .await
        .expect("alpha may call sim/echo, so it may hold the lease");
    assert_eq!(held["held"], true, "{held}");
    alpha
        .call("tools/call", call("sim/echo"))
        .await
        .expect("the holder calls its leased tool");
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
}

/// A controller renewing its lease as fast as it can, while two subscribers read slowly:
/// each subscriber holds at most one `relay/lease` notice (the newest), never one per
/// renewal, and the relay's memory stays within its bounds.
#[tokio::test]
async fn a_renew_flood_leaves_each_slow_subscriber_one_lease_notice() {
    use futures::StreamExt;

    const RENEWS: usize = 100_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"alpha\"\ntoken = \"{ALPHA}\"\n\n[[route.bridge]]\nname = \"watcher\"\ntoken = \"{WATCHER}\"\nrole = \"observe\"\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "leased = [\"sim/echo\"]", &bridges),
    );
    let file = dir.path().join("bridge.json");
    let relay = serve_config(&cfg, file.to_str().expect("utf8"), &["--no-record"]).await;
    let mut watchers = Vec::new();
    for _ in 0..2 {
        let (mut w, _) = bridge(&relay.addr, WATCHER).await;
        w.subscribe(&["world/tick"]).await.expect("subscribed");
        watchers.push(w);
    }
    let (mut alpha, _) = bridge(&relay.addr, ALPHA).await;
    alpha
        .call("relay/lease", json!({"action": "acquire", "ttlMs": 60000}))
        .await
        .expect("acquired");
    let rss_before = relay.peak_rss_mib();
    // Pipelined renewals, written while their answers are read.
    let (mut frames, mut write, _) = alpha.into_parts();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut buf = Vec::new();
        for i in 0..RENEWS {
            let body = gabp_proto::message::request(
                &gabp_client::new_id(),
                "relay/lease",
                json!({"action": "renew", "ttlMs": 60000}),
            );
            buf.extend_from_slice(&gabp_proto::frame_bytes(&body));
            if buf.len() > 64 * 1024 || i + 1 == RENEWS {
                write.write_all(&buf).await.expect("write");
                buf.clear();
            }
        }
        write
    });
    let mut answered = 0;
    while answered < RENEWS {
        let f = tokio::time::timeout(Duration::from_secs(60), frames.next())
            .await
            .expect("answers keep coming")
            .expect("open")
            .expect("frame");
        let v: Value = serde_json::from_slice(&f.body).expect("json");
        assert_eq!(v["result"]["held"], true, "{v}");
        answered += 1;
    }
    let _write = writer.await.expect("writer");
    drop(frames);
    // A renewal costs nothing that lasts (no timer per change, no notice per subscriber).
    let grown = relay.peak_rss_mib().saturating_sub(rss_before);
    assert!(
        grown < 48,
        "the relay grew {grown} MiB over {RENEWS} renewals"
    );

    // What the relay holds for the two subscribers that read nothing yet.
    let out = output(&[
        "status",
        "--bridge-file",
        file.to_str().expect("utf8"),
        "--json",
    ])
    .await;
    let v = json(&out);
    let held: Vec<Value> = v["relays"][0]["status"]["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .filter(|b| b["name"] == "watcher")
        .cloned()
        .collect();
    assert_eq!(held.len(), 2, "{v}");
    for b in &held {
        assert!(b["queueNotices"].as_u64().expect("notices") <= 1, "{b}");
        assert!(b["queueNoticeBytes"].as_u64().expect("bytes") < 1024, "{b}");
        let queued = b["queueBytes"].as_u64().unwrap_or(0)
            + b["queueControlBytes"].as_u64().unwrap_or(0)
            + b["queueNoticeBytes"].as_u64().unwrap_or(0);
        assert!(queued <= 16 << 20, "within the outbox bound: {b}");
    }
    // A subscriber that reads now sees the lease's current state, and far fewer notices
    // than renewals (only as many as it took while the flood went on).
    for mut w in watchers {
        let mut seen = 0usize;
        let mut last = Value::Null;
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), w.next_message()).await;
            let Ok(Ok(Some(m))) = next else { break };
            if m["channel"] == "relay/lease" {
                seen += 1;
                last = m;
            }
        }
        assert!(
            (1..RENEWS / 4).contains(&seen),
            "{seen} lease notices for {RENEWS} renewals"
        );
        assert_eq!(last["payload"]["change"], "renewed", "{last}");
        assert!(
            last["seq"].as_u64().expect("seq") >= RENEWS as u64,
            "{last}"
        );
    }
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
}

/// A bridge that keeps asking for a lease another holds is answered every time, but its
/// requests and their refusals are recorded within the session's refusal budget (1,024
/// frames), like any refused request: asking cannot fill the disk.
#[tokio::test]
async fn asking_for_a_held_lease_is_recorded_within_the_refusal_budget() {
    const ASKS: usize = 3000;
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let bridges = format!(
        "[[route.bridge]]\nname = \"alpha\"\ntoken = \"{ALPHA}\"\n\n[[route.bridge]]\nname = \"beta\"\ntoken = \"{BETA}\"\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "leased = [\"sim/echo\"]", &bridges),
    );
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf8");
    let file = dir.path().join("bridge.json");
    let relay = serve_config(&cfg, file.to_str().expect("utf8"), &["--data-dir", d]).await;
    let (mut alpha, w) = bridge(&relay.addr, ALPHA).await;
    let session = w["capabilities"]["extensions"]["relay"]["sessionId"]
        .as_str()
        .expect("session id")
        .to_string();
    alpha
        .call("relay/lease", json!({"action": "acquire", "ttlMs": 60000}))
        .await
        .expect("acquired");
    let (mut beta, _) = bridge(&relay.addr, BETA).await;
    for _ in 0..ASKS {
        let (code, msg, _) = refused(&mut beta, "relay/lease", json!({"action": "acquire"})).await;
        assert_eq!(code, LEASE_HELD, "{msg}");
    }
    drop(beta);
    drop(alpha);
    relay.stop().await;
    let out = crate::support::hostile::run(&["export", &session, "--data-dir", d]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asks = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"bridge->relay\"") && l.contains("\"relay/lease\""))
        .count();
    // Alpha's acquire, and at most the budget's 1,024 of beta's refused asks.
    assert!(
        (2..=1 + 1024).contains(&asks),
        "{asks} lease requests recorded for {ASKS} asked"
    );
}
