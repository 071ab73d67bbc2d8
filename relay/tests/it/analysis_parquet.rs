//! Parquet export through the real binary, on sessions a real relay recorded in front of the
//! simulated mod:
//! - the columns are the contract (names and types, read back with the parquet crate), and
//!   every row says what the JSONL line of the same frame says;
//! - a selection becomes a Hive-partitioned directory, written whole or not at all, replaced
//!   only with --force;
//! - `examples/analysis.py` (DuckDB and Polars from PyPI, installed into
//!   ~/.cache/gabp-relay/venv when missing) reads it with one glob and agrees with
//!   `gabp-relay stats --json`, and fails when the figures disagree; DuckDB's DESCRIBE shows
//!   the documented schema.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::*;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampNanosecondType};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};

const CHANNELS: [&str; 3] = ["world/tick", "player/move", "chat/message"];
/// Events the bridge reads in each session (the mod streams on until the relay stops).
const EVENTS: u64 = 240;
/// Tool calls each session makes (one of every `FAIL_EVERY` fails).
const CALLS: usize = 30;
const FAIL_EVERY: usize = 10;

/// The columns of a single-session file, in order, with their Arrow types (the README's
/// table). A Hive directory's files are the same without `route`.
const COLUMNS: [(&str, &str); 20] = [
    ("session", "Utf8"),
    ("route", "Utf8"),
    ("frame", "Int64"),
    ("t_ns", "Timestamp(ns, \"UTC\")"),
    ("offset_ms", "Float64"),
    ("dir", "Utf8"),
    ("conn", "Int64"),
    ("bridge", "Utf8"),
    ("kind", "Utf8"),
    ("method", "Utf8"),
    ("id", "Utf8"),
    ("channel", "Utf8"),
    ("mod_seq", "Int64"),
    ("relay_seq", "Int64"),
    ("error_code", "Int64"),
    ("payload", "Utf8"),
    ("label", "Utf8"),
    ("data", "Utf8"),
    ("tags", "Map"),
    ("episode", "Int64"),
];

/// Records one session on `route` with `tags`: a bridge subscribes to every channel and reads
/// all the mod's events, marks an episode around `CALLS` tool calls (some failing), and the
/// relay stops (SIGTERM) so the data dir is free.
async fn record(data: &str, route: &str, tags: &[&str], latency_ms: u64) {
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(2000.0),
            tool_latency: Duration::from_millis(latency_ms),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut extra = vec!["--route-name", route];
    extra.extend(tags.iter().flat_map(|t| ["--tag", t]));
    let s = serve_recording(sim.addr(), std::path::Path::new(data), &extra).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&CHANNELS).await.expect("subscribe");
    for _ in 0..EVENTS {
        tokio::time::timeout(Duration::from_secs(20), c.next_event())
            .await
            .expect("event in time")
            .expect("event");
    }
    c.call(
        "relay/mark",
        json!({"label": "ep-start", "data": {"ep": 1}}),
    )
    .await
    .expect("mark");
    for i in 0..CALLS {
        let tool = if i % FAIL_EVERY == FAIL_EVERY - 1 {
            "no/such-tool"
        } else {
            "sim/echo"
        };
        c.request("tools/call", json!({"name": tool, "arguments": {"i": i}}))
            .await
            .expect("answer");
    }
    c.call("relay/mark", json!({"label": "ep-end"}))
        .await
        .expect("mark");
    s.stop_cleanly().await;
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every row of a Parquet file, as one batch.
pub(crate) fn read_parquet(path: &Path) -> RecordBatch {
    let file = std::fs::File::open(path).expect("parquet file");
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("a Parquet file")
        .with_batch_size(1 << 20)
        .build()
        .expect("reader");
    let mut batches: Vec<RecordBatch> = reader.map(|b| b.expect("batch")).collect();
    assert_eq!(batches.len(), 1, "one batch holds a small session");
    batches.pop().expect("rows")
}

/// A short name of an Arrow type, as in [`COLUMNS`].
fn type_name(t: &arrow_schema::DataType) -> String {
    use arrow_schema::{DataType, TimeUnit};
    match t {
        DataType::Timestamp(TimeUnit::Nanosecond, Some(tz)) => format!("Timestamp(ns, {tz:?})"),
        DataType::Map(..) => "Map".into(),
        other => format!("{other:?}"),
    }
}

fn text(b: &RecordBatch, col: &str, i: usize) -> Option<String> {
    let a = b.column_by_name(col).expect("column").as_string::<i32>();
    (!a.is_null(i)).then(|| a.value(i).to_string())
}

fn int(b: &RecordBatch, col: &str, i: usize) -> Option<i64> {
    let a = b
        .column_by_name(col)
        .expect("column")
        .as_primitive::<Int64Type>();
    (!a.is_null(i)).then(|| a.value(i))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_columns_are_the_contract_and_say_what_jsonl_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    record(data, "lab", &["exp=ppo", "seed=7"], 1).await;

    let file = dir.path().join("one.parquet");
    let f = file.to_str().expect("utf-8");
    let report = json(
        &output(&[
            "export",
            "latest",
            "--format",
            "parquet",
            "-o",
            f,
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    let lines: Vec<Value> = ok(&output(&["export", "latest", "--data-dir", data]).await)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(report["frames"], lines.len() as u64);

    let b = read_parquet(&file);
    let schema = b.schema();
    let got: Vec<(String, String)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), type_name(f.data_type())))
        .collect();
    let want: Vec<(String, String)> = COLUMNS
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(got, want, "the column contract changed");
    assert_eq!(b.num_rows(), lines.len());

    let t_ns = b
        .column_by_name("t_ns")
        .expect("t_ns")
        .as_primitive::<TimestampNanosecondType>();
    let offset = b
        .column_by_name("offset_ms")
        .expect("offset_ms")
        .as_primitive::<Float64Type>();
    let tags = b.column_by_name("tags").expect("tags").as_map();
    let (mut events, mut errors, mut marks) = (0, 0, 0);
    for (i, l) in lines.iter().enumerate() {
        let what = format!("row {i}: {l}");
        assert_eq!(
            text(&b, "session", i).as_deref(),
            l["session"].as_str(),
            "{what}"
        );
        assert_eq!(text(&b, "route", i).as_deref(), Some("lab"), "{what}");
        assert_eq!(int(&b, "frame", i), l["frame"].as_i64(), "{what}");
        assert_eq!(Some(t_ns.value(i)), l["tNs"].as_i64(), "{what}");
        assert_eq!(Some(offset.value(i)), l["offsetMs"].as_f64(), "{what}");
        assert_eq!(text(&b, "dir", i).as_deref(), l["dir"].as_str(), "{what}");
        assert_eq!(int(&b, "conn", i), l["conn"].as_i64(), "{what}");
        assert_eq!(text(&b, "kind", i).as_deref(), l["kind"].as_str(), "{what}");
        assert_eq!(
            text(&b, "channel", i).as_deref(),
            l["channel"].as_str(),
            "{what}"
        );
        assert_eq!(int(&b, "mod_seq", i), l["modSeq"].as_i64(), "{what}");
        assert_eq!(int(&b, "relay_seq", i), l["relaySeq"].as_i64(), "{what}");
        assert_eq!(int(&b, "episode", i), l["episode"].as_i64(), "{what}");
        // No identity names are configured: the bridge column is null throughout.
        assert_eq!(text(&b, "bridge", i), None, "{what}");
        let msg = &l["msg"];
        assert_eq!(
            text(&b, "method", i).as_deref(),
            msg["method"].as_str(),
            "{what}"
        );
        let id = msg
            .get("id")
            .filter(|v| !v.is_null())
            .map(|v| match v.as_str() {
                Some(s) => s.to_string(),
                None => v.to_string(),
            });
        assert_eq!(text(&b, "id", i), id, "{what}");
        let payload: Option<Value> =
            text(&b, "payload", i).map(|p| serde_json::from_str(&p).expect("payload is JSON"));
        let want_payload = match l["kind"].as_str() {
            Some("request" | "mark") => msg.get("params"),
            Some("response") if msg.get("error").is_some_and(|e| !e.is_null()) => msg.get("error"),
            Some("response") => msg.get("result"),
            Some("event") => msg.get("payload"),
            _ => None,
        };
        assert_eq!(payload.as_ref(), want_payload, "{what}");
        match l["kind"].as_str() {
            Some("event") => events += 1,
            Some("mark") => {
                marks += 1;
                assert_eq!(
                    text(&b, "label", i).as_deref(),
                    l["label"].as_str(),
                    "{what}"
                );
                let data =
                    text(&b, "data", i).map(|d| serde_json::from_str::<Value>(&d).expect("json"));
                assert_eq!(data.unwrap_or(Value::Null), l["data"], "{what}");
            }
            _ => assert_eq!(text(&b, "label", i), None, "{what}"),
        }
        if let Some(code) = int(&b, "error_code", i) {
            assert_eq!(Some(code), msg["error"]["code"].as_i64(), "{what}");
            errors += 1;
        }
        // The session's tags, on every row.
        let entry = tags.value(i);
        let keys = entry.column(0).as_string::<i32>();
        let values = entry.column(1).as_string::<i32>();
        let row_tags: BTreeMap<&str, &str> = (0..entry.len())
            .map(|j| (keys.value(j), values.value(j)))
            .collect();
        assert_eq!(
            row_tags,
            BTreeMap::from([("exp", "ppo"), ("seed", "7")]),
            "{what}"
        );
    }
    assert!(events >= EVENTS, "{events} events");
    assert_eq!(marks, 2);
    assert_eq!(
        errors,
        CALLS / FAIL_EVERY,
        "one error answer per failed call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selection_is_a_hive_directory_written_whole_or_not_at_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    record(data, "lab/a", &[], 0).await;
    record(data, "lab b", &[], 0).await;
    let ids: Vec<String> = json(&output(&["sessions", "--json", "--data-dir", data]).await)
        ["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect();
    let out = dir.path().join("out");
    let o = out.to_str().expect("utf-8");

    // Usage errors, before anything is read or written.
    for args in [
        vec!["export", "--all", "--format", "parquet"],
        vec!["export", "--all", "--force", "-o", o],
        vec![
            "export", "latest", "--format", "parquet", "--force", "-o", o,
        ],
    ] {
        let mut a = args.clone();
        a.extend(["--data-dir", data]);
        let r = output(&a).await;
        assert_eq!(r.status.code(), Some(2), "{args:?}");
        one_line(&r);
        assert!(!out.exists(), "{args:?} wrote something");
    }

    let report = json(
        &output(&[
            "export",
            "--all",
            "--format",
            "parquet",
            "-o",
            o,
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    let today = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .to_string();
    let files: Vec<String> = report["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["file"].as_str().expect("file").to_string())
        .collect();
    // A session's start may fall on either side of midnight; its date is in its path.
    let dated = |f: &str, route: &str, id: &str| {
        let date = f.split("date=").nth(1).expect("date")[..10].to_string();
        assert!(date <= today, "{f}");
        assert_eq!(f, format!("route={route}/date={date}/session={id}.parquet"));
    };
    dated(&files[0], "lab%2Fa", &ids[0]);
    dated(&files[1], "lab%20b", &ids[1]);
    let listing = |p: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = walk(p)
            .into_iter()
            .map(|f| f.strip_prefix(p).expect("inside").to_path_buf())
            .collect();
        v.sort();
        v
    };
    let mut want: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    want.sort();
    assert_eq!(listing(&out), want);
    // The partition is the route: the files leave the column out.
    let b = read_parquet(&out.join(&files[0]));
    assert!(b.column_by_name("route").is_none());
    assert_eq!(b.num_columns(), COLUMNS.len() - 1);
    assert_eq!(text(&b, "session", 0).as_deref(), Some(ids[0].as_str()));

    // A non-empty directory is refused without --force, untouched.
    std::fs::write(out.join("keep.txt"), "mine").expect("write");
    let before = listing(&out);
    let r = output(&[
        "export",
        "--all",
        "--format",
        "parquet",
        "-o",
        o,
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(r.status.code(), Some(2));
    assert!(one_line(&r).contains("--force"));
    assert_eq!(listing(&out), before);

    // A failing export (a mark no session has) leaves it as it was, and no temporary behind.
    let r = output(&[
        "export",
        "--all",
        "--format",
        "parquet",
        "-o",
        o,
        "--force",
        "--from-mark",
        "nope",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(r.status.code(), Some(1));
    one_line(&r);
    assert_eq!(listing(&out), before);
    let fresh = dir.path().join("fresh");
    let r = output(&[
        "export",
        "--route",
        "lab b",
        "--format",
        "parquet",
        "-o",
        fresh.to_str().expect("utf-8"),
        "--from-mark",
        "nope",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(r.status.code(), Some(1));
    assert!(!fresh.exists());
    let stray: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "temporaries left: {stray:?}");

    // --force replaces it whole: the stranger's file is gone, the selection's files are there.
    let r = output(&[
        "export",
        "--route",
        "lab b",
        "--format",
        "parquet",
        "-o",
        o,
        "--force",
        "--data-dir",
        data,
    ])
    .await;
    ok(&r);
    assert_eq!(listing(&out), [PathBuf::from(&files[1])]);
}

pub(crate) fn walk(p: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(p).expect("read dir") {
        let path = e.expect("entry").path();
        if path.is_dir() {
            v.extend(walk(&path));
        } else {
            v.push(path);
        }
    }
    v
}

/// The virtualenv's python with `duckdb` and `polars` importable.
fn python() -> PathBuf {
    crate::support::mcp::venv_python("duckdb, polars", &["duckdb", "polars"])
}

fn example() -> PathBuf {
    // The clone this runs in, not the one that compiled this binary (see `proto/tests`).
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join("../examples/analysis.py")
}

async fn run_python(args: &[&str]) -> std::process::Output {
    let py = python();
    tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(py).args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("python finished")
    .expect("python runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analysis_example_agrees_with_stats_and_fails_when_it_does_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    record(data, "lab/a", &["exp=ppo"], 2).await;
    record(data, "lab/a", &["exp=dqn"], 1).await;
    record(data, "lab b", &[], 3).await;
    let out = dir.path().join("export");
    let o = out.to_str().expect("utf-8");
    ok(&output(&[
        "export",
        "--all",
        "--format",
        "parquet",
        "-o",
        o,
        "--data-dir",
        data,
    ])
    .await);
    let stats = dir.path().join("stats.json");
    std::fs::write(
        &stats,
        ok(&output(&["stats", "--all", "--json", "--data-dir", data]).await),
    )
    .expect("write stats");
    let example = example();
    let example = example.to_str().expect("utf-8");

    let r = run_python(&[example, o, stats.to_str().expect("utf-8")]).await;
    let said = ok(&r);
    eprintln!("{said}");
    assert!(
        said.starts_with("3 sessions on 2 routes (lab b, lab/a)"),
        "{said}"
    );
    for ch in CHANNELS {
        assert!(said.contains(&format!("events {ch}: ")), "{said}");
    }
    assert!(said.contains("calls tools/call: 90 answered"), "{said}");
    assert!(said.contains("marks: 6"), "{said}");
    assert!(
        said.trim_end().ends_with("export and stats agree"),
        "{said}"
    );

    // Stats of other sessions: the example says so and fails.
    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        ok(&output(&["stats", "--route", "lab b", "--json", "--data-dir", data]).await),
    )
    .expect("write");
    let r = run_python(&[example, o, other.to_str().expect("utf-8")]).await;
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    assert!(String::from_utf8_lossy(&r.stderr).contains("MISMATCH sessions differ"));

    // One channel's count off by one, or one percentile off by more than the histogram's 1/16.
    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(&stats).expect("read")).expect("json");
    let n = doc["sessions"][0]["channels"][0]["events"]
        .as_u64()
        .expect("events");
    doc["sessions"][0]["channels"][0]["events"] = json!(n + 1);
    let off = dir.path().join("off.json");
    std::fs::write(&off, doc.to_string()).expect("write");
    let r = run_python(&[example, o, off.to_str().expect("utf-8")]).await;
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("MISMATCH events of "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(&stats).expect("read")).expect("json");
    let m = doc["sessions"][2]["methods"]
        .as_array_mut()
        .expect("methods")
        .iter_mut()
        .find(|m| m["method"] == "tools/call")
        .expect("tools/call");
    let p90 = m["p90Ms"].as_f64().expect("p90");
    m["p90Ms"] = json!(p90 * 1.2);
    std::fs::write(&off, doc.to_string()).expect("write");
    let r = run_python(&[example, o, off.to_str().expect("utf-8")]).await;
    assert_eq!(r.status.code(), Some(1));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("MISMATCH p90Ms of tools/call"), "{err}");

    // The schema as DuckDB sees it (no pyarrow): the documented columns, with the partition's
    // route and date after them; a single-session file carries its route itself.
    let one = dir.path().join("one.parquet");
    ok(&output(&[
        "export",
        "latest",
        "--format",
        "parquet",
        "-o",
        one.to_str().expect("utf-8"),
        "--data-dir",
        data,
    ])
    .await);
    let describe = "import duckdb, json, sys\n\
        for path, hive in ((sys.argv[1], True), (sys.argv[2], False)):\n\
        \x20   rows = duckdb.sql(f\"DESCRIBE SELECT * FROM read_parquet('{path}', hive_partitioning = {hive})\").fetchall()\n\
        \x20   print(json.dumps([[r[0], r[1]] for r in rows]))\n";
    let glob = format!("{o}/**/*.parquet");
    let r = run_python(&["-c", describe, &glob, one.to_str().expect("utf-8")]).await;
    let said = ok(&r);
    let mut docs = said
        .lines()
        .map(|l| serde_json::from_str::<Vec<(String, String)>>(l).expect("json"));
    let duck = |with_route: bool, partitions: bool| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = COLUMNS
            .iter()
            .filter(|(n, _)| with_route || *n != "route")
            .map(|(n, t)| {
                let t = match *t {
                    "Utf8" => "VARCHAR",
                    "Int64" => "BIGINT",
                    "Float64" => "DOUBLE",
                    "Map" => "MAP(VARCHAR, VARCHAR)",
                    _ => "TIMESTAMPTZ",
                };
                (n.to_string(), t.to_string())
            })
            .collect();
        if partitions {
            v.push(("date".into(), "DATE".into()));
            v.push(("route".into(), "VARCHAR".into()));
        }
        v
    };
    // A timestamp with a zone, at whatever precision this DuckDB names (TIMESTAMPTZ_NS in
    // 2.x, TIMESTAMP WITH TIME ZONE before).
    let zoned = |mut v: Vec<(String, String)>| {
        for (n, t) in &mut v {
            if n == "t_ns" && (t.starts_with("TIMESTAMPTZ") || t.ends_with("WITH TIME ZONE")) {
                *t = "TIMESTAMPTZ".into();
            }
        }
        v
    };
    // DuckDB appends the partition columns in an order of its own: compare them as a set.
    let mut hive = zoned(docs.next().expect("hive"));
    hive[COLUMNS.len() - 1..].sort();
    assert_eq!(hive, duck(false, true));
    assert_eq!(zoned(docs.next().expect("file")), duck(true, false));
}
