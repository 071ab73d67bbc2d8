//! The controller lease through the real binary (issue 15): contention between two
//! controllers, "held by <name> until <time>", release, expiry, the holder leaving, and the
//! `relay/lease` events a subscriber sees, in order.

mod support;

use serde_json::{json, Value};
use support::identities::*;
use support::*;

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
