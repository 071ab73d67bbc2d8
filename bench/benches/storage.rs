//! The recorder's batch write path: append frames and group-commit, by compression and
//! durability. One iteration records one 10 ms tick's worth at 1 M events/s (10,000 frames).

use bytes::Bytes;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gabp_bench::event_body;
use gabp_storage::{
    Compression, Direction, Durability, FrameRecord, SessionMeta, SessionWriter, Store,
    StoreOptions,
};

const TICK: usize = 10_000;

fn recorder(c: &mut Criterion) {
    let mut g = c.benchmark_group("recorder");
    g.throughput(Throughput::Elements(TICK as u64));
    let bodies: Vec<Bytes> = (0..TICK)
        .map(|i| Bytes::from(event_body(256, i as u64)))
        .collect();
    for (name, compression, durability, wal_compression) in [
        ("lz4_batch", Compression::Lz4, Durability::Batch, false),
        (
            "lz4_batch_walzstd",
            Compression::Lz4,
            Durability::Batch,
            true,
        ),
        ("zstd_batch", Compression::Zstd, Durability::Batch, false),
        (
            "zstd_batch_walzstd",
            Compression::Zstd,
            Durability::Batch,
            true,
        ),
        ("lz4_none", Compression::Lz4, Durability::None, false),
        (
            "nocompress_batch",
            Compression::None,
            Durability::Batch,
            false,
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(
            dir.path(),
            StoreOptions {
                durability,
                compression,
                read_only: false,
                wal_compression,
                allow_symlinked_dir: false,
            },
        )
        .expect("open");
        let mut w = SessionWriter::new(store);
        let meta = SessionMeta {
            id: uuid::Uuid::now_v7(),
            route: "bench".into(),
            started_ns: 1,
            ..SessionMeta::default()
        };
        let id = meta.id;
        w.begin(meta);
        w.define_channel(id, 0, "world/tick");
        let mut seq = 0u64;
        g.bench_with_input(
            BenchmarkId::new("append+commit_256B", name),
            &name,
            |b, _| {
                b.iter(|| {
                    for body in &bodies {
                        let rec = FrameRecord {
                            dir: Direction::ModToRelay,
                            conn: 0,
                            time_ns: seq,
                            channel: Some(0),
                            mod_seq: Some(seq),
                            relay_seq: Some(seq),
                            json_ok: true,
                            body: body.clone(),
                        };
                        seq += 1;
                        w.append(id, &rec);
                    }
                    w.commit().expect("commit")
                })
            },
        );
        let size: u64 = walk(dir.path());
        eprintln!(
            "recorder/{name}: data dir {:.1} MiB after {} frames ({:.0} B/frame)",
            size as f64 / (1 << 20) as f64,
            seq,
            size as f64 / seq.max(1) as f64
        );
    }
    g.finish();
}

fn walk(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |d| {
        d.filter_map(Result::ok)
            .map(|e| {
                e.metadata()
                    .map_or(0, |m| if m.is_dir() { walk(&e.path()) } else { m.len() })
            })
            .sum()
    })
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(5)).warm_up_time(std::time::Duration::from_secs(1));
    targets = recorder
}
