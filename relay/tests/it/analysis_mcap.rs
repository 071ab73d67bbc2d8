//! MCAP export through the real binary, read back with the official `mcap` reader from PyPI
//! (installed into ~/.cache/gabp-relay/venv when missing): a session a real relay recorded in
//! front of the simulated mod becomes one file with a channel per event channel and per call
//! direction, exactly as many messages on each as the JSONL export has frames, at the times
//! they were recorded, with the tools' schemas from `tools/list`, chunked and indexed; to a
//! pipe too; and never half-written over an existing file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::*;
use serde_json::{json, Value};

const CHANNELS: [&str; 3] = ["world/tick", "player/move", "chat/message"];

/// Records one session: a bridge subscribed to every channel reads 200 events, lists the
/// tools, calls `sim/echo` 5 times, `sim/fail` twice and `state/get` once between two marks.
async fn record(data: &str) {
    let sim = start_mod(Some(2000.0));
    let s = serve_recording(sim.addr(), std::path::Path::new(data), &["--tag", "seed=3"]).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&CHANNELS).await.expect("subscribe");
    for _ in 0..200 {
        tokio::time::timeout(Duration::from_secs(20), c.next_event())
            .await
            .expect("event in time")
            .expect("event");
    }
    c.call(
        "relay/mark",
        json!({"label": "episode-start", "data": {"episode": 1}}),
    )
    .await
    .expect("mark");
    c.call("tools/list", json!({})).await.expect("tools/list");
    for i in 0..5 {
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"i": i}}),
        )
        .await
        .expect("echo");
    }
    for _ in 0..2 {
        let r = c
            .request("tools/call", json!({"name": "sim/fail", "arguments": {}}))
            .await
            .expect("answered");
        assert!(r["error"].is_object(), "{r}");
    }
    c.request("state/get", json!({})).await.expect("state");
    c.call("relay/mark", json!({"label": "episode-end"}))
        .await
        .expect("mark");
    s.stop_cleanly().await;
}

/// The virtualenv's python with the official `mcap` reader importable; installs it from PyPI
/// if needed (once per test process).
fn python() -> PathBuf {
    static READY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    READY
        .get_or_init(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            let venv = Path::new(&home).join(".cache/gabp-relay/venv");
            let py = venv.join("bin/python");
            let ready = |py: &Path| {
                std::process::Command::new(py)
                    .args(["-c", "import mcap.reader"])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !ready(&py) {
                if !py.exists() {
                    let made = std::process::Command::new("python3")
                        .args(["-m", "venv"])
                        .arg(&venv)
                        .status()
                        .expect("python3 runs");
                    assert!(made.success(), "python3 -m venv failed");
                }
                let ok = std::process::Command::new(&py)
                    .args(["-m", "pip", "install", "-q", "mcap"])
                    .status()
                    .expect("pip runs");
                assert!(ok.success(), "pip install mcap failed");
                assert!(ready(&py), "mcap still not importable after pip install");
            }
            py
        })
        .clone()
}

/// What the official reader finds in an MCAP file, as JSON.
const READ: &str = r#"
import json, sys
from mcap.reader import make_reader

with open(sys.argv[1], "rb") as f:
    reader = make_reader(f)
    summary = reader.get_summary()
    topics, first, schemas, encodings = {}, {}, {}, set()
    for schema, channel, message in reader.iter_messages():
        topics[channel.topic] = topics.get(channel.topic, 0) + 1
        first.setdefault(channel.topic, [message.log_time, message.publish_time, message.sequence])
        encodings.add((channel.message_encoding, schema.encoding))
        schemas[channel.topic] = json.loads(schema.data)
        json.loads(message.data)  # every message is a JSON document
    meta = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
    stats = {summary.channels[c].topic: n for c, n in summary.statistics.channel_message_counts.items()}
    print(json.dumps({
        "topics": topics, "first": first, "encodings": sorted(encodings), "metadata": meta,
        "statistics": stats, "chunks": len(summary.chunk_indexes),
        "compression": sorted({c.compression for c in summary.chunk_indexes}),
        "schemas": schemas,
    }))
"#;

async fn read_mcap(path: &Path) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(python())
            .args(["-c", READ, path.to_str().expect("utf-8")])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("python finished")
    .expect("python runs");
    assert!(
        out.status.success(),
        "the reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// The topic each JSONL row should be in, by the documented mapping; and the first `tNs`.
fn expected(rows: &[Value]) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let mut counts = BTreeMap::new();
    let mut first = BTreeMap::new();
    let mut awaited: BTreeMap<String, String> = BTreeMap::new();
    for r in rows {
        let msg = &r["msg"];
        let topic = match (r["dir"].as_str(), r["kind"].as_str()) {
            (Some("mod->relay"), Some("event")) => {
                format!("/events/{}", r["channel"].as_str().expect("channel"))
            }
            (Some("bridge->relay"), Some("mark")) => "/marks".into(),
            (Some("relay->mod"), Some("request")) => {
                let method = msg["method"].as_str().expect("method");
                let base = match method {
                    "tools/call" => {
                        format!(
                            "/calls/tools/call/{}",
                            msg["params"]["name"].as_str().expect("tool")
                        )
                    }
                    m => format!("/calls/{m}"),
                };
                awaited.insert(msg["id"].as_str().expect("id").into(), base.clone());
                format!("{base}/request")
            }
            (Some("mod->relay"), Some("response")) => {
                let base = msg["id"]
                    .as_str()
                    .and_then(|id| awaited.remove(id))
                    .unwrap_or_else(|| "/calls/(unmatched)".into());
                format!("{base}/response")
            }
            _ => continue,
        };
        first
            .entry(topic.clone())
            .or_insert(r["tNs"].as_u64().expect("tNs"));
        *counts.entry(topic).or_default() += 1;
    }
    (counts, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcap_has_a_channel_per_event_channel_and_call_read_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    record(data).await;

    let rows: Vec<Value> = {
        let out = output(&["export", "latest", "--data-dir", data]).await;
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let (want, first) = expected(&rows);
    for topic in [
        "/events/world/tick",
        "/events/player/move",
        "/events/chat/message",
        "/calls/tools/list/request",
        "/calls/tools/list/response",
        "/calls/tools/call/sim/echo/request",
        "/calls/tools/call/sim/echo/response",
        "/calls/tools/call/sim/fail/response",
        "/calls/state/get/response",
        "/calls/events/subscribe/request",
        "/marks",
    ] {
        assert!(want.contains_key(topic), "{topic} expected: {want:?}");
    }
    assert_eq!(want["/calls/tools/call/sim/echo/request"], 5);
    assert_eq!(want["/calls/tools/call/sim/fail/response"], 2);
    assert_eq!(want["/marks"], 2);

    let file = dir.path().join("run.mcap");
    let f = file.to_str().expect("utf-8");
    let said = json(
        &output(&[
            "export",
            "latest",
            "--format",
            "mcap",
            "-o",
            f,
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    let said_channels: BTreeMap<String, u64> =
        serde_json::from_value(said["channels"].clone()).expect("channels");
    assert_eq!(said_channels, want, "what export --json reports");
    assert_eq!(said["messages"].as_u64(), Some(want.values().sum::<u64>()));

    let got = read_mcap(&file).await;
    let topics: BTreeMap<String, u64> =
        serde_json::from_value(got["topics"].clone()).expect("topics");
    assert_eq!(
        topics, want,
        "messages per channel, as the official reader counts them"
    );
    let stats: BTreeMap<String, u64> =
        serde_json::from_value(got["statistics"].clone()).expect("stats");
    assert_eq!(stats, want, "the summary's statistics");
    assert_eq!(got["encodings"], json!([["json", "jsonschema"]]));
    assert!(
        got["chunks"].as_u64().expect("chunks") >= 1,
        "chunked and indexed"
    );
    assert_eq!(got["compression"], json!(["lz4"]));
    // Log and publish time are when the relay recorded the frame.
    for (topic, t) in &first {
        assert_eq!(got["first"][topic][0].as_u64(), Some(*t), "{topic}");
        assert_eq!(got["first"][topic][1].as_u64(), Some(*t), "{topic}");
    }
    // An event's sequence is the relay's seq.
    assert_eq!(got["first"]["/events/world/tick"][2], 0);
    let session = &rows[0]["session"];
    assert_eq!(got["metadata"]["gabp.session"]["session"], *session);
    assert_eq!(got["metadata"]["gabp.session"]["tag.seed"], "3");
    // A tool's channels are described by what tools/list said of it.
    let echo = &got["schemas"]["/calls/tools/call/sim/echo/request"];
    assert_eq!(
        echo["properties"]["params"]["properties"]["name"]["const"],
        "sim/echo"
    );
    assert_eq!(
        echo["properties"]["params"]["properties"]["arguments"],
        json!({"type": "object"})
    );
    assert_eq!(
        got["schemas"]["/calls/tools/call/sim/echo/response"]["properties"]["result"],
        json!({"type": "object"})
    );
    // Without an events/list answer, an event channel's payload is permissive.
    let tick = &got["schemas"]["/events/world/tick"];
    assert_eq!(tick["properties"]["channel"]["const"], "world/tick");
    assert_eq!(tick["properties"]["payload"], json!({}));

    // To a pipe (no seeking): the same messages.
    let piped = output(&[
        "export",
        "latest",
        "--format",
        "mcap",
        "-o",
        "-",
        "--data-dir",
        data,
    ])
    .await;
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    let pfile = dir.path().join("piped.mcap");
    std::fs::write(&pfile, &piped.stdout).expect("write");
    let p = read_mcap(&pfile).await;
    assert_eq!(p["topics"], got["topics"]);

    // One episode alone; and a failed export leaves the file that was there.
    let ep = json(
        &output(&[
            "export",
            "latest",
            "--format",
            "mcap",
            "--episode",
            "1",
            "-o",
            f,
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(ep["channels"]["/marks"], 2);
    assert_eq!(ep["channels"]["/calls/tools/call/sim/echo/request"], 5);
    assert!(ep["channels"]
        .get("/calls/events/subscribe/request")
        .is_none());
    let before = std::fs::read(&file).expect("read");
    let failed = output(&[
        "export",
        "latest",
        "--format",
        "mcap",
        "--episode",
        "2",
        "-o",
        f,
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(failed.status.code(), Some(1));
    one_line(&failed);
    assert_eq!(std::fs::read(&file).expect("read"), before, "untouched");
    // MCAP holds one session: a selection is a usage error, as is a missing -o.
    for bad in [
        &["export", "--all", "--format", "mcap", "-o", f][..],
        &["export", "latest", "--format", "mcap"],
    ] {
        let mut a = bad.to_vec();
        a.extend(["--data-dir", data]);
        assert_eq!(output(&a).await.status.code(), Some(2), "{bad:?}");
    }
}
