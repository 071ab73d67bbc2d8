//! A fixed loop of parses for instruction counts (`valgrind --tool=callgrind
//! target/release/examples/parse_loop [N] [PAD] [MODE]`): stable on a busy machine where
//! wall-clock timings are not. `MODE` `event` (the default) parses the load generator's event
//! bodies tolerantly, as the mod's side does; `call` parses its `tools/call` request strictly,
//! as the bridge's side does, with PAD bytes of argument text. BENCHMARKS.md records the counts.

use gabp_proto::{Mode, Parser};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let pad: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(106);
    let call = args.next().is_some_and(|m| m == "call");
    let pad = "q".repeat(pad);
    let bodies: Vec<Vec<u8>> = (0..64u64)
        .map(|i| {
            if call {
                format!(
                    r#"{{"v":"gabp/1","id":"1a2b3c4d-0000-4000-8000-{i:012x}","type":"request","method":"tools/call","params":{{"name":"sim/echo","arguments":{{"text":"{pad}"}}}}}}"#
                )
            } else {
                format!(
                    r#"{{"v":"gabp/1","id":"1a2b3c4d-0000-4000-8000-{i:012x}","type":"event","channel":"sim/ch{}","seq":{},"payload":{{"t":{},"pad":"{pad}"}}}}"#,
                    i % 3,
                    1000 + i,
                    1_700_000_000_000_000_000u64 + i
                )
            }
            .into_bytes()
        })
        .collect();
    let mode = if call { Mode::Strict } else { Mode::Tolerant };
    let mut parser = Parser::new();
    let mut seen = 0u64;
    for i in 0..n {
        let view = parser
            .parse(&bodies[i % bodies.len()], mode)
            .expect("valid frame");
        seen =
            seen.wrapping_add(view.seq.unwrap_or(0) + view.id_span.map_or(0, |s| s.len() as u64));
    }
    println!("{n} parses, checksum {seen}");
}
