//! Names a bridge chooses (channels, methods) that spell a secret: any bridge token, the mod's,
//! one a reload added. The relay sends them on to the mod as they are, but no recording, log
//! line, metric label or `relay/status` answer holds the secret, whichever frame carries the
//! name: the bridge's own, the subscriptions the relay makes for it, the mod's answers and
//! events, or the relay's replies.

use crate::support::hostile::{accept, bind, ModConn};
use crate::support::identities::*;
use crate::support::*;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// An observer's token: it must not learn the other identities' tokens from `relay/status`.
const LOOKER: &str = "looker-token-0123456789abcdef";
/// A token that exists only after a reload.
const LATE: &str = "late-token-0123456789abcdef";

/// The scripted mod: every request answered successfully with its params echoed (as mods
/// that echo what they were asked do), and one event on each channel it is asked for.
fn echoing_mod(mut m: ModConn) {
    tokio::spawn(async move {
        let mut seq = 0u64;
        while let Some(Ok(f)) = m.frames.next().await {
            let Ok(req) = serde_json::from_slice::<Value>(&f.body) else {
                continue;
            };
            let answer = json!({"v": "gabp/1", "id": req["id"], "type": "response", "result": {"echo": req["params"]}});
            let mut bodies = vec![answer.to_string()];
            if req["method"] == "events/subscribe" {
                for c in req["params"]["channels"].as_array().into_iter().flatten() {
                    bodies.push(json!({"v": "gabp/1", "type": "event", "channel": c, "seq": seq, "payload": {"n": seq}}).to_string());
                    seq += 1;
                }
            }
            let mut wire = bytes::BytesMut::new();
            for b in bodies {
                gabp_proto::encode_frame(b.as_bytes(), &mut wire);
            }
            if m.write.write_all(&wire).await.is_err() {
                return;
            }
        }
    });
}

/// Where `text` shows one of `secrets`, as `place: secret`.
fn leaks(place: &str, text: &str, secrets: &[&str]) -> Vec<String> {
    secrets
        .iter()
        .filter(|s| text.contains(*s))
        .map(|s| format!("{place}: {s}"))
        .collect()
}

#[tokio::test]
async fn names_spelling_a_secret_reach_no_recording_log_metric_or_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (listener, mod_addr) = bind().await;
    let mod_addr: Addr = mod_addr.parse().expect("addr");
    let looker = format!(
        "[[route.bridge]]\nname = \"looker\"\ntoken = \"{LOOKER}\"\nrole = \"observe\"\n\n"
    );
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(&mod_addr, "", &looker),
    );
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf8");
    let data = dir.path().join("data");
    let metrics_addr = free_addr().to_string();
    let relay = serve_config(
        &cfg,
        f,
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
    let mut m = accept(&listener).await;
    m.welcome(&["world"]).await;
    echoing_mod(m);

    // A token added by a reload is a secret from then on.
    let late = format!("[[route.bridge]]\nname = \"late\"\ntoken = \"{LATE}\"\n\n");
    config_file(
        dir.path(),
        "relay.toml",
        &config_text(&mod_addr, "", &format!("{looker}{late}")),
    );
    let out = output(&["reload", "--bridge-file", f]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secrets = [BRIDGE_TOKEN, LOOKER, LATE, MOD_TOKEN];

    // Subscriptions named after every secret: the relay subscribes the mod to each (recorded
    // relay->mod on conn 0), the mod echoes them and sends an event on each.
    let (mut owner, _) = bridge(&relay.addr, BRIDGE_TOKEN).await;
    let channels: Vec<String> = secrets.iter().map(|s| format!("c/{s}")).collect();
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    owner.subscribe(&names).await.expect("subscribed");
    for _ in &channels {
        tokio::time::timeout(Duration::from_secs(10), owner.next_event())
            .await
            .expect("an event on each channel")
            .expect("event");
    }
    // A method spelling a token, answered successfully by the mod.
    owner
        .call(&format!("game/t{LATE}"), json!({}))
        .await
        .expect("the mod answers any method");
    owner
        .call(
            "events/unsubscribe",
            json!({"channels": [format!("c/{LOOKER}")]}),
        )
        .await
        .expect("unsubscribed");

    // The observer may not call it; its request spells the token with a `\u` escape.
    let (mut looker_bridge, _) = bridge(&relay.addr, LOOKER).await;
    let escaped = format!("game/t\\u{:04x}{}", LATE.as_bytes()[0], &LATE[1..]);
    let id = gabp_client::new_id();
    looker_bridge
        .send_body(
            format!(r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"{escaped}","params":{{}}}}"#)
                .as_bytes(),
        )
        .await
        .expect("sent");
    let refusal = looker_bridge.response_to(&id).await.expect("answered");
    assert_eq!(refusal["error"]["code"], -32006, "{refusal}");
    relay.wait_log("request refused", 1).await;

    // Every place is looked at before the test fails, so a failure names them all: where a
    // secret shows, and where a redacted name that should be there is not.
    let mut found = Vec::new();
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            found.push(format!("not as expected: {what}"));
        }
    };
    // relay/status, as an observer asks it and as `gabp-relay status --json` prints it.
    let status = looker_bridge
        .call("relay/status", json!({}))
        .await
        .expect("status")
        .to_string();
    expect(
        status.contains("c/[redacted]"),
        "relay/status shows the subscriptions, redacted",
    );
    let out = output(&["status", "--bridge-file", f, "--json"]).await;
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    // Metrics: the method is counted, under `other`.
    let scraped = metrics(&metrics_addr).await;
    expect(
        scraped.contains(r#"gabp_requests_total{route="r",method="other",outcome="ok"}"#),
        "the method spelling a token is counted as `other`",
    );

    drop((owner, looker_bridge));
    let log = relay.log.clone();
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    let log = log.lock().join("\n");
    expect(
        log.contains("may not call game/t[redacted]"),
        "the refusal is logged, redacted",
    );
    // The recording, as exported and as bytes on disk.
    let d = data.to_str().expect("utf8");
    let export = output(&["export", "latest", "--data-dir", d]).await;
    assert!(export.status.success());
    let recorded = String::from_utf8_lossy(&export.stdout).to_string();
    let to_mod = |method: &str| {
        recorded.lines().any(|l| {
            let v: Value = serde_json::from_str(l).expect("JSON lines");
            v["dir"] == "relay->mod"
                && v["msg"]["method"] == method
                && v["msg"]["params"].to_string().contains("c/[redacted]")
        })
    };
    expect(
        to_mod("events/subscribe") && to_mod("events/unsubscribe"),
        "the relay's own requests to the mod are recorded, redacted",
    );
    for (place, text) in [
        ("relay/status", &status),
        ("status --json", &printed),
        ("/metrics", &scraped),
        ("log", &log),
        ("export", &recorded),
    ] {
        found.extend(leaks(place, text, &secrets));
    }
    for s in secrets {
        for hit in files_containing(&data, s) {
            found.push(format!("data dir file {hit}: {s}"));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}
