//! Reloading identities through the real binary: `gabp-relay reload` (SIGHUP to
//! the relay found through its discovery file) re-reads the config; a bridge whose identity is
//! unchanged stays connected, one that was removed or whose token changed gets a
//! `relay/revoked` notice and is closed, the new token works and the old ones do not; a
//! config that no longer loads changes nothing and is reported; ignored changes are logged.

use crate::support::identities::*;
use crate::support::*;
use serde_json::json;

const KEEP: &str = "keeper-token-0123456789abcdef";
const GONE: &str = "goner-token-0123456789abcdef";
const OLD: &str = "rotated-old-0123456789abcdef";
const NEW: &str = "rotated-new-0123456789abcdef";

/// The next message, which must be the revocation notice, then the end of the connection.
async fn revoked(c: &mut Client, reason: &str) {
    let notice = c
        .next_message()
        .await
        .expect("read")
        .expect("a notice before the close");
    assert_eq!(notice["channel"], "relay/revoked", "{notice}");
    assert_eq!(notice["payload"]["reason"], reason, "{notice}");
    match c.next_message().await {
        Ok(None) | Err(_) => {}
        Ok(Some(m)) => panic!("still open after the notice: {m}"),
    }
}

#[tokio::test]
async fn reload_revokes_changed_identities_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let token_file = dir.path().join("rotated.token");
    std::fs::write(&token_file, OLD).expect("token file");
    let tables = |with_goner: bool, keeper_role: &str| {
        let mut t = format!(
            "[[route.bridge]]\nname = \"keeper\"\ntoken = \"{KEEP}\"\nrole = \"{keeper_role}\"\n\n[[route.bridge]]\nname = \"rotated\"\ntoken_file = \"{}\"\n\n",
            token_file.display()
        );
        if with_goner {
            t += &format!("[[route.bridge]]\nname = \"goner\"\ntoken = \"{GONE}\"\n");
        }
        t
    };
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "", &tables(true, "control")),
    );
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf8");
    let data = dir.path().join("data");
    let relay = serve_config(
        &cfg,
        f,
        &[
            "--data-dir",
            data.to_str().expect("utf8"),
            "--compression",
            "none",
        ],
    )
    .await;
    let (mut keeper, _) = bridge(&relay.addr, KEEP).await;
    let (mut rotated, _) = bridge(&relay.addr, OLD).await;
    let (mut goner, _) = bridge(&relay.addr, GONE).await;
    keeper
        .call("tools/call", call("sim/echo"))
        .await
        .expect("control");
    keeper
        .call(
            "relay/lease",
            json!({"action": "acquire", "ttlMs": 300_000}),
        )
        .await
        .expect("a controller takes the lease");

    // The goner is removed, the rotated token changes, the keeper becomes an observer, and a
    // setting that needs a restart changes too.
    std::fs::write(&token_file, NEW).expect("rotate");
    let text = config_text(md.addr(), "outbox_frames = 999", &tables(false, "observe"));
    config_file(dir.path(), "relay.toml", &text);
    let out = output(&["reload", "--bridge-file", f]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(said, "route r: reloaded (1 kept, 2 disconnected)\n");

    revoked(&mut goner, "identity-removed").await;
    revoked(&mut rotated, "token-changed").await;
    // The keeper is still connected, with its new rights.
    keeper
        .call("tools/list", json!({}))
        .await
        .expect("still connected");
    let r = keeper
        .request("tools/call", call("sim/echo"))
        .await
        .expect("answered");
    assert_eq!(r["error"]["code"], -32006, "now an observer: {r}");
    // An observer holds no lease: the one it held ended with the reload.
    let st = keeper
        .call("relay/status", json!({}))
        .await
        .expect("status");
    assert!(
        st["lease"].is_null(),
        "the demoted holder's lease ended: {st}"
    );

    // The new token works; the old and removed ones do not.
    let (mut renewed, _) = bridge(&relay.addr, NEW).await;
    // Tokens the relay accepted before the reload stay secrets: a bridge that sends them
    // along (to the mod and back) leaves them in no recording.
    renewed
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"x": GONE, "y": OLD}}),
        )
        .await
        .expect("echoed");
    for t in [OLD, GONE] {
        let mut c = Client::connect(&relay.addr).await.expect("connect");
        let err = c.hello(t).await.expect_err("refused");
        assert!(err.to_string().contains("-31000"), "{err}");
    }
    relay
        .wait_log("changed settings ignored until a restart: outbox_frames", 1)
        .await;

    // A config that no longer loads: reported in one line, nothing changes.
    config_file(dir.path(), "relay.toml", "[[route]]\nname = 5\n");
    let out = output(&["reload", "--bridge-file", f]).await;
    assert_eq!(out.status.code(), Some(1));
    let line = one_line(&out);
    assert!(
        line.contains("reload failed, nothing changed") && line.contains("line 2"),
        "{line}"
    );
    keeper
        .call("tools/list", json!({}))
        .await
        .expect("kept through a failed reload");
    bridge(&relay.addr, NEW).await;

    // SIGHUP itself (as `systemctl reload` sends it) does the same.
    config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "", &tables(true, "control")),
    );
    signal(&relay.child, "HUP");
    relay.wait_log("reload: identities now", 2).await;
    bridge(&relay.addr, GONE).await;

    let log = relay.log.lock().join("\n");
    for t in [KEEP, GONE, OLD, NEW, BRIDGE_TOKEN] {
        assert!(!log.contains(t), "a token in the log");
    }
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    for t in [GONE, OLD] {
        let hits = files_containing(&data, t);
        assert!(
            hits.is_empty(),
            "a token the relay once accepted is recorded: {hits:?}"
        );
    }
}

/// A relay started without `--config` has nothing to re-read: `reload` says so (exit 1)
/// instead of reporting a reload, and the relay goes on as it was.
#[tokio::test]
async fn reload_without_a_config_file_says_there_is_nothing_to_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let md = quiet_mod();
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf8");
    let data = dir.path().join("data");
    let relay = serve_recording(md.addr(), &data, &["--bridge-file", f]).await;
    let out = output(&["reload", "--bridge-file", f]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = one_line(&out);
    assert!(
        line.contains("reload failed, nothing changed") && line.contains("without --config"),
        "{line}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    bridge(&relay.addr, BRIDGE_TOKEN).await;
    relay.stop_cleanly().await;
}

/// A quiet simulated mod on `addr` (a port picked before the relay started).
fn quiet_mod_at(addr: std::net::SocketAddr) -> ModSim {
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        autostart: false,
        ..ModSimConfig::default()
    };
    ModSim::start(&Addr::Tcp(addr), cfg).expect("mod")
}

/// A hello that waits for the mod is decided when it is welcomed: a reload meanwhile that
/// makes its identity an observer, or removes it, is what the bridge gets.
#[tokio::test]
async fn a_hello_waiting_for_the_mod_gets_the_identity_in_force_at_its_welcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_addr();
    let upstream = Addr::Tcp(port);
    let tables = |planner_role: &str, with_goner: bool| {
        let mut t = format!("[[route.bridge]]\nname = \"planner\"\ntoken = \"{KEEP}\"\nrole = \"{planner_role}\"\n\n");
        if with_goner {
            t += &format!("[[route.bridge]]\nname = \"goner\"\ntoken = \"{GONE}\"\n");
        }
        t
    };
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(&upstream, "", &tables("control", true)),
    );
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf8");
    let relay = serve_config(&cfg, f, &["--no-record"]).await;
    // Both say hello while the mod is down: the relay holds their hellos.
    let mut planner = Client::connect(&relay.addr).await.expect("connect");
    let mut goner = Client::connect(&relay.addr).await.expect("connect");
    planner.set_wait(Duration::from_secs(30));
    goner.set_wait(Duration::from_secs(30));
    let hello = |token: &str| json!({"token": token, "bridgeVersion": "t", "platform": "linux", "launchId": "t"});
    let planner_hello = gabp_client::new_id();
    let goner_hello = gabp_client::new_id();
    for (c, id, token) in [
        (&mut planner, &planner_hello, KEEP),
        (&mut goner, &goner_hello, GONE),
    ] {
        let body = gabp_proto::message::request(id, "session/hello", hello(token));
        c.send_body(&body).await.expect("hello sent");
    }
    config_file(
        dir.path(),
        "relay.toml",
        &config_text(&upstream, "", &tables("observe", false)),
    );
    let out = output(&["reload", "--bridge-file", f]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = quiet_mod_at(port);
    let welcome = planner.response_to(&planner_hello).await.expect("answered");
    assert_eq!(
        welcome["result"]["capabilities"]["extensions"]["relay"]["bridge"]["role"], "observe",
        "{welcome}"
    );
    let (code, msg, _) = refused(&mut planner, "tools/call", call("sim/echo")).await;
    assert_eq!(code, -32006, "{msg}");
    let refusal = goner.response_to(&goner_hello).await.expect("answered");
    assert_eq!(refusal["error"]["code"], -31000, "{refusal}");
    assert_eq!(md.calls(), 0, "nothing reached the mod");
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
}

/// A hello refused because the mod is down has one answer, and the bridge may say hello
/// again on the same connection once the mod is up: no second, unasked error, no close.
#[tokio::test]
async fn a_hello_refused_for_want_of_a_mod_may_be_said_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_addr();
    let file = dir.path().join("bridge.json");
    let upstream = port.to_string();
    let relay = serve(&[
        "--upstream",
        &upstream,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--no-record",
        "--bridge-file",
        file.to_str().expect("utf8"),
    ])
    .await;
    let mut c = Client::connect(&relay.addr).await.expect("connect");
    c.set_wait(Duration::from_secs(30));
    let err = c.hello(BRIDGE_TOKEN).await.expect_err("no mod");
    assert!(err.to_string().contains("-32000"), "{err}");
    // Nothing more arrives on its own (the relay used to send a second error and close).
    let more = tokio::time::timeout(Duration::from_secs(2), c.next_message()).await;
    assert!(more.is_err(), "an unasked message or a close: {more:?}");
    let md = quiet_mod_at(port);
    let welcome = c
        .hello(BRIDGE_TOKEN)
        .await
        .expect("welcomed on the same connection");
    assert!(
        welcome["capabilities"]["extensions"]["relay"].is_object(),
        "{welcome}"
    );
    c.call("tools/call", call("sim/echo"))
        .await
        .expect("called");
    assert_eq!(md.calls(), 1);
    relay.stop_cleanly().await;
}
