//! The Python client package (`python/`) as a lab would use it: built and installed with pip
//! from a copy of the clone's `python/` (offline: `--no-index --no-build-isolation`, with the
//! setuptools of the venv at ~/.cache/gabp-relay/venv), its unit tests run against the installed
//! copy, then `python/tests/live_relay.py` drives a real `serve` in front of the simulated mod
//! and reads the session back through `export`. Both run with `python -S`: the standard
//! library and the package only, so a dependency that crept in fails here.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::identities::{config_text, serve_config};
use crate::support::{config_file, ModSim, ModSimConfig, BIN, MOD_TOKEN};

/// The clone this runs in (not the one that compiled this binary).
fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from)
        .parent()
        .expect("the relay crate sits in the workspace")
        .join("python")
}

/// The test venv's python, with a setuptools that builds wheels by itself (70.1 or later; the
/// one a fresh venv gets may be older), as `scripts/setup --test` installs it.
fn python() -> PathBuf {
    crate::support::mcp::venv_python("setuptools.command.bdist_wheel", &["setuptools>=70.1"])
}

/// Copies the package's sources (not what an in-tree build left) from `from` into `to`.
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read python/") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "build" || name == "__pycache__" || name.ends_with(".egg-info") {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&*name));
        } else {
            std::fs::copy(&path, to.join(&*name)).expect("copy");
        }
    }
}

/// Runs `cmd` to completion (bounded), asserting success; returns its stdout.
async fn run(what: &str, cmd: &mut tokio::process::Command) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        cmd.stdin(Stdio::null()).kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} did not finish within 180 s"))
    .unwrap_or_else(|e| panic!("{what} did not run: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_installs_and_drives_a_live_relay() {
    let py = python();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("python");
    let site = dir.path().join("site");
    copy_sources(&package_dir(), &src);
    run(
        "pip install",
        tokio::process::Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-build-isolation",
            ])
            .args(["--no-deps", "--target"])
            .arg(&site)
            .arg(&src),
    )
    .await;
    assert!(
        site.join("gabp_relay/py.typed").exists(),
        "the installed package is marked typed"
    );
    // The standard library and the installed package only (`-S`: no site-packages).
    let python = |args: &[&str]| {
        let mut c = tokio::process::Command::new(&py);
        c.arg("-S")
            .args(args)
            .env("PYTHONPATH", &site)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("GABP_RELAY_TOKEN")
            .env_remove("XDG_CONFIG_HOME");
        c
    };
    let tests = src.join("tests");
    let tests = tests.to_str().expect("utf-8");
    run(
        "the package's unit tests",
        &mut python(&["-m", "unittest", "discover", "-s", tests]),
    )
    .await;

    let md = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: Some(600.0),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &config_text(md.addr(), "leased = [\"sim/echo\"]", ""),
    );
    let data = dir.path().join("data");
    let bridge_file = dir.path().join("bridge.json");
    let relay = serve_config(
        &cfg,
        bridge_file.to_str().expect("utf-8"),
        &["--data-dir", data.to_str().expect("utf-8")],
    )
    .await;
    let script = src.join("tests/live_relay.py");
    let out = run(
        "live_relay.py",
        &mut python(&[
            script.to_str().expect("utf-8"),
            "--bridge-file",
            bridge_file.to_str().expect("utf-8"),
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--relay",
            BIN,
        ]),
    )
    .await;
    let summary: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("live_relay.py printed no summary ({e}):\n{out}"));
    eprintln!("live_relay.py: {summary}");
    assert_eq!(summary["markRows"], 2, "{summary}");
    assert!(
        summary["exportRows"].as_u64().is_some_and(|n| n > 1000),
        "{summary}"
    );
    drop(relay);
}
