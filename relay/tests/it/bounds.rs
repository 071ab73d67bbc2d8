//! Regression tests for promises hostile or unlucky bridges once broke:
//! pre-hello floods, tokens in malformed hellos, the slow-bridge policies, the write deadline,
//! huge subscriptions, request bytes held for a deaf mod, and mod order on a busy socket. Each
//! failed against the code before its fix.

use std::time::{Duration, Instant};

use futures::StreamExt;
use gabp_client::Client;
use gabp_engine::{RouteConfig, Upstream};
use gabp_proto::GabpCodec;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

use crate::support::in_process::{
    error_code, exported, files_containing, loopback, quiet_mod, raw, recorded_frames,
    relay_config, request_wire, wait_until, Harness,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_is_closed_after_a_few_errors_and_not_recorded() {
    let h = Harness::start(quiet_mod()).await;
    h.wait_session().await;
    let mut honest = h.bridge().await;
    let mut s = raw(&h).await;
    // 20,000 well-formed requests without a hello, never reading: it used to be answered (and
    // recorded) 20,000 times, with the replies queued without bound.
    let one = request_wire("tools/list", json!({}));
    let flood: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take(one.len() * 20_000)
        .collect();
    let (mut r, mut w) = s.split();
    let write = async {
        let _ = w.write_all(&flood).await;
    };
    let read = async {
        let mut frames = FramedRead::new(&mut r, GabpCodec::default());
        let mut replies = 0;
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(f) = frames.next().await {
                match f {
                    Ok(_) => replies += 1,
                    Err(_) => return,
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the relay closed the connection");
        replies
    };
    let ((), replies) = tokio::join!(write, read);
    assert!(
        replies <= gabp_engine::bridge::MAX_PREHELLO_ERRORS as usize,
        "{replies} replies before the close"
    );
    assert!(honest.call("tools/list", json!({})).await.is_ok());
    drop(honest);
    let dir = h.shutdown().await;
    let frames = recorded_frames(dir.path());
    let prehello = frames
        .iter()
        .filter(|f| String::from_utf8_lossy(&f.body).contains("send session/hello first"))
        .count();
    assert_eq!(prehello, 0, "pre-hello traffic is counted, not recorded");
    assert!(frames.len() < 100, "{} frames recorded", frames.len());
}

/// Hellos in every malformed shape we could think of, each carrying the real token.
fn malformed_hellos(token: &str) -> Vec<Vec<u8>> {
    let id = uuid::Uuid::new_v4();
    let params = format!(
        r#""params":{{"token":"{token}","bridgeVersion":"b","platform":"linux","launchId":"l"}}"#
    );
    let good = format!(
        r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"session/hello",{params}}}"#
    );
    let mut escaped = String::new();
    for c in token.chars() {
        escaped.push_str(&format!("\\u{:04x}", c as u32));
    }
    let shapes: Vec<String> = vec![
        // id not a UUID
        good.replace(&id.to_string(), "not-a-uuid"),
        // duplicated keys: in params, in the envelope
        good.replace(
            r#""bridgeVersion":"b""#,
            &format!(r#""bridgeVersion":"b","token":"{token}""#),
        ),
        good.replace(
            r#""type":"request""#,
            r#""type":"request","type":"request""#,
        ),
        // unknown envelope field, unknown params field
        good.replace(r#""type":"request""#, r#""type":"request","extra":1"#),
        good.replace(
            r#""platform":"linux""#,
            r#""platform":"linux","x":{"y":[1,2]}"#,
        ),
        // trailing garbage, leading garbage, two documents
        format!("{good} garbage"),
        format!("x{good}"),
        format!("{good}{good}"),
        // truncated JSON, wrong version, wrong type, response shape
        good[..good.len() - 3].to_string(),
        good.replace("gabp/1", "gabp/9"),
        good.replace(r#""type":"request""#, r#""type":"event""#),
        good.replace(
            r#""type":"request","method":"session/hello","#,
            r#""type":"response","result":{"ok":1},"#,
        ),
        // invalid method name, method missing
        good.replace("session/hello", "Session.Hello"),
        good.replace(r#""method":"session/hello","#, ""),
        // non-finite numbers, a number token, nested token
        good.replace(r#""launchId":"l""#, r#""launchId":"l","n":1e999"#),
        good.replace(
            &format!(r#""token":"{token}""#),
            &format!(r#""token":{{"value":"{token}"}}"#),
        ),
        good.replace(
            r#""params":{"#,
            &format!(r#""params":{{"auth":{{"token":"{token}"}},"#),
        ),
        // the token escaped (decodes to the real one) with garbage after it
        format!("{} !", good.replace(token, &escaped)),
        // the token spelled with an escaped key, upper case key, array envelope
        good.replace(r#""token""#, r#""\u0074oken""#)
            .replace(r#""launchId":"l""#, r#""launchId":"l","#),
        good.replace(r#""token""#, r#""TOKEN""#).replace("}}", "}"),
        format!(r#"["session/hello","{token}"]"#),
        format!(r#"{{"token":"{token}"}}"#),
        // the token as a key name (echoed by "unknown field" errors)
        good.replace(
            r#""type":"request""#,
            &format!(r#""type":"request","{token}":1"#),
        ),
        // valid hellos carrying the token elsewhere too
        good.replace(r#""launchId":"l""#, &format!(r#""launchId":"{token}""#)),
        good.replace(
            r#""bridgeVersion":"b""#,
            &format!(r#""bridgeVersion":"{escaped}""#),
        ),
    ];
    let mut out: Vec<Vec<u8>> = shapes.into_iter().map(String::into_bytes).collect();
    // Invalid UTF-8 next to the token.
    let mut bad_utf8 = good.clone().into_bytes();
    let at = bad_utf8.len() - 2;
    bad_utf8.insert(at, 0xff);
    out.push(bad_utf8);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_malformed_hello_puts_the_token_in_the_recording() {
    let h = Harness::start(quiet_mod()).await;
    h.wait_session().await;
    let shapes = malformed_hellos(&h.token);
    // Before any hello, on fresh connections (each is closed after a few errors)...
    for body in &shapes {
        let mut c = Client::connect(&h.addr).await.expect("connect");
        c.send_body(body).await.expect("send");
        let _ = c.next_frame().await;
    }
    // ...and after a successful hello, where bad frames are recorded (redacted).
    let mut authed = h.bridge().await;
    for body in &shapes {
        authed.send_body(body).await.expect("send");
        let reply = authed.next_message().await.expect("reply").expect("open");
        assert!(reply.get("error").is_some(), "{reply}");
    }
    // The token in a tool's arguments, which the mod echoes back.
    let echo = authed
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"t": h.token}}),
        )
        .await
        .expect("echo");
    assert_eq!(echo["echo"]["t"], h.token.as_str());
    // The token spelled with JSON escapes in a valid request: one escaped character, then all.
    let one = format!("\\u{:04x}{}", h.token.as_bytes()[0], &h.token[1..]);
    let all: String = h.token.bytes().map(|c| format!("\\u{c:04x}")).collect();
    for (i, spelled) in [one, all].iter().enumerate() {
        let body = format!(
            r#"{{"v":"gabp/1","id":"00000000-0000-4000-8000-00000000e5c{i}","type":"request","method":"tools/call","params":{{"name":"sim/echo","arguments":{{"t":"{spelled}"}}}}}}"#
        );
        authed.send_body(body.as_bytes()).await.expect("send");
        let reply = authed.next_message().await.expect("reply").expect("open");
        assert_eq!(reply["result"]["echo"]["t"], h.token.as_str(), "{reply}");
    }
    assert!(authed.call("tools/list", json!({})).await.is_ok());
    drop(authed);
    let token = h.token.clone();
    let dir = h.shutdown().await;
    let frames = recorded_frames(dir.path());
    assert!(
        frames
            .iter()
            .any(|f| String::from_utf8_lossy(&f.body).contains("[redacted]")),
        "the hello is recorded, redacted"
    );
    for f in &frames {
        // Decoded too: an escaped token is still the token.
        let decoded = serde_json::from_slice::<serde_json::Value>(&f.body)
            .map(|v| v.to_string())
            .unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&f.body).contains(&token) && !decoded.contains(&token),
            "token recorded in {:?}",
            String::from_utf8_lossy(&f.body)
        );
    }
    let export = exported(dir.path());
    assert!(!export.is_empty());
    assert!(
        !String::from_utf8_lossy(&export).contains(&token),
        "token in the export"
    );
    let hits = files_containing(dir.path(), token.as_bytes());
    assert!(hits.is_empty(), "token in {hits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_subscribe_is_refused_before_any_work() {
    let h = Harness::start(quiet_mod()).await;
    let mut hostile = h.bridge().await;
    let mut honest = h.bridge().await;
    let channels: Vec<String> = (0..80_000).map(|i| format!("c{i}")).collect();
    let started = Instant::now();
    let r = hostile
        .request("events/subscribe", json!({ "channels": channels }))
        .await
        .expect("answer");
    assert_eq!(error_code(&r), -32002);
    // Generous: the O(n²) de-duplication took ~5 s; a cap check takes microseconds.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    // Under the cap, duplicates are fine and de-duplicated.
    let dup: Vec<&str> = std::iter::repeat_n("a", 1000).chain(["b"]).collect();
    let r = hostile
        .call("events/subscribe", json!({ "channels": dup }))
        .await
        .expect("subscribe");
    assert_eq!(r["subscribed"], json!(["a", "b"]));
    assert!(honest.call("tools/list", json!({})).await.is_ok());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_name_a_bridge_invents_is_bounded_in_length() {
    let h = Harness::start(quiet_mod()).await;
    let mut b = h.bridge().await;
    let longest = "c".repeat(gabp_proto::params::MAX_CHANNEL_NAME);
    let r = b
        .call("events/subscribe", json!({ "channels": [longest] }))
        .await
        .expect("a name of the longest length is taken");
    assert_eq!(r["subscribed"], json!([longest]));
    let r = b
        .request(
            "events/subscribe",
            json!({ "channels": ["a", format!("{longest}c")] }),
        )
        .await
        .expect("answer");
    assert_eq!(error_code(&r), -32602, "{r}");
    h.shutdown().await;
}

/// A mod that welcomes the relay and then never reads again.
async fn deaf_mod() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.expect("accept");
        let (r, mut w) = s.into_split();
        let mut frames = FramedRead::new(r, GabpCodec::default());
        let hello = frames.next().await.expect("hello").expect("frame");
        let hello: Value = serde_json::from_slice(&hello.body).expect("json");
        let welcome = gabp_proto::message::result_response(
            hello["id"].as_str().expect("id"),
            json!({"agentId": "deaf", "app": {"name": "Deaf", "version": "1"}, "capabilities": {"events": []}}),
        );
        w.write_all(&gabp_proto::frame_bytes(&welcome))
            .await
            .expect("welcome");
        // Hold the connection, reading nothing, until told to go.
        let _ = stopped.await;
        drop((frames, w));
    });
    (addr, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_a_deaf_mod_are_bounded_in_bytes_and_memory_comes_back() {
    let (mod_addr, stop) = deaf_mod().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = gabp_engine::generate_token();
    let mut route = RouteConfig::new(
        "deaf",
        Upstream::Addr(gabp_sim::Addr::Tcp(mod_addr)),
        loopback(),
        token.clone(),
    );
    route.record = false;
    let relay = gabp_engine::Relay::start(relay_config(route, dir.path()))
        .await
        .expect("relay");
    let r = relay.routes[0].clone();
    let mut rx = r.sessions();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.is_some()))
        .await
        .expect("session")
        .expect("watch");
    let (mut c, _) = Client::connect_hello(&relay.addrs[0], &token)
        .await
        .expect("hello");
    // 200 requests of ~900 KB: 180 MB the relay used to hold (and keep).
    let pad = "x".repeat(900 * 1024);
    let mut refused = 0;
    let mut peak = 0;
    for _ in 0..200 {
        let body = gabp_proto::message::request(
            &gabp_client::new_id(),
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"pad": pad}}),
        );
        c.send_body(&body).await.expect("send");
        peak = peak.max(r.pending().bytes.used());
        c.set_wait(Duration::from_millis(200));
        if let Ok(Some(m)) = c.next_message().await {
            assert_eq!(error_code(&m), -32002, "{m}");
            refused += 1;
        }
    }
    peak = peak.max(r.pending().bytes.used());
    let bound = gabp_engine::pending::BRIDGE_BYTES + 1024 * 1024;
    assert!(
        peak <= bound,
        "held {peak} bytes of requests (bound {bound})"
    );
    assert!(refused >= 150, "only {refused} of 200 refused");
    // The mod goes away: the queued requests are dropped and their memory comes back.
    let _ = stop.send(());
    wait_until("request bytes released", Duration::from_secs(10), || {
        r.pending().bytes.used() == 0
    })
    .await;
    drop(c);
    assert!(relay.shutdown().await);
}
