//! Long commands show their progress on a terminal's stderr and nowhere else: driven under a
//! pseudo-terminal (`script`), a command's stdout redirected to a file stays exactly what it
//! prints when piped, while the terminal sees the bar; piped, with `--json` or `--quiet`, no
//! bar is drawn at all.

use crate::support::*;

/// Runs `gabp-relay ARGS > OUT` inside `script`, so stderr is a pseudo-terminal and stdout a
/// file: what the terminal showed, and what stdout got.
pub(crate) async fn under_a_terminal(args: &[&str], dir: &std::path::Path) -> (String, String) {
    let out = dir.join("stdout.txt");
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let line = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ");
    let cmd = format!("{line} > {}", quote(out.to_str().expect("utf-8")));
    let run = tokio::process::Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env("COLUMNS", "120")
        .stdin(std::process::Stdio::null())
        .output();
    let r = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("finished")
        .expect("script(1) runs");
    assert!(
        r.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&r.stdout)
    );
    let stdout = std::fs::read_to_string(&out).expect("stdout file");
    (String::from_utf8_lossy(&r.stdout).into_owned(), stdout)
}

/// A data dir with a session big enough that reading it takes a few frames of the bar.
async fn a_large_session() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let demo = output(&[
        "demo",
        "--duration",
        "3s",
        "--rate",
        "200000",
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    assert!(
        demo.status.success(),
        "{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    (dir, data)
}

#[tokio::test(flavor = "multi_thread")]
async fn long_commands_show_progress_on_a_terminal_and_keep_stdout_clean() {
    let (dir, data) = a_large_session().await;
    let d = data.to_str().expect("utf-8");
    let page = dir.path().join("report.html");
    let page = page.to_str().expect("utf-8");
    let parquet = dir.path().join("export.parquet");
    let parquet = parquet.to_str().expect("utf-8");
    // Each command, and the flags that turn its bar off (`--json` where it has one).
    for (args, off) in [
        (
            &["stats", "latest", "--data-dir", d][..],
            &["--quiet", "--json"][..],
        ),
        (
            &["sessions", "check", "--data-dir", d],
            &["--quiet", "--json"],
        ),
        (&["export", "latest", "--data-dir", d], &["--quiet"]),
        (
            &[
                "export",
                "latest",
                "--data-dir",
                d,
                "--format",
                "parquet",
                "-o",
                parquet,
            ],
            &["--quiet", "--json"],
        ),
        (
            &["episodes", "--all", "--data-dir", d],
            &["--quiet", "--json"],
        ),
        (
            &["report", "latest", "--data-dir", d, "-o", page],
            &["--quiet"],
        ),
        (
            &["report", "--all", "--data-dir", d, "-o", page],
            &["--quiet"],
        ),
    ] {
        let (terminal, stdout) = under_a_terminal(args, dir.path()).await;
        assert!(
            terminal.contains(" frames") && terminal.contains("left"),
            "{args:?}: no progress on the terminal: {terminal:?}"
        );
        let piped = output(args).await;
        assert!(piped.status.success());
        assert_eq!(
            stdout,
            String::from_utf8_lossy(&piped.stdout),
            "{args:?}: stdout under a terminal differs from stdout piped"
        );
        assert!(
            !String::from_utf8_lossy(&piped.stderr).contains("left"),
            "{args:?}: progress drawn on a pipe"
        );
        for &quiet in off {
            let mut with: Vec<&str> = args.to_vec();
            with.push(quiet);
            let (terminal, _) = under_a_terminal(&with, dir.path()).await;
            assert!(
                !terminal.contains("left"),
                "{with:?}: progress drawn: {terminal:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sessions_table_fits_a_long_route_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    let sim = start_mod(Some(1000.0));
    for route in ["lab-rooftop-camera-7", "a"] {
        let s = serve_recording(sim.addr(), &data, &["--route-name", route]).await;
        // Welcomed: the mod's session has started, so it is recorded.
        let (c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
            .await
            .expect("hello");
        drop(c);
        s.stop_cleanly().await;
    }
    sim.stop();
    let out = output(&["sessions", "--data-dir", d]).await;
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text}");
    // Each column starts where its header does.
    for header in ["ROUTE", "FRAMES", "END", "TAGS"] {
        let at = lines[0].find(header).expect("header");
        let end_of_prev = lines[1][..at].trim_end().len();
        assert!(end_of_prev < at, "{header} column out of line:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn repair_shows_the_copy_and_the_check() {
    let (dir, data) = a_large_session().await;
    let d = data.to_str().expect("utf-8");
    let (terminal, stdout) = under_a_terminal(&["repair", "--data-dir", d], dir.path()).await;
    assert!(
        terminal.contains("checking") && terminal.contains(" frames") && terminal.contains("left"),
        "no progress on the terminal: {terminal:?}"
    );
    assert!(stdout.contains("repaired "), "{stdout}");
    assert!(
        !stdout.contains("checking") && !stdout.contains('\r'),
        "progress on stdout: {stdout}"
    );
    let (terminal, _) = under_a_terminal(&["repair", "--data-dir", d, "--quiet"], dir.path()).await;
    assert!(!terminal.contains("checking"), "--quiet drew: {terminal:?}");
}
