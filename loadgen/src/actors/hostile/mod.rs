//! Hostile clients for `gabp-loadgen chaos`: one actor per misbehaviour (flood before hello,
//! never read, half-close, trickle, garbage, huge frames, huge arrays, wrong-token storms,
//! metric-label attack, reconnect churn). Each actor loops over short *runs* (one connection's
//! misbehaviour, or one burst of connections), every run bounded in time and every actor bounded
//! in runs, and stops by itself at its deadline or when told to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::ValueEnum;
use gabp_proto::{encode_frame, message};
use gabp_sim::Addr;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

mod wire;

use wire::{
    ask, connect, drain, framed, hello, id, radix36, read_frames, subscribe_all, welcomed, write,
    Wrote,
};

/// One kind of hostile client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Connects, never says hello, floods well-formed requests and never reads.
    NoHelloFlood,
    /// Says hello, subscribes to everything, never reads.
    NeverRead,
    /// Says hello, subscribes, sends a request and closes its write side.
    HalfClose,
    /// Sends a frame one byte at a time (the hello, or a request after it).
    Trickle,
    /// Sends bytes that are not GABP (random, bad headers, bodies that are not JSON).
    Garbage,
    /// Sends frames at, just over and far over the relay's body limit.
    HugeFrame,
    /// Subscribes to 100,000 channels in one request.
    HugeArray,
    /// Reconnects in a loop, each time saying hello with a wrong token.
    WrongToken,
    /// Sends requests with thousands of distinct method names (metric-label attack).
    MethodLabels,
    /// Connects, subscribes, reads a few events and leaves, over and over.
    Churn,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 10] = [
        Kind::NoHelloFlood,
        Kind::NeverRead,
        Kind::HalfClose,
        Kind::Trickle,
        Kind::Garbage,
        Kind::HugeFrame,
        Kind::HugeArray,
        Kind::WrongToken,
        Kind::MethodLabels,
        Kind::Churn,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NoHelloFlood => "no-hello-flood",
            Kind::NeverRead => "never-read",
            Kind::HalfClose => "half-close",
            Kind::Trickle => "trickle",
            Kind::Garbage => "garbage",
            Kind::HugeFrame => "huge-frame",
            Kind::HugeArray => "huge-array",
            Kind::WrongToken => "wrong-token",
            Kind::MethodLabels => "method-labels",
            Kind::Churn => "churn",
        }
    }

    /// The longest one run may take, and the most runs one actor makes.
    fn bounds(self) -> (Duration, u64) {
        let s = Duration::from_secs;
        match self {
            Kind::NoHelloFlood => (s(4), 1_000),
            Kind::NeverRead | Kind::HalfClose => (s(5), 1_000),
            Kind::Trickle => (s(4), 1_000),
            Kind::Garbage | Kind::HugeFrame => (s(5), 5_000),
            Kind::HugeArray => (s(15), 1_000),
            Kind::WrongToken => (s(5), 5_000),
            Kind::MethodLabels => (s(10), 1_000),
            Kind::Churn => (s(3), 100_000),
        }
    }
}

/// What every actor of one kind did, counted as it happens.
#[derive(Debug, Default)]
pub struct Counts {
    /// Runs started.
    pub runs: AtomicU64,
    /// Connections opened.
    pub connections: AtomicU64,
    /// Frames (or frame attempts) sent.
    pub frames: AtomicU64,
    /// Bytes written.
    pub bytes: AtomicU64,
    /// Times the relay closed the connection on the actor.
    pub closed_by_relay: AtomicU64,
    /// Times a write stayed blocked (the relay stopped reading: backpressure).
    pub blocked: AtomicU64,
    /// Connections refused or failed.
    pub connect_errors: AtomicU64,
    /// Slowest answer to a request this kind waited for, ms.
    pub slowest_reply_ms: AtomicU64,
    /// Requests this kind waited for that were never answered in time.
    pub unanswered: AtomicU64,
    /// Runs still going at their time bound (e.g. still waiting for an answer).
    pub cut_short: AtomicU64,
}

impl Counts {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn reply_took(&self, d: Duration) {
        self.slowest_reply_ms
            .fetch_max(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// A JSON summary.
    pub fn summary(&self, kind: Kind, workers: usize) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "kind": kind.name(),
            "workers": workers,
            "runs": g(&self.runs),
            "connections": g(&self.connections),
            "frames": g(&self.frames),
            "bytes": g(&self.bytes),
            "closed_by_relay": g(&self.closed_by_relay),
            "writes_blocked": g(&self.blocked),
            "connect_errors": g(&self.connect_errors),
            "unanswered": g(&self.unanswered),
            "slowest_reply_ms": g(&self.slowest_reply_ms),
            "cut_short": g(&self.cut_short),
        })
    }
}

/// Where and how hostile actors attack.
#[derive(Debug, Clone)]
pub struct Target {
    /// The relay's bridge address (loopback).
    pub addr: Addr,
    /// The real bridge token (for kinds that get past hello).
    pub token: String,
    /// The mod's channels (for "subscribe to everything").
    pub channels: Vec<String>,
    /// The relay's body limit.
    pub max_body: usize,
    /// Shared counter for distinct method names across all method-label actors.
    pub method_counter: Arc<AtomicU64>,
}

/// Runs one actor of `kind` until `deadline`, `stop`, or its run bound.
pub async fn actor(
    kind: Kind,
    t: Target,
    counts: Arc<Counts>,
    seed: u64,
    deadline: Instant,
    stop: CancellationToken,
) {
    let (per_run, max_runs) = kind.bounds();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    for run in 0..max_runs {
        let now = Instant::now();
        if stop.is_cancelled() || now >= deadline {
            break;
        }
        Counts::add(&counts.runs, 1);
        let bound = per_run.min(deadline - now);
        let one = one_run(kind, &t, &counts, run, &mut rng, bound);
        tokio::select! {
            _ = stop.cancelled() => break,
            r = tokio::time::timeout(bound, one) => if r.is_err() {
                Counts::add(&counts.cut_short, 1);
            }
        }
    }
}

async fn one_run(
    kind: Kind,
    t: &Target,
    counts: &Counts,
    run: u64,
    rng: &mut rand::rngs::SmallRng,
    bound: Duration,
) {
    match kind {
        Kind::NoHelloFlood => {
            let Some(mut c) = connect(t, counts).await else {
                return;
            };
            // 64 well-formed requests per write, never reading the error replies.
            let mut batch = BytesMut::new();
            for i in 0..64 {
                encode_frame(
                    &message::request(&id(i), "tools/list", json!({})),
                    &mut batch,
                );
            }
            for _ in 0..4_000 {
                if write(&mut c.write, &batch, counts).await != Wrote::Sent {
                    return;
                }
                Counts::add(&counts.frames, 64);
            }
        }
        Kind::NeverRead => {
            let Some(mut c) = welcomed(t, counts).await else {
                return;
            };
            if write(&mut c.write, &framed(&subscribe_all(t, 2)), counts).await == Wrote::Sent {
                Counts::add(&counts.frames, 1);
                // Hold the connection, never reading, for the rest of the run.
                tokio::time::sleep(bound).await;
            }
        }
        Kind::HalfClose => {
            let Some(mut c) = welcomed(t, counts).await else {
                return;
            };
            let mut out = framed(&subscribe_all(t, 2));
            encode_frame(&message::request(&id(3), "tools/list", json!({})), &mut out);
            if write(&mut c.write, &out, counts).await != Wrote::Sent {
                return;
            }
            Counts::add(&counts.frames, 2);
            let _ = c.write.shutdown().await;
            if run.is_multiple_of(2) {
                // Half-closed and reading: the relay decides when to close.
                drain(&mut c.read, bound, counts).await;
            } else {
                // Half-closed and never reading.
                tokio::time::sleep(bound).await;
            }
        }
        Kind::Trickle => {
            let Some(mut c) = (if run.is_multiple_of(2) {
                connect(t, counts).await
            } else {
                welcomed(t, counts).await
            }) else {
                return;
            };
            let frame = if run.is_multiple_of(2) {
                hello(&t.token, 1)
            } else {
                framed(&message::request(&id(5), "tools/list", json!({})))
            };
            Counts::add(&counts.frames, 1);
            for b in frame.iter() {
                if write(&mut c.write, &[*b], counts).await != Wrote::Sent {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drain(&mut c.read, Duration::from_secs(1), counts).await;
        }
        Kind::Garbage => {
            let in_sync = run % 4 == 3;
            let Some(mut c) = (if in_sync {
                welcomed(t, counts).await
            } else {
                connect(t, counts).await
            }) else {
                return;
            };
            let bytes: Vec<u8> = match run % 4 {
                0 => (0..16 * 1024).map(|_| rng.gen()).collect(),
                1 => b"Content-Length: banana\r\n\r\n{}".to_vec(),
                2 => b"Content-Length: 12\r\nContent-Length: 99\r\n\r\n{\"v\":\"gabp\"}".repeat(8),
                // Framed correctly, bodies that are not JSON: the stream stays in sync.
                _ => {
                    let mut b = BytesMut::new();
                    for _ in 0..200 {
                        encode_frame(b"{not json at all", &mut b);
                    }
                    b.to_vec()
                }
            };
            Counts::add(&counts.frames, 1);
            if write(&mut c.write, &bytes, counts).await == Wrote::Sent {
                drain(&mut c.read, Duration::from_secs(2), counts).await;
            }
        }
        Kind::HugeFrame => {
            let shape = run % 4;
            let Some(mut c) = (if shape == 0 {
                connect(t, counts).await
            } else {
                welcomed(t, counts).await
            }) else {
                return;
            };
            Counts::add(&counts.frames, 1);
            match shape {
                // Exactly the limit, well-formed: must be served.
                1 => {
                    let overhead = message::request(
                        &id(7),
                        "tools/call",
                        json!({"name": "sim/echo", "arguments": {"pad": ""}}),
                    )
                    .len();
                    let pad = "x".repeat(t.max_body.saturating_sub(overhead));
                    let body = message::request(
                        &id(7),
                        "tools/call",
                        json!({"name": "sim/echo", "arguments": {"pad": pad}}),
                    );
                    if write(&mut c.write, &framed(&body), counts).await == Wrote::Sent {
                        let t0 = Instant::now();
                        if read_frames(&mut c.read, 1, bound, counts).await == 1 {
                            counts.reply_took(t0.elapsed());
                        } else {
                            Counts::add(&counts.unanswered, 1);
                        }
                    }
                }
                // One byte over (before hello for shape 0, after it for 2), or a declared
                // length far beyond it: sent in 64 KiB pieces, as far as the relay takes them.
                _ => {
                    let declared = if shape == 3 {
                        1u64 << 40
                    } else {
                        t.max_body as u64 + 1
                    };
                    let head = format!("Content-Length: {declared}\r\n\r\n");
                    if write(&mut c.write, head.as_bytes(), counts).await != Wrote::Sent {
                        return;
                    }
                    let chunk = vec![b' '; 64 * 1024];
                    let mut left = declared.min(t.max_body as u64 + 1 + (4 << 20));
                    let mut wrote = Wrote::Sent;
                    while left > 0 && wrote == Wrote::Sent {
                        let n = left.min(chunk.len() as u64) as usize;
                        wrote = write(&mut c.write, &chunk[..n], counts).await;
                        left -= n as u64;
                    }
                    // A close the write already counted is not counted again by the read.
                    if wrote != Wrote::Closed {
                        drain(&mut c.read, Duration::from_secs(2), counts).await;
                    }
                }
            }
        }
        Kind::HugeArray => {
            let Some(mut c) = welcomed(t, counts).await else {
                return;
            };
            // 100,000 distinct valid names, as many as fit the body limit.
            let mut names = Vec::with_capacity(100_000);
            let mut size = 200;
            for i in 0..100_000u32 {
                let n = format!("a/c{}", radix36(i + (run as u32) * 100_000));
                size += n.len() + 3;
                if size > t.max_body {
                    break;
                }
                names.push(n);
            }
            let body = message::request(&id(9), "events/subscribe", json!({ "channels": names }));
            ask(&mut c, &body, counts, bound).await;
        }
        Kind::WrongToken => {
            for i in 0..200 {
                let Some(mut c) = connect(t, counts).await else {
                    continue;
                };
                let wrong = uuid::Uuid::new_v4().simple().to_string();
                if write(&mut c.write, &hello(&wrong, i), counts).await == Wrote::Sent {
                    Counts::add(&counts.frames, 1);
                    read_frames(&mut c.read, 1, Duration::from_secs(2), counts).await;
                }
            }
        }
        Kind::MethodLabels => {
            let Some(c) = welcomed(t, counts).await else {
                return;
            };
            let (mut r, mut w) = (c.read, c.write);
            const N: u64 = 1_000;
            let first = t.method_counter.fetch_add(N, Ordering::Relaxed);
            let mut out = BytesMut::new();
            for k in 0..N {
                encode_frame(
                    &message::request(
                        &id(first + k),
                        &format!("chaos/m{}", radix36((first + k) as u32)),
                        json!({}),
                    ),
                    &mut out,
                );
            }
            // Write and read at once, so this is not also a never-read client.
            let t0 = Instant::now();
            let (wrote, got) = tokio::join!(
                write(&mut w, &out, counts),
                read_frames(&mut r, N, bound, counts)
            );
            if wrote == Wrote::Sent {
                Counts::add(&counts.frames, N);
            }
            if got == N {
                counts.reply_took(t0.elapsed());
            } else {
                Counts::add(&counts.unanswered, N - got);
            }
        }
        Kind::Churn => {
            let Some(mut c) = welcomed(t, counts).await else {
                return;
            };
            if write(&mut c.write, &framed(&subscribe_all(t, 2)), counts).await == Wrote::Sent {
                Counts::add(&counts.frames, 1);
                let n = rng.gen_range(1..50);
                read_frames(&mut c.read, n, Duration::from_secs(1), counts).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_are_valid() {
        assert!(gabp_proto::envelope::is_uuid(&id(0)));
        assert!(gabp_proto::envelope::is_uuid(&id(u64::MAX)));
        assert_eq!(radix36(0), "0");
        assert_eq!(radix36(36 * 36 - 1), "zz");
        let m = format!("chaos/m{}", radix36(123_456));
        assert!(gabp_proto::envelope::is_method_name(&m), "{m}");
        assert!(gabp_proto::envelope::is_method_name("a/c0"));
        let mut names = std::collections::HashSet::new();
        for k in Kind::ALL {
            assert!(names.insert(k.name()));
            assert_eq!(
                <Kind as ValueEnum>::from_str(k.name(), false).ok(),
                Some(k),
                "command-line name of {k:?}"
            );
        }
    }
}
