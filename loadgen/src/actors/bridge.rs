//! A measuring bridge: hello, subscribe, then read events as fast as possible (or at a set
//! pace) into a [`Tally`], which checks per-channel seq contiguity and measures latency from
//! each event's scheduled send time (no coordinated omission).

use std::time::{Duration, Instant};

use bytes::Buf;
use gabp_client::Client;
use gabp_sim::Addr;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::tally::{ReaderResult, Tally};

/// Connects, says hello and subscribes to `channels`.
pub async fn connect(addr: &Addr, token: &str, channels: &[String]) -> anyhow::Result<Client> {
    let (mut c, _) = Client::connect_hello(addr, token).await?;
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    c.subscribe(&names).await?;
    Ok(c)
}

/// Reads until `stop`, counting into `tally`. Frames are parsed in place in the read buffer
/// (no per-frame allocation), as the peers' subscribers parse theirs, so the reader's own cost
/// is the same whichever system it measures.
pub async fn read(
    client: Client,
    read_rate: f64,
    mut tally: Tally,
    stop: CancellationToken,
) -> ReaderResult {
    let (frames, _writer, _buffered) = client.into_parts();
    let codec = frames.decoder().clone();
    let parts = frames.into_parts();
    let (mut io, mut buf) = (parts.io, parts.read_buf);
    let started = Instant::now();
    let mut consumed = 0u64;
    'read: loop {
        let mut at = 0;
        loop {
            let (head, len) = match codec.extent(&buf[at..]) {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(_) => {
                    tally.disconnected();
                    break 'read;
                }
            };
            if buf.len() - at < head + len {
                break;
            }
            let counted = tally.event(&buf[at + head..at + head + len]);
            at += head + len;
            if counted {
                consumed += 1;
                if read_rate > 0.0 && consumed.is_multiple_of(64) {
                    let due = started + Duration::from_secs_f64(consumed as f64 / read_rate);
                    tokio::select! { _ = stop.cancelled() => break 'read, _ = tokio::time::sleep_until(due.into()) => {} }
                }
            }
        }
        buf.advance(at);
        tally.flush_pace();
        buf.reserve(64 * 1024);
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = io.read_buf(&mut buf) => if !matches!(r, Ok(n) if n > 0) {
                if !stop.is_cancelled() {
                    tally.disconnected();
                }
                break;
            },
        }
    }
    tally.finish()
}
