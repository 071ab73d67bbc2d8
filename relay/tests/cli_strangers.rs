//! What a stranger's review of the command line found (issue 18), each held through the real
//! binary: usage mistakes exit 2 in one line that names what is wrong, `-o -` is stdout,
//! two routes on one address are a config error, and a stale discovery file is one line.

mod support;

use support::*;

/// Runs `gabp-relay ARGS` in `cwd`.
async fn output_in(cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(60),
        relay().current_dir(cwd).args(args).output(),
    )
    .await
    .expect("command finished")
    .expect("ran")
}

/// Asserts a usage error: exit 2 and one line on stderr, which is returned.
fn usage_error(out: &std::process::Output, what: &str) -> String {
    assert_eq!(
        out.status.code(),
        Some(2),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    one_line(out)
}

#[tokio::test]
async fn selection_mistakes_exit_2_and_dash_is_stdout() {
    let dir = record_a_session().await;
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    let cwd = tempfile::tempdir().expect("cwd");
    let run = |args: Vec<&str>| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["--data-dir".to_string(), d.to_string()]);
        let cwd = cwd.path().to_path_buf();
        async move {
            let v: Vec<&str> = all.iter().map(String::as_str).collect();
            output_in(&cwd, &v).await
        }
    };
    for cmd in ["stats", "export"] {
        let err = usage_error(&run(vec![cmd, "latest", "--all"]).await, cmd);
        assert!(err.contains("not both"), "{err}");
        let err = usage_error(&run(vec![cmd, ""]).await, cmd);
        assert!(err.contains("must not be empty"), "{err}");
    }
    for label in ["--from-mark", "--to-mark"] {
        let err = usage_error(&run(vec!["export", "latest", label, ""]).await, label);
        assert!(err.contains("must not be empty"), "{err}");
    }
    for key in ["", "bad key", "a=b"] {
        let out = run(vec!["sessions", "tag", "latest", "--remove", key]).await;
        let err = usage_error(&out, key);
        assert!(err.contains("tag key"), "{err}");
    }
    // A missing argument names itself on the one line.
    let err = usage_error(&run(vec!["sessions", "tag"]).await, "no session");
    assert!(err.contains("<SESSION>"), "{err}");
    let err = usage_error(
        &run(vec!["export", "latest", "-o", "-", "--json"]).await,
        "--json to stdout",
    );
    assert!(err.contains("--json"), "{err}");

    // `-o -` is standard output, for export and report alike; no file named "-" appears.
    let out = run(vec!["export", "latest", "-o", "-"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.lines().count() > 20, "{text}");
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("a JSON line");
    }
    let out = run(vec!["report", "latest", "-o", "-"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let page = String::from_utf8(out.stdout).expect("utf-8");
    assert!(page.contains("<svg") && page.trim_end().ends_with("</html>"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("to stdout"), "{err}");
    assert!(!cwd.path().join("-").exists(), "a file named - was written");
}

#[tokio::test]
async fn two_routes_on_one_address_are_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_addr().port();
    let route = |name: &str| {
        format!("[[route]]\nname = \"{name}\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:{port}\"\nrecord = false\n")
    };
    let cfg = config_file(
        dir.path(),
        "relay.toml",
        &format!("{}\n{}", route("a"), route("b")),
    );
    let out = output(&["serve", "--config", &cfg, "--no-bridge-file"]).await;
    let err = usage_error(&out, "same listen");
    assert!(err.contains("route \"b\", field listen"), "{err}");
    assert!(err.contains("route \"a\"'s listen address"), "{err}");
}

#[tokio::test]
async fn a_stale_discovery_file_is_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A pid that is certainly gone: a child that has been reaped.
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let pid = gone.id();
    gone.wait().expect("reaped");
    let file = dir.path().join("bridge-a.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "transport": {"address": "127.0.0.1:1"},
            "token": BRIDGE_TOKEN,
            "metadata": {"route": "a", "pid": pid},
        })
        .to_string(),
    )
    .expect("write");
    let out = output(&["status", "--bridge-file", file.to_str().expect("utf-8")]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = one_line(&out);
    assert!(
        err.contains("no running relay found") && err.contains(&format!("pid {pid}")),
        "{err}"
    );
    assert!(!err.contains(BRIDGE_TOKEN), "{err}");
}
