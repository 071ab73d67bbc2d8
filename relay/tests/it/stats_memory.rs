//! Read commands in bounded memory, whatever the data dir holds:
//! - a mod with 100,000 channels: the per-commit catalog entry stays small (channel names are
//!   written once under keys of their own), and `gabp-relay stats` streams with a few hundred
//!   bytes per channel (a full histogram per channel cost ~350 KB each before: 10,000 channels
//!   took 3.45 GB);
//! - a session twice as long: `sessions check`, `stats`, `export` (JSONL and Parquet) and `report` peak at the same resident
//!   memory (check kept a map of every event before: 690 MB at 9 M frames);
//! - 10,000 sessions: `sessions` lists them from the catalog alone, quickly.
//!
//! A child's peak memory is read with wait4(2) (its ru_maxrss). Linux carries the spawning
//! process's own peak into that figure across exec, so the commands must be started by a small
//! process: each test runs in a process of its own ([`alone`]: this test binary started again
//! for that one test, not the suite's process, which runs every other test beside it), and its
//! data is written by a third (the same test, started with `GABP_TEST_FIXTURE` naming the
//! fixture and `GABP_TEST_DATA` the data dir to write it into).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gabp_storage::{
    BridgeInfo, Direction, Durability, EndReason, FrameRecord, SessionId, SessionMeta,
    SessionWriter, Store, StoreOptions,
};

use crate::support::BIN;

const CHANNELS: u32 = 100_000;
/// Frames of the shorter long session (the longer has twice as many).
const LONG: u64 = 1_000_000;

/// What one measured run of the binary gave.
struct Run {
    /// Its output, in a file: read back streaming, so this process never holds it whole (its
    /// own peak would show in the next child's figure).
    out: tempfile::NamedTempFile,
    err: tempfile::NamedTempFile,
    peak_kib: i64,
    took: Duration,
}

impl Run {
    fn reader(&self) -> std::io::BufReader<std::fs::File> {
        std::io::BufReader::new(self.out.reopen().expect("output"))
    }

    /// Lines of output, counted as read.
    fn lines(&self) -> impl Iterator<Item = String> {
        use std::io::BufRead;
        self.reader().lines().map(|l| l.expect("utf-8 output"))
    }

    /// The output as JSON, decoded straight from the file into `T`.
    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_reader(self.reader()).expect("json output")
    }
}

/// Runs `program args...`, waits for it with wait4(2) and returns its output, its peak resident
/// memory and its wall time. Fails the test on a non-zero exit.
// The child is reaped by wait4 (for its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run_measured(program: &Path, args: &[&str], env: &[(&str, &Path)]) -> Run {
    let out = tempfile::NamedTempFile::new().expect("stdout file");
    let err = tempfile::NamedTempFile::new().expect("stderr file");
    let start = Instant::now();
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.reopen().expect("stdout"))
        .stderr(err.reopen().expect("stderr"))
        .spawn()
        .expect("spawn");
    let mut status = 0;
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: wait4(2) on our own child, with valid pointers to the status and rusage it fills.
    #[allow(unsafe_code)]
    let (pid, ru) = unsafe {
        let pid = libc::wait4(child.id() as i32, &mut status, 0, ru.as_mut_ptr());
        (pid, ru.assume_init())
    };
    let took = start.elapsed();
    assert_eq!(pid, child.id() as i32, "wait4 failed for {args:?}");
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    assert!(
        ok,
        "{args:?} failed: {}",
        std::fs::read_to_string(err.path()).unwrap_or_default()
    );
    Run {
        out,
        err,
        peak_kib: ru.ru_maxrss,
        took,
    }
}

/// `gabp-relay args... --data-dir data`, measured.
fn relay(args: &[&str], data: &Path) -> Run {
    let mut all = args.to_vec();
    let d = data.to_str().expect("utf-8 path");
    all.extend(["--data-dir", d]);
    run_measured(Path::new(BIN), &all, &[])
}

/// Set in the process [`alone`] starts for one test.
const ALONE: &str = "GABP_TEST_ALONE";

/// `test`'s name as the test binary lists it (its path in the crate, without the crate's name).
fn test_name(test: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{test}")
}

/// This test binary run for the one test `test` (exactly, output not captured) with `env`, to
/// its end; its output and its peak memory.
fn this_test_alone(test: &str, env: &[(&str, &Path)]) -> Run {
    let exe = std::env::current_exe().expect("test binary");
    let name = test_name(test);
    let run = run_measured(&exe, &[&name, "--exact", "--nocapture"], env);
    // A name that matched no test would exit 0 having run nothing.
    assert!(
        run.lines()
            .any(|l| l.starts_with("test result: ok. 1 passed;")),
        "{name} did not run: {:?}",
        run.lines().collect::<Vec<_>>()
    );
    run
}

/// Runs the test `test`: `body` in a process of its own, or, in the child
/// [`write_fixture`] starts, writes the fixture it names.
fn alone(test: &str, body: impl FnOnce()) {
    if let (Some(kind), Some(data)) = (
        std::env::var_os("GABP_TEST_FIXTURE"),
        std::env::var_os("GABP_TEST_DATA"),
    ) {
        write_fixture_here(Path::new(&kind), Path::new(&data));
    } else if std::env::var_os(ALONE).is_some() {
        body();
    } else {
        let run = this_test_alone(test, &[(ALONE, Path::new("1"))]);
        // Its figures, shown with --nocapture.
        eprint!(
            "{}",
            std::fs::read_to_string(run.err.path()).unwrap_or_default()
        );
    }
}

/// Writes fixture `kind` into `data` in a child process (this binary running `test`); returns
/// the session ids it printed.
fn write_fixture(test: &str, kind: &str, data: &Path) -> Vec<SessionId> {
    let run = this_test_alone(
        test,
        &[
            ("GABP_TEST_FIXTURE", Path::new(kind)),
            ("GABP_TEST_DATA", data),
        ],
    );
    let ids: Vec<SessionId> = run
        .lines()
        .filter_map(|l| Some(l.strip_prefix("fixture-id: ")?.parse().expect("an id")))
        .collect();
    assert!(!ids.is_empty(), "the fixture wrote nothing");
    eprintln!("fixture {kind}: written in {:?}", run.took);
    ids
}

/// In the child [`write_fixture`] starts: writes fixture `kind` into `data` and prints the
/// session ids.
fn write_fixture_here(kind: &Path, data: &Path) {
    let store = Store::open(
        data,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let mut w = SessionWriter::new(store.clone());
    let ids = match kind.to_str().expect("kind") {
        "channels" => vec![write_many_channels(&store, &mut w)],
        "long" => vec![
            write_long_session(&mut w, LONG),
            write_long_session(&mut w, 2 * LONG),
        ],
        "many" => write_many_sessions(&mut w, 10_000),
        other => panic!("no fixture {other}"),
    };
    // Flushed, so that the commands measured do not replay the write-ahead log into memory
    // (a read-only open does, up to 256 MiB: a cost of the dir, not of the session's length).
    drop(w);
    store.flush().expect("flush");
    for id in ids {
        println!("fixture-id: {id}");
    }
}

fn write_many_channels(store: &Store, w: &mut SessionWriter) -> SessionId {
    let meta = SessionMeta {
        id: SessionId::now_v7(),
        route: "r".into(),
        started_ns: 1,
        welcome: Some(serde_json::json!({"agentId": "a", "app": {"name": "x"}})),
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    let mut largest_entry = 0;
    for ch in 0..CHANNELS {
        let name = format!("mod/channel/{ch:06}");
        w.define_channel(id, ch, &name);
        let body = gabp_proto::message::event(&name, 0, serde_json::json!({"n": ch}));
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: 1 + ch as u64,
                channel: Some(ch),
                mod_seq: Some(0),
                relay_seq: Some(0),
                json_ok: true,
                body,
            },
        );
        if ch % 1000 == 999 {
            w.commit().expect("commit");
            let entry = serde_json::to_vec(&store.sessions().expect("list")[0]).expect("json");
            largest_entry = largest_entry.max(entry.len());
        }
    }
    w.end(id, EndReason::Clean, 1 + CHANNELS as u64);
    w.commit().expect("commit");
    // Rewritten on every commit, the entry must not grow with the channels.
    assert!(
        largest_entry < 2048,
        "catalog entry grew to {largest_entry} bytes"
    );
    let full = store.resolve("latest").expect("session");
    assert_eq!(full.channels.len(), CHANNELS as usize);
    assert_eq!(full.channels[77_777], "mod/channel/077777");
    assert_eq!(full.welcome.as_ref().expect("welcome")["agentId"], "a");
    assert!(store.check_session(id).expect("check").ok());
    id
}

/// One ended session of `frames` events on 8 channels.
fn write_long_session(w: &mut SessionWriter, frames: u64) -> SessionId {
    let meta = SessionMeta {
        id: SessionId::now_v7(),
        route: "long".into(),
        started_ns: 1,
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    for ch in 0..8 {
        w.define_channel(id, ch, &format!("game/ch{ch}"));
    }
    let mut seqs = [0u64; 8];
    for i in 0..frames {
        let ch = (i % 8) as u32;
        let seq = seqs[ch as usize];
        seqs[ch as usize] += 1;
        let body = format!(
            r#"{{"v":"gabp/1","type":"event","channel":"game/ch{ch}","seq":{seq},"payload":{{"tick":{i},"x":{},"name":"unit"}}}}"#,
            i * 7 % 1000
        );
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: 1 + i * 1000,
                channel: Some(ch),
                mod_seq: Some(seq),
                relay_seq: Some(seq),
                json_ok: true,
                body: body.into(),
            },
        );
        if i % 10_000 == 9_999 {
            w.commit().expect("commit");
        }
    }
    w.end(id, EndReason::Clean, 1 + frames * 1000);
    w.commit().expect("commit");
    id
}

/// `n` short ended sessions: a channel, a bridge and one event each.
fn write_many_sessions(w: &mut SessionWriter, n: u64) -> Vec<SessionId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let t = 1_700_000_000_000_000_000 + i * 1_000_000_000;
        let meta = SessionMeta {
            id: SessionId::now_v7(),
            route: "r".into(),
            started_ns: t,
            app_name: Some("game".into()),
            ..SessionMeta::default()
        };
        let id = meta.id;
        ids.push(id);
        w.begin(meta);
        w.define_channel(id, 0, "tick");
        let bridge = BridgeInfo {
            conn: 1,
            ..BridgeInfo::default()
        };
        w.upsert_bridge(id, bridge);
        let body = gabp_proto::message::event("tick", 0, serde_json::json!({"i": i}));
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: t,
                channel: Some(0),
                mod_seq: Some(0),
                relay_seq: Some(0),
                json_ok: true,
                body,
            },
        );
        w.end(id, EndReason::Clean, t + 500_000_000);
        if i % 500 == 499 {
            w.commit().expect("commit");
        }
    }
    w.commit().expect("commit");
    ids.truncate(1);
    ids
}

#[test]
fn stats_of_100k_channels_streams_in_bounded_memory() {
    alone("stats_of_100k_channels_streams_in_bounded_memory", || {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        write_fixture(
            "stats_of_100k_channels_streams_in_bounded_memory",
            "channels",
            &data,
        );
        let run = relay(&["stats", "latest", "--json"], &data);
        #[derive(serde::Deserialize)]
        struct Stats {
            channels: Vec<serde::de::IgnoredAny>,
        }
        assert_eq!(run.json::<Stats>().channels.len(), CHANNELS as usize);
        eprintln!(
            "stats over {CHANNELS} channels: {:?}, peak RSS {} MiB",
            run.took,
            run.peak_kib / 1024
        );
        assert!(
            run.peak_kib < 400 * 1024,
            "stats peaked at {} MiB for {CHANNELS} channels",
            run.peak_kib / 1024
        );
    });
}

#[test]
fn check_stats_and_export_peak_the_same_for_a_session_twice_as_long() {
    alone(
        "check_stats_and_export_peak_the_same_for_a_session_twice_as_long",
        || {
            let dir = tempfile::tempdir().expect("tempdir");
            let data = dir.path().join("data");
            let ids = write_fixture(
                "check_stats_and_export_peak_the_same_for_a_session_twice_as_long",
                "long",
                &data,
            );
            let page = dir.path().join("report.html");
            let parquet = dir.path().join("export.parquet");
            for cmd in [
                "sessions check",
                "stats --json",
                "export",
                "export --format parquet",
                "report",
            ] {
                let mut peaks = Vec::new();
                for (id, frames) in [(ids[0], LONG), (ids[1], 2 * LONG)] {
                    let id = id.to_string();
                    let mut args: Vec<&str> = cmd.split(' ').collect();
                    args.insert(if cmd == "sessions check" { 2 } else { 1 }, &id);
                    if cmd == "report" {
                        args.extend(["-o", page.to_str().expect("utf-8")]);
                    }
                    if cmd == "export --format parquet" {
                        args.extend(["-o", parquet.to_str().expect("utf-8")]);
                    }
                    let run = relay(&args, &data);
                    // Each command read the whole session.
                    match args[0] {
                        "export" if cmd.contains("parquet") => {
                            // The footer alone: its row count.
                            let f = std::fs::File::open(&parquet).expect("parquet file");
                            let r = parquet::file::reader::SerializedFileReader::new(f)
                                .expect("parquet");
                            use parquet::file::reader::FileReader;
                            assert_eq!(r.metadata().file_metadata().num_rows() as u64, frames);
                        }
                        "export" => assert_eq!(run.lines().count() as u64, frames),
                        "report" => {
                            let html = std::fs::read_to_string(&page).expect("page");
                            assert!(html.contains(&format!("<dt>frames</dt><dd>{frames}</dd>")));
                        }
                        "stats" => {
                            #[derive(serde::Deserialize)]
                            struct Stats {
                                frames: u64,
                            }
                            assert_eq!(run.json::<Stats>().frames, frames);
                        }
                        _ => {
                            let out: Vec<String> = run.lines().collect();
                            assert!(out[0].contains(&format!("ok  {frames} frames")), "{out:?}");
                        }
                    }
                    eprintln!(
                        "{cmd} over {frames} frames: {:?}, peak RSS {} MiB",
                        run.took,
                        run.peak_kib / 1024
                    );
                    peaks.push(run.peak_kib);
                }
                let (at_n, at_2n) = (peaks[0], peaks[1]);
                // Memory that grew with the session would nearly double; allow noise, not growth.
                assert!(
                    at_2n <= at_n + at_n / 4 + 16 * 1024,
                    "{cmd}: peak {} MiB at {LONG} frames, {} MiB at {}",
                    at_n / 1024,
                    at_2n / 1024,
                    2 * LONG
                );
                assert!(at_2n < 200 * 1024, "{cmd} peaked at {} MiB", at_2n / 1024);
            }
        },
    );
}

#[test]
fn sessions_lists_10000_sessions_quickly() {
    alone("sessions_lists_10000_sessions_quickly", || {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        write_fixture("sessions_lists_10000_sessions_quickly", "many", &data);
        let table = relay(&["sessions"], &data);
        let rows = table
            .lines()
            .filter(|l| l.split_whitespace().any(|w| w == "clean"))
            .count();
        assert_eq!(rows, 10_000);
        let json = relay(&["sessions", "--json"], &data);
        #[derive(serde::Deserialize)]
        struct Row {
            frames: u64,
            bridges: u64,
        }
        #[derive(serde::Deserialize)]
        struct List {
            sessions: Vec<Row>,
        }
        let list = json.json::<List>().sessions;
        assert_eq!(list.len(), 10_000);
        assert!(list.iter().all(|s| s.frames == 1 && s.bridges == 1));
        for (what, run) in [("sessions", &table), ("sessions --json", &json)] {
            eprintln!(
                "{what} over 10,000 sessions: {:?}, peak RSS {} MiB",
                run.took,
                run.peak_kib / 1024
            );
            assert!(
                run.took < Duration::from_secs(10),
                "{what} took {:?}",
                run.took
            );
            assert!(
                run.peak_kib < 200 * 1024,
                "{what} peaked at {} MiB",
                run.peak_kib / 1024
            );
        }
    });
}
