//! The recording keeps cause before effect: what a bridge sends after it saw a frame (a mark, a
//! request) is recorded after that frame. Episode exports (`export --from-mark/--to-mark`)
//! depend on it: an episode's answer and events belong between its marks.

use crate::support::*;
use serde_json::{json, Value};

/// A recording relay in front of the simulated mod publishing `rate` events/s: (the mod, the
/// data dir's parent, the data dir, the relay).
async fn recording_relay(rate: f64) -> (ModSim, tempfile::TempDir, String, Serve) {
    let sim = start_mod(Some(rate));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let s = serve_recording(sim.addr(), &data, &[]).await;
    let data = data.to_str().expect("utf-8").to_string();
    (sim, dir, data, s)
}

/// An integer beyond a double's precision is kept digit for digit end to end: as the bridge
/// sent it, as the simulated mod echoes it, and as the recording exports both.
#[tokio::test]
async fn an_integer_beyond_a_double_survives_the_mod_and_the_recording_digit_for_digit() {
    let (_sim, _dir, data, s) = recording_relay(100.0).await;
    let big = format!("1{}", "7".repeat(299));
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    let id = "6f1c2e3a-0000-4000-8000-000000000042";
    let body = format!(
        r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"tools/call","params":{{"name":"sim/echo","arguments":{{"x":{big},"s":"é"}}}}}}"#
    );
    c.send_body(body.as_bytes()).await.expect("send");
    let answer = loop {
        let m = c.next_message().await.expect("read").expect("an answer");
        if m["id"] == id {
            break m;
        }
    };
    assert_eq!(answer["result"]["echo"]["s"], "é", "{answer}");
    s.stop_cleanly().await;
    let out = output(&["export", "latest", "--data-dir", &data]).await;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for dir in ["bridge->relay", "relay->mod", "mod->relay"] {
        let exact = text
            .lines()
            .filter(|l| l.contains(&format!(r#""dir":"{dir}""#)))
            .any(|l| l.contains(&format!(r#""x":{big}"#)));
        assert!(exact, "{dir}: the integer is not exact in the export");
    }
}

/// The latest session of `data`, exported: one JSON value per recorded frame, in order.
async fn exported(data: &str) -> Vec<Value> {
    let out = output(&["export", "latest", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// Every request forwarded to the mod is recorded before the mod's answer to it, however fast
/// the mod answers: pipelined calls from several bridges, each answer's row after its request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_recorded_before_its_answer() {
    let (_sim, _dir, data, s) = recording_relay(10.0).await;
    let data = data.as_str();
    const BRIDGES: usize = 4;
    const CALLS: usize = 5000;
    let mut tasks = Vec::new();
    for b in 0..BRIDGES {
        let addr = s.addr.clone();
        tasks.push(tokio::spawn(async move {
            let (mut c, _) = Client::connect_hello(&addr, BRIDGE_TOKEN)
                .await
                .expect("hello");
            // In windows of 100 pipelined calls (the in-flight cap is far above).
            for w in 0..CALLS / 100 {
                let mut ids = Vec::new();
                for i in 0..100 {
                    let id = gabp_client::new_id();
                    let body = json!({"v": "gabp/1", "id": id, "type": "request", "method": "tools/call",
                        "params": {"name": "sim/echo", "arguments": {"b": b, "i": w * 100 + i}}});
                    c.send_body(body.to_string().as_bytes()).await.expect("send");
                    ids.push(id);
                }
                for id in ids {
                    let got = c.response_to(&id).await.expect("answer");
                    assert!(got.get("result").is_some(), "{got}");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("bridge");
    }
    s.stop_cleanly().await;
    // Row of each upstream id's request; every answer must come after it.
    let mut asked = std::collections::HashMap::new();
    let (mut answers, mut overtaken) = (0, Vec::new());
    for (row, r) in exported(data).await.into_iter().enumerate() {
        let id = r["msg"]["id"].as_str().unwrap_or_default().to_string();
        match (r["dir"].as_str(), r["msg"]["type"].as_str()) {
            (Some("relay->mod"), Some("request")) => {
                asked.insert(id, row);
            }
            (Some("mod->relay"), Some("response")) if r["msg"]["result"]["echo"].is_object() => {
                answers += 1;
                if asked.get(&id).is_none_or(|&at| at > row) {
                    overtaken.push(id);
                }
            }
            _ => {}
        }
    }
    assert_eq!(answers, BRIDGES * CALLS);
    assert!(
        overtaken.is_empty(),
        "answers recorded before their request: {overtaken:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_bridge_saw_is_recorded_before_what_it_sent_after() {
    let (_sim, _dir, data, s) = recording_relay(2000.0).await;
    let data = data.as_str();
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    const EPISODES: u64 = 100;
    for i in 0..EPISODES {
        c.call("relay/mark", json!({"label": format!("s{i}")}))
            .await
            .expect("start mark");
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"i": i}}),
        )
        .await
        .expect("echo");
        // The event this bridge has seen last: its mark names it.
        let ev = c.next_event().await.expect("an event");
        c.call(
            "relay/mark",
            json!({"label": format!("e{i}"), "data": {"seq": ev["seq"]}}),
        )
        .await
        .expect("end mark");
    }
    s.stop_cleanly().await;
    let rows = exported(data).await;
    let at = |pred: &dyn Fn(&Value) -> bool, what: &str| -> usize {
        rows.iter()
            .position(pred)
            .unwrap_or_else(|| panic!("no row for {what}"))
    };
    let (mut late_answers, mut late_events) = (Vec::new(), Vec::new());
    for i in 0..EPISODES {
        let end = at(&|r| r["label"] == format!("e{i}"), "the end mark");
        let answer = at(
            &|r| r["dir"] == "mod->relay" && r["msg"]["result"]["echo"]["i"] == i,
            "the answer",
        );
        if answer > end {
            late_answers.push(i);
        }
        let seen = &rows[end]["data"]["seq"];
        let event = at(
            &|r| r["dir"] == "mod->relay" && r["channel"] == "world/tick" && &r["relaySeq"] == seen,
            "the event seen",
        );
        if event > end {
            late_events.push(i);
        }
        // And the episode export holds the answer.
        if i % 25 == 0 {
            let ep = output(&[
                "export",
                "latest",
                "--from-mark",
                &format!("s{i}"),
                "--to-mark",
                &format!("e{i}"),
                "--data-dir",
                data,
            ])
            .await;
            let text = String::from_utf8_lossy(&ep.stdout);
            let answers = text
                .lines()
                .filter(|l| l.contains("\"mod->relay\"") && l.contains("\"echo\""))
                .count();
            assert_eq!(
                answers, 1,
                "episode {i} holds exactly its own answer:\n{text}"
            );
        }
    }
    assert!(
        late_answers.is_empty(),
        "answers recorded after the mark their bridge sent once it had them: {late_answers:?}"
    );
    assert!(
        late_events.is_empty(),
        "events recorded after the mark their bridge sent once it had them: {late_events:?}"
    );
}
