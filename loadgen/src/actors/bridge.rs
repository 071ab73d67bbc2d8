//! A measuring bridge: hello, subscribe, then read events as fast as possible (or at a set
//! pace) into a [`Tally`], which checks per-channel seq contiguity and measures latency from
//! each event's scheduled send time (no coordinated omission).

use std::time::{Duration, Instant};

use futures::StreamExt;
use gabp_sim::{Addr, Client};
use tokio_util::sync::CancellationToken;

use super::tally::{ReaderResult, Tally};

/// Connects, says hello and subscribes to `channels`.
pub async fn connect(addr: &Addr, token: &str, channels: &[String]) -> anyhow::Result<Client> {
    let (mut c, _) = Client::connect_hello(addr, token).await?;
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    c.subscribe(&names).await?;
    Ok(c)
}

/// Reads until `stop`, counting into `tally`.
pub async fn read(
    client: Client,
    read_rate: f64,
    mut tally: Tally,
    stop: CancellationToken,
) -> ReaderResult {
    let (mut frames, _writer, _buffered) = client.into_parts();
    let started = Instant::now();
    let mut consumed = 0u64;
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            f = frames.next() => match f {
                Some(Ok(f)) => f.body,
                _ => {
                    if !stop.is_cancelled() {
                        tally.disconnected();
                    }
                    break;
                }
            },
        };
        if !tally.event(&frame) {
            continue;
        }
        consumed += 1;
        if read_rate > 0.0 && consumed.is_multiple_of(64) {
            let due = started + Duration::from_secs_f64(consumed as f64 / read_rate);
            tokio::select! { _ = stop.cancelled() => break, _ = tokio::time::sleep_until(due.into()) => {} }
        }
    }
    tally.finish()
}
