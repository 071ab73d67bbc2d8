//! The catalog's layout: parts under keys of their own (a fixed-size counters key rewritten by
//! commits, a key per bridge), entries of older data dirs still read and rewritten in the new
//! layout, and listing 10,000 sessions from the catalog alone.

use std::time::Instant;

use bytes::Bytes;
use gabp_storage::chunk::ChunkBuilder;
use gabp_storage::keys::{self, CatalogPart, Detail, IndexEntry};
use gabp_storage::{
    BridgeInfo, Direction, Durability, EndReason, FrameRecord, SessionMeta, SessionWriter, Store,
    StoreOptions,
};
use rocksdb::{IteratorMode, Options, DB};

const CFS: [&str; 4] = ["frames", "chan_index", "catalog", "details"];

fn event(ch: u32, seq: u64, t: u64) -> FrameRecord {
    FrameRecord {
        dir: Direction::ModToRelay,
        conn: 0,
        time_ns: t,
        channel: Some(ch),
        mod_seq: Some(seq),
        relay_seq: Some(seq),
        json_ok: true,
        body: Bytes::from(format!(
            r#"{{"v":"gabp/1","type":"event","channel":"c{ch}","seq":{seq},"payload":{{}}}}"#
        )),
    }
}

fn bridge(conn: u32) -> BridgeInfo {
    BridgeInfo {
        conn,
        name: None,
        bridge_version: "1".into(),
        platform: "test".into(),
        launch_id: format!("l{conn}"),
        peer: "127.0.0.1:1".into(),
        attached_ns: 10,
        detached_ns: None,
        dropped: 0,
        policy: "drop-oldest".into(),
        unrecorded_bad_frames: 0,
        rate_limited: 0,
        denied: 0,
        lease_refused: 0,
        label: None,
    }
}

/// Every (key, value) of a column family, read with the raw RocksDB API.
fn raw_entries(dir: &std::path::Path, cf: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let db = DB::open_cf_for_read_only(&Options::default(), dir, CFS, false).expect("raw open");
    let cf = db.cf_handle(cf).expect("cf");
    db.iterator_cf(&cf, IteratorMode::Start)
        .map(|kv| {
            let (k, v) = kv.expect("read");
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

#[test]
fn a_session_is_stored_as_record_counters_and_one_key_per_bridge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let store = Store::open(&data, StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let m = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "r".into(),
        started_ns: 1,
        app_name: Some("game".into()),
        ..SessionMeta::default()
    };
    let id = m.id;
    w.begin(m);
    for ch in 0..500u32 {
        w.define_channel(id, ch, &format!("channel/{ch}"));
    }
    for conn in 1..=40 {
        w.upsert_bridge(id, bridge(conn));
    }
    for i in 0..2000u64 {
        w.append(id, &event((i % 500) as u32, i / 500, 2 + i));
        if i % 100 == 0 {
            w.commit().expect("commit");
        }
    }
    let mut gone = bridge(7);
    gone.detached_ns = Some(500);
    w.upsert_bridge(id, gone);
    w.end(id, EndReason::Clean, 3000);
    w.commit().expect("commit");
    drop(w);
    drop(store);

    let catalog = raw_entries(&data, "catalog");
    let parts: Vec<(CatalogPart, usize)> = catalog
        .iter()
        .map(|(k, v)| {
            let (s, part) = keys::parse_catalog_key(k).expect("a catalog key");
            assert_eq!(s, id);
            (part, v.len())
        })
        .collect();
    assert_eq!(parts.len(), 42, "{parts:?}");
    assert_eq!(parts[0].0, CatalogPart::Session);
    assert!(parts[0].1 < 512, "session record of {} bytes", parts[0].1);
    assert_eq!(parts[1], (CatalogPart::Counters, 57));
    for (i, (part, _)) in parts[2..].iter().enumerate() {
        assert_eq!(*part, CatalogPart::Bridge(i as u32 + 1));
    }
    let details = raw_entries(&data, "details");
    assert_eq!(details.len(), 500, "one key per channel name");

    let store = Store::open_for_reading(&data).expect("read");
    let m = store.session(id).expect("read").expect("present");
    assert_eq!((m.frames, m.events, m.channels.len()), (2000, 2000, 500));
    assert_eq!(m.bridges.len(), 40);
    assert_eq!(m.bridges[6].detached_ns, Some(500));
    assert!(m.bridges.iter().all(|b| b.detached_ns.is_some()));
    assert_eq!(m.end_reason, Some(EndReason::Clean));
    assert_eq!(m.app_name.as_deref(), Some("game"));
    let r = store.check_session(id).expect("check");
    assert!(r.ok(), "{:?}", r.problems);
    // No channel repeats within a chunk (500 channels, chunks of at most 256 frames): one
    // index entry per frame.
    assert_eq!(r.index_entries, 2000);
}

/// The catalog entry exactly as the previous version wrote it (serde of its `SessionMeta`).
fn old_entry(id: uuid::Uuid, state: &str, end: &str, inline: bool) -> Vec<u8> {
    let mut v = serde_json::json!({
        "id": id, "route": "old", "state": state, "end_reason": end,
        "started_ns": 100, "ended_ns": if state == "ended" { serde_json::json!(900) } else { serde_json::Value::Null },
        "last_ns": 800, "agent_id": "agent", "app_name": "game", "app_version": "0.9",
        "relay_version": "0.1.0",
        "bridges": [{"conn": 3, "bridge_version": "b", "platform": "p", "launch_id": "l",
                     "peer": "127.0.0.1:9", "attached_ns": 150, "detached_ns": null,
                     "dropped": 2, "policy": "drop-oldest"}],
        "frames": 300, "bytes": 0, "events": 300, "anomalies": 1, "record_errors": 0,
        "lost_frames": 0
    });
    if end.is_empty() {
        v["end_reason"] = serde_json::Value::Null;
    }
    if inline {
        // Older still: the welcome and channel names inline in the entry.
        v["welcome"] = serde_json::json!({"agentId": "agent"});
        v["channels"] = serde_json::json!(["a", "b"]);
    }
    serde_json::to_vec(&v).expect("json")
}

/// Writes one old-format session (frames, index, catalog entry, details) with the raw API.
fn write_old_session(db: &DB, id: uuid::Uuid, state: &str, end: &str, inline: bool) -> u64 {
    let cf = |n| db.cf_handle(n).expect("cf");
    let mut bytes = 0;
    for first in [0u64, 256] {
        let mut b = ChunkBuilder::default();
        let n = if first == 0 { 256 } else { 44 };
        for i in first..first + n {
            let rec = event((i % 2) as u32, i / 2, 100 + i);
            bytes += rec.body.len() as u64;
            b.push(&rec);
        }
        db.put_cf(&cf("frames"), keys::frame_key(id, first), b.finish())
            .expect("put");
        for ch in 0..2u32 {
            let e = IndexEntry {
                frame_no: first + ch as u64,
                chunk: first,
                count: n as u32 / 2,
            };
            db.put_cf(
                &cf("chan_index"),
                keys::index_key(id, ch, first / 2),
                e.encode(),
            )
            .expect("put");
        }
    }
    let mut entry: serde_json::Value =
        serde_json::from_slice(&old_entry(id, state, end, inline)).expect("json");
    entry["bytes"] = bytes.into();
    db.put_cf(
        &cf("catalog"),
        keys::catalog_key(id),
        serde_json::to_vec(&entry).expect("json"),
    )
    .expect("put");
    if !inline {
        for (ch, name) in ["a", "b"].iter().enumerate() {
            db.put_cf(
                &cf("details"),
                keys::detail_key(id, Detail::Channel, ch as u64),
                name,
            )
            .expect("put");
        }
    }
    bytes
}

#[test]
fn data_dirs_of_the_previous_catalog_layout_are_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (ended, crashed) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    {
        let mut o = Options::default();
        o.create_if_missing(true);
        o.create_missing_column_families(true);
        let db = DB::open_cf(&o, &data, CFS).expect("raw create");
        write_old_session(&db, ended, "ended", "clean", false);
        write_old_session(&db, crashed, "recording", "", true);
    }
    {
        let store = Store::open_for_reading(&data).expect("read");
        let list = store.sessions().expect("list");
        assert_eq!(list.len(), 2);
        let m = &list[0];
        assert_eq!((m.id, m.route.as_str()), (ended, "old"));
        assert_eq!((m.frames, m.events, m.anomalies), (300, 300, 1));
        assert_eq!(m.end_reason, Some(EndReason::Clean));
        assert_eq!(m.bridges.len(), 1);
        assert_eq!(m.bridges[0].dropped, 2);
        // No relay holds the dir: the unfinished one shows as crashed.
        assert_eq!(list[1].end_label(), "crash");
        let full = store.resolve(&ended.to_string()).expect("resolve");
        assert_eq!(full.channels, vec!["a", "b"]);
        let full = store.resolve("latest").expect("resolve");
        assert_eq!(full.channels, vec!["a", "b"]);
        assert_eq!(full.welcome.as_ref().expect("welcome")["agentId"], "agent");
        for id in [ended, crashed] {
            let r = store.check_session(id).expect("check");
            assert!(r.ok(), "{:?}", r.problems);
            assert_eq!((r.frames, r.chunks, r.index_entries), (300, 2, 4));
        }
    }
    // A relay's open finishes the crashed session, writing it in the new layout.
    let store = Store::open(&data, StoreOptions::default()).expect("open");
    drop(store);
    let parts: Vec<(uuid::Uuid, CatalogPart)> = raw_entries(&data, "catalog")
        .iter()
        .map(|(k, _)| keys::parse_catalog_key(k).expect("catalog key"))
        .collect();
    assert_eq!(
        parts,
        vec![
            (ended, CatalogPart::Legacy),
            (crashed, CatalogPart::Session),
            (crashed, CatalogPart::Counters),
            (crashed, CatalogPart::Bridge(3)),
        ]
    );
    let store = Store::open_for_reading(&data).expect("read");
    let m = store.session(crashed).expect("read").expect("present");
    assert_eq!(m.end_reason, Some(EndReason::Crash));
    assert_eq!((m.frames, m.ended_ns), (300, Some(800)));
    assert_eq!(
        m.channels,
        vec!["a", "b"],
        "inline channels moved to details"
    );
    assert_eq!(m.welcome.as_ref().expect("welcome")["agentId"], "agent");
    assert_eq!(m.bridges[0].detached_ns, Some(800));
    assert!(store.check_session(crashed).expect("check").ok());
    drop(store);
    // Deleting removes every part, old or new.
    let store = Store::open_for_change(&data).expect("change");
    store.delete_session(ended).expect("rm");
    store.delete_session(crashed).expect("rm");
    assert!(store.sessions().expect("list").is_empty());
    drop(store);
    assert!(raw_entries(&data, "catalog").is_empty());
}

/// Writes `n` short ended sessions (3 frames, a bridge, a channel each) through the writer.
pub fn write_short_sessions(store: &Store, n: usize) {
    let mut w = SessionWriter::new(store.clone());
    for i in 0..n {
        let m = SessionMeta {
            id: uuid::Uuid::now_v7(),
            route: format!("route{}", i % 7),
            started_ns: 1_000 + i as u64,
            app_name: Some("game".into()),
            ..SessionMeta::default()
        };
        let id = m.id;
        w.begin(m);
        w.define_channel(id, 0, "tick");
        w.upsert_bridge(id, bridge(1));
        for s in 0..3 {
            w.append(id, &event(0, s, 1_000 + i as u64 + s));
        }
        w.end(id, EndReason::Clean, 2_000 + i as u64);
        if i % 500 == 499 {
            w.commit().expect("commit");
        }
    }
    w.commit().expect("commit");
}

#[test]
fn listing_10000_sessions_reads_the_catalog_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let store = Store::open(
        &data,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let t = Instant::now();
    write_short_sessions(&store, 10_000);
    eprintln!("wrote 10,000 sessions in {:?}", t.elapsed());
    drop(store);
    let store = Store::open_for_reading(&data).expect("read");
    let t = Instant::now();
    let list = store.sessions().expect("list");
    let took = t.elapsed();
    eprintln!("listed 10,000 sessions in {took:?}");
    assert_eq!(list.len(), 10_000);
    assert!(list.windows(2).all(|w| w[0].id < w[1].id), "start order");
    assert!(list
        .iter()
        .all(|m| m.frames == 3 && m.bridges.len() == 1 && m.end_label() == "clean"));
    // Listing holds counters, not details: channels are read only for one session.
    assert!(list.iter().all(|m| m.channels.is_empty()));
    assert_eq!(
        store.resolve("latest").expect("latest").channels,
        vec!["tick"]
    );
    assert!(took.as_secs() < 5, "listing took {took:?}");
}

/// A session that bridges keep joining and leaving holds a bounded number of bridge entries in
/// the writer's memory; every one of them is in the catalog on disk.
#[test]
fn bridges_that_left_are_kept_on_disk_not_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let store = Store::open(&data, StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let m = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "r".into(),
        started_ns: 1,
        ..SessionMeta::default()
    };
    let id = m.id;
    w.begin(m);
    let bound = gabp_storage::writer::BRIDGES_IN_MEMORY;
    let n = 6 * bound as u32;
    let mut most = 0;
    for conn in 1..=n {
        w.upsert_bridge(id, bridge(conn));
        w.commit().expect("commit");
        let mut gone = bridge(conn);
        gone.detached_ns = Some(10 + u64::from(conn));
        w.upsert_bridge(id, gone);
        most = most.max(w.bridges_held(id));
    }
    assert!(
        most <= bound + bound / 4 + 1,
        "{most} entries held (bound {bound})"
    );
    w.end(id, EndReason::Clean, 10 + u64::from(n) + 1);
    w.commit().expect("commit");
    drop(w);
    let meta = store.session(id).expect("read").expect("the session");
    assert_eq!(meta.bridges.len(), n as usize);
    assert!(meta.bridges.iter().all(|b| b.detached_ns.is_some()));
}
