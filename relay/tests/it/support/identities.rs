//! What the identity, lease and reload tests share: a logged `serve` of a config file with a
//! discovery file (for `status` and `reload`), a config with named bridges, hellos that expect
//! an error, `/metrics`, and a search for a secret through a directory's files.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::hostile::Relay;
use super::{Addr, Client, Stdio, BIN};

/// Tokens of the named identities (never to be found in logs, recordings or metrics).
pub const PLANNER: &str = "planner-token-0123456789abcdef";
pub const WATCHER: &str = "watcher-token-0123456789abcdef";
pub const SLOW: &str = "slowpoke-token-0123456789abcdef";

/// `serve --config CONFIG --bridge-file FILE` plus `args`, with its log kept.
pub async fn serve_config(config: &str, bridge_file: &str, args: &[&str]) -> Relay {
    let head = ["serve", "--config", config, "--bridge-file", bridge_file];
    super::hostile::start_logged(&head, args).await
}

/// A route `r` to the mod at `upstream` with `extra` route keys and then `bridges` (the
/// `[[route.bridge]]` tables).
pub fn config_text(upstream: &Addr, extra: &str, bridges: &str) -> String {
    format!(
        "[[route]]\nname = \"r\"\nupstream = \"{upstream}\"\nupstream_token = \"{}\"\nlisten = \"127.0.0.1:0\"\ntoken = \"{}\"\n{extra}\n{bridges}",
        super::MOD_TOKEN,
        super::BRIDGE_TOKEN
    )
}

/// A connected, welcomed bridge; the welcome is returned too.
pub async fn bridge(addr: &Addr, token: &str) -> (Client, Value) {
    let mut c = Client::connect(addr).await.expect("connect");
    let w = c.hello(token).await.expect("welcomed");
    (c, w)
}

/// The error of a request that must fail: `(code, message, data)`.
pub async fn refused(c: &mut Client, method: &str, params: Value) -> (i64, String, Value) {
    let r = c.request(method, params).await.expect("answered");
    let e = &r["error"];
    assert!(e.is_object(), "{method} should fail: {r}");
    (
        e["code"].as_i64().expect("code"),
        e["message"].as_str().expect("message").to_string(),
        e["data"].clone(),
    )
}

/// A `tools/call` of `tool`.
pub fn call(tool: &str) -> Value {
    json!({"name": tool, "arguments": {"x": 1}})
}

/// One GET /metrics.
pub async fn metrics(addr: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("ask");
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("answered")
        .expect("read");
    out
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                if memchr_find(&bytes, needle.as_bytes()) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
    hits
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A simulated mod that sends events only when asked (`sim/emit`), so event streams hold just
/// what a test looks for.
pub fn quiet_mod() -> super::ModSim {
    let cfg = super::ModSimConfig {
        token: super::MOD_TOKEN.into(),
        autostart: false,
        ..super::ModSimConfig::default()
    };
    super::ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}
