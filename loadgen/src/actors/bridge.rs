//! A measuring bridge: hello, subscribe, then read events as fast as possible (or at a set
//! pace), checking per-channel seq contiguity and measuring latency from each event's
//! scheduled send time (`payload.t`), so a stalled pipeline shows as latency, not as fewer
//! samples (no coordinated omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gabp_sim::clock::now_ns;
use gabp_sim::{Addr, Client};
use hdrhistogram::Histogram;
use tokio_util::sync::CancellationToken;

use super::{find_channel, find_u64, latency_histogram, Window};

/// What one bridge saw in the window.
#[derive(Debug)]
pub struct BridgeResult {
    /// Events received in the window.
    pub events: u64,
    /// Event latency from scheduled send time, ns.
    pub latency: Histogram<u64>,
    /// Seq gaps not announced by a drop notice.
    pub unannounced_gaps: u64,
    /// Events announced as dropped (`relay/dropped`).
    pub dropped: u64,
    /// Whether the relay closed the connection early.
    pub disconnected: bool,
}

/// Connects, says hello and subscribes to `channels`.
pub async fn connect(addr: &Addr, token: &str, channels: &[String]) -> anyhow::Result<Client> {
    let (mut c, _) = Client::connect_hello(addr, token).await?;
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    c.subscribe(&names).await?;
    Ok(c)
}

/// Reads until `stop`, counting inside `window`.
pub async fn read(
    client: Client,
    read_rate: f64,
    window: Arc<Window>,
    stop: CancellationToken,
) -> BridgeResult {
    let (mut frames, _writer, _buffered) = client.into_parts();
    let mut r = BridgeResult {
        events: 0,
        latency: latency_histogram(),
        unannounced_gaps: 0,
        dropped: 0,
        disconnected: false,
    };
    let mut last: Vec<(Vec<u8>, u64)> = Vec::new();
    let started = Instant::now();
    let mut consumed = 0u64;
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            f = frames.next() => match f {
                Some(Ok(f)) => f.body,
                _ => { r.disconnected = !stop.is_cancelled(); break; }
            },
        };
        let Some(channel) = find_channel(&frame) else {
            continue;
        };
        if channel == b"relay/dropped" {
            let n = find_u64(&frame, b"\"count\":").unwrap_or(0);
            let to = find_u64(&frame, b"\"toSeq\":");
            let ch = memchr::memmem::find(&frame, b"\"payload\":")
                .and_then(|p| find_channel_in_payload(&frame[p..]));
            if let (Some(ch), Some(to)) = (ch, to) {
                set_last(&mut last, &ch, to);
            }
            if window.is_open() {
                r.dropped += n;
            }
            continue;
        }
        if channel.starts_with(b"relay/") {
            continue;
        }
        let Some(seq) = find_u64(&frame, b"\"seq\":") else {
            continue;
        };
        if let Some(prev) = get_last(&last, channel) {
            if seq != prev + 1 && window.is_open() {
                r.unannounced_gaps += 1;
            }
        }
        set_last(&mut last, channel, seq);
        if window.is_open() {
            r.events += 1;
            if let Some(t) = find_u64(&frame, b"\"t\":") {
                let _ = r.latency.record(now_ns().saturating_sub(t).max(1));
            }
        }
        consumed += 1;
        if read_rate > 0.0 && consumed.is_multiple_of(64) {
            let due = started + Duration::from_secs_f64(consumed as f64 / read_rate);
            tokio::select! { _ = stop.cancelled() => break, _ = tokio::time::sleep_until(due.into()) => {} }
        }
    }
    r
}

/// The `"channel"` named inside a drop notice's payload.
fn find_channel_in_payload(payload: &[u8]) -> Option<Vec<u8>> {
    find_channel(payload).map(<[u8]>::to_vec)
}

fn get_last(last: &[(Vec<u8>, u64)], ch: &[u8]) -> Option<u64> {
    last.iter().find(|(c, _)| c == ch).map(|(_, s)| *s)
}

fn set_last(last: &mut Vec<(Vec<u8>, u64)>, ch: &[u8], seq: u64) {
    match last.iter_mut().find(|(c, _)| c == ch) {
        Some(e) => e.1 = seq,
        None => last.push((ch.to_vec(), seq)),
    }
}
