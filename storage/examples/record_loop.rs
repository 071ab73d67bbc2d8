//! A fixed recording workload for CPU counts: `perf stat -e task-clock,instructions
//! target/release/examples/record_loop [FRAMES] [none|batch]` records FRAMES 256-byte events in
//! 10,000-frame commits (one 10 ms tick at 1 M events/s) and closes the store after its memtables
//! are flushed, so RocksDB's flush and compaction threads are counted with the writer's. On a
//! shared machine, CPU per frame is stable where frames per second are not (BENCHMARKS.md).

use bytes::Bytes;
use gabp_storage::{
    Direction, Durability, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};

const TICK: u64 = 10_000;

/// An event like the load generator's: an envelope, then seeded random letters.
fn body(seq: u64) -> Bytes {
    let head = format!(
        r#"{{"v":"gabp/1","id":"550e8400-e29b-41d4-a716-{seq:012x}","type":"event","channel":"world/tick","seq":{seq},"payload":{{"t":1764470000000000000,"pad":""#
    );
    let mut b = head.into_bytes();
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    b.extend((b.len()..253).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b'a' + (x % 26) as u8
    }));
    b.extend_from_slice(b"\"}}");
    Bytes::from(b)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let frames: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(3_000_000);
    let durability = match args.next().as_deref() {
        Some("none") => Durability::None,
        _ => Durability::Batch,
    };
    let bodies: Vec<Bytes> = (0..TICK).map(body).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(
        dir.path(),
        StoreOptions {
            durability,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let mut w = SessionWriter::new(store.clone());
    let meta = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "record_loop".into(),
        started_ns: 1,
        ..SessionMeta::default()
    };
    let id = meta.id;
    w.begin(meta);
    w.define_channel(id, 0, "world/tick");
    let started = std::time::Instant::now();
    for seq in 0..frames {
        w.append(
            id,
            &FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: seq,
                channel: Some(0),
                mod_seq: Some(seq),
                relay_seq: Some(seq),
                json_ok: true,
                body: bodies[(seq % TICK) as usize].clone(),
            },
        );
        if seq % TICK == TICK - 1 {
            w.commit().expect("commit");
        }
    }
    w.commit().expect("commit");
    store.flush().expect("flush");
    let secs = started.elapsed().as_secs_f64();
    drop(w);
    drop(store);
    let bytes = dir_bytes(dir.path());
    eprintln!(
        "record_loop: {frames} frames in {secs:.2} s ({:.2} M frames/s wall), {:.1} B/frame on disk",
        frames as f64 / secs / 1e6,
        bytes as f64 / frames as f64
    );
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}
