//! A fixed loop of tolerant parses of the load generator's event bodies, for instruction counts
//! (`valgrind --tool=callgrind target/release/examples/parse_loop [N] [PAD]`): stable on a busy
//! machine where wall-clock timings are not. BENCHMARKS.md records its before/after counts.

use gabp_proto::{Mode, Parser};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let pad: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(106);
    let pad = "q".repeat(pad);
    let bodies: Vec<Vec<u8>> = (0..64u64)
        .map(|i| {
            format!(
                r#"{{"v":"gabp/1","id":"1a2b3c4d-0000-4000-8000-{i:012x}","type":"event","channel":"sim/ch{}","seq":{},"payload":{{"t":{},"pad":"{pad}"}}}}"#,
                i % 3,
                1000 + i,
                1_700_000_000_000_000_000u64 + i
            )
            .into_bytes()
        })
        .collect();
    let mut parser = Parser::new();
    let mut seqs = 0u64;
    for i in 0..n {
        let view = parser
            .parse(&bodies[i % bodies.len()], Mode::Tolerant)
            .expect("valid event");
        seqs = seqs.wrapping_add(view.seq.unwrap_or(0));
    }
    println!("{n} parses, seq sum {seqs}");
}
