//! What the hostile-mod tests share: a `serve` whose log is collected, a scripted TCP mod
//! speaking the framing, stdio mod scripts, and checks on what the relay recorded.

pub use std::process::Stdio;
pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

pub use bytes::BytesMut;
pub use futures::StreamExt;
pub use gabp_client::Client;
pub use gabp_proto::GabpCodec;
pub use gabp_sim::Addr;
pub use parking_lot::Mutex;
pub use serde_json::{json, Value};
pub use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
pub use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
pub use tokio::net::TcpListener;
pub use tokio::process::{Child, Command};
pub use tokio_util::codec::FramedRead;

pub use super::{until, BIN, MOD_TOKEN};

pub const TOKEN: &str = "hostile-bridge-token";

/// A running `serve` whose stderr (the log) is collected line by line.
pub struct Relay {
    pub child: Child,
    pub addr: Addr,
    pub log: Arc<Mutex<Vec<String>>>,
}

/// `serve` on a loopback port with the test token.
pub async fn serve(args: &[&str]) -> Relay {
    let mut all = vec!["--listen", "127.0.0.1:0", "--token", TOKEN];
    all.extend_from_slice(args);
    serve_args(&all).await
}

pub async fn serve_args(args: &[&str]) -> Relay {
    start_logged(&["serve", "--no-bridge-file"], args).await
}

/// The relay binary run with `head` and then `args` (no token or data dir from this process's
/// environment), its log collected, returned once it has printed its `recording` line.
pub async fn start_logged(head: &[&str], args: &[&str]) -> Relay {
    let mut child = Command::new(BIN)
        .env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .env("GABP_LOG", "info")
        .args(head)
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
    if tokio::time::timeout(Duration::from_secs(30), read)
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
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Peak resident memory so far, in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM");
        kib / 1024
    }

    pub fn log_lines(&self, needle: &str) -> usize {
        self.log
            .lock()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits until the log holds `n` lines containing `needle`.
    pub async fn wait_log(&self, needle: &str, n: usize) {
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
    pub async fn stop(mut self) -> (Option<i32>, Duration) {
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

/// The scripted mod's end of one relay connection.
pub struct ModConn {
    pub frames: FramedRead<OwnedReadHalf, GabpCodec>,
    pub write: OwnedWriteHalf,
    pub hello_id: String,
}

pub async fn accept(listener: &TcpListener) -> ModConn {
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
    pub async fn next(&mut self) -> Option<Value> {
        let f = tokio::time::timeout(Duration::from_secs(20), self.frames.next())
            .await
            .expect("frame from the relay in time")?
            .expect("framing");
        Some(serde_json::from_slice(&f.body).expect("the relay sends JSON"))
    }

    pub async fn send(&mut self, body: &[u8]) {
        let mut wire = BytesMut::new();
        gabp_proto::encode_frame(body, &mut wire);
        self.write.write_all(&wire).await.expect("write to relay");
    }

    pub async fn send_all(&mut self, bodies: impl IntoIterator<Item = String>) {
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
    pub async fn welcome_raw(&mut self, result: &str) {
        let body = format!(
            r#"{{"v":"gabp/1","id":"{}","type":"response","result":{result}}}"#,
            self.hello_id
        );
        self.send(body.as_bytes()).await;
    }

    pub async fn welcome(&mut self, channels: &[&str]) {
        let result = json!({"agentId": "hostile", "app": {"name": "hostile-mod", "version": "1"}, "capabilities": {"events": channels}});
        self.welcome_raw(&result.to_string()).await;
    }

    /// Reads until the relay's `events/subscribe` arrives; returns its channels.
    pub async fn subscribed(&mut self) -> Vec<String> {
        loop {
            let m = self.next().await.expect("subscribe");
            if m["method"] == "events/subscribe" {
                return serde_json::from_value(m["params"]["channels"].clone()).expect("list");
            }
        }
    }
}

/// An event body with a raw payload; `seq` left out when `None`.
pub fn event(channel: &str, seq: Option<u64>, payload: &str) -> String {
    let seq = seq.map(|s| format!(r#","seq":{s}"#)).unwrap_or_default();
    format!(r#"{{"v":"gabp/1","type":"event","channel":"{channel}"{seq},"payload":{payload}}}"#)
}

pub async fn bind() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    (l, a)
}

pub async fn run(args: &[&str]) -> std::process::Output {
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
pub async fn checked_session(data: &str) -> Value {
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
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
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
pub async fn next_on(c: &mut Client, channel: &str) -> Value {
    loop {
        let e = c.next_event().await.expect("event");
        if e["channel"] == channel {
            return e;
        }
    }
}

/// Writes an executable shell script into `dir`.
pub fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p.to_str().expect("utf8").to_string()
}
