//! What the retention tests and the retention bench (`storage/benches/retention.rs`) share:
//! sessions of incompressible events written straight through the storage API, and a data dir's
//! size on disk.
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use gabp_storage::{
    Direction, Durability, EndReason, FrameRecord, SessionId, SessionMeta, SessionWriter, Store,
    StoreOptions,
};
/// Bytes of every file under `dir`.
pub fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                disk_usage(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// An event whose payload does not compress away, so the session's size on disk is real.
pub fn event(ch: u32, seq: u64, t: u64) -> FrameRecord {
    let noise = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t.rotate_left(17);
    FrameRecord {
        dir: Direction::ModToRelay,
        conn: 0,
        time_ns: t,
        channel: Some(ch),
        mod_seq: Some(seq),
        relay_seq: Some(seq),
        json_ok: true,
        body: Bytes::from(format!(
            r#"{{"v":"gabp/1","type":"event","channel":"c{ch}","seq":{seq},"payload":{{"n":"{noise:016x}{:016x}"}}}}"#,
            noise.rotate_left(31) ^ 0x5555
        )),
    }
}

/// Writes one ended session of `frames` events, timed from `t0`.
pub fn write_session(w: &mut SessionWriter, frames: u64, t0: u64) -> SessionId {
    let m = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "r".into(),
        started_ns: t0,
        ..SessionMeta::default()
    };
    let id = m.id;
    w.begin(m);
    w.define_channel(id, 0, "a");
    for i in 0..frames {
        w.append(id, &event(0, i, t0 + i));
        if i % 10_000 == 9_999 {
            w.commit().expect("commit");
        }
    }
    w.end(id, EndReason::Clean, t0 + frames);
    w.commit().expect("commit");
    id
}

pub fn fast(data: &Path) -> Store {
    Store::open(
        data,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .expect("open")
}
