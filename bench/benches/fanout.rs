//! The hub's fan-out: one published event offered to 8 and 32 outboxes, drained by writers;
//! and one subscriber behind the default resume window, whose oldest events are freed as new
//! ones arrive (long out of cache by then).

use std::sync::Arc;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gabp_bench::event_body;
use gabp_engine::hub::Hub;
use gabp_engine::outbox::{Batch, Outbox, Runs};
use gabp_engine::OnSlow;
use gabp_proto::{Mode, Parser};

const EVENTS: usize = 256;

fn fanout(c: &mut Criterion) {
    let mut g = c.benchmark_group("fanout");
    let body = event_body(256, 1);
    let span = Parser::new()
        .parse(&body, Mode::Tolerant)
        .expect("valid")
        .seq_span;
    for subs in [8usize, 32] {
        let hub = Hub::new();
        let outboxes: Vec<Arc<Outbox>> = (0..subs)
            .map(|_| Arc::new(Outbox::new(OnSlow::DropOldest, 1 << 20, 1 << 30)))
            .collect();
        for (i, o) in outboxes.iter().enumerate() {
            hub.subscribe(i as u32, o, &["world/tick".to_string()]);
        }
        // Deliveries per iteration: EVENTS events to `subs` subscribers.
        g.throughput(Throughput::Elements((EVENTS * subs) as u64));
        g.bench_with_input(
            BenchmarkId::new("publish+offer+drain", subs),
            &subs,
            |b, _| {
                let (mut batch, mut runs) = (Batch::default(), Runs::default());
                b.iter(|| publish_and_drain(&hub, &body, &span, &outboxes, &mut batch, &mut runs))
            },
        );
    }
    // One subscriber, the default resume window (16,384 events) full: every publish evicts.
    let hub = Hub::with_window(16_384, 16 << 20);
    let outboxes = [Arc::new(Outbox::new(OnSlow::DropOldest, 1 << 20, 1 << 30))];
    hub.subscribe(0, &outboxes[0], &["world/tick".to_string()]);
    let mut runs = Runs::default();
    for _ in 0..16_384 {
        hub.publish("world/tick", &body, span.clone(), &mut runs);
    }
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.bench_function("publish+offer+drain/1 with a full resume window", |b| {
        let mut batch = Batch::default();
        b.iter(|| publish_and_drain(&hub, &body, &span, &outboxes, &mut batch, &mut runs))
    });
    g.finish();
}

/// One iteration: `EVENTS` events published (one burst, as the mod reader reads them) and
/// offered to their subscribers, then every outbox drained as a writer would; returns the
/// bytes taken.
fn publish_and_drain(
    hub: &Hub,
    body: &[u8],
    span: &Option<std::ops::Range<usize>>,
    outboxes: &[Arc<Outbox>],
    batch: &mut Batch,
    runs: &mut Runs,
) -> usize {
    for _ in 0..EVENTS {
        hub.publish("world/tick", body, span.clone(), runs);
    }
    for (subscribers, run) in runs.take() {
        for (_, o) in subscribers.iter() {
            o.offer_run(&run, 0);
        }
    }
    let mut bytes = 0usize;
    for o in outboxes {
        o.take(batch).expect("open");
        bytes += batch.frames.iter().map(|f| f.bytes().len()).sum::<usize>();
        batch.frames.clear();
    }
    bytes
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = fanout
}
