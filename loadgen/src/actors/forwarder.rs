//! The baseline: a raw GABP broadcaster, the ceiling for any relay on this machine.
//!
//! It speaks just enough GABP to be driven by the same bridges as the relay (hello and
//! subscribe are answered from the mod's welcome), then forwards the mod's bytes without
//! parsing them: it reads only `Content-Length` headers to cut the stream after the last whole
//! frame, and hands that chunk, many frames at once, to every subscriber as one shared buffer.
//! Writers batch chunks into large writes. It is lossless: a full subscriber queue makes the
//! reader wait (and through TCP, the mod), so bridges see every frame. No JSON parsing, no seq
//! rewriting, no recording, no per-frame work: what is left is the cost of moving bytes.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_client::Client;
use gabp_proto::{message, GabpCodec, Mode, Parser};
use gabp_rt::net::{Addr, Conn, Listener};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

/// Chunks queued per subscriber before the reader waits for it.
const QUEUE: usize = 64;

/// Length of the longest prefix of `buf` made of whole frames.
pub fn whole_frames(buf: &[u8]) -> usize {
    let mut at = 0;
    while let Some(end) = memchr::memmem::find(&buf[at..], b"\r\n\r\n") {
        let head = &buf[at..at + end];
        let Some(len) = head.split(|&b| b == b'\n').find_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            line[..colon]
                .eq_ignore_ascii_case(b"content-length")
                .then(|| {
                    std::str::from_utf8(&line[colon + 1..])
                        .ok()?
                        .trim()
                        .parse::<usize>()
                        .ok()
                })?
        }) else {
            return at;
        };
        let next = at + end + 4 + len;
        if next > buf.len() {
            return at;
        }
        at = next;
    }
    at
}

type Subscribers = Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>;

/// Connects to the mod, then serves bridges on `listener` until the process ends.
pub async fn serve(
    listener: Listener,
    upstream: Addr,
    upstream_token: String,
    token: String,
) -> Result<()> {
    let (mut up, welcome) = Client::connect_hello(&upstream, &upstream_token)
        .await
        .map_err(|e| anyhow!("baseline cannot reach the mod: {e}"))?;
    let channels = gabp_proto::message::advertised_channels(&welcome);
    let names: Vec<&str> = channels.iter().map(String::as_str).collect();
    up.subscribe(&names).await?;
    let (frames, _up_write, _) = up.into_parts();
    let subs: Subscribers = Arc::default();
    let (s2, welcome2) = (subs.clone(), Arc::new(welcome));
    tokio::spawn(async move {
        loop {
            let Ok(conn) = listener.accept().await else {
                continue;
            };
            tokio::spawn(bridge(conn, s2.clone(), welcome2.clone(), token.clone()));
        }
    });
    // Forward the rest of the mod's stream (the codec may hold bytes already read).
    let parts = frames.into_parts();
    let mut read = parts.io;
    let mut buf = BytesMut::with_capacity(512 * 1024);
    buf.extend_from_slice(&parts.read_buf);
    loop {
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        if read.read_buf(&mut buf).await? == 0 {
            bail!("the mod closed the connection");
        }
        let n = whole_frames(&buf);
        if n == 0 {
            continue;
        }
        let chunk = buf.split_to(n).freeze();
        let targets: Vec<mpsc::Sender<Bytes>> = subs.lock().clone();
        let mut gone = false;
        for tx in &targets {
            gone |= tx.send(chunk.clone()).await.is_err();
        }
        if gone {
            subs.lock().retain(|tx| !tx.is_closed());
        }
    }
}

async fn bridge(conn: Conn, subs: Subscribers, welcome: Arc<Value>, token: String) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(QUEUE);
    let mut write = conn.write;
    let mut frames = FramedRead::new(conn.read, GabpCodec::default());
    let mut parser = Parser::new();
    // Handshake and subscription, answered here; the stream starts after the subscribe reply.
    let mut subscribed = false;
    while !subscribed {
        let Some(Ok(frame)) = frames.next().await else {
            return;
        };
        let Ok(view) = parser.parse(&frame.body, Mode::Tolerant) else {
            return;
        };
        let id = view.id.as_deref().unwrap_or(message::NIL_ID).to_string();
        let reply = match view.method.as_deref() {
            Some("session/hello") => {
                let params: Value = view
                    .params
                    .clone()
                    .and_then(|p| serde_json::from_slice(&frame.body[p]).ok())
                    .unwrap_or_default();
                if params["token"].as_str() != Some(token.as_str()) {
                    message::error_response(
                        Some(&id),
                        gabp_proto::ErrorCode::BadToken,
                        "invalid token",
                        None,
                    )
                } else {
                    message::result_response(&id, (*welcome).clone())
                }
            }
            Some("events/subscribe") => {
                subscribed = true;
                message::result_response(&id, json!({"subscribed": []}))
            }
            _ => message::error_response(
                Some(&id),
                gabp_proto::ErrorCode::MethodNotFound,
                "baseline forwarder",
                None,
            ),
        };
        if write
            .write_all(&gabp_proto::frame_bytes(&reply))
            .await
            .is_err()
        {
            return;
        }
    }
    subs.lock().push(tx);
    // Keep reading (and ignoring) so the bridge never blocks on writes to us.
    tokio::spawn(async move { while let Some(Ok(_)) = frames.next().await {} });
    let mut out = BytesMut::with_capacity(512 * 1024);
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk);
        while out.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(c) => out.extend_from_slice(&c),
                Err(_) => break,
            }
        }
        if write.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_after_the_last_whole_frame() {
        let mut b = BytesMut::new();
        gabp_proto::encode_frame(b"{}", &mut b);
        gabp_proto::encode_frame(b"[1]", &mut b);
        let whole = b.len();
        let first = gabp_proto::frame_bytes(b"{}").len();
        b.extend_from_slice(b"Content-Length: 10\r\n\r\n{\"a\"");
        assert_eq!(whole_frames(&b), whole);
        assert_eq!(whole_frames(&b[..whole - 1]), first);
        assert_eq!(whole_frames(b"content-length: 2\r\n\r\n{}"), 23);
    }
}
