//! What `stats` and the report share when they walk a recording's calls: which methods get a
//! latency histogram of their own, how many requests are followed while they await an answer,
//! how an answer is matched to its request, and how latency is kept and read. No I/O; each
//! reader keeps its own tables.

use std::collections::HashMap;

use hdrhistogram::Histogram;

/// Methods with their own latency histogram; later ones are pooled.
pub const MAX_METHODS: usize = 64;
/// Requests awaiting an answer that are tracked for latency.
pub const MAX_OPEN: usize = 1 << 16;
/// The pool of methods beyond [`MAX_METHODS`].
pub const OTHER_METHODS: &str = "(other methods)";

/// A method's latency histogram (ns), as the report and `stats` keep it.
pub fn new_latency() -> Histogram<u64> {
    // 1 ns to one hour at 2 significant figures: ~40 KB per method.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds")
}

/// A method's latency at quantile `q` (ns), as the report and `stats` both show it: a bucket's
/// upper end can pass the exact longest call, so it is capped there.
pub fn latency_at(h: &Histogram<u64>, max_ns: u64, q: f64) -> u64 {
    h.value_at_quantile(q).min(max_ns)
}

/// Takes the awaited request (what, sent at, conn) with upstream id `id` if a mod response to
/// it recorded with `conn` is its answer: routed to the bridge that sent it (or to the relay,
/// conn 0, for its own). A late answer, recorded with no conn, leaves it awaited.
pub fn take_answered<T>(
    open: &mut HashMap<String, (T, u64, u32)>,
    id: &str,
    conn: u32,
) -> Option<(T, u64, u32)> {
    if open.get(id)?.2 != conn {
        return None;
    }
    open.remove(id)
}
