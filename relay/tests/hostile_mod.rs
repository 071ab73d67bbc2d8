//! Hostile and broken mods in front of real `gabp-relay serve` processes: a scripted mod (a
//! `TcpListener` speaking the framing, written here) or a stdio mod (a small shell script) does
//! what a buggy or malicious game mod can do, and each test asserts the relay's costs stay
//! bounded (peak RSS from `/proc/PID/status`, data dir bytes per event), what it refused is
//! counted as an anomaly, bridges only ever get frames they can decode within the size limit,
//! the log says what happened once, and the recording passes `sessions check` and exports.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::StreamExt;
use gabp_proto::GabpCodec;
use gabp_sim::{Addr, Client};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio_util::codec::FramedRead;

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
const TOKEN: &str = "bridge-token";

/// A running `serve` whose stderr (the log) is collected line by line.
struct Relay {
    child: Child,
    addr: Addr,
    log: Arc<Mutex<Vec<String>>>,
}

/// `serve` on a loopback port with the test token.
async fn serve(args: &[&str]) -> Relay {
    let mut all = vec!["--listen", "127.0.0.1:0", "--token", TOKEN];
    all.extend_from_slice(args);
    serve_args(&all).await
}

async fn serve_args(args: &[&str]) -> Relay {
    let mut child = Command::new(BIN)
        .env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .env("GABP_LOG", "info")
        .args(["serve", "--no-bridge-file"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gabp-relay");
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut err_lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = err_lines.next_line().await {
            sink.lock().push(l);
        }
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut addr = None;
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(rest) = line.split(" listening on ").nth(1) {
                addr = rest.split(' ').next().and_then(|a| a.parse::<Addr>().ok());
            }
            if line.starts_with("recording") {
                break;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .is_err()
    {
        panic!("relay did not start: {:?}", log.lock());
    }
    Relay {
        child,
        addr: addr.expect("listening line"),
        log,
    }
}

impl Relay {
    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Peak resident memory so far, in MiB.
    fn peak_rss_mib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM");
        kib / 1024
    }

    fn log_lines(&self, needle: &str) -> usize {
        self.log
            .lock()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until the log holds `n` lines containing `needle`.
    async fn wait_log(&self, needle: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.log_lines(needle) < n {
            assert!(
                Instant::now() < deadline,
                "log never had {n} lines with {needle:?}: {:#?}",
                self.log.lock()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM; returns the exit code and how long the exit took.
    async fn stop(mut self) -> (Option<i32>, Duration) {
        let t = Instant::now();
        std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill -TERM");
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("exits")
            .expect("status");
        (status.code(), t.elapsed())
    }
}

/// Polls `cond` until it holds (20 s at most).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The scripted mod's end of one relay connection.
struct ModConn {
    frames: FramedRead<OwnedReadHalf, GabpCodec>,
    write: OwnedWriteHalf,
    hello_id: String,
}

async fn accept(listener: &TcpListener) -> ModConn {
    let (stream, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .expect("relay connected in time")
        .expect("accept");
    let (r, w) = stream.into_split();
    let mut m = ModConn {
        frames: FramedRead::new(r, GabpCodec::new(64 * 1024 * 1024)),
        write: w,
        hello_id: String::new(),
    };
    let hello = m.next().await.expect("hello");
    assert_eq!(hello["method"], "session/hello");
    m.hello_id = hello["id"].as_str().expect("id").to_string();
    m
}

impl ModConn {
    async fn next(&mut self) -> Option<Value> {
        let f = tokio::time::timeout(Duration::from_secs(20), self.frames.next())
            .await
            .expect("frame from the relay in time")?
            .expect("framing");
        Some(serde_json::from_slice(&f.body).expect("the relay sends JSON"))
    }

    async fn send(&mut self, body: &[u8]) {
        let mut wire = BytesMut::new();
        gabp_proto::encode_frame(body, &mut wire);
        self.write.write_all(&wire).await.expect("write to relay");
    }

    async fn send_all(&mut self, bodies: impl IntoIterator<Item = String>) {
        let mut wire = BytesMut::new();
        for b in bodies {
            gabp_proto::encode_frame(b.as_bytes(), &mut wire);
            if wire.len() > 1 << 20 {
                self.write.write_all(&wire).await.expect("write to relay");
                wire.clear();
            }
        }
        self.write.write_all(&wire).await.expect("write to relay");
    }

    /// Answers the hello with `result`, written as raw JSON text.
    async fn welcome_raw(&mut self, result: &str) {
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"response","result":{result}}}"#,
            self.hello_id
        );
        self.send(body.as_bytes()).await;
    }

    async fn welcome(&mut self, channels: &[&str]) {
        let result = json!({"agentId": "hostile", "app": {"name": "hostile-mod", "version": "1"}, "capabilities": {"events": channels}});
        self.welcome_raw(&result.to_string()).await;
    }

    /// Reads until the relay's `events/subscribe` arrives; returns its channels.
    async fn subscribed(&mut self) -> Vec<String> {
        loop {
            let m = self.next().await.expect("subscribe");
            if m["method"] == "events/subscribe" {
                return serde_json::from_value(m["params"]["channels"].clone()).expect("list");
            }
        }
    }
}

/// An event body with a raw payload; `seq` left out when `None`.
fn event(channel: &str, seq: Option<u64>, payload: &str) -> String {
    let seq = seq.map(|s| format!(r#","seq":{s}"#)).unwrap_or_default();
    format!(r#"{{"v":"gabp/1","type":"event","channel":"{channel}"{seq},"payload":{payload}}}"#)
}

async fn bind() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    (l, a)
}

async fn run(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(BIN)
            .args(args)
            .env_remove("GABP_RELAY_DATA_DIR")
            .output(),
    )
    .await
    .expect("command finished")
    .expect("ran")
}

/// The only session of `data`, after checking the data dir passes `sessions check` and the
/// session exports as one JSON document per line.
async fn checked_session(data: &str) -> Value {
    let out = run(&["sessions", "check", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "sessions check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(&["export", "latest", "--data-dir", data]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        serde_json::from_slice::<Value>(line).expect("every exported line is JSON");
    }
    let out = run(&["sessions", "--data-dir", data, "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    v["sessions"][0].clone()
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                    _ => e.metadata().map(|m| m.len()).unwrap_or(0),
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The next event on `channel`, skipping the relay's own notices.
async fn next_on(c: &mut Client, channel: &str) -> Value {
    loop {
        let e = c.next_event().await.expect("event");
        if e["channel"] == channel {
            return e;
        }
    }
}

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
    let (code, _) = relay.stop().await;
    assert_eq!(code, Some(0));
    let s = checked_session(data).await;
    assert_eq!(s["anomalies"], 4, "{s}");
    assert_eq!(s["events"], 2, "{s}");
    // The recording replays: a bridge of the replay gets the same two events.
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
    let (mut c, _) = Client::connect_hello(&addr, TOKEN).await.expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    let a = next_on(&mut c, "c").await;
    let b = next_on(&mut c, "c").await;
    assert_eq!((a["seq"].as_u64(), b["seq"].as_u64()), (Some(0), Some(1)));
    assert_eq!(b["payload"]["n"], 2);
    replay.start_kill().expect("stop replay");
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
    m.welcome(&["c"]).await;
    m.subscribed().await;
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    // Ten small events (relay seqs 0-9), then events at the limit: the relay's two-digit seq
    // would push a one-digit or missing mod seq past it (refused), not a two-digit one.
    let sized = |seq: Option<u64>, len: usize| {
        let empty = event("c", seq, r#""""#).len();
        event("c", seq, &format!("\"{}\"", "x".repeat(len - empty)))
    };
    let mut bodies: Vec<String> = (0..10).map(|i| event("c", Some(i), "{}")).collect();
    bodies.extend([
        sized(None, MAX),          // refused: grows by `,"seq":10`
        sized(Some(1), MAX),       // refused: 1 -> 10
        sized(Some(10), MAX),      // forwarded as seq 10, exactly MAX
        sized(None, MAX - 9),      // forwarded as seq 11, exactly MAX
        sized(None, MAX - 8),      // refused: one byte over
        sized(Some(99), MAX - 50), // forwarded as seq 12
    ]);
    assert!(bodies.iter().all(|b| b.len() <= MAX));
    m.send_all(bodies).await;
    let mut seen = 0;
    let mut at_limit = 0;
    while seen < 13 {
        let frame = c.next_frame().await.expect("frame").expect("open");
        assert!(frame.len() <= MAX, "forwarded a {} byte frame", frame.len());
        let v: Value = serde_json::from_slice(&frame).expect("json");
        if v["channel"] == "c" {
            assert_eq!(v["seq"], seen);
            seen += 1;
            at_limit += usize::from(frame.len() == MAX);
        }
    }
    assert_eq!(at_limit, 2);
    drop(m);
    assert_eq!(relay.stop().await.0, Some(0));
    let s = checked_session(data).await;
    assert_eq!(
        (s["events"].as_u64(), s["anomalies"].as_u64()),
        (Some(13), Some(3)),
        "{s}"
    );
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
    assert_eq!(relay.stop().await.0, Some(0));
    let s = checked_session(data).await;
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

/// Writes an executable shell script into `dir`.
fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p.to_str().expect("utf8").to_string()
}

#[tokio::test]
async fn a_stdio_mods_stderr_flood_is_drained_with_bounded_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let done = dir.path().join("done");
    // A non-UTF-8 byte, a control sequence, 256 MiB without a newline, then 20,000 short lines:
    // the mod must be able to write all of it (no SIGPIPE, no stall) and say so.
    let mod_cmd = script(
        dir.path(),
        "flood.sh",
        &format!(
            "printf 'bad \\377 byte \\033[2J\\n' >&2\nhead -c 268435456 /dev/zero >&2\nprintf '\\n' >&2\nseq 20000 >&2\necho ok > {}\nexec sleep 30",
            done.display()
        ),
    );
    let relay = serve(&["--no-record", "--upstream", "stdio", "--", &mod_cmd]).await;
    until("the mod wrote all its stderr", || done.exists()).await;
    relay.wait_log("bad \u{fffd} byte \\u{1b}[2J", 1).await;
    relay
        .wait_log("more bytes of this line not logged", 1)
        .await;
    relay
        .wait_log("stderr lines of the mod not logged", 1)
        .await;
    let peak = relay.peak_rss_mib();
    assert!(
        peak < 100,
        "peak RSS {peak} MiB while draining 256 MiB of stderr"
    );
    assert!(
        relay.log_lines("mod_command") < 1000,
        "stderr lines are rate-limited"
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn stdio_mod_exits_are_logged_backed_off_and_a_missing_one_fails_at_start() {
    let out = run(&[
        "serve",
        "--no-record",
        "--no-bridge-file",
        "--listen",
        "127.0.0.1:0",
        "--token",
        TOKEN,
        "--upstream",
        "stdio",
        "--",
        "/nonexistent/game-mod",
    ])
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/nonexistent/game-mod") && err.trim().lines().count() == 1,
        "{err}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let starts = dir.path().join("starts");
    let mod_cmd = script(
        dir.path(),
        "dies.sh",
        &format!("date +%s%N >> {}\nexit 3", starts.display()),
    );
    let relay = serve(&["--no-record", "--upstream", "stdio", "--", &mod_cmd]).await;
    relay.wait_log("exited (exit status: 3)", 1).await;
    let times = || -> Vec<u64> {
        std::fs::read_to_string(&starts)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    until("five starts", || times().len() >= 5).await;
    // 50 ms doubling: five starts take at least 50+100+200+400 ms.
    let t = times();
    let took = Duration::from_nanos(t[4] - t[0]);
    assert!(took >= Duration::from_millis(700), "{took:?}");
    assert_eq!(
        relay.log_lines("exited (exit status: 3)"),
        1,
        "{:#?}",
        relay.log.lock()
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn two_stdio_routes_keep_their_own_mods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a_starts, b_starts) = (dir.path().join("a"), dir.path().join("b"));
    let a = script(
        dir.path(),
        "a.sh",
        &format!("echo x >> {}\nexit 1", a_starts.display()),
    );
    let b = script(
        dir.path(),
        "b.sh",
        &format!(
            "echo x >> {}\nexec {BIN} mod-sim --stdio --token modtok --rate 50",
            b_starts.display()
        ),
    );
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "[[route]]\nname = \"a\"\nupstream_command = [\"{a}\"]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
             [[route]]\nname = \"b\"\nupstream_command = [\"{b}\"]\nupstream_token = \"modtok\"\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"
        ),
    )
    .expect("config");
    let data = dir.path().join("data");
    let relay = serve_args(&[
        "--data-dir",
        data.to_str().expect("utf8"),
        "--config",
        config.to_str().expect("utf8"),
    ])
    .await;
    let count = |p: &std::path::Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
    until("route a restarted its mod four times", || {
        count(&a_starts) >= 4
    })
    .await;
    assert_eq!(
        count(&b_starts),
        1,
        "route a's restarts killed route b's mod"
    );
    assert_eq!(
        relay.log_lines("session ended"),
        0,
        "{:#?}",
        relay.log.lock()
    );
    assert_eq!(relay.stop().await.0, Some(0));
}

#[tokio::test]
async fn sigterm_is_prompt_in_every_upstream_state() {
    // Waiting for the welcome (the mod read the hello and says nothing).
    let (listener, up) = bind().await;
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    let m = accept(&listener).await;
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(2),
        "waiting for the welcome: {took:?}"
    );
    drop(m);
    // Backing off (nothing listens upstream).
    drop(listener);
    let relay = serve(&["--upstream", &up, "--no-record"]).await;
    relay.wait_log("mod not reachable", 1).await;
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(2), "backing off: {took:?}");
    // Running, mid-stream.
    let (listener, up) = bind().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf8");
    let relay = serve(&["--upstream", &up, "--data-dir", data]).await;
    let mut m = accept(&listener).await;
    m.welcome(&["c"]).await;
    m.subscribed().await;
    // The mod never pauses: it writes until the relay goes away.
    let ModConn { write, frames, .. } = m;
    let flood = tokio::spawn(async move {
        let mut write = write;
        let batch: Vec<u8> = {
            let mut wire = BytesMut::new();
            for i in 0..1000 {
                gabp_proto::encode_frame(event("c", Some(i), "{}").as_bytes(), &mut wire);
            }
            wire.to_vec()
        };
        let mut sent = 0u64;
        while write.write_all(&batch).await.is_ok() {
            sent += 1000;
        }
        drop(frames);
        sent
    });
    let (mut c, _) = Client::connect_hello(&relay.addr, TOKEN)
        .await
        .expect("hello");
    c.subscribe(&["c"]).await.expect("subscribe");
    next_on(&mut c, "c").await; // the flood is flowing
    let (code, took) = relay.stop().await;
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(2), "running: {took:?}");
    assert!(flood.await.expect("flood") > 0);
    assert_eq!(checked_session(data).await["end"], "relay_shutdown");
}
