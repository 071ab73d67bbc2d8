//! The bridge discovery file: how a bridge finds a route (token, transport, address, metadata),
//! in the shape of the GABP transport spec's `bridge.json`. Written atomically (temp file +
//! rename) with mode 0600 because it holds the token, and removed on clean exit.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gabp_sim::Addr;
use serde_json::json;

/// The default location: `$XDG_CONFIG_HOME/gabp-relay/bridge-{route}.json`, or under
/// `~/.config` when `XDG_CONFIG_HOME` is unset.
pub fn default_path(route: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("gabp-relay").join(format!("bridge-{route}.json")))
}

/// The file's contents for a route.
pub fn contents(route: &str, addr: &Addr, token: &str, launch_id: &str) -> serde_json::Value {
    let transport = match addr {
        Addr::Tcp(a) => {
            json!({"type": "tcp", "host": a.ip().to_string(), "port": a.port(), "address": a.to_string()})
        }
        Addr::Unix(p) => {
            json!({"type": "unix", "path": p.display().to_string(), "address": addr.to_string()})
        }
    };
    json!({
        "token": token,
        "transport": transport,
        "metadata": {
            "route": route,
            "pid": std::process::id(),
            "startedAtNs": gabp_sim::clock::now_ns(),
            "launchId": launch_id,
            "relay": format!("gabp-relay/{}", crate::route::VERSION),
        }
    })
}

/// Writes `value` to `path` atomically with mode 0600 (parent directories created 0700).
pub fn write(path: &Path, value: &serde_json::Value) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(
            serde_json::to_string_pretty(value)
                .expect("serializable")
                .as_bytes(),
        )?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn written_atomically_with_mode_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/bridge.json");
        let v = contents(
            "r",
            &"127.0.0.1:7000".parse().expect("addr"),
            "tok",
            "launch",
        );
        write(&path, &v).expect("write");
        assert_eq!(
            std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(back["transport"]["port"], 7000);
        assert_eq!(back["token"], "tok");
        write(&path, &v).expect("overwrite is atomic too");
        assert_eq!(
            std::fs::read_dir(path.parent().expect("dir"))
                .expect("ls")
                .count(),
            1,
            "no temp files left"
        );
    }
}
