//! Decode + envelope view against the `serde_json::Value` baseline on the same frames.

use bytes::BytesMut;
use criterion::{criterion_group, BatchSize, BenchmarkId, Criterion, Throughput};
use gabp_bench::{event_body, wire};
use gabp_proto::{GabpCodec, Mode, Parser};
use tokio_util::codec::Decoder;

const FRAMES: usize = 1000;

fn decode_and_view(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    for size in [256usize, 4096] {
        let input = wire(size, FRAMES);
        g.throughput(Throughput::Elements(FRAMES as u64));
        g.bench_with_input(BenchmarkId::new("decode+view", size), &input, |b, input| {
            let mut parser = Parser::new();
            let mut codec = GabpCodec::default();
            b.iter_batched(
                || BytesMut::from(&input[..]),
                |mut buf| {
                    let mut seqs = 0u64;
                    while let Some(f) = codec.decode(&mut buf).expect("valid") {
                        let v = parser.parse(&f.body, Mode::Tolerant).expect("valid");
                        seqs += v.seq.unwrap_or(0);
                    }
                    seqs
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(
            BenchmarkId::new("decode+serde_json_value", size),
            &input,
            |b, input| {
                let mut codec = GabpCodec::default();
                b.iter_batched(
                    || BytesMut::from(&input[..]),
                    |mut buf| {
                        let mut seqs = 0u64;
                        while let Some(f) = codec.decode(&mut buf).expect("valid") {
                            let v: serde_json::Value =
                                serde_json::from_slice(&f.body).expect("valid");
                            seqs += v["seq"].as_u64().unwrap_or(0);
                        }
                        seqs
                    },
                    BatchSize::LargeInput,
                )
            },
        );
        g.bench_with_input(BenchmarkId::new("decode_only", size), &input, |b, input| {
            let mut codec = GabpCodec::default();
            b.iter_batched(
                || BytesMut::from(&input[..]),
                |mut buf| {
                    let mut n = 0usize;
                    while let Some(f) = codec.decode(&mut buf).expect("valid") {
                        n += f.body.len();
                    }
                    n
                },
                BatchSize::LargeInput,
            )
        });
        // Strict mode is what bridge input pays.
        let body = event_body(size, 1);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("view_strict_bytes", size),
            &body,
            |b, body| {
                let mut parser = Parser::new();
                b.iter(|| parser.parse(body, Mode::Strict).expect("valid").seq)
            },
        );
    }
    g.finish();
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec_encode");
    let body = event_body(256, 1);
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_frame_256", |b| {
        let mut out = BytesMut::with_capacity(64 * 1024);
        b.iter(|| {
            if out.len() > 60 * 1024 {
                out.clear();
            }
            gabp_proto::encode_frame(&body, &mut out);
        })
    });
    g.bench_function("wire_with_seq_256", |b| {
        let view = Parser::new()
            .parse(&body, Mode::Tolerant)
            .expect("valid")
            .seq_span;
        b.iter(|| gabp_proto::rewrite::wire_with_seq(&body, view.clone(), 123_456))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = decode_and_view, encode
}

/// Where the view's time goes: simd-json's tape alone, and the top-level scanner alone.
fn parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("view_parts");
    for size in [256usize, 4096] {
        let body = event_body(size, 1);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("simd_json_tape", size),
            &body,
            |b, body| {
                let mut buffers = simd_json::Buffers::new(body.len());
                let mut scratch = body.clone();
                b.iter(|| {
                    scratch.copy_from_slice(body);
                    let mut tape = simd_json::tape::Tape(Vec::new());
                    simd_json::fill_tape(&mut scratch, &mut buffers, &mut tape).expect("valid");
                    tape.0.len()
                })
            },
        );
        g.bench_with_input(BenchmarkId::new("scan_members", size), &body, |b, body| {
            let mut m = Vec::new();
            b.iter(|| {
                m.clear();
                gabp_proto::scan::members(body, &mut m).expect("object");
                m.len()
            })
        });
        g.bench_with_input(BenchmarkId::new("from_utf8", size), &body, |b, body| {
            b.iter(|| std::str::from_utf8(body).is_ok())
        });
    }
    g.finish();
}

criterion_group! {
    name = parts_group;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = parts
}
