//! A mod with 100,000 channels costs bounded resources: the per-commit catalog entry stays small
//! (channel names are written once under keys of their own), and `gabp-relay stats` streams with
//! a few hundred bytes per channel (a full histogram per channel cost ~350 KB each before:
//! 10,000 channels took 3.45 GB).

use gabp_storage::{
    Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
const CHANNELS: u32 = 100_000;

/// Peak RSS of every child waited for so far, in KiB.
fn children_peak_rss_kib() -> i64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage(2) fills the rusage struct it is given a valid pointer to.
    #[allow(unsafe_code)]
    let ru = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, ru.as_mut_ptr()), 0);
        ru.assume_init()
    };
    ru.ru_maxrss
}

#[test]
fn stats_of_100k_channels_streams_in_bounded_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let store = Store::open(&data, StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let meta = SessionMeta {
        id: gabp_storage::SessionId::now_v7(),
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
    drop(w);
    drop(store);
    // Rewritten on every commit, the entry must not grow with the channels.
    assert!(
        largest_entry < 2048,
        "catalog entry grew to {largest_entry} bytes"
    );
    let store = Store::open_for_reading(&data).expect("read");
    let full = store.resolve("latest").expect("session");
    assert_eq!(full.channels.len(), CHANNELS as usize);
    assert_eq!(full.channels[77_777], "mod/channel/077777");
    assert_eq!(full.welcome.as_ref().expect("welcome")["agentId"], "a");
    assert!(store.check_session(id).expect("check").ok());
    drop(store);

    let before = children_peak_rss_kib();
    let out = std::process::Command::new(BIN)
        .args(["stats", "latest", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .expect("stats");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peak = children_peak_rss_kib().max(before);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["channels"].as_array().expect("channels").len(),
        CHANNELS as usize
    );
    eprintln!(
        "stats over {CHANNELS} channels: peak RSS {} MiB",
        peak / 1024
    );
    assert!(
        peak < 400 * 1024,
        "stats peaked at {} MiB for {CHANNELS} channels",
        peak / 1024
    );
}
