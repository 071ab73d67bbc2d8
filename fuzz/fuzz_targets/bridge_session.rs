//! The bridge-facing state machine, driven by sequences of frames: hellos (right, wrong,
//! repeated), requests of every kind, subscriptions, garbage bodies and broken framing, in any
//! order, into a real bridge connection task over an in-memory stream (virtual time, so every
//! timeout fires at once). Checks, whatever the sequence:
//! - every frame the relay writes is a well-formed response or event;
//! - nothing reaches the mod before the relay has welcomed the bridge;
//! - before a welcome, at most `MAX_PREHELLO_ERRORS` errors are sent, then the connection ends;
//! - the bridge's queues stay within their bounds, and the connection task always ends once
//!   the peer is gone.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gabp_proto::{frame_bytes, message, GabpCodec};
use gabp_engine::bridge::{self, Closer, MAX_PREHELLO_ERRORS};
use gabp_engine::route::{Route, SessionInfo};
use gabp_engine::{OnSlow, RouteConfig, Upstream};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// One step of the sequence, chosen by an input byte; its argument bytes follow.
fn step(op: u8, arg: &[u8]) -> Vec<u8> {
    let id = uuid::Uuid::from_u128(
        arg.iter()
            .fold(7u128, |h, &b| h.wrapping_mul(31) ^ b as u128),
    );
    let text = String::from_utf8_lossy(arg);
    let body = |method: &str, params: Value| {
        frame_bytes(&message::request(&id.to_string(), method, params)).to_vec()
    };
    match op % 12 {
        0 => body(
            "session/hello",
            json!({"token": TOKEN, "bridgeVersion": "f", "platform": "linux", "launchId": text}),
        ),
        1 => body(
            "session/hello",
            json!({"token": text, "bridgeVersion": "f", "platform": "linux", "launchId": "l"}),
        ),
        2 => body(
            "events/subscribe",
            json!({"channels": arg.iter().map(|b| format!("c{}", b % 16)).collect::<Vec<_>>()}),
        ),
        3 => body(
            "events/unsubscribe",
            json!({"channels": arg.iter().map(|b| format!("c{b}")).collect::<Vec<_>>()}),
        ),
        4 => body(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"x": text}}),
        ),
        5 => body("relay/status", json!({})),
        6 => body(
            &format!("x/{}", arg.first().copied().unwrap_or(0)),
            json!({}),
        ),
        // A framed body of raw input bytes.
        7 => frame_bytes(arg).to_vec(),
        // Raw bytes: broken framing, partial frames, headers.
        8 => arg.to_vec(),
        9 => format!("Content-Length: {}\r\n\r\n", arg.len() * 997).into_bytes(),
        10 => body("tools/list", json!({})),
        _ => {
            // A valid request with a response's shape, or an event: bridges may only request.
            let v = json!({"v": "gabp/1", "id": id.to_string(), "type": if arg.len() % 2 == 0 { "response" } else { "event" }, "result": {}, "channel": "c", "seq": 0, "payload": {}});
            frame_bytes(&serde_json::to_vec(&v).expect("json")).to_vec()
        }
    }
}

fn route() -> Arc<Route> {
    let mut cfg = RouteConfig::new(
        "fuzz",
        Upstream::Addr("127.0.0.1:9".parse().expect("addr")),
        "127.0.0.1:0".parse().expect("addr"),
        TOKEN.into(),
    );
    cfg.record = false;
    cfg.on_slow = OnSlow::DropOldest;
    cfg.outbox_frames = 16;
    cfg.outbox_bytes = 4096;
    cfg.max_pending = 4;
    cfg.max_subscriptions = 8;
    cfg.max_body = 4096;
    cfg.hello_wait = Duration::from_millis(10);
    cfg.frame_timeout = Duration::from_millis(100);
    cfg.write_deadline = Duration::from_millis(100);
    Route::new(cfg, None, tokio_util::sync::CancellationToken::new())
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(run(data));
});

async fn run(data: &[u8]) {
    let route = route();
    let (up_tx, mut up_rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    route.set_session(Some(Arc::new(SessionInfo {
        id: uuid::Uuid::now_v7(),
        welcome: json!({"agentId": "fuzz", "capabilities": {"events": ["c1"]}}),
        advertised: vec!["c1".into()],
        started_ns: 0,
        upstream: up_tx,
    })));
    let (client, server) = tokio::io::duplex(8 * 1024);
    let (sr, sw) = tokio::io::split(server);
    let conn = gabp_rt::net::Conn::from_halves(sr, sw, "fuzz");
    let permit = Arc::new(tokio::sync::Semaphore::new(1))
        .try_acquire_owned()
        .expect("permit");
    let serve = tokio::spawn(bridge::serve(
        route.clone(),
        conn,
        permit,
        Closer::default(),
    ));
    let (cr, mut cw) = tokio::io::split(client);

    // What the relay writes, in order, with what had reached the mod by then.
    let reader = tokio::spawn(async move {
        let mut frames = FramedRead::new(cr, GabpCodec::new(1 << 20));
        let mut out: Vec<Value> = Vec::new();
        while let Some(Ok(f)) = frames.next().await {
            let v: Value = serde_json::from_slice(&f.body).expect("the relay writes JSON");
            assert!(
                matches!(v["type"].as_str(), Some("response" | "event")),
                "relay wrote {v}"
            );
            out.push(v);
        }
        out
    });
    let mut rest = data;
    while let [op, len, tail @ ..] = rest {
        let n = (*len as usize).min(tail.len());
        let _ = cw.write_all(&step(*op, &tail[..n])).await;
        rest = &tail[n..];
        // Let the relay act on each step (virtual time: free).
        tokio::time::sleep(Duration::from_millis(1)).await;
        for b in route.bridges().iter() {
            let (events, event_bytes, _) = b.outbox.depth();
            assert!(events <= 16 && event_bytes <= 4096 + 8192);
            assert!(b.outbox.control_bytes() <= 4096 + (1 << 20));
        }
    }
    let _ = cw.shutdown().await;
    drop(cw);
    tokio::time::timeout(Duration::from_secs(60), serve)
        .await
        .expect("the connection task ends once the peer is gone")
        .expect("no panic");
    let written = reader.await.expect("reader");
    let welcomed = written
        .iter()
        .any(|v| v["result"]["capabilities"]["extensions"]["relay"].is_object());
    if data.len() >= 2 && data[0] % 12 == 0 {
        assert!(welcomed, "a first hello with the right token is welcomed");
    }
    let mut forwarded = 0;
    while up_rx.try_recv().is_ok() {
        forwarded += 1;
    }
    if !welcomed {
        assert_eq!(forwarded, 0, "a request reached the mod without a welcome");
        let errors = written.iter().filter(|v| v.get("error").is_some()).count();
        assert!(
            errors <= MAX_PREHELLO_ERRORS as usize,
            "{errors} errors before a welcome"
        );
    }
    assert!(
        route.bridges().is_empty(),
        "the bridge's state is freed"
    );
}
