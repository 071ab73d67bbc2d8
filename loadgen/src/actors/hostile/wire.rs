//! The hostile clients' wire helpers: frames, hellos, writes that give up instead of waiting,
//! draining and reading replies, connecting and asking the relay something. They never decide
//! a misbehaviour (that is [`super`]'s one run per kind).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use gabp_proto::{encode_frame, message};
use gabp_sim::Conn;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Counts, Target};

/// A request id shaped like a UUID, cheap to make in a loop.
pub(super) fn id(n: u64) -> String {
    format!("00000000-0000-4000-8000-{:012x}", n & 0xffff_ffff_ffff)
}

pub(super) fn framed(body: &[u8]) -> BytesMut {
    let mut b = BytesMut::with_capacity(body.len() + 64);
    encode_frame(body, &mut b);
    b
}

pub(super) fn hello(token: &str, n: u64) -> BytesMut {
    framed(&message::request(
        &id(n),
        "session/hello",
        json!({"token": token, "bridgeVersion": "chaos/0.1", "platform": "linux", "launchId": id(n + 1)}),
    ))
}

/// How a bounded write ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wrote {
    Sent,
    /// The relay stopped reading for a whole second.
    Blocked,
    /// The connection is gone.
    Closed,
}

pub(super) async fn write(
    w: &mut (impl AsyncWrite + Unpin),
    bytes: &[u8],
    counts: &Counts,
) -> Wrote {
    match tokio::time::timeout(Duration::from_secs(1), w.write_all(bytes)).await {
        Ok(Ok(())) => {
            Counts::add(&counts.bytes, bytes.len() as u64);
            Wrote::Sent
        }
        Ok(Err(_)) => {
            Counts::add(&counts.closed_by_relay, 1);
            Wrote::Closed
        }
        Err(_) => {
            Counts::add(&counts.blocked, 1);
            Wrote::Blocked
        }
    }
}

/// Reads and discards until the relay closes (counted) or `within` passes.
pub(super) async fn drain(r: &mut (impl AsyncRead + Unpin), within: Duration, counts: &Counts) {
    let mut buf = vec![0u8; 64 * 1024];
    let until = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until.into(), r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                Counts::add(&counts.closed_by_relay, 1);
                return;
            }
            Ok(Ok(_)) => {}
            Err(_) => return,
        }
    }
}

/// Reads until `n` frames arrived (returns how many did) or the relay closed or `within` passed.
pub(super) async fn read_frames(
    r: &mut (impl AsyncRead + Unpin),
    n: u64,
    within: Duration,
    counts: &Counts,
) -> u64 {
    // Answers may echo a body at the limit back, with an envelope around it.
    let codec = gabp_proto::GabpCodec::new(64 << 20);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let until = Instant::now() + within;
    let mut got = 0;
    while got < n {
        loop {
            match codec.extent(&buf) {
                Ok(Some((head, len))) if buf.len() >= head + len => {
                    let _ = buf.split_to(head + len);
                    got += 1;
                }
                Ok(_) => break,
                Err(_) => return got,
            }
        }
        if got >= n {
            break;
        }
        buf.reserve(64 * 1024);
        match tokio::time::timeout_at(until.into(), r.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                Counts::add(&counts.closed_by_relay, 1);
                return got;
            }
            Ok(Ok(_)) => {}
            Err(_) => return got,
        }
    }
    got
}

pub(super) async fn connect(t: &Target, counts: &Counts) -> Option<Conn> {
    match Conn::connect(&t.addr).await {
        Ok(c) => {
            Counts::add(&counts.connections, 1);
            Some(c)
        }
        Err(_) => {
            Counts::add(&counts.connect_errors, 1);
            // A refused connect returns at once; do not spin on it.
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Connects and completes hello; `None` if the relay would not have it.
pub(super) async fn welcomed(t: &Target, counts: &Counts) -> Option<Conn> {
    let mut c = connect(t, counts).await?;
    if write(&mut c.write, &hello(&t.token, 1), counts).await != Wrote::Sent {
        return None;
    }
    Counts::add(&counts.frames, 1);
    (read_frames(&mut c.read, 1, Duration::from_secs(5), counts).await == 1).then_some(c)
}

/// Sends `body` and waits for one frame back; records how long that took.
pub(super) async fn ask(c: &mut Conn, body: &[u8], counts: &Counts, within: Duration) -> bool {
    let t = Instant::now();
    if write(&mut c.write, &framed(body), counts).await != Wrote::Sent {
        return false;
    }
    Counts::add(&counts.frames, 1);
    let answered = read_frames(&mut c.read, 1, within, counts).await == 1;
    if answered {
        counts.reply_took(t.elapsed());
    } else {
        Counts::add(&counts.unanswered, 1);
    }
    answered
}

pub(super) fn subscribe_all(t: &Target, n: u64) -> bytes::Bytes {
    message::request(
        &id(n),
        "events/subscribe",
        json!({ "channels": t.channels }),
    )
}

pub(super) fn radix36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}
