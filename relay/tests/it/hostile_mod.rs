//! Hostile and broken mods in front of real `gabp-relay serve` processes: a scripted mod (a
//! `TcpListener` speaking the framing, written here) or a stdio mod (a small shell script) does
//! what a buggy or malicious game mod can do, and each test asserts the relay's costs stay
//! bounded (peak RSS from `/proc/PID/status`, data dir bytes per event), what it refused is
//! counted as an anomaly, bridges only ever get frames they can decode within the size limit,
//! the log says what happened once, and the recording passes `sessions check` and exports.

use crate::support::hostile::*;

#[tokio::test]
async fn non_finite_numbers_and_lone_surrogates_are_anomalies_not_forwarded() {
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&["--upstream", &up, "--data-dir", data]).await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    assert_eq!(m.subscribed().await, vec!["c"]);
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    m.send_all([
        event("c", Some(1), r#"{"n":1}"#),
        event("c", Some(2), r#"{"n":1e999}"#),
        event("c", Some(3), r#"{"s":"\ud800"}"#),
        event("c", Some(4), r#"["\udc00x"]"#),
        event("c", Some(5), r#"-1E+400"#),
        event("c", Some(6), r#"{"n":2,"ok":"\ud83d\ude00","big":1e308}"#),
    ])
    .await;
    // The bridge gets exactly the two decodable events, with contiguous relay seqs, each one
    // decodable by serde_json (what `next_event` parses with).
    let a = next_on(&mut c, "c").await;
    let b = next_on(&mut c, "c").await;
    assert_eq!(
        (a["seq"].as_u64(), a["payload"]["n"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(
        (b["seq"].as_u64(), b["payload"]["n"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(b["payload"]["ok"], "😀");
    drop(m);
    let s = stopped_session(relay, data).await;
    assert_eq!(s["anomalies"], 4, "{s}");
    assert_eq!(s["events"], 2, "{s}");
    // The recording replays: a bridge of the replay gets the same two events.
    let (mut replay, addr) = replay_latest(data).await;
    let (mut c, _) = Client::connect_hello(&addr, TOKEN).await.expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    let a = next_on(&mut c, "c").await;
    let b = next_on(&mut c, "c").await;
    assert_eq!((a["seq"].as_u64(), b["seq"].as_u64()), (Some(0), Some(1)));
    assert_eq!(b["payload"]["n"], 2);
    replay.start_kill().expect("stop replay");
}

/// Every shape a quirky mod answers in reaches the caller promptly (never by the request
/// timeout) and in strict form: exactly one of `result` and `error`, a null counted as absent
/// cut out; an answer the relay cannot read is "outcome unknown" at once.
#[tokio::test]
async fn every_answer_reaches_its_bridge_at_once_with_exactly_one_of_result_and_error() {
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&[
        "--upstream",
        &up,
        "--data-dir",
        data,
        "--request-timeout",
        "10m",
    ])
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&[]).await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    // (what follows the id in the mod's answer, the key the bridge gets, its value)
    let bad = r#"{"code":-31000,"message":"bad"}"#;
    let cases = [
        (
            r#""type":"response","result":null"#,
            "result",
            "null".to_string(),
        ),
        (
            r#""type":"response","result":null,"error":null"#,
            "result",
            "null".into(),
        ),
        (
            r#""type":"response","result":{"a":1},"error":null"#,
            "result",
            r#"{"a":1}"#.into(),
        ),
        (
            r#""type":"response", "error" : null , "result":2"#,
            "result",
            "2".into(),
        ),
        (
            r#""type":"response","result":null,"error":{"code":-31000,"message":"bad"}"#,
            "error",
            bad.into(),
        ),
        // Unreadable: no type, and both a result and an error.
        (r#""result":1"#, "error", "-32001".into()),
        (
            r#""type":"response","result":1,"error":{"code":1,"message":"x"}"#,
            "error",
            "-32001".into(),
        ),
    ];
    for (answer, key, value) in cases {
        let (id, up_id) = call_through(&mut c, &mut m).await;
        m.send(format!(r#"{{"v":"gabp/1","id":"{up_id}",{answer}}}"#).as_bytes())
            .await;
        let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(&id))
            .await
            .expect("answered in time, not by the request timeout")
            .expect("response");
        assert_eq!(got["id"], id.as_str(), "{answer}");
        let other = if key == "result" { "error" } else { "result" };
        assert!(got.get(other).is_none(), "{answer} -> {got}");
        let v = got.get(key).unwrap_or_else(|| panic!("{answer} -> {got}"));
        match value.strip_prefix('-') {
            Some(_) => {
                assert_eq!(v["code"].to_string(), value, "{answer} -> {got}");
                let msg = v["message"].as_str().expect("message");
                assert!(msg.contains("could not be read"), "{msg}");
            }
            None => assert_eq!(v.to_string(), value, "{answer} -> {got}"),
        }
    }
    drop(m);
    // The two unreadable answers are recorded as anomalies, as the mod sent them.
    let s = stopped_session(relay, data).await;
    assert_eq!(s["anomalies"], 2, "{s}");
}

/// Every "outcome unknown" a bridge is told is in the recording, as the relay's other replies
/// are: for an answer the relay could not read, a request timed out, and a mod gone first.
#[tokio::test]
async fn every_outcome_unknown_a_bridge_is_told_is_recorded() {
    let (_dir, data, relay, mut m, mut c) =
        recording_with_a_bridge(&["--request-timeout", "500ms"]).await;
    let data = data.as_str();
    async fn outcome_unknown(c: &mut Client, id: &str) {
        let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(id))
            .await
            .expect("answered")
            .expect("response");
        assert_eq!(got["error"]["code"], -32001, "{got}");
    }
    let (unreadable, up_id) = call_through(&mut c, &mut m).await;
    m.send(format!(r#"{{"v":"gabp/1","id":"{up_id}","result":1}}"#).as_bytes())
        .await;
    outcome_unknown(&mut c, &unreadable).await;
    let (timed_out, _) = call_through(&mut c, &mut m).await;
    outcome_unknown(&mut c, &timed_out).await;
    let (mod_gone, _) = call_through(&mut c, &mut m).await;
    drop(m);
    outcome_unknown(&mut c, &mod_gone).await;
    let told = [unreadable, timed_out, mod_gone];
    assert_eq!(relay.stop().await.0, Some(0));
    let out = run(&["export", "latest", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replies: Vec<Value> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Value>(l).expect("json"))
        .filter(|r| r["dir"] == "relay->bridge" && r["msg"]["error"]["code"] == -32001)
        .collect();
    let ids: Vec<&str> = replies
        .iter()
        .filter_map(|r| r["msg"]["id"].as_str())
        .collect();
    assert_eq!(ids, told, "{replies:#?}");
}

/// A request whose bridge has gone times out unanswered and nothing is recorded as told to
/// it; the one of a bridge still there is answered and recorded.
#[tokio::test]
async fn a_timeout_reply_to_a_bridge_gone_is_not_recorded() {
    let (_dir, data, relay, mut m, mut gone) =
        recording_with_a_bridge(&["--request-timeout", "500ms"]).await;
    let data = data.as_str();
    call_through(&mut gone, &mut m).await;
    drop(gone);
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    // Timed out after the first (the sweeper takes them in deadline order).
    let (id, _) = call_through(&mut c, &mut m).await;
    let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(&id))
        .await
        .expect("answered")
        .expect("response");
    assert_eq!(got["error"]["code"], -32001, "{got}");
    assert_eq!(relay.stop().await.0, Some(0));
    let out = run(&["export", "latest", "--data-dir", data]).await;
    let told: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(r#""dir":"relay->bridge""#) && l.contains("-32001"))
        .map(str::to_string)
        .collect();
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(told[0].contains(&id), "{told:#?}");
}

/// A mod's answer that comes after its caller was told -32001 (past `--request-timeout`) is
/// recorded, but `stats` and `report` count the call unanswered, not answered late.
#[tokio::test]
async fn a_late_answer_after_the_timeout_leaves_the_call_unanswered_in_stats_and_report() {
    let (_dir, data, relay, mut m, mut c) =
        recording_with_a_bridge(&["--request-timeout", "300ms"]).await;
    let data = data.as_str();
    let answer = |up: &str| format!(r#"{{"v":"gabp/1","id":"{up}","type":"response","result":1}}"#);
    let (late, late_up) = call_through(&mut c, &mut m).await;
    let told = tokio::time::timeout(Duration::from_secs(10), c.response_to(&late))
        .await
        .expect("timed out in time")
        .expect("response");
    assert_eq!(told["error"]["code"], -32001, "{told}");
    m.send(answer(&late_up).as_bytes()).await;
    // Answered on time, after the late answer on the same connection (so that one is in).
    let (on_time, up) = call_through(&mut c, &mut m).await;
    m.send(answer(&up).as_bytes()).await;
    let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(&on_time))
        .await
        .expect("answered")
        .expect("response");
    assert_eq!(got["result"], 1, "{got}");
    let s = stopped_session(relay, data).await;
    assert_eq!(s["anomalies"], 1, "the late answer is an anomaly: {s}");
    let stats =
        crate::support::json(&run(&["stats", "latest", "--json", "--data-dir", data]).await);
    let call = stats["methods"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["method"] == "tools/call"))
        .unwrap_or_else(|| panic!("{stats}"));
    assert_eq!(
        (call["calls"].as_u64(), call["unanswered"].as_u64()),
        (Some(2), Some(1)),
        "{call}"
    );
    let max = call["maxMs"].as_f64().expect("maxMs");
    assert!(max < 300.0, "only the answer on time has a latency: {call}");
    // Outside the data dir (the relay refuses to write into it).
    let out_dir = tempfile::tempdir().expect("tempdir");
    let page = out_dir.path().join("report.html");
    let page = page.to_str().expect("utf-8");
    let out = run(&["report", "latest", "--data-dir", data, "-o", page]).await;
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(page).expect("page");
    let row = html
        .lines()
        .find(|l| l.starts_with("<tr><td class=\"t\">tools/call</td>"))
        .expect("the page's tools/call row");
    let cells: Vec<&str> = row
        .split("<td class=\"n\">")
        .skip(1)
        .map(|c| c.split('<').next().unwrap_or_default())
        .collect();
    assert_eq!(
        &cells[..3],
        ["2", "0", "1"],
        "calls, errors, unanswered: {row}"
    );
    assert_eq!(cells[6], format!("{max:.3}"), "{row}");
}

/// A method whose every call went unanswered has no latency: `null` in `stats --json`, `-` in
/// the table and on the page, never a 0 ms that was not measured.
#[tokio::test]
async fn a_method_never_answered_has_no_latency_rather_than_zero() {
    let (_dir, data, relay, mut m, mut c) =
        recording_with_a_bridge(&["--request-timeout", "200ms"]).await;
    let data = data.as_str();
    let (id, _up) = call_through(&mut c, &mut m).await;
    let told = tokio::time::timeout(Duration::from_secs(10), c.response_to(&id))
        .await
        .expect("timed out in time")
        .expect("response");
    assert_eq!(told["error"]["code"], -32001, "{told}");
    let _ = stopped_session(relay, data).await;
    let stats =
        crate::support::json(&run(&["stats", "latest", "--json", "--data-dir", data]).await);
    let call = stats["methods"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["method"] == "tools/call"))
        .unwrap_or_else(|| panic!("{stats}"));
    assert_eq!(call["unanswered"], 1, "{call}");
    for k in ["p50Ms", "p90Ms", "p99Ms", "maxMs"] {
        assert!(call[k].is_null(), "{k}: {call}");
    }
    let table = run(&["stats", "latest", "--data-dir", data]).await;
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let row = table
        .lines()
        .find(|l| l.starts_with("tools/call"))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["tools/call", "1", "0", "1", "-", "-", "-", "-"],
        "{table}"
    );
    let out_dir = tempfile::tempdir().expect("tempdir");
    let page = out_dir.path().join("report.html");
    let page = page.to_str().expect("utf-8");
    let out = run(&["report", "latest", "--data-dir", data, "-o", page]).await;
    assert!(out.status.success(), "{out:?}");
    let html = std::fs::read_to_string(page).expect("page");
    let row = html
        .lines()
        .find(|l| l.starts_with("<tr><td class=\"t\">tools/call</td>"))
        .expect("the page's tools/call row");
    assert!(
        row.ends_with("<td class=\"n\">-</td><td class=\"n\">-</td><td class=\"n\">-</td><td class=\"n\">-</td></tr>"),
        "{row}"
    );
}

/// At shutdown every request still awaiting the mod is answered -32005 to its bridge, which
/// reads those answers before its connection closes, and each is recorded.
#[tokio::test]
async fn requests_pending_at_shutdown_are_answered_before_the_bridge_is_closed() {
    let (_dir, data, relay, mut m, mut c) = recording_with_a_bridge(&[]).await;
    let data = data.as_str();
    const N: usize = 300;
    for _ in 0..N {
        call_through(&mut c, &mut m).await;
    }
    let read = tokio::spawn(async move {
        let mut told = 0;
        while let Ok(Some(f)) = c.next_frame().await {
            let v: Value = serde_json::from_slice(&f).expect("json");
            if v["error"]["code"] == -32005 {
                told += 1;
            }
        }
        told
    });
    assert_eq!(relay.stop().await.0, Some(0));
    let told = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("closed")
        .expect("reader");
    assert_eq!(told, N, "every pending request answered before the close");
    drop(m);
    let out = run(&["export", "latest", "--data-dir", data]).await;
    let recorded = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(r#""dir":"relay->bridge""#) && l.contains("-32005"))
        .count();
    assert_eq!(recorded, N);
}

#[tokio::test]
async fn an_unreadable_welcome_or_a_refused_hello_is_logged_once_with_a_count() {
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    // A welcome with a non-finite number, then one with a lone surrogate: each is a clear
    // error on the first answer, not a silent wait for the hello timeout.
    let t = Instant::now();
    let mut m = accept(&listener).await;
    m.welcome_raw(r#"{"agentId":"x","big":1e999}"#).await;
    relay.wait_log("non-finite number", 1).await;
    let mut m2 = accept(&listener).await;
    m2.welcome_raw(r#"{"agentId":"\ud800"}"#).await;
    relay.wait_log("lone surrogate", 1).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(relay.log_lines("unreadable"), 2);
    // A mod that refuses the token every time: retried with backoff, logged once.
    let mut attempts = 0;
    while attempts < 5 {
        let mut m = accept(&listener).await;
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"response","error":{{"code":-31000,"message":"bad token"}}}}"#,
            m.hello_id
        );
        m.send(body.as_bytes()).await;
        attempts += 1;
    }
    // The fifth refusal has been read by the time the sixth connection arrives.
    let _sixth = accept(&listener).await;
    assert_eq!(
        relay.log_lines("rejected the relay's hello"),
        1,
        "{:#?}",
        relay.log.lock()
    );
    drop((m, m2));
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn events_that_would_outgrow_max_body_are_refused_and_forwarded_frames_fit() {
    const MAX: usize = 4096;
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&[
        "--upstream",
        &up,
        "--data-dir",
        data,
        "--max-body",
        &MAX.to_string(),
    ])
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&["c", "d"]).await;
    m.subscribed().await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c", "d"]).await.expect("subscribe");
    // Ten small events (relay seqs 0-9), then events at the limit: the relay's two-digit seq
    // would push a one-digit or missing mod seq past it (refused), not a two-digit one.
    let sized_on = |channel: &str, seq: Option<u64>, len: usize| {
        let empty = event(channel, seq, r#""""#).len();
        event(channel, seq, &format!("\"{}\"", "x".repeat(len - empty)))
    };
    let sized = |seq: Option<u64>, len: usize| sized_on("c", seq, len);
    let mut bodies: Vec<String> = (0..10).map(|i| event("c", Some(i), "{}")).collect();
    bodies.extend([
        sized(None, MAX),          // refused: grows by `,"seq":10`
        sized(Some(1), MAX),       // refused: 1 -> 10
        sized(Some(10), MAX),      // forwarded as seq 10, exactly MAX
        sized(None, MAX - 9),      // forwarded as seq 11, exactly MAX
        sized(None, MAX - 8),      // refused: one byte over
        sized(Some(99), MAX - 50), // forwarded as seq 12
        // Its channel's first event: relay seq 0, so exactly MAX, though the session has
        // seen 13 events (a two-digit count).
        sized_on("d", Some(0), MAX),
    ]);
    assert!(bodies.iter().all(|b| b.len() <= MAX));
    m.send_all(bodies).await;
    let mut seen = 0;
    let mut at_limit = 0;
    let mut on_d = 0;
    while seen < 13 || on_d < 1 {
        let frame = tokio::time::timeout(Duration::from_secs(10), c.next_frame())
            .await
            .unwrap_or_else(|_| panic!("no frame after {seen} on c and {on_d} on d"))
            .expect("frame")
            .expect("open");
        assert!(frame.len() <= MAX, "forwarded a {} byte frame", frame.len());
        let v: Value = serde_json::from_slice(&frame).expect("json");
        if v["channel"] == "c" {
            assert_eq!(v["seq"], seen);
            seen += 1;
            at_limit += usize::from(frame.len() == MAX);
        }
        if v["channel"] == "d" {
            assert_eq!((v["seq"].as_u64(), frame.len()), (Some(0), MAX));
            on_d += 1;
        }
    }
    assert_eq!(at_limit, 2);
    drop(m);
    let s = stopped_session(relay, data).await;
    assert_eq!(
        (s["events"].as_u64(), s["anomalies"].as_u64()),
        (Some(14), Some(3)),
        "{s}"
    );
}

/// A mod frame over `--max-body` as the mod sent it is passed over unread: the session goes
/// on, the frame is an anomaly, and the call it answered hears -32003 at once.
#[tokio::test]
async fn a_mod_frame_over_max_body_is_skipped_and_the_session_goes_on() {
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&[
        "--upstream",
        &up,
        "--data-dir",
        data,
        "--max-body",
        "4KiB",
        "--request-timeout",
        "10m",
    ])
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    let (id, up_id) = call_through(&mut c, &mut m).await;
    let big = "x".repeat(20_000);
    m.send_all([
        event("c", Some(1), "1"),
        event("c", Some(2), &format!("\"{big}\"")),
        format!(r#"{{"v":"gabp/1","id":"{up_id}","type":"response","result":"{big}"}}"#),
        event("c", Some(3), "3"),
    ])
    .await;
    let mut payloads = Vec::new();
    let mut answer = None;
    while payloads.len() < 2 || answer.is_none() {
        let v = tokio::time::timeout(Duration::from_secs(10), c.next_message())
            .await
            .expect("in time, not by the request timeout")
            .expect("frame")
            .expect("open");
        match v["type"].as_str() {
            Some("event") => payloads.push((v["seq"].clone(), v["payload"].clone())),
            _ => answer = Some(v),
        }
    }
    assert_eq!(payloads, vec![(0.into(), 1.into()), (1.into(), 3.into())]);
    let answer = answer.expect("answer");
    assert_eq!(
        (answer["id"].as_str(), &answer["error"]["code"]),
        (Some(id.as_str()), &(-32003).into()),
        "{answer}"
    );
    // The same session carries on.
    let (id, up_id) = call_through(&mut c, &mut m).await;
    m.send(
        format!(r#"{{"v":"gabp/1","id":"{up_id}","type":"response","result":{{"ok":true}}}}"#)
            .as_bytes(),
    )
    .await;
    let got = c.response_to(&id).await.expect("answer");
    assert_eq!(got["result"]["ok"], true, "{got}");
    relay.wait_log("skipped unread", 1).await;
    drop(m);
    let s = stopped_session(relay, data).await;
    assert_eq!(
        (s["events"].as_u64(), s["anomalies"].as_u64()),
        (Some(2), Some(2)),
        "{s}"
    );
}

/// An answer that cannot be read still names its caller wherever its id stands (after a
/// flaw, after nesting no parser takes, after a BOM): the caller hears -32001 at once. A frame
/// whose readable `type` is not a response answers nobody.
#[tokio::test]
async fn an_unreadable_answer_finds_its_caller_wherever_its_id_stands() {
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record", "--request-timeout", "10m"]).await;
    let mut m = accept(&listener).await;
    m.welcome(&[]).await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    // Each shape with UPID where the relay's upstream id goes.
    let shapes: Vec<Vec<u8>> = vec![
        br#"{"a":1,,"type":"response","id":"UPID"}"#.to_vec(),
        br#"{"n":1e400,"type":"response","id":"UPID"}"#.to_vec(),
        format!(r#"{{"d":{deep},"id":"UPID","result":1}}"#).into_bytes(),
        "\u{feff}{\"v\":\"gabp/1\",\"id\":\"UPID\",\"type\":\"response\",\"result\":1}"
            .as_bytes()
            .to_vec(),
        b"{\"s\":\"\xff\xfe\",\"id\":\"UPID\",\"result\":1}".to_vec(),
    ];
    for shape in shapes {
        let (id, up_id) = call_through(&mut c, &mut m).await;
        let at = shape.windows(4).position(|w| w == b"UPID").expect("UPID");
        let body = [&shape[..at], up_id.as_bytes(), &shape[at + 4..]].concat();
        m.send(&body).await;
        let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(&id))
            .await
            .unwrap_or_else(|_| panic!("no prompt answer to {}", String::from_utf8_lossy(&body)))
            .expect("response");
        assert_eq!(got["error"]["code"], -32001, "{got}");
    }
    // An event carrying a pending call's id is not its answer: the call waits for the real one.
    let (id, up_id) = call_through(&mut c, &mut m).await;
    m.send(
        format!(r#"{{"v":"gabp/1","type":"event","id":"{up_id}","channel":"c","payload":1e999}}"#)
            .as_bytes(),
    )
    .await;
    m.send(
        format!(r#"{{"v":"gabp/1","id":"{up_id}","type":"response","result":"real"}}"#).as_bytes(),
    )
    .await;
    let got = c.response_to(&id).await.expect("answer");
    assert_eq!(got["result"], "real", "{got}");
    assert_eq!(relay.stop().await.0, Some(0));
}

/// A mod frame over `--max-body` answers its caller with -32003 as soon as its first bytes are
/// in, not when its last byte arrives; and a mod stuck mid-frame is cut at `--frame-timeout`
/// (its calls then "outcome unknown") and reconnected, not waited for forever.
#[tokio::test]
async fn a_mod_stuck_mid_frame_is_cut_at_the_frame_timeout_and_reconnected() {
    let (listener, up) = bind().await;
    let relay = serve(&[
        "--upstream",
        &up,
        "--no-record",
        "--max-body",
        "4KiB",
        "--frame-timeout",
        "2s",
        "--request-timeout",
        "10m",
    ])
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&[]).await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    // An oversized answer whose body stops after 5 KB of a declared terabyte.
    let (id, up_id) = call_through(&mut c, &mut m).await;
    let head = format!(
        "Content-Length: 1000000000000\r\n\r\n{{\"v\":\"gabp/1\",\"id\":\"{up_id}\",\"type\":\"response\",\"result\":\"{}",
        "x".repeat(5000)
    );
    m.write.write_all(head.as_bytes()).await.expect("write");
    let got = tokio::time::timeout(Duration::from_secs(10), c.response_to(&id))
        .await
        .expect("told before the frame ends")
        .expect("response");
    assert_eq!(got["error"]["code"], -32003, "{got}");
    // A call pending behind the stuck frame is failed when the mod is cut, and the relay
    // connects again.
    let (id, _) = call_through(&mut c, &mut m).await;
    let t = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(20), c.response_to(&id))
        .await
        .expect("failed at the frame timeout, not the request timeout")
        .expect("response");
    assert_eq!(got["error"]["code"], -32001, "{got}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let mut m2 = accept(&listener).await;
    m2.welcome(&[]).await;
    relay.wait_log("did not complete a frame", 1).await;
    // A partial frame that merely stops (no oversize) is cut the same way.
    m2.write
        .write_all(b"Content-Length: 500\r\n\r\n{\"v\":")
        .await
        .expect("write");
    let _m3 = accept(&listener).await;
    relay.wait_log("did not complete a frame", 2).await;
    drop(m);
    assert_eq!(relay.stop().await.0, Some(0));
}

/// Who a frame that is not forwarded answers is read past its first bytes and past a repeated
/// `id` (the last counts, as JSON parsers read it), and an event is nobody's answer, however
/// late its `type` comes: only the caller it names hears, and only once.
#[tokio::test]
async fn a_frame_not_forwarded_fails_only_the_call_its_last_id_names() {
    let (listener, up) = bind().await;
    let relay = serve(&[
        "--upstream",
        &up,
        "--no-record",
        "--max-body",
        "4KiB",
        "--request-timeout",
        "10m",
    ])
    .await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    let (x, up_x) = call_through(&mut c, &mut m).await;
    let (y, up_y) = call_through(&mut c, &mut m).await;
    let (z, up_z) = call_through(&mut c, &mut m).await;
    let pad = "x".repeat(10_000);
    m.send_all([
        // Oversized, its id and type after 10 KB: y.
        format!(r#"{{"result":{{"pad":"{pad}"}},"v":"gabp/1","id":"{up_y}","type":"response"}}"#),
        // Unreadable, its id repeated: the last, z, not x.
        format!(r#"{{"id":"{up_x}","type":"response","result":1e400,"id":"{up_z}"}}"#),
        // Oversized event carrying x's id, its type last: nobody's answer.
        format!(r#"{{"v":"gabp/1","id":"{up_x}","channel":"c","payload":"{pad}","type":"event"}}"#),
        format!(r#"{{"v":"gabp/1","id":"{up_x}","type":"response","result":"real"}}"#),
    ])
    .await;
    let mut got = Vec::new();
    while got.len() < 3 {
        let v = tokio::time::timeout(Duration::from_secs(10), c.next_message())
            .await
            .expect("in time, not by the request timeout")
            .expect("frame")
            .expect("open");
        if v["type"] == "response" {
            got.push((
                v["id"].as_str().expect("id").to_string(),
                v["error"]["code"].clone(),
                v["result"].clone(),
            ));
        }
    }
    assert_eq!(
        got,
        vec![
            (y, (-32003).into(), Value::Null),
            (z, (-32001).into(), Value::Null),
            (x, Value::Null, "real".into()),
        ]
    );
    drop(m);
    assert_eq!(relay.stop().await.0, Some(0));
}

/// Stops the relay (it must exit 0) and returns its recorded session, checked and exported.
async fn stopped_session(relay: Relay, data: &str) -> Value {
    assert_eq!(relay.stop().await.0, Some(0));
    checked_session(data).await
}

/// A recording relay (`extra` flags added) in front of a welcomed mod, and one bridge it has
/// welcomed: (the data dir, its path, the relay, the mod, the bridge).
async fn recording_with_a_bridge(
    extra: &[&str],
) -> (tempfile::TempDir, String, Relay, ModConn, Client) {
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8").to_string();
    let mut args = vec!["--upstream", up.as_str(), "--data-dir", data.as_str()];
    args.extend_from_slice(extra);
    let relay = serve(&args).await;
    let mut m = accept(&listener).await;
    m.welcome(&[]).await;
    let (c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    (dir, data, relay, m, c)
}

/// A bridge's `tools/call`, read on the mod's side: (the bridge's id, the relay's upstream id).
async fn call_through(c: &mut Client, m: &mut ModConn) -> (String, String) {
    let id = gabp_client::new_id();
    let req = format!(
        r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"tools/call","params":{{"name":"game/x"}}}}"#
    );
    c.send_body(req.as_bytes()).await.expect("send");
    loop {
        let f = m.next().await.expect("the call reaches the mod");
        if f["method"] == "tools/call" {
            return (id, f["id"].as_str().expect("id").to_string());
        }
    }
}

#[tokio::test]
async fn a_mod_that_drops_every_session_is_retried_with_growing_waits() {
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    let t = Instant::now();
    let mut sessions = 0;
    while t.elapsed() < Duration::from_secs(3) {
        let accepted = tokio::time::timeout(Duration::from_secs(3), listener.accept()).await;
        let Ok(Ok((stream, _))) = accepted else { break };
        let (r, w) = stream.into_split();
        let mut m = ModConn {
            frames: FramedRead::new(r, GabpCodec::default()),
            write: w,
            hello_id: String::new(),
        };
        let hello = m.next().await.expect("hello");
        m.hello_id = hello["id"].as_str().expect("id").to_string();
        m.welcome(&["c"]).await;
        m.subscribed().await; // the session started; then the mod hangs up
        sessions += 1;
    }
    // Backoff reset after every handshake reconnected every ~50-75 ms (40+ in 3 s).
    assert!((2..=10).contains(&sessions), "{sessions} sessions in 3 s");
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn a_hundred_thousand_channels_cost_bounded_memory_and_disk() {
    const N: usize = 100_000;
    const CAP: usize = 4096; // upstream::MAX_CHANNELS
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&[
        "--upstream",
        &up,
        "--data-dir",
        data,
        "--max-body",
        "4194304",
    ])
    .await;
    let baseline = relay.peak_rss_mib();
    let names: Vec<String> = (0..N).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut m = accept(&listener).await;
    m.welcome(&refs).await;
    let subscribed = m.subscribed().await;
    assert_eq!(subscribed.len(), CAP, "subscribe-all is capped");
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c0", "c99999"]).await.expect("subscribe");
    // One event on every channel, then one more on the first and the last.
    m.send_all(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| event(n, Some(i as u64), r#"{"x":1}"#)),
    )
    .await;
    m.send_all([event("c0", None, "2"), event("c99999", None, "3")])
        .await;
    let first = next_on(&mut c, "c0").await;
    assert_eq!(first["seq"], 0);
    let second = next_on(&mut c, "c0").await;
    assert_eq!(
        (second["seq"].as_u64(), second["payload"].as_u64()),
        (Some(1), Some(2))
    );
    let peak = relay.peak_rss_mib();
    drop(m);
    let s = stopped_session(relay, data).await;
    let events = s["events"].as_u64().expect("events");
    assert_eq!(events, CAP as u64 + 1, "{s}");
    assert_eq!(s["anomalies"].as_u64(), Some((N - CAP + 1) as u64), "{s}");
    let frames = (N + 2) as u64;
    let per_frame = dir_bytes(dir.path()) / frames;
    eprintln!("rss {baseline} -> {peak} MiB, {per_frame} bytes on disk per frame");
    assert!(
        peak < baseline + 200,
        "peak RSS {peak} MiB (started at {baseline})"
    );
    assert!(per_frame < 2048, "{per_frame} bytes on disk per frame");
}

/// `--max-body` covers what the relay writes itself: a status with more bridges than fit is
/// cut (saying how many it left out), and a welcome the relay's extension would push over the
/// limit is refused with -32003 instead of being sent.
#[tokio::test]
async fn frames_the_relay_writes_itself_stay_within_max_body() {
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record", "--max-body", "1KiB"]).await;
    let mut m = accept(&listener).await;
    m.welcome(&[]).await;
    let mut bridges = Vec::new();
    for _ in 0..7 {
        let (c, _) = Client::connect_hello(&relay.addr, TOKEN)
            .await
            .expect("hello");
        bridges.push(c);
    }
    let c = &mut bridges[0];
    let id = gabp_client::new_id();
    let req = format!(r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"relay/status"}}"#);
    c.send_body(req.as_bytes()).await.expect("send");
    let body = c.next_frame().await.expect("frame").expect("answer");
    assert!(body.len() <= 1024, "{} bytes", body.len());
    let status: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let r = &status["result"];
    let shown = r["bridges"].as_array().expect("bridges").len();
    assert!(shown < 7, "{r}");
    assert_eq!(
        shown as u64 + r["bridgesOmitted"].as_u64().expect("omitted"),
        7,
        "{r}"
    );
    // `status` leaves its own connection out of the count too, listed or omitted.
    let addr = relay.addr.to_string();
    let out = run(&["status", "--address", &addr, "--token", TOKEN, "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let st = &v["relays"][0]["status"];
    let listed = st["bridges"].as_array().map_or(0, Vec::len) as u64;
    assert_eq!(
        listed
            + st["bridgesOmitted"]
                .as_u64()
                .unwrap_or_else(|| panic!("{v}")),
        7,
        "{v}"
    );
    // A new session whose welcome fits the limit alone but not with the relay's extension.
    drop(m);
    let mut m = accept(&listener).await;
    let pad = "x".repeat(800);
    m.welcome_raw(&format!(r#"{{"agentId":"big","pad":"{pad}"}}"#))
        .await;
    let mut c = loop {
        // Bridges of the first session may still be told the mod went away: a fresh one asks.
        let mut c = Client::connect(&relay.addr).await.expect("connect");
        let id = gabp_client::new_id();
        let hello = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"session/hello","params":{{"token":"{TOKEN}","bridgeVersion":"t/1","platform":"linux","launchId":"l"}}}}"#
        );
        c.send_body(hello.as_bytes()).await.expect("send");
        let body = c.next_frame().await.expect("frame").expect("answer");
        assert!(body.len() <= 1024, "{} bytes", body.len());
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        if v["result"]["capabilities"]["extensions"]["relay"]["modConnected"] == false {
            continue; // welcomed before the new session began
        }
        assert_eq!(v["error"]["code"], -32003, "{v}");
        let msg = v["error"]["message"].as_str().expect("message");
        assert!(msg.contains("--max-body"), "{msg}");
        break c;
    };
    // The connection closes after the refusal.
    assert!(c.next_frame().await.expect("read").is_none());
    // `status` (relay-only) still sees the relay: it is welcomed with the relay's part alone.
    let out = run(&["status", "--address", &addr, "--token", TOKEN, "--json"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["relays"][0]["modConnected"], true, "{v}");
}

#[tokio::test]
async fn a_bridge_is_welcomed_with_the_mods_welcome_byte_for_byte_live_and_in_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--data-dir", data]).await;
    let mut m = accept(&listener).await;
    // Keys out of order, numbers no double holds, escapes, spacing, non-ASCII, and a forged
    // relay extension: all as the mod wrote them, except the relay's extension.
    let kept = r#""zeta": 1, "alpha": {"big": 123456789012345678901234567890, "f": 1.50e2, "neg": -18446744073709551617}, "name": "G\u00e4me ü""#;
    let ext = r#""extensions": {"mod": {"n": 340282366920938463463374607431768211457}, "relay": "#;
    m.welcome_raw(&format!(
        r#"{{ "agentId":"w", {kept}, "capabilities": {{"events": [], {ext}"forged"}}}} }}"#
    ))
    .await;
    let welcome = welcome_text(&relay.addr).await;
    for want in [kept, ext] {
        assert!(welcome.contains(want), "live: {welcome}");
    }
    drop(m);
    assert_eq!(relay.stop().await.0, Some(0));
    // Replay serves the welcome as recorded, byte for byte too.
    let (mut replay, addr) = replay_latest(data).await;
    let welcome = welcome_text(&addr).await;
    for want in [kept, ext] {
        assert!(welcome.contains(want), "replay: {welcome}");
    }
    replay.kill().await.expect("replay stopped");
}

/// Says hello to the relay at `addr` and returns its answer's bytes, checking its relay
/// extension is the relay's own.
async fn welcome_text(addr: &Addr) -> String {
    let mut c = Client::connect(addr).await.expect("connect");
    let id = "0b9f6a3e-5d2c-4c8e-9a71-2f4d6b8e1c05";
    let hello = gabp_proto::message::request(
        id,
        "session/hello",
        json!({"token": TOKEN, "bridgeVersion": "t", "platform": "linux", "launchId": "l"}),
    );
    c.send_body(&hello).await.expect("hello sent");
    let body = c.next_frame().await.expect("read").expect("welcome");
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    assert!(!text.contains("forged"), "{text}");
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["id"], id);
    let relay_ext = &v["result"]["capabilities"]["extensions"]["relay"];
    assert_eq!(relay_ext["name"], "gabp-relay", "{text}");
    text
}

/// Nesting is refused exactly where serde_json stops reading (a 128th level, the frame's own
/// object counting as the first), from a bridge and from the mod: whatever is forwarded, a
/// serde_json peer decodes.
#[tokio::test]
async fn nesting_past_serde_jsons_limit_is_refused_both_ways_and_up_to_it_forwarded() {
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    assert_eq!(m.subscribed().await, vec!["c"]);
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    // The envelope is level 1 and its params or payload object level 2.
    let nested = |levels: usize| {
        format!(
            r#"{{"x":{}{}}}"#,
            "[".repeat(levels - 2),
            "]".repeat(levels - 2)
        )
    };
    let request = |id: &str, levels: usize| {
        format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"tools/list","params":{}}}"#,
            nested(levels)
        )
    };
    let too_deep = "6a0f3c2e-1b4d-4e8f-9a7c-5d3e2f1a0b9c";
    c.send_body(request(too_deep, 128).as_bytes())
        .await
        .expect("sent");
    let r = c.response_to(too_deep).await.expect("answered");
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|s| s.contains("nesting deeper than 127")),
        "{r}"
    );
    let deepest = "7b1e4d3f-2c5e-4f90-8b6d-6e4f3a2b1c0d";
    c.send_body(request(deepest, 127).as_bytes())
        .await
        .expect("sent");
    let forwarded = loop {
        let f = m.next().await.expect("a request reaches the mod");
        if f["method"] == "tools/list" {
            break f;
        }
    };
    // The mod gets the 127-level request, and it is the first request since the subscribe.
    assert!(forwarded["params"]["x"].is_array(), "{forwarded}");
    // From the mod: the event one level too deep is an anomaly; the next is forwarded.
    m.send_all([
        event("c", Some(1), &nested(128)),
        event("c", Some(2), &nested(127)),
    ])
    .await;
    let e = c.next_event().await.expect("event");
    assert_eq!(
        e["seq"], 0,
        "the first event forwarded has relay seq 0: {e}"
    );
    assert!(e["payload"]["x"].is_array(), "the 127-level event: {e}");
    drop(m);
    assert_eq!(relay.stop().await.0, Some(0));
}

/// A mod's own values never make `relay/status` unreadable: a welcome at the nesting limit is
/// served, and status stays within it. A mark with no mod connected is refused, not answered
/// and lost.
#[tokio::test]
async fn a_deep_welcome_leaves_status_readable_and_marks_need_a_session() {
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&["--upstream", &up, "--data-dir", data]).await;
    let mut m = accept(&listener).await;
    // The envelope is level 1, the result 2, app 3: 127 levels in all.
    let app = format!(
        r#"{{"name":"deep","a":{}1{}}}"#,
        r#"{"a":"#.repeat(124),
        "}".repeat(124)
    );
    m.welcome_raw(&format!(
        r#"{{"agentId":"x","app":{app},"capabilities":{{"events":[]}}}}"#
    ))
    .await;
    let (mut c, welcome) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("the 127-level welcome is served");
    assert_eq!(welcome["app"]["name"], "deep");
    let status = c
        .call("relay/status", json!({}))
        .await
        .expect("status is readable");
    assert_eq!(status["session"]["app"]["name"], "deep", "{status}");
    // The mod goes; once the relay knows, a mark is refused.
    drop(m);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.call("relay/status", json!({})).await.expect("status");
        if s["session"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the relay never saw the mod go");
        tokio::task::yield_now().await;
    }
    let r = c
        .request("relay/mark", json!({"label": "while-down"}))
        .await
        .expect("answered");
    assert_eq!(r["error"]["code"], -32000, "{r}");
    drop(c);
    assert_eq!(relay.stop().await.0, Some(0));
}

/// `replay latest` of the recording in `data` at full speed, and the address it listens on.
async fn replay_latest(data: &str) -> (Child, Addr) {
    let mut replay = Command::new(BIN)
        .args([
            "replay",
            "latest",
            "--data-dir",
            data,
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--token", TOKEN, "--speed", "max"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn replay");
    let mut lines = BufReader::new(replay.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("replay started")
        .expect("stdout")
        .expect("a line");
    let addr: Addr = line
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("replay address");
    (replay, addr)
}
