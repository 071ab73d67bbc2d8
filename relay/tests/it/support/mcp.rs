//! What the MCP test and the MCP latency bench (`relay/benches/mcp.rs`) share: the official MCP
//! Python SDK in a virtualenv outside the clone (installed into ~/.cache/gabp-relay/venv when
//! missing), a running `gabp-relay serve` with its MCP endpoint in front of the simulated mod,
//! and relay/tests/it/support/mcp_client.py run against it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
/// The simulated mod's token (16+ characters: the relay warns about shorter bridge tokens).
pub const MOD_TOKEN: &str = "mod-token-for-tests";

/// The virtualenv's python with the MCP SDK importable.
pub fn python() -> PathBuf {
    venv_python("mcp.client.streamable_http", &["mcp"])
}

pub fn client_script() -> PathBuf {
    // The clone this runs in, not the one that compiled this binary (see `proto/tests`).
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .join("tests/it/support/mcp_client.py")
}

pub fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A running `gabp-relay serve` with its MCP HTTP endpoint.
pub struct Serve {
    pub _child: Child,
    pub addr: Addr,
    pub mcp_url: String,
    pub token: String,
    pub bridge_file: PathBuf,
    pub data_dir: PathBuf,
}

pub async fn serve(sim: &ModSim, dir: &Path) -> Serve {
    let token = token();
    let bridge_file = dir.join("bridge.json");
    let data_dir = dir.join("data");
    let mut child = Command::new(BIN)
        .arg("serve")
        .args([
            "--upstream",
            &sim.addr().to_string(),
            "--upstream-token",
            MOD_TOKEN,
        ])
        .args(["--listen", "127.0.0.1:0", "--token", &token])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--bridge-file")
        .arg(&bridge_file)
        .args(["--mcp-listen", "127.0.0.1:0"])
        .env_remove("GABP_RELAY_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gabp-relay serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut addr, mut mcp_url) = (None, None);
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(rest) = line.split(" listening on ").nth(1) {
                addr = rest.split(' ').next().and_then(|a| a.parse::<Addr>().ok());
            }
            if let Some(url) = line.strip_prefix("mcp on ") {
                mcp_url = Some(url.trim().to_string());
            }
            if line.starts_with("recording") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("relay printed its start-up lines");
    Serve {
        _child: child,
        addr: addr.expect("listening line"),
        mcp_url: mcp_url.expect("mcp line"),
        token,
        bridge_file,
        data_dir,
    }
}

pub fn sim(autostart: bool, rate: Option<f64>) -> ModSim {
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        autostart,
        rate,
        payload_bytes: 256,
        ..ModSimConfig::default()
    };
    ModSim::start(&"127.0.0.1:0".parse().expect("addr"), cfg).expect("mod")
}

/// A running client.py, its stdout as lines, its stderr in a file (shown when it fails).
pub struct Py {
    pub child: Child,
    pub out: Lines<BufReader<ChildStdout>>,
    pub stderr: PathBuf,
}

pub fn spawn_py(
    what: &str,
    mode: &str,
    name: &str,
    s: &Serve,
    dir: &Path,
    env: &[(&str, &str)],
) -> Py {
    let stderr = dir.join(format!("{name}.stderr"));
    let mut cmd = Command::new(python());
    cmd.arg(client_script()).args([what, mode, name]);
    if mode == "stdio" {
        cmd.args(["--", BIN, "mcp", "--name", name, "--bridge-file"])
            .arg(&s.bridge_file);
    } else {
        cmd.arg(&s.mcp_url).env("GABP_TOKEN", &s.token);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .env_remove("GABP_RELAY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn python");
    let out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    Py { child, out, stderr }
}

impl Py {
    /// The next stdout line, within `wait`.
    pub async fn line(&mut self, wait: Duration) -> String {
        match tokio::time::timeout(wait, self.out.next_line()).await {
            Ok(Ok(Some(l))) => l,
            other => panic!(
                "client.py gave no line ({other:?}); its stderr:\n{}",
                std::fs::read_to_string(&self.stderr).unwrap_or_default()
            ),
        }
    }

    /// The result document and a successful exit.
    pub async fn finish(mut self, wait: Duration) -> Value {
        let line = self.line(wait).await;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("client.py exits")
            .expect("wait");
        assert!(
            status.success(),
            "client.py failed; its stderr:\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        serde_json::from_str(&line).expect("client.py printed JSON")
    }
}

/// (Here, not in `support`, because the MCP bench includes this file alone.)
/// The test virtualenv's python (`~/.cache/gabp-relay/venv`, made by `scripts/setup --test`)
/// with `imports` importable (a Python `import` list, e.g. `"duckdb, polars"`): creates the
/// venv and installs `requirements` from PyPI when they are not (one install at a time).
pub fn venv_python(imports: &str, requirements: &[&str]) -> std::path::PathBuf {
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let home = std::env::var_os("HOME").expect("HOME is set");
    let venv = std::path::Path::new(&home).join(".cache/gabp-relay/venv");
    let py = venv.join("bin/python");
    let ready = |py: &std::path::Path| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {imports}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&py) {
        return py;
    }
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if !py.exists() {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 runs");
        assert!(made.success(), "python3 -m venv failed");
    }
    let ok = std::process::Command::new(&py)
        .args(["-m", "pip", "install", "-q"])
        .args(requirements)
        .status()
        .expect("pip runs");
    assert!(ok.success(), "pip install {requirements:?} failed");
    assert!(
        ready(&py),
        "{imports} still not importable after pip install"
    );
    py
}
