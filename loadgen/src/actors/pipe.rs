//! The thinnest proxy: each connection accepted gets a connection of its own to the upstream,
//! and bytes are copied both ways without being read (TCP_NODELAY on both sides). No framing,
//! no parsing, no shared state: what it adds to a round trip is what any proxy process adds on
//! this machine, two more hops through the kernel and two more wake-ups. `scripts/bench-calls`
//! measures a tool call through it beside the relay and the mod itself.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};

/// Each direction's copy buffer: large enough that an event stream moves in few reads.
const BUF: usize = 64 * 1024;

/// Serves `listener` until the process is stopped: every connection is piped to `upstream`.
pub async fn serve(listener: TcpListener, upstream: SocketAddr) -> Result<()> {
    loop {
        let (mut down, _) = listener.accept().await.context("accepting")?;
        tokio::spawn(async move {
            let Ok(mut up) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional_with_sizes(&mut down, &mut up, BUF, BUF).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_go_both_ways_unchanged_on_a_connection_of_their_own() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.expect("accept");
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = front.local_addr().expect("addr");
        tokio::spawn(serve(front, upstream));
        let mut a = TcpStream::connect(addr).await.expect("connect");
        let mut b = TcpStream::connect(addr).await.expect("connect");
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        a.write_all(&big).await.expect("write");
        b.write_all(b"second").await.expect("write");
        let mut back = vec![0; big.len()];
        a.read_exact(&mut back).await.expect("read");
        assert_eq!(back, big);
        let mut six = [0; 6];
        b.read_exact(&mut six).await.expect("read");
        assert_eq!(&six, b"second");
    }
}
