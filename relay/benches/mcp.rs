//! A measurement, not a test: tools/call latency through MCP (stdio and Streamable HTTP)
//! against a plain GABP bridge, and `events_poll` keeping up with the simulated mod's 20,000
//! events/s. Prints the figures as JSON (BENCHMARKS.md). About a minute:
//! `cargo bench --workspace --bench mcp`.

#[path = "../tests/it/support/mcp.rs"]
mod harness;

use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_sim::Addr;
use harness::*;
use serde_json::{json, Value};

fn pct(h: &hdrhistogram::Histogram<u64>) -> Value {
    json!({"p50Ms": h.value_at_quantile(0.5) as f64 / 1e3, "p99Ms": h.value_at_quantile(0.99) as f64 / 1e3, "n": h.len()})
}

/// A plain bridge's tools/call latency: 100 calls/s open loop, then 8 bridges closed loop.
async fn plain_bench(addr: &Addr, token: &str, calls: u64, secs: u64) -> Value {
    let (mut c, _) = Client::connect_hello(addr, token).await.expect("hello");
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let t0 = Instant::now();
    for i in 0..calls {
        let due = t0 + Duration::from_millis(i * 10);
        tokio::time::sleep_until(due.into()).await;
        c.call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"i": i}}),
        )
        .await
        .expect("call");
        h.record(due.elapsed().as_micros() as u64).expect("record");
    }
    let rate100 = pct(&h);
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (addr, token) = (addr.clone(), token.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut c, _) = Client::connect_hello(&addr, &token).await.expect("hello");
            let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
            while Instant::now() < stop {
                let s = Instant::now();
                c.call(
                    "tools/call",
                    json!({"name": "sim/echo", "arguments": {"c": 8}}),
                )
                .await
                .expect("call");
                h.record(s.elapsed().as_micros() as u64).expect("record");
            }
            h
        }));
    }
    let mut all = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        all.add(t.await.expect("task")).expect("add");
    }
    let mut conc8 = pct(&all);
    conc8["callsPerS"] = json!(all.len() as f64 / secs as f64);
    json!({"rate100": rate100, "conc8": conc8})
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, and there it only
    // has to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(measure_mcp_latency_and_event_polling());
}

/// Latency through MCP (stdio, HTTP) vs a plain bridge, and events_poll against the simulated
/// mod's 20,000 events/s.
async fn measure_mcp_latency_and_event_polling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quiet = sim(false, None);
    let s = serve(&quiet, dir.path()).await;
    let plain = plain_bench(&s.addr, &s.token, 500, 5).await;
    let env = [("BENCH_CALLS", "500"), ("BENCH_SECONDS", "5")];
    let stdio = spawn_py("bench", "stdio", "bench-stdio", &s, dir.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    let http = spawn_py("bench", "http", "bench-http", &s, dir.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    drop(s);

    let dir2 = tempfile::tempdir().expect("tempdir");
    let busy = sim(true, Some(20_000.0));
    let s2 = serve(&busy, dir2.path()).await;
    let env = [("BENCH_CALLS", "0"), ("BENCH_EVENTS_SECONDS", "10")];
    let events = spawn_py("bench", "stdio", "bench-events", &s2, dir2.path(), &env)
        .finish(Duration::from_secs(120))
        .await;
    let report =
        json!({"plain": plain, "mcpStdio": stdio, "mcpHttp": http, "eventsPoll": events["events"]});
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    let per_s = events["events"]["perS"].as_u64().expect("events/s");
    assert!(
        per_s >= 18_000,
        "events_poll kept up with {per_s} events/s only"
    );
    assert_eq!(events["events"]["missed"], 0, "events_poll missed events");
}
