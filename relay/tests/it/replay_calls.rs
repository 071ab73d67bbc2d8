//! Agents tested against a recording, through the real binary: a session recorded by `serve` in
//! front of the simulated mod while a bridge calls a tool, then `replay --expect-calls` with an
//! agent that makes the same calls (exit 0), changes one argument (exit 1, the tool and the
//! field named in the text and the JSON), or leaves a call out and adds another (both
//! reported); and each `--match` mode answering as documented.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::*;

/// Records one session in `data`: a bridge calls `tools/call` once per entry of `calls`
/// (`(tool, arguments)`), in order, then `serve` stops cleanly.
async fn record(data: &Path, calls: &[(&str, Value)]) {
    let sim = start_mod(Some(200.0));
    let s = serve_recording(sim.addr(), data, &[]).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    for (tool, args) in calls {
        c.call("tools/call", json!({"name": tool, "arguments": args}))
            .await
            .expect("the mod answers");
    }
    drop(c);
    s.stop_cleanly().await;
    sim.stop();
}

/// A running `replay latest` of `data` with `extra` flags: its address and its stdout lines.
struct Replay {
    child: Child,
    addr: Addr,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

async fn replay(data: &Path, extra: &[&str]) -> Replay {
    let mut child = relay()
        .args(["replay", "latest", "--speed", "max", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--token", BRIDGE_TOKEN])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn replay");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = replay_address(&mut out, Duration::from_secs(20)).await;
    Replay { child, addr, out }
}

impl Replay {
    /// An agent: one bridge that makes these calls and leaves; the whole answers it got.
    async fn agent(&self, calls: &[(&str, &str, Value)]) -> Vec<Value> {
        let (mut c, _) = Client::connect_hello(&self.addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        let mut answers = Vec::new();
        for (method, tool, args) in calls {
            let params = if method == &"tools/call" {
                json!({"name": tool, "arguments": args})
            } else {
                args.clone()
            };
            answers.push(c.request(method, params).await.expect("an answer"));
        }
        c.close().await.expect("close");
        answers
    }

    /// Waits for the replay to end by itself: its exit code, the rest of stdout, and stderr.
    async fn ended(mut self) -> (Option<i32>, String, String) {
        let mut text = String::new();
        let read = async {
            while let Some(l) = self.out.next_line().await.expect("stdout") {
                text.push_str(&l);
                text.push('\n');
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the replay ends once the agent left");
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use tokio::io::AsyncReadExt;
            let _ = e.read_to_string(&mut err).await;
        }
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exits")
            .expect("status");
        (status.code(), text, err)
    }
}

fn echo(q: i64) -> Value {
    json!({"q": q})
}

/// The calls the recording holds: sim/echo three times.
const RECORDED: [i64; 3] = [1, 2, 3];

async fn recorded_session(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    let calls: Vec<(&str, Value)> = RECORDED.iter().map(|&q| ("sim/echo", echo(q))).collect();
    record(&data, &calls).await;
    data
}

fn calls(qs: &[i64]) -> Vec<(&'static str, &'static str, Value)> {
    qs.iter()
        .map(|&q| ("tools/call", "sim/echo", echo(q)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_agent_passes_and_a_changed_argument_is_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = recorded_session(dir.path()).await;

    // The same calls: exit 0, every answer the recorded one.
    let r = replay(&data, &["--expect-calls"]).await;
    let answers = r.agent(&calls(&RECORDED)).await;
    for (a, q) in answers.iter().zip(RECORDED) {
        assert_eq!(a["result"]["echo"], echo(q), "{a}");
    }
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("calls match: 3 calls"), "{out}");
    assert!(
        out.contains(
            "replay ended: 3 requests, 3 answered from the recording, 0 with no recorded match"
        ),
        "{out}"
    );

    // One argument changed: exit 1, the tool and the field named, in the text and the JSON.
    let diff = dir.path().join("diff.json");
    let r = replay(
        &data,
        &[
            "--expect-calls",
            "--diff-json",
            diff.to_str().expect("utf-8"),
        ],
    )
    .await;
    let answers = r.agent(&calls(&[1, 20, 3])).await;
    assert_eq!(answers[1]["error"]["code"], -32004, "{}", answers[1]);
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains("changed  call 2 (made as call 2): tools/call sim/echo"),
        "{out}"
    );
    assert!(
        out.contains("/params/arguments/q: recorded 2, got 20"),
        "{out}"
    );
    assert!(out.contains("calls differ: 1 changed"), "{out}");
    assert!(
        err.contains(
            "the agent's calls differ from the recording's (1 changed, 0 missing, 0 extra"
        ),
        "{err}"
    );
    let v: Value =
        serde_json::from_slice(&std::fs::read(&diff).expect("--diff-json written")).expect("JSON");
    assert_eq!(v["same"], false);
    assert_eq!(v["match"], "exact");
    assert_eq!(v["recorded"]["calls"], 3);
    assert_eq!(v["got"]["calls"], 3);
    assert_eq!(
        v["counts"],
        json!({"missing": 0, "extra": 0, "changed": 1, "timing": 0})
    );
    let d = &v["bridges"][0]["differences"][0];
    assert_eq!(d["kind"], "changed");
    assert_eq!(d["tool"], "sim/echo");
    assert_eq!(d["recordedIndex"], 2);
    assert_eq!(
        d["changes"],
        json!([{"path": "/params/arguments/q", "recorded": 2, "got": 20}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_call_and_an_extra_call_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = recorded_session(dir.path()).await;
    let diff = dir.path().join("diff.json");
    let r = replay(
        &data,
        &[
            "--expect-calls",
            "--diff-json",
            diff.to_str().expect("utf-8"),
        ],
    )
    .await;
    // Call 2 left out; a tools/list added at the end.
    let mut made = calls(&[1, 3]);
    made.push(("tools/list", "", json!({})));
    r.agent(&made).await;
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains(
            "missing  call 2: tools/call sim/echo {\"arguments\":{\"q\":2},\"name\":\"sim/echo\"}"
        ),
        "{out}"
    );
    assert!(out.contains("extra    call 3 made: tools/list {}"), "{out}");
    assert!(out.contains("calls differ: 1 missing, 1 extra"), "{out}");
    let v: Value =
        serde_json::from_slice(&std::fs::read(&diff).expect("--diff-json written")).expect("JSON");
    let kinds: Vec<&str> = v["bridges"][0]["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| d["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, ["missing", "extra"], "{v}");
    assert_eq!(v["bridges"][0]["differences"][1]["method"], "tools/list");

    // Compared with another session instead (--calls-from): in a data dir of two, the first
    // (one call) while the latest (three) is replayed.
    let both = dir.path().join("both");
    record(&both, &[("sim/echo", echo(1))]).await;
    let three: Vec<(&str, Value)> = RECORDED.iter().map(|&q| ("sim/echo", echo(q))).collect();
    record(&both, &three).await;
    let out = output(&[
        "sessions",
        "--json",
        "--data-dir",
        both.to_str().expect("utf-8"),
    ])
    .await;
    let first = json(&out)["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .min()
        .expect("two sessions");
    let r = replay(&both, &["--expect-calls", "--calls-from", &first]).await;
    r.agent(&calls(&[1])).await;
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!("1 recorded in session {first}")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_match_mode_answers_as_documented() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let stamped = |q: i64, ts: i64| json!({"q": q, "timestamp": ts});
    record(
        &data,
        &[
            ("sim/echo", stamped(1, 1000)),
            ("sim/echo", stamped(2, 2000)),
        ],
    )
    .await;
    let call = |q: i64, ts: i64| ("tools/call", "sim/echo", stamped(q, ts));
    let echoed = |a: &Value| a["result"]["echo"].clone();

    // exact (the default): the same params get the recorded answer; a new timestamp does not.
    let r = replay(&data, &[]).await;
    let a = r.agent(&[call(1, 1000), call(1, 5), call(2, 2000)]).await;
    assert_eq!(echoed(&a[0]), stamped(1, 1000));
    assert_eq!(a[1]["error"]["code"], -32004, "{}", a[1]);
    assert_eq!(a[1]["error"]["data"]["match"], "exact");
    assert_eq!(echoed(&a[2]), stamped(2, 2000));
    sigterm(&r.child);
    let (_, out, _) = r.ended().await;
    assert!(
        out.contains("replay ended: 3 requests, 2 answered from the recording, 1 with no recorded match (-32004)"),
        "{out}"
    );

    // ignore: the timestamp left out, a changed one still matches (and the check passes).
    let r = replay(
        &data,
        &[
            "--ignore-field",
            "params.arguments.timestamp",
            "--expect-calls",
        ],
    )
    .await;
    let a = r.agent(&[call(1, 7), call(2, 8)]).await;
    assert_eq!(echoed(&a[0]), stamped(1, 1000), "{}", a[0]);
    assert_eq!(echoed(&a[1]), stamped(2, 2000), "{}", a[1]);
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("(ignoring params.arguments.timestamp)"),
        "{out}"
    );
    // The same as a JSON pointer, but q changed: no match.
    let r = replay(
        &data,
        &[
            "--match",
            "ignore",
            "--ignore-field",
            "/params/arguments/timestamp",
        ],
    )
    .await;
    let a = r.agent(&[call(3, 1000)]).await;
    assert_eq!(a[0]["error"]["code"], -32004, "{}", a[0]);
    sigterm(&r.child);
    r.ended().await;

    // order: the Nth call of a method gets the Nth recorded answer, whatever its params; a
    // method never recorded gets -32004.
    let r = replay(&data, &["--match", "order", "--expect-calls"]).await;
    let a = r
        .agent(&[call(7, 0), call(8, 0), ("tools/list", "", json!({}))])
        .await;
    assert_eq!(echoed(&a[0]), stamped(1, 1000), "{}", a[0]);
    assert_eq!(echoed(&a[1]), stamped(2, 2000), "{}", a[1]);
    assert_eq!(a[2]["error"]["code"], -32004, "{}", a[2]);
    let (code, out, _) = r.ended().await;
    // Params are not compared under order; the tools/list is an extra call.
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("calls differ: 1 extra"), "{out}");
}

#[tokio::test]
async fn call_check_flags_that_disagree_are_usage_errors() {
    for args in [
        &["--calls-from", "latest"][..],
        &["--diff-json", "x.json"],
        &["--timing-tolerance", "1s"],
        &["--match", "ignore"],
        &["--match", "order", "--ignore-field", "params.a"],
        &["--ignore-field", "arguments.a"],
    ] {
        let out = output(
            &[
                &[
                    "replay",
                    "latest",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    "/nonexistent",
                ][..],
                args,
            ]
            .concat(),
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        one_line(&out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_expected_are_those_of_the_replayed_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = start_mod(Some(200.0));
    let s = serve_recording(sim.addr(), &data, &[]).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    for q in [1, 2] {
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": echo(q)}),
        )
        .await
        .expect("the mod answers");
    }
    c.call("relay/mark", json!({"label": "go"}))
        .await
        .expect("marked");
    for q in [3, 4] {
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": echo(q)}),
        )
        .await
        .expect("the mod answers");
    }
    drop(c);
    s.stop_cleanly().await;
    sim.stop();

    // From the mark on, the agent meets the game after the first two calls: it owes the last
    // two only.
    let r = replay(&data, &["--expect-calls", "--from-mark", "go"]).await;
    r.agent(&calls(&[3, 4])).await;
    let (code, out, err) = r.ended().await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("calls match: 2 calls"), "{out}");
}
