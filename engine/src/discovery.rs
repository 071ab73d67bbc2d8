//! The bridge discovery file: how a bridge finds a route (token, transport, address, metadata),
//! in the shape of the GABP transport spec's `bridge.json`. Written atomically (temp file +
//! rename) with mode 0600 because it holds the token, and removed on exit. The file names the
//! relay's pid: a file left by a relay that is gone is replaced, a running relay's never is.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gabp_rt::Addr;
use serde_json::json;

use crate::config::RouteConfig;
use crate::server::Relay;

/// The default location: `$XDG_CONFIG_HOME/gabp-relay/bridge-{route}.json`, or under
/// `~/.config` when `XDG_CONFIG_HOME` is unset. A `/` or `%` in the route name is written
/// `%2F` or `%25`, so every route's file is one file in that directory.
pub fn default_path(route: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("gabp-relay").join(file_name(route)))
}

/// `bridge-{route}.json`, the route name escaped to stay one path component.
fn file_name(route: &str) -> String {
    let name = route.replace('%', "%25").replace('/', "%2F");
    format!("bridge-{name}.json")
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
            "startedAtNs": gabp_rt::clock::now_ns(),
            "launchId": launch_id,
            "relay": format!("gabp-relay/{}", crate::route::VERSION),
        }
    })
}

/// Who holds an existing discovery file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No file (or not one a relay wrote): free to write.
    Free,
    /// Written by a relay that is gone (killed with SIGKILL, say): replace it.
    Stale(u32),
    /// Written by a relay that is still running: leave it alone.
    Live(u32),
}

/// The pid recorded in the discovery file at `path`, if it is a relay's discovery file.
pub fn recorded_pid(path: &Path) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    u32::try_from(v["metadata"]["pid"].as_u64()?).ok()
}

/// Whether a relay process `pid` is running: the pid exists, and where /proc tells, its
/// program is gabp-relay (so a reused pid does not keep a stale file alive forever).
pub fn relay_running(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    // Signal 0 only checks that the process exists (EPERM: it does, owned by someone else).
    let exists = matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None),
        Ok(()) | Err(nix::errno::Errno::EPERM)
    );
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) if comm.trim_end().starts_with("gabp-relay") => true,
        // Renamed or linked binaries: the same executable as this one.
        Ok(_) => std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .is_some_and(|exe| std::env::current_exe().is_ok_and(|me| me == exe)),
        Err(_) => true,
    }
}

/// Who holds the discovery file at `path`.
pub fn holder(path: &Path) -> Holder {
    match recorded_pid(path) {
        Some(pid) if pid == std::process::id() => Holder::Free,
        Some(pid) if relay_running(pid) => Holder::Live(pid),
        Some(pid) => Holder::Stale(pid),
        None => Holder::Free,
    }
}

/// Removes the discovery file at `path` if this process wrote it (never another relay's).
pub fn remove_own(path: &Path) {
    if recorded_pid(path) == Some(std::process::id()) {
        let _ = std::fs::remove_file(path);
    }
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

/// Where each route's discovery file goes, as (route index, path): `configured` (the flag or
/// the config's `bridge_file`, `{route}` replaced, or `-{route}` added when several routes
/// share it), else [`default_path`].
pub fn paths(routes: &[RouteConfig], configured: Option<&PathBuf>) -> Vec<(usize, PathBuf)> {
    let mut paths = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let path = match configured {
            Some(p) if routes.len() > 1 && !p.to_string_lossy().contains("{route}") => {
                let p = p.to_string_lossy();
                PathBuf::from(p.replace(".json", &format!("-{}.json", r.name)))
            }
            Some(p) => PathBuf::from(p.to_string_lossy().replace("{route}", &r.name)),
            None => match default_path(&r.name) {
                Some(p) => p,
                None => continue,
            },
        };
        paths.push((i, path));
    }
    paths
}

/// Refuses to start where a running relay owns a route's discovery file (it must be neither
/// overwritten nor, at this relay's exit, deleted); a file left by a dead relay is replaced.
pub fn check_free(routes: &[RouteConfig], paths: &[(usize, PathBuf)]) -> Result<(), String> {
    for (i, path) in paths {
        match holder(path) {
            Holder::Live(pid) => return Err(format!(
                "route {}: a running relay (pid {pid}) owns the discovery file {}; stop it, or give this relay another --route-name, --bridge-file or --no-bridge-file",
                routes[*i].name,
                path.display()
            )),
            Holder::Stale(pid) => tracing::info!(
                path = %path.display(),
                pid,
                "replacing a discovery file left by a relay that is no longer running"
            ),
            Holder::Free => {}
        }
    }
    Ok(())
}

/// Writes each route's discovery file; returns the paths written (removed again at exit).
pub fn write_all(relay: &Relay, paths: &[(usize, PathBuf)]) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for (i, path) in paths {
        let r = &relay.routes[*i];
        let body = contents(&r.cfg.name, &relay.addrs[*i], &r.cfg.token, &r.launch_id);
        match write(path, &body) {
            Ok(()) => written.push(path.clone()),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the bridge discovery file")
            }
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_route_name_is_one_file_name() {
        assert_eq!(file_name("default"), "bridge-default.json");
        assert_eq!(file_name("../lab/a"), "bridge-..%2Flab%2Fa.json");
        assert_eq!(file_name("50%/b"), "bridge-50%25%2Fb.json");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    }

    #[test]
    fn holder_tells_own_dead_and_foreign_pids_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bridge.json");
        assert_eq!(holder(&path), Holder::Free, "no file");
        let with_pid = |pid: u32| {
            std::fs::write(&path, json!({"metadata": {"pid": pid}}).to_string()).expect("write")
        };
        with_pid(std::process::id());
        assert_eq!(holder(&path), Holder::Free, "this process's own file");
        let mut gone = std::process::Command::new("true").spawn().expect("spawn");
        let gone_pid = gone.id();
        gone.wait().expect("reaped");
        with_pid(gone_pid);
        assert_eq!(holder(&path), Holder::Stale(gone_pid));
        // pid 1 runs, but is not a relay: a reused pid does not pin a stale file.
        with_pid(1);
        assert_eq!(holder(&path), Holder::Stale(1));
        std::fs::write(&path, "not json").expect("write");
        assert_eq!(holder(&path), Holder::Free);
        remove_own(&path);
        assert!(path.exists(), "not this process's file: kept");
    }

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
