//! Criterion benches: `cargo bench -p gabp-bench` (numbers and commands in BENCHMARKS.md).

mod codec;
mod fanout;
mod maps;
mod storage;

criterion::criterion_main!(
    codec::benches,
    codec::parts_group,
    fanout::benches,
    maps::benches,
    storage::benches
);
