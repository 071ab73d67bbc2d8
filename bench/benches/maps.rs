//! Concurrent maps on the relay's two shared tables, a single `parking_lot` lock around a
//! `HashMap` (what the relay uses) against `dashmap` (sharded locks), under 1, 2 and 4 threads:
//!
//! - pending requests: each thread forwards requests (insert under a fresh UUID) and takes the
//!   answers back (remove), as bridge readers and the mod reader do;
//! - the bridge registry: connects and disconnects (insert, remove) against status snapshots
//!   (iterate everything), as bridge tasks and `relay/status` do.
//!
//! Each iteration is `OPS` operations per thread, all threads started together.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use parking_lot::Mutex;
use uuid::Uuid;

const OPS: usize = 4096;
const THREADS: [usize; 3] = [1, 2, 4];

/// The operations both maps offer, as the relay uses them.
trait Table<K, V>: Send + Sync {
    fn insert(&self, k: K, v: V);
    fn remove(&self, k: &K) -> Option<V>;
    fn count_matching(&self, f: &dyn Fn(&V) -> bool) -> usize;
}

impl<K: Eq + Hash + Send, V: Send> Table<K, V> for Mutex<HashMap<K, V>> {
    fn insert(&self, k: K, v: V) {
        self.lock().insert(k, v);
    }
    fn remove(&self, k: &K) -> Option<V> {
        self.lock().remove(k)
    }
    fn count_matching(&self, f: &dyn Fn(&V) -> bool) -> usize {
        self.lock().values().filter(|v| f(v)).count()
    }
}

impl<K: Eq + Hash + Send + Sync, V: Send + Sync> Table<K, V> for DashMap<K, V> {
    fn insert(&self, k: K, v: V) {
        DashMap::insert(self, k, v);
    }
    fn remove(&self, k: &K) -> Option<V> {
        DashMap::remove(self, k).map(|(_, v)| v)
    }
    fn count_matching(&self, f: &dyn Fn(&V) -> bool) -> usize {
        self.iter().filter(|e| f(e.value())).count()
    }
}

/// What a pending entry carries (session, method, deadline), at about its real size.
struct Entry {
    session: Uuid,
    _method: String,
    _deadline: Instant,
}

/// Runs `work(thread)` on `threads` threads started together; returns the wall time.
fn together(threads: usize, work: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, work) = (&barrier, &work);
            s.spawn(move || {
                barrier.wait();
                work(t);
            });
        }
    });
    start.elapsed()
}

fn pending_round_trips<T: Table<Uuid, Entry>>(table: &T, threads: usize) -> Duration {
    let session = Uuid::now_v7();
    let deadline = Instant::now();
    // Ids are made before the clock starts: a v4 UUID costs a getrandom call, which would
    // hide the map.
    let ids: Vec<Vec<Uuid>> = (0..threads)
        .map(|_| (0..OPS).map(|_| Uuid::new_v4()).collect())
        .collect();
    together(threads, |t| {
        // Up to 64 requests in flight per thread, answered in order.
        for chunk in ids[t].chunks(64) {
            for id in chunk {
                table.insert(
                    *id,
                    Entry {
                        session,
                        _method: String::from("tools/call"),
                        _deadline: deadline,
                    },
                );
            }
            for id in chunk {
                let e = table.remove(id).expect("inserted");
                assert_eq!(e.session, session);
            }
        }
    })
}

fn registry_churn<T: Table<u32, Arc<u64>>>(table: &T, threads: usize) -> Duration {
    // 64 bridges connected all along; each thread connects and disconnects its own, and takes a
    // status snapshot every 16 operations.
    for b in 0..64u32 {
        table.insert(1_000_000 + b, Arc::new(u64::from(b)));
    }
    let d = together(threads, |t| {
        for i in 0..OPS {
            let conn = (t * OPS + i) as u32;
            table.insert(conn, Arc::new(i as u64));
            if i % 16 == 0 {
                std::hint::black_box(table.count_matching(&|v| **v % 2 == 0));
            }
            table.remove(&conn).expect("inserted");
        }
    });
    for b in 0..64u32 {
        table.remove(&(1_000_000 + b));
    }
    d
}

fn maps(c: &mut Criterion) {
    let mut g = c.benchmark_group("maps");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for threads in THREADS {
        g.throughput(Throughput::Elements((OPS * threads) as u64));
        let lock: Mutex<HashMap<Uuid, Entry>> = Mutex::default();
        g.bench_with_input(
            BenchmarkId::new("pending/lock", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| (0..iters).map(|_| pending_round_trips(&lock, n)).sum()),
        );
        let dash: DashMap<Uuid, Entry> = DashMap::new();
        g.bench_with_input(
            BenchmarkId::new("pending/dashmap", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| (0..iters).map(|_| pending_round_trips(&dash, n)).sum()),
        );
        let lock: Mutex<HashMap<u32, Arc<u64>>> = Mutex::default();
        g.bench_with_input(
            BenchmarkId::new("registry/lock", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| (0..iters).map(|_| registry_churn(&lock, n)).sum()),
        );
        let dash: DashMap<u32, Arc<u64>> = DashMap::new();
        g.bench_with_input(
            BenchmarkId::new("registry/dashmap", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| (0..iters).map(|_| registry_churn(&dash, n)).sum()),
        );
    }
    g.finish();
}

criterion_group!(benches, maps);
