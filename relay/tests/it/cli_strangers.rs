//! What a stranger's review of the command line found, each held through the real
//! binary: usage mistakes exit 2 in one line that names what is wrong, `-o -` is stdout,
//! two routes on one address are a config error, a stale discovery file is one line, and no
//! export or report may write into, over or around the data dir it reads.

use crate::support::*;

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

/// `export -o` (even with `--force`) and `report -o` at the data dir, inside it, or at a
/// directory holding it: exit 2, one line, and every recording still there.
#[tokio::test]
async fn an_output_at_in_or_around_the_data_dir_is_refused() {
    let dir = record_a_session().await;
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    let sessions =
        |out: &std::process::Output| json(out)["sessions"].as_array().expect("sessions").len();
    let before = sessions(&output(&["sessions", "--json", "--data-dir", d]).await);
    assert_eq!(before, 1);
    std::fs::write(dir.path().join("notes.txt"), "keep me").expect("a file beside");
    let inside = data.join("CURRENT");
    let parent = dir.path().to_str().expect("utf-8");
    let targets = [d, inside.to_str().expect("utf-8"), parent, "data"];
    for o in targets {
        for args in [
            vec!["export", "--all", "--format", "parquet", "--force", "-o", o],
            vec!["export", "latest", "-o", o],
            vec!["export", "latest", "--format", "parquet", "-o", o],
            vec!["report", "latest", "-o", o],
        ] {
            let mut all = args.clone();
            all.extend(["--data-dir", d]);
            let out = output_in(dir.path(), &all).await;
            let err = usage_error(&out, &format!("{args:?}"));
            assert!(err.contains("data dir"), "{err}");
        }
    }
    let after = sessions(&output(&["sessions", "--json", "--data-dir", d]).await);
    assert_eq!(after, before, "the recordings are all there");
    let check = output(&["sessions", "check", "--data-dir", d]).await;
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).expect("still there"),
        "keep me"
    );
    // Beside the data dir is fine.
    let beside = dir.path().join("out.parquet");
    let out = output(&[
        "export",
        "latest",
        "--format",
        "parquet",
        "-o",
        beside.to_str().expect("utf-8"),
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Shipping's usage mistakes exit 2 before anything connects:
/// an out-of-range port, names NATS refuses, NATS settings without `--ship`; and `--help`
/// shows each default once.
#[tokio::test]
async fn shipping_mistakes_exit_2_and_defaults_show_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf8");
    let serve = [
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--no-bridge-file",
        "--data-dir",
        d,
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:99999",
                "--data-dir",
                d,
            ],
            "99999",
        ),
        (
            vec!["ship", "--all", "--to", "nats://:4222", "--data-dir", d],
            "nats://",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222",
                "--stream",
                "a.b",
                "--data-dir",
                d,
            ],
            "--stream",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "a.*",
                "--data-dir",
                d,
            ],
            "--subject-prefix",
        ),
        (
            vec![
                "collect",
                "--from",
                "nats://127.0.0.1:4222",
                "--durable",
                "a.b",
                "--data-dir",
                d,
            ],
            "--durable",
        ),
        (
            [&serve[..], &["--nats-token", "abcdefabcdefabcdef"]].concat(),
            "--ship",
        ),
        ([&serve[..], &["--stream", "OTHER"]].concat(), "--ship"),
        ([&serve[..], &["--retain-unshipped"]].concat(), "--ship"),
        (
            [
                &serve[..],
                &["--ship", "nats://127.0.0.1:4222", "--no-record"],
            ]
            .concat(),
            "recording is off",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "$JS",
                "--data-dir",
                d,
            ],
            "belong to the NATS server",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "_INBOX",
                "--data-dir",
                d,
            ],
            "belong to the NATS server",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222,",
                "--data-dir",
                d,
            ],
            "empty address",
        ),
        (
            vec![
                "ship",
                "--all",
                "--to",
                "nats://127.0.0.1:4222,127.0.0.1:99999",
                "--data-dir",
                d,
            ],
            "99999",
        ),
    ];
    for (args, names) in cases {
        let out = output_in(dir.path(), &args).await;
        let line = usage_error(&out, &format!("{args:?}"));
        assert!(line.contains(names), "{args:?}: {line}");
        assert!(!line.contains("abcdefabcdef"), "no secret: {line}");
    }
    assert!(!data.exists(), "nothing was recorded");
    for cmd in ["ship", "collect", "serve"] {
        let out = output_in(dir.path(), &[cmd, "--help"]).await;
        let help = String::from_utf8_lossy(&out.stdout);
        for line in help.lines() {
            assert!(line.matches("[default:").count() <= 1, "{cmd}: {line}");
        }
    }
}

/// A replay cut that leaves nothing to play (a channel the session does not have, a start
/// past its end) fails in one line naming what it has, instead of serving an empty replay;
/// an existing directory (or a link to one) given as one file's `-o`, or a link to a directory
/// as a directory export's, is a usage error before anything is read.
#[tokio::test]
async fn empty_replay_cuts_and_a_directory_for_one_file_are_one_line() {
    let dir = record_a_session().await;
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf8");
    let replay = [
        "replay",
        "latest",
        "--data-dir",
        d,
        "--listen",
        "127.0.0.1:0",
    ];
    for (extra, says) in [
        (&["--channel", "nope"][..], "world/tick"),
        (
            &["--channel", "world/tick", "--channel", "nope"][..],
            "\"nope\"",
        ),
        (&["--from", "1h"][..], "past the end"),
    ] {
        let out = output_in(dir.path(), &[&replay[..], extra].concat()).await;
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        let line = one_line(&out);
        assert!(line.contains(says), "{extra:?}: {line}");
    }
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let o = out_dir.to_str().expect("utf8");
    for args in [
        &["export", "latest", "--data-dir", d, "-o", o][..],
        &[
            "export",
            "latest",
            "--data-dir",
            d,
            "--format",
            "parquet",
            "-o",
            o,
        ],
        &["report", "latest", "--data-dir", d, "-o", o],
    ] {
        let out = output_in(dir.path(), args).await;
        let line = usage_error(&out, &format!("{args:?}"));
        assert!(line.contains("is a directory"), "{args:?}: {line}");
    }
    // A link to that directory is neither replaced by the output nor written through.
    let link = dir.path().join("latest-out");
    std::os::unix::fs::symlink(&out_dir, &link).expect("symlink");
    let l = link.to_str().expect("utf8");
    let l_slash = format!("{l}/");
    fn parquet_to<'a>(d: &'a str, o: &'a str, force: bool) -> Vec<&'a str> {
        let mut v = vec!["export", "--all", "--data-dir", d, "--format", "parquet"];
        v.extend(force.then_some("--force"));
        v.extend(["-o", o]);
        v
    }
    for args in [
        vec!["export", "latest", "--data-dir", d, "-o", l],
        vec!["report", "latest", "--data-dir", d, "-o", l],
        parquet_to(d, l, true),
        // Written as a directory (`link/`): still the link, still refused before anything.
        parquet_to(d, &l_slash, false),
        parquet_to(d, &l_slash, true),
    ] {
        let args = &args[..];
        let out = output_in(dir.path(), args).await;
        let line = usage_error(&out, &format!("{args:?}"));
        assert!(
            line.contains("is a symbolic link to a directory"),
            "{args:?}: {line}"
        );
        assert!(std::fs::symlink_metadata(&link).expect("meta").is_symlink());
    }
    assert_eq!(
        std::fs::read_dir(&out_dir).expect("ls").count(),
        0,
        "nothing written"
    );
}
