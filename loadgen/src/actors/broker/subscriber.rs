//! Subscribers on the peer servers: connect, subscribe to every channel, and count each
//! message into the same [`Tally`] as the relay's bridges; plus the incremental parsers of
//! RESP2 pushes and NATS `MSG` items, which take a frame whole or not at all.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::actors::tally::{ReaderResult, Tally};

use super::{Broker, NATS_CONNECT};

/// A connected, subscribed reader.
#[derive(Debug)]
pub struct Subscriber {
    pub(super) kind: Broker,
    pub(super) conn: tokio::net::TcpStream,
    pub(super) buf: BytesMut,
}

/// Connects to `addr` and subscribes to `channels`; returns once the server has confirmed.
pub async fn subscribe(kind: Broker, addr: SocketAddr, channels: &[String]) -> Result<Subscriber> {
    let conn = tokio::net::TcpStream::connect(addr).await?;
    conn.set_nodelay(true)?;
    let mut s = Subscriber {
        kind,
        conn,
        buf: BytesMut::with_capacity(256 * 1024),
    };
    let confirm = async {
        match kind {
            Broker::Redis => {
                let mut cmd = format!("*{}\r\n$9\r\nSUBSCRIBE\r\n", channels.len() + 1);
                for c in channels {
                    cmd.push_str(&format!("${}\r\n{c}\r\n", c.len()));
                }
                s.conn.write_all(cmd.as_bytes()).await?;
                let mut confirmed = 0;
                while confirmed < channels.len() {
                    match parse_resp_push(&s.buf)? {
                        Some((used, push)) => {
                            if &s.buf[push.kind.clone()] != b"subscribe" {
                                bail!("unexpected reply to SUBSCRIBE");
                            }
                            confirmed += 1;
                            s.buf.advance(used);
                        }
                        None => s.fill().await?,
                    }
                }
            }
            Broker::Nats => {
                s.read_line().await.context("reading the NATS INFO line")?;
                let mut cmd = String::from_utf8_lossy(NATS_CONNECT).into_owned();
                for (sid, c) in channels.iter().enumerate() {
                    cmd.push_str(&format!("SUB {c} {}\r\n", sid + 1));
                }
                cmd.push_str("PING\r\n");
                s.conn.write_all(cmd.as_bytes()).await?;
                // PONG means the server has processed every SUB before the PING.
                loop {
                    let line = s.read_line().await?;
                    if line.starts_with("PONG") {
                        break;
                    }
                    if line.starts_with("-ERR") {
                        bail!("nats-server: {}", line.trim());
                    }
                }
            }
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), confirm)
        .await
        .map_err(|_| anyhow!("{} did not confirm the subscription", kind.program()))??;
    Ok(s)
}

impl Subscriber {
    async fn fill(&mut self) -> Result<()> {
        self.buf.reserve(64 * 1024);
        if self.conn.read_buf(&mut self.buf).await? == 0 {
            bail!("connection closed");
        }
        Ok(())
    }

    async fn read_line(&mut self) -> Result<String> {
        loop {
            if let Some(end) = memchr::memmem::find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.advance(end + 2);
                return Ok(line);
            }
            if self.buf.len() > 64 * 1024 {
                bail!("line too long");
            }
            self.fill().await?;
        }
    }

    /// Reads messages until `stop`, counting their bodies into `tally`.
    pub async fn read(mut self, mut tally: Tally, stop: CancellationToken) -> ReaderResult {
        loop {
            let used = match self.kind {
                Broker::Redis => self.drain_redis(&mut tally),
                Broker::Nats => self.drain_nats(&mut tally).await,
            };
            let Ok(used) = used else {
                tally.disconnected();
                break;
            };
            self.buf.advance(used);
            tally.flush_pace();
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                r = self.fill() => if r.is_err() {
                    if !stop.is_cancelled() {
                        tally.disconnected();
                    }
                    break;
                },
            }
        }
        tally.finish()
    }

    /// Counts every complete Redis push in the buffer; returns the bytes used.
    pub(super) fn drain_redis(&mut self, tally: &mut Tally) -> Result<usize> {
        let mut at = 0;
        while let Some((used, push)) = parse_resp_push(&self.buf[at..])? {
            if let Some(body) = push.data {
                tally.event(&self.buf[at + body.start..at + body.end]);
            }
            at += used;
        }
        Ok(at)
    }

    /// Counts every complete NATS message in the buffer; returns the bytes used.
    async fn drain_nats(&mut self, tally: &mut Tally) -> Result<usize> {
        let mut at = 0;
        let mut pong = false;
        while let Some((used, item)) = parse_nats(&self.buf[at..])? {
            match item {
                Nats::Msg(body) => {
                    tally.event(&self.buf[at + body.start..at + body.end]);
                }
                Nats::Ping => pong = true,
                Nats::Other => {}
            }
            at += used;
        }
        if pong {
            self.conn.write_all(b"PONG\r\n").await?;
        }
        Ok(at)
    }
}

/// One item of the NATS protocol as a subscriber sees it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Nats {
    /// `MSG`, with the range of its payload.
    Msg(std::ops::Range<usize>),
    /// `PING`, to be answered with `PONG`.
    Ping,
    /// `+OK`, `PONG`, `INFO …`: nothing to do.
    Other,
}

/// Parses one item at the start of `buf`: (bytes used, item), `None` if it is not complete
/// yet, an error for `-ERR` or a `MSG` line without a valid size.
pub(super) fn parse_nats(buf: &[u8]) -> Result<Option<(usize, Nats)>> {
    let Some(eol) = memchr::memmem::find(buf, b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[..eol];
    if let Some(args) = line.strip_prefix(b"MSG ") {
        // MSG <subject> <sid> [reply-to] <#bytes>
        let len = args
            .rsplit(|b| *b == b' ')
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
            .ok_or_else(|| anyhow!("bad MSG line: {}", String::from_utf8_lossy(line)))?;
        let start = eol + 2;
        if buf.len() < start + len + 2 {
            return Ok(None);
        }
        return Ok(Some((start + len + 2, Nats::Msg(start..start + len))));
    }
    if line.starts_with(b"-ERR") {
        bail!("nats-server: {}", String::from_utf8_lossy(line));
    }
    let item = if line == b"PING" {
        Nats::Ping
    } else {
        Nats::Other
    };
    Ok(Some((eol + 2, item)))
}

/// One RESP2 push: its kind (`message`, `subscribe`, ...) and, for a message, its data.
#[derive(Debug)]
pub(super) struct Push {
    pub(super) kind: std::ops::Range<usize>,
    pub(super) data: Option<std::ops::Range<usize>>,
}

/// Parses one `*3` push (`[kind, channel, data|count]`) at the start of `buf`; `None` if it
/// is not complete yet.
pub(super) fn parse_resp_push(buf: &[u8]) -> Result<Option<(usize, Push)>> {
    pub(super) fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = memchr::memchr(b'\n', buf.get(at..)?)? + at;
        (end > at && buf[end - 1] == b'\r').then_some((at, end - 1))
    }
    pub(super) fn num(b: &[u8]) -> Result<usize> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("bad RESP length"))
    }
    let Some((s, e)) = line(buf, 0) else {
        return Ok(None);
    };
    if buf[s] == b'-' {
        bail!("redis: {}", String::from_utf8_lossy(&buf[s + 1..e]));
    }
    if buf[s] != b'*' || num(&buf[s + 1..e])? != 3 {
        bail!("unexpected RESP reply");
    }
    let mut at = e + 2;
    let mut parts: [Option<std::ops::Range<usize>>; 3] = [None, None, None];
    for part in &mut parts {
        let Some((s, e)) = line(buf, at) else {
            return Ok(None);
        };
        match buf[s] {
            b'$' => {
                let len = num(&buf[s + 1..e])?;
                let start = e + 2;
                if buf.len() < start + len + 2 {
                    return Ok(None);
                }
                *part = Some(start..start + len);
                at = start + len + 2;
            }
            b':' => at = e + 2,
            _ => bail!("unexpected RESP element"),
        }
    }
    let kind = parts[0]
        .clone()
        .ok_or_else(|| anyhow!("RESP push without a kind"))?;
    let data = (&buf[kind.clone()] == b"message")
        .then(|| parts[2].clone())
        .flatten();
    Ok(Some((at, Push { kind, data })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_pushes_parse_whole_or_not_at_all() {
        let mut wire = Vec::new();
        wire.extend_from_slice(b"*3\r\n$9\r\nsubscribe\r\n$3\r\na/b\r\n:1\r\n");
        wire.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$3\r\na/b\r\n$5\r\nhe\r\no\r\n");
        let (used, p) = parse_resp_push(&wire).expect("ok").expect("complete");
        assert_eq!(&wire[p.kind], b"subscribe");
        assert!(p.data.is_none());
        let rest = &wire[used..];
        let (used2, p) = parse_resp_push(rest).expect("ok").expect("complete");
        assert_eq!(&rest[p.data.expect("data")], b"he\r\no", "binary-safe bulk");
        assert_eq!(used + used2, wire.len());
        for cut in 0..rest.len() {
            assert!(
                parse_resp_push(&rest[..cut]).expect("ok").is_none(),
                "{cut}"
            );
        }
        assert!(parse_resp_push(b"-ERR nope\r\n").is_err());
    }

    #[test]
    fn nats_items_parse_whole_or_not_at_all() {
        let wire = b"MSG a/b 1 5\r\nhe\r\no\r\nPING\r\n+OK\r\n";
        let (used, item) = parse_nats(wire).expect("ok").expect("complete");
        assert_eq!(item, Nats::Msg(13..18));
        assert_eq!(&wire[13..18], b"he\r\no", "binary-safe payload");
        for cut in 0..used {
            assert!(parse_nats(&wire[..cut]).expect("ok").is_none(), "{cut}");
        }
        let (u2, item) = parse_nats(&wire[used..]).expect("ok").expect("complete");
        assert_eq!(item, Nats::Ping);
        let (_, item) = parse_nats(&wire[used + u2..])
            .expect("ok")
            .expect("complete");
        assert_eq!(item, Nats::Other);
        let (_, item) = parse_nats(b"MSG a/b 1 reply.to 2\r\n{}\r\n")
            .expect("ok")
            .expect("complete");
        assert_eq!(item, Nats::Msg(22..24), "with a reply subject");
        assert!(parse_nats(b"-ERR 'Authorization Violation'\r\n").is_err());
        assert!(parse_nats(b"MSG a/b 1 x\r\n").is_err(), "size not a number");
    }
}
