//! The data dir's safety around storage faults, with the real binary on real files: read
//! commands never create a data dir, the data dir and its files are private, unsafe data dirs
//! are refused, `sessions rm` names the recording relay, `repair` copies before it touches
//! anything and says when data was lost, and `export -o` never damages its target.

use crate::support::storage::*;

#[tokio::test]
async fn read_commands_never_create_a_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("nothing-here");
    let d = data.to_str().expect("utf8");
    for args in [
        vec!["sessions", "--data-dir", d],
        vec!["sessions", "check", "--data-dir", d],
        vec!["sessions", "rm", "latest", "--data-dir", d],
        vec!["stats", "latest", "--data-dir", d],
        vec!["export", "latest", "--data-dir", d],
        vec![
            "replay",
            "latest",
            "--data-dir",
            d,
            "--listen",
            "127.0.0.1:0",
        ],
        vec!["repair", "--data-dir", d],
    ] {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(error_line(&out), format!("gabp-relay: no data dir at {d}"));
        assert!(!data.exists(), "{args:?} created the data dir");
    }
}

#[tokio::test]
async fn sessions_rm_while_recording_names_the_relay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "mod-token-for-tests".into(),
            max_events: Some(100),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = serve(&sim.addr().to_string(), &data, &[]).await;
    wait_for_events(&data, 100).await;
    let out = run(&[
        "sessions",
        "rm",
        "latest",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let line = error_line(&out);
    let pid = child.id().expect("running");
    assert!(
        line.contains("in use") && line.contains(&format!("pid {pid}")),
        "{line}"
    );
    signal(&child, "-TERM");
    assert_eq!(wait_exit(&mut child).await, Some(0));
    sim.stop();
}

#[tokio::test]
async fn data_dir_and_files_are_private_and_unsafe_dirs_are_refused() {
    let (dir, data) = recorded(Left::Killed).await;
    assert_eq!(mode(&data), 0o700);
    for e in std::fs::read_dir(&data).expect("dir") {
        let p = e.expect("entry").path();
        assert_eq!(mode(&p), 0o600, "{} is {:o}", p.display(), mode(&p));
    }
    let try_serve = |d: PathBuf, extra: Vec<&'static str>| async move {
        tokio::time::timeout(
            Duration::from_secs(30),
            relay()
                .args([
                    "serve",
                    "--upstream",
                    "127.0.0.1:1",
                    "--listen",
                    "127.0.0.1:0",
                    "--token",
                    "bridge-token-for-tests",
                    "--no-bridge-file",
                ])
                .args(extra)
                .arg("--data-dir")
                .arg(d)
                .output(),
        )
        .await
        .expect("in time")
        .expect("ran")
    };
    // Writable by others.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = try_serve(data.clone(), vec![]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&out).contains("writable by group or others"));
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // A symlink, unless allowed.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).expect("symlink");
    let out = try_serve(link.clone(), vec![]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&out).contains("symlink"));
    let mut s = serve("127.0.0.1:1", &link, &["--allow-symlinked-data-dir"]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
    // Owned by someone else (only checkable as root, which may chown).
    let other = dir.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    if std::os::unix::fs::chown(&other, Some(65534), Some(65534)).is_ok() {
        let out = try_serve(other.clone(), vec![]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(error_line(&out).contains("owned by uid 65534"));
    } else {
        eprintln!("SKIPPED: cannot chown (not root): foreign owner not checked");
    }
}

#[tokio::test]
async fn export_to_a_file_is_atomic_private_and_does_not_follow_symlinks() {
    let (dir, data) = recorded(Left::Killed).await;
    let d = data.to_str().expect("utf8");
    let target = dir.path().join("out.jsonl");
    std::fs::write(&target, b"keep me").expect("write");
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        d,
        "--channel",
        "no/such",
        "-o",
        target.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&target).expect("read"), b"keep me");
    // A symlink at FILE is replaced, never written through.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").expect("write");
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        d,
        "-o",
        link.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&victim).expect("read"), b"precious");
    assert!(!std::fs::symlink_metadata(&link)
        .expect("meta")
        .file_type()
        .is_symlink());
    assert_eq!(mode(&link), 0o600);
    let lines = std::fs::read_to_string(&link)
        .expect("read")
        .lines()
        .count() as u64;
    assert!(lines >= EVENTS, "{lines} lines");
    let leftovers = files_with(dir.path(), |n| n.starts_with(".gabp-"));
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // What a Parquet directory export killed mid-write leaves (its work dir, named after its
    // process) is removed by the next export beside it; a live process's is not.
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("reaped");
    let killed = dir.path().join(format!(".gabp-export-{dead}-AbC123"));
    std::fs::create_dir_all(killed.join("route=x")).expect("mkdir");
    std::fs::write(killed.join("route=x").join("part.parquet"), b"half").expect("write");
    // The mark every work dir of the relay's carries (a look-alike without it is kept), and
    // its mode (one open to others is not the relay's and is kept too).
    std::fs::write(killed.join(".gabp-work-dir"), b"").expect("mark");
    std::fs::set_permissions(&killed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let lookalike = dir.path().join(format!(".gabp-export-{dead}-Qwerty"));
    std::fs::create_dir(&lookalike).expect("mkdir");
    let live = dir
        .path()
        .join(format!(".gabp-export-{}-XyZ789", std::process::id()));
    std::fs::create_dir(&live).expect("mkdir");
    let pq = dir.path().join("pq");
    let export_dir = |force: bool| {
        let mut args = vec!["export", "--all", "--format", "parquet", "--data-dir", d];
        if force {
            args.push("--force");
        }
        args.extend(["-o", pq.to_str().expect("utf8")]);
        async move {
            let out = run(&args).await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    export_dir(false).await;
    assert!(!killed.exists(), "a killed export's work dir was left");
    assert!(live.exists(), "a live process's work dir was removed");
    assert!(lookalike.exists(), "an unmarked look-alike was removed");
    assert!(
        !pq.join(".gabp-work-dir").exists(),
        "the placed export kept the work mark"
    );
    // As private as a single file's export: dirs 0700, files 0600, whatever the umask.
    all_private(&pq);
    // Replacing it (`--force`) leaves only the new export beside it.
    export_dir(true).await;
    let work = files_with(dir.path(), |n| {
        n.starts_with(".gabp-export-") && !n.ends_with("-Qwerty") && !n.ends_with("-XyZ789")
    });
    assert!(work.is_empty(), "{work:?}");
    assert!(!pq.join(".gabp-work-dir").exists());
    all_private(&pq);
}

/// A relay killed before any flush (everything in the write-ahead log) with its MANIFEST
/// destroyed: RocksDB's own repair knows only the default column family and sets the log
/// aside, so `repair` must not call that a success. It exits 1 with one line naming what was
/// lost and the untouched copy, never advises running itself, and leaves the dir private.
#[tokio::test]
async fn repair_that_loses_data_says_so_and_keeps_the_dir_private() {
    let (_dir, data) = recorded(Left::Killed).await;
    assert!(files_with(&data, |n| n.ends_with(".sst")).is_empty());
    let manifest = files_with(&data, |n| n.starts_with("MANIFEST-"));
    let noise: Vec<u8> = (0..100u32).map(|i| (i * 97 + 13) as u8).collect();
    std::fs::write(&manifest[0], noise).expect("overwrite manifest");
    let out = run(&["repair", "--data-dir", data.to_str().expect("utf8")]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let line = error_line(&out);
    assert!(
        line.contains("could not recover") && line.contains(".bak-"),
        "{line}"
    );
    assert!(!said.contains("repaired"), "{said}");
    assert!(!said.contains("gabp-relay repair"), "{said}");
    let backup = line.split("copy is at ").nth(1).expect("names the copy");
    assert!(Path::new(backup.trim()).is_dir(), "{backup}");
    // Whatever repair created is as private as the relay keeps its data dir.
    all_private(&data);
}

/// `sessions tag` and `sessions rm` open the dir read-write, and RocksDB writes new logs,
/// tables and manifests then: with the usual umask 022 they must still be private.
#[tokio::test]
async fn sessions_tag_and_rm_keep_the_dir_private() {
    let (_dir, data) = recorded(Left::Flushed).await;
    let d = data.to_str().expect("utf8");
    for args in [
        &["sessions", "tag", "latest", "k=v", "--data-dir", d][..],
        &["sessions", "rm", "latest", "--data-dir", d][..],
    ] {
        let out = run(args).await;
        assert!(out.status.success(), "{args:?}: {}", error_line(&out));
        all_private(&data);
    }
}

/// Files left readable by others (an older relay, a manual copy, a repair run without the
/// private umask) are made private when a relay opens the dir to record.
#[tokio::test]
async fn serve_makes_files_it_finds_readable_by_others_private() {
    let (_dir, data) = recorded(Left::Flushed).await;
    let lost = data.join("lost");
    std::fs::create_dir(&lost).expect("mkdir lost");
    std::fs::write(lost.join("000001.log"), b"set aside").expect("write");
    let open = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
    };
    open(&data, 0o755);
    open(&lost, 0o755);
    for e in std::fs::read_dir(&data).expect("dir") {
        let p = e.expect("entry").path();
        if p.is_file() {
            open(&p, 0o644);
        }
    }
    open(&lost.join("000001.log"), 0o644);
    let mut s = serve("127.0.0.1:1", &data, &[]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
    all_private(&data);
}

/// Every dir under `p` (itself included) is 0700 and every file 0600.
fn all_private(p: &Path) {
    if p.is_dir() {
        assert_eq!(mode(p), 0o700, "{}", p.display());
        for e in std::fs::read_dir(p).expect("read dir") {
            all_private(&e.expect("entry").path());
        }
    } else {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
}

/// A data dir another user cannot read is said to be a permissions problem, naming the dir,
/// never damage for `repair`: a dir it cannot list, and a dir whose files it cannot read.
/// Runs the commands as `nobody` (root reads everything); skipped when not root.
#[tokio::test]
async fn an_unreadable_data_dir_is_a_permissions_problem_not_damage() {
    if !std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
    {
        eprintln!("SKIPPED: not root: cannot run as another user");
        return;
    }
    let (dir, data) = recorded(Left::Flushed).await;
    // The binary where `nobody` can run it (the build's own dir may be private).
    let bin_dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let bin = bin_dir.path().join("gabp-relay");
    std::fs::copy(BIN, &bin).expect("copy the binary");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let as_nobody = |args: Vec<String>| {
        let bin = bin.clone();
        async move {
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&bin)
                .args(&args)
                .env("HOME", "/")
                .output()
                .await
                .expect("setpriv runs")
        }
    };
    let d = data.to_str().expect("utf8").to_string();
    let files: Vec<PathBuf> = std::fs::read_dir(&data)
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .collect();
    // (dir mode, its files' mode, the parent's mode, what the line says this user cannot do)
    for (mode_dir, mode_files, mode_parent, what) in [
        (0o700, 0o600, 0o755, "cannot list and search it"),
        // Listable but not searchable: its files cannot even be looked at.
        (0o744, 0o644, 0o755, "cannot list and search it"),
        (0o755, 0o600, 0o755, "cannot read its files"),
        (0o755, 0o644, 0o700, "cannot reach it"),
    ] {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode_parent))
            .expect("chmod");
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(mode_dir)).expect("chmod");
        for f in &files {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(mode_files))
                .expect("chmod");
        }
        for args in [
            vec!["sessions", "--data-dir", &d],
            vec!["sessions", "check", "--data-dir", &d],
            vec!["stats", "latest", "--data-dir", &d],
            vec!["export", "latest", "--data-dir", &d, "-o", "-"],
            vec!["repair", "--data-dir", &d],
            vec!["sessions", "rm", "latest", "--data-dir", &d],
            vec!["sessions", "tag", "latest", "a=b", "--data-dir", &d],
        ] {
            let out = as_nobody(args.iter().map(|s| s.to_string()).collect()).await;
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let line = error_line(&out);
            // `repair`, `rm` and `tag` need to write too, and say so.
            let what = if args[0] == "repair" || args[1] == "rm" || args[1] == "tag" {
                "this user cannot"
            } else {
                what
            };
            assert!(
                line.contains(&d) && line.contains("permission denied") && line.contains(what),
                "{args:?} (dir {mode_dir:o}, parent {mode_parent:o}): {line}"
            );
            assert!(!line.contains("run `gabp-relay repair"), "{args:?}: {line}");
        }
    }
}
