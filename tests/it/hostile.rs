//! Hostile and broken input from real sockets (DESIGN.md, Wire): an error reply while the
//! stream is in sync, a close when it is not, no internals in any message, and nobody else
//! affected.

use std::time::Duration;

use gabp_sim::Client;
use serde_json::json;

use crate::harness::{error_code, quiet_mod, Harness};

const ID: &str = "550e8400-e29b-41d4-a716-446655440000";

/// Sends one framed body after hello and returns the reply.
async fn reply_to(c: &mut Client, body: &[u8]) -> serde_json::Value {
    c.send_body(body).await.expect("send");
    c.next_message()
        .await
        .expect("reply")
        .expect("connection open")
}

fn assert_no_internals(v: &serde_json::Value) {
    let s = v.to_string();
    for bad in [
        "/src/",
        ".rs",
        "panicked",
        "simd",
        "backtrace",
        "at line",
        "/home/",
        "/root/",
    ] {
        assert!(!s.contains(bad), "reply leaks internals ({bad}): {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_error_replies_and_the_connection_continues() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = h.bridge().await;
    let cases: Vec<(Vec<u8>, i64)> = vec![
        (b"{not json".to_vec(), -32600),
        (b"{\"v\":\"gabp/1\xff\"}".to_vec(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","id":"{ID}","type":"request","method":"tools/list"}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"tools/list","params":{{"x":NaN}}}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"tools/list","params":{{"x":1e999}}}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"tools/list","extra":true}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/2","id":"{ID}","type":"request","method":"tools/list"}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"Tools.List"}}"#).into_bytes(), -32600),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"tools/call","params":{{"name":"inventory.get"}}}}"#).into_bytes(), -32602),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"events/subscribe","params":{{"channels":[]}}}}"#).into_bytes(), -32602),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"request","method":"attention/ack","params":{{}}}}"#).into_bytes(), -32602),
        (format!(r#"{{"v":"gabp/1","id":"{ID}","type":"response","result":{{}}}}"#).into_bytes(), -32600),
        (b"[]".to_vec(), -32600),
    ];
    for (body, code) in cases {
        let r = reply_to(&mut c, &body).await;
        assert_eq!(
            error_code(&r),
            code,
            "for {}",
            String::from_utf8_lossy(&body)
        );
        assert_no_internals(&r);
    }
    // Still in sync and working.
    assert!(c.call("tools/list", json!({})).await.is_ok());
    h.shutdown().await;
}

async fn expect_closed(c: &mut Client) {
    c.set_wait(Duration::from_secs(5));
    loop {
        match c.next_frame().await {
            Ok(None) | Err(_) => return,
            Ok(Some(body)) => {
                let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
                assert_no_internals(&v);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_framing_closes_only_that_connection() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].max_body = 4096;
        c.routes[0].frame_timeout = Duration::from_millis(500);
    })
    .await;
    let mut bystander = h.bridge().await;
    let cases: Vec<&[u8]> = vec![
        b"Content-Length: abc\r\n\r\n{}",
        b"Content-Length: -5\r\n\r\n{}",
        b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"Content-Type: application/json\r\n\r\n{}",
        b"Content-Length: 999999\r\n\r\n",
        b"no colon here\r\n\r\n",
    ];
    for raw in cases {
        let mut c = h.bridge().await;
        c.send_raw(raw).await.expect("send");
        expect_closed(&mut c).await;
    }
    // An endless header.
    let mut c = h.bridge().await;
    c.send_raw(&vec![b'X'; 9000]).await.expect("send");
    expect_closed(&mut c).await;
    // A header with no end, then silence: closed by the frame timeout.
    let mut c = h.bridge().await;
    c.send_raw(b"Content-Length: 10\r\n").await.expect("send");
    expect_closed(&mut c).await;
    // A body shorter than declared, then a close: the relay just drops the connection.
    let mut c = h.bridge().await;
    c.send_raw(b"Content-Length: 100\r\n\r\n{\"v\":")
        .await
        .expect("send");
    c.close().await.expect("close");
    // A connection that never says hello.
    let mut c = Client::connect(&h.addr).await.expect("connect");
    expect_closed(&mut c).await;
    assert!(
        bystander.call("tools/list", json!({})).await.is_ok(),
        "other bridges are unaffected"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_header_is_closed_in_bounded_time() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].frame_timeout = Duration::from_millis(400)
    })
    .await;
    let mut c = h.bridge().await;
    let started = std::time::Instant::now();
    let trickle = async {
        for b in b"Content-Length: 2\r\n" {
            if c.send_raw(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c
    };
    let mut c = trickle.await;
    expect_closed(&mut c).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_wrong_tokens_never_succeed_and_do_not_slow_others() {
    let h = Harness::start(quiet_mod()).await;
    let addr = h.addr.clone();
    let attacker = tokio::spawn(async move {
        let mut c = Client::connect(&addr).await.expect("connect");
        for i in 0..30 {
            let r = c.request("session/hello", json!({"token": format!("guess{i}"), "bridgeVersion": "x", "platform": "linux", "launchId": "x"})).await.expect("answer");
            assert_eq!(error_code(&r), -31000);
        }
    });
    // While the attacker is throttled, an honest bridge connects at once.
    let started = std::time::Instant::now();
    let mut honest = h.bridge().await;
    assert!(honest.call("tools/list", json!({})).await.is_ok());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "honest bridge delayed {:?}",
        started.elapsed()
    );
    attacker.abort();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_cap_and_subscription_cap() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].max_bridges = 2;
        c.routes[0].max_subscriptions = 3;
    })
    .await;
    let mut a = h.bridge().await;
    let _b = h.bridge().await;
    let mut third = Client::connect(&h.addr)
        .await
        .expect("tcp accept still happens");
    let msg = third
        .next_message()
        .await
        .expect("refusal")
        .expect("a frame");
    assert_eq!(error_code(&msg), -32002);
    let r = a
        .request(
            "events/subscribe",
            json!({"channels": ["c1", "c2", "c3", "c4"]}),
        )
        .await
        .expect("answer");
    assert_eq!(error_code(&r), -32002);
    h.shutdown().await;
}
