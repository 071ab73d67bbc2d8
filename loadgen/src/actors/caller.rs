//! Drives `tools/call` against a mod or a relay at a fixed rate (open loop: latency counts from
//! each call's scheduled time) or at a fixed concurrency (closed loop).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::StreamExt;
use gabp_client::Client;
use gabp_proto::{encode_frame, message, Mode, Parser};
use gabp_rt::clock::now_ns;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::{latency_histogram, Window};

/// What the caller saw in the window.
#[derive(Debug)]
pub struct CallResult {
    /// Calls sent in the window and answered.
    pub calls: u64,
    /// Error answers to those.
    pub errors: u64,
    /// Calls sent in the window and never answered.
    pub unanswered: u64,
    /// Latency from scheduled send time, ns.
    pub latency: Histogram<u64>,
}

/// How long after the run stops a call sent in the window may still be answered.
const UNANSWERED_AFTER: Duration = Duration::from_secs(5);

/// Open loop: `rate` calls per second over one connection, pipelined.
pub async fn fixed_rate(
    client: Client,
    tool: String,
    args: Value,
    rate: f64,
    window: Arc<Window>,
    stop: CancellationToken,
) -> CallResult {
    let (mut frames, mut writer, _) = client.into_parts();
    let sent: Arc<Mutex<HashMap<String, (u64, bool)>>> = Arc::default();
    let result = Arc::new(Mutex::new(CallResult {
        calls: 0,
        errors: 0,
        unanswered: 0,
        latency: latency_histogram(),
    }));
    let (s2, r2) = (sent.clone(), result.clone());
    // The reader outlives `stop` by a grace period (below), so that calls sent late in the
    // window are counted with their latency rather than left out as unanswered.
    let reader = tokio::spawn(async move {
        let mut parser = Parser::new();
        loop {
            let body = match frames.next().await {
                Some(Ok(f)) => f.body,
                _ => break,
            };
            let Ok(view) = parser.parse(&body, Mode::Tolerant) else {
                continue;
            };
            let Some(id) = view.id.as_deref() else {
                continue;
            };
            let Some((scheduled, counted)) = s2.lock().remove(id) else {
                continue;
            };
            // Counted if it was sent inside the window, whenever its answer comes.
            if counted {
                let mut r = r2.lock();
                r.calls += 1;
                if view.is_error() {
                    r.errors += 1;
                }
                let _ = r.latency.record(now_ns().saturating_sub(scheduled).max(1));
            }
        }
    });
    let start = Instant::now();
    let start_ns = now_ns();
    let params = serde_json::json!({"name": tool, "arguments": args});
    let mut i = 0u64;
    let mut buf = BytesMut::new();
    loop {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::select! { _ = stop.cancelled() => break, _ = tokio::time::sleep_until(due.into()) => {} }
        // Send everything that is due, each stamped with its own scheduled time.
        let now = start.elapsed().as_secs_f64();
        while (i as f64) / rate <= now {
            let id = uuid::Uuid::new_v4().to_string();
            let scheduled = start_ns + (i as f64 * 1e9 / rate) as u64;
            sent.lock()
                .insert(id.clone(), (scheduled, window.is_open()));
            encode_frame(
                &message::request(&id, "tools/call", params.clone()),
                &mut buf,
            );
            i += 1;
        }
        if writer.write_all(&buf).await.is_err() {
            break;
        }
        buf.clear();
    }
    let grace = Instant::now() + UNANSWERED_AFTER;
    while Instant::now() < grace
        && !reader.is_finished()
        && sent.lock().values().any(|(_, counted)| *counted)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reader.abort();
    let mut r = std::mem::replace(
        &mut *result.lock(),
        CallResult {
            calls: 0,
            errors: 0,
            unanswered: 0,
            latency: latency_histogram(),
        },
    );
    r.unanswered = sent.lock().values().filter(|(_, counted)| *counted).count() as u64;
    r
}

/// Closed loop: `concurrency` callers, each waiting for its answer before the next call.
pub async fn fixed_concurrency(
    clients: Vec<Client>,
    tool: String,
    args: Value,
    window: Arc<Window>,
    stop: CancellationToken,
) -> CallResult {
    let mut tasks = Vec::new();
    for mut c in clients {
        let (tool, args, window, stop) = (tool.clone(), args.clone(), window.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut r = CallResult { calls: 0, errors: 0, unanswered: 0, latency: latency_histogram() };
            loop {
                let t = now_ns();
                let resp = tokio::select! { _ = stop.cancelled() => break, r = c.request("tools/call", serde_json::json!({"name": tool, "arguments": args})) => r };
                let Ok(resp) = resp else { break };
                if window.is_open() {
                    r.calls += 1;
                    if resp.get("error").is_some_and(|e| !e.is_null()) {
                        r.errors += 1;
                    }
                    let _ = r.latency.record(now_ns().saturating_sub(t).max(1));
                }
            }
            r
        }));
    }
    let mut total = CallResult {
        calls: 0,
        errors: 0,
        unanswered: 0,
        latency: latency_histogram(),
    };
    for t in tasks {
        if let Ok(r) = t.await {
            total.calls += r.calls;
            total.errors += r.errors;
            let _ = total.latency.add(&r.latency);
        }
    }
    total
}

/// Closed loop on one connection: `n` calls in flight, the next sent as each answer comes
/// back (a relay's traffic to its mod, without the relay).
pub async fn pipelined(
    client: Client,
    tool: String,
    args: Value,
    n: usize,
    window: Arc<Window>,
    stop: CancellationToken,
) -> CallResult {
    let (mut frames, mut writer, _) = client.into_parts();
    let params = serde_json::json!({"name": tool, "arguments": args});
    let mut r = CallResult {
        calls: 0,
        errors: 0,
        unanswered: 0,
        latency: latency_histogram(),
    };
    let mut sent: HashMap<String, u64> = HashMap::with_capacity(n);
    let mut buf = BytesMut::new();
    let queue = |sent: &mut HashMap<String, u64>, buf: &mut BytesMut| {
        let id = uuid::Uuid::new_v4().to_string();
        encode_frame(&message::request(&id, "tools/call", params.clone()), buf);
        sent.insert(id, now_ns());
    };
    for _ in 0..n {
        queue(&mut sent, &mut buf);
    }
    let mut parser = Parser::new();
    loop {
        if !buf.is_empty() {
            if writer.write_all(&buf).await.is_err() {
                break;
            }
            buf.clear();
        }
        let body = tokio::select! {
            _ = stop.cancelled() => break,
            f = frames.next() => match f {
                Some(Ok(f)) => f.body,
                _ => break,
            },
        };
        let Ok(view) = parser.parse(&body, Mode::Tolerant) else {
            continue;
        };
        let Some(t) = view.id.as_deref().and_then(|id| sent.remove(id)) else {
            continue;
        };
        if window.is_open() {
            r.calls += 1;
            if view.is_error() {
                r.errors += 1;
            }
            let _ = r.latency.record(now_ns().saturating_sub(t).max(1));
        }
        queue(&mut sent, &mut buf);
    }
    r
}
