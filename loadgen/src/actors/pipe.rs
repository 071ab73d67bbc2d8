//! The thinnest proxy: each connection accepted gets a connection of its own to the upstream,
//! and bytes are copied both ways without being read (TCP_NODELAY on both sides). No framing,
//! no parsing, no shared state: what it adds to a round trip is what any proxy process adds on
//! this machine, two more hops through the kernel and two more wake-ups. `scripts/bench-calls`
//! measures a tool call through it beside the relay and the mod itself.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};

/// Each direction's copy buffer: large enough that an event stream moves in few reads.
const BUF: usize = 64 * 1024;
/// A failed accept (out of descriptors, say) is retried after this, not fatal: the pipes
/// already open keep going.
const RETRY_ACCEPT: Duration = Duration::from_millis(100);

/// Serves `listener` until the process is stopped: every connection is piped to `upstream`.
pub async fn serve(listener: TcpListener, upstream: SocketAddr) -> Result<()> {
    let said = Arc::new(Said::default());
    loop {
        let mut down = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                said.once_a_second(&format!("accepting: {e}; retrying every 100 ms"));
                tokio::time::sleep(RETRY_ACCEPT).await;
                continue;
            }
        };
        let said = said.clone();
        tokio::spawn(async move {
            let mut up = match TcpStream::connect(upstream).await {
                Ok(s) => s,
                Err(e) => {
                    said.once_a_second(&format!(
                        "cannot reach the upstream {upstream}: {e}; the client's connection is closed"
                    ));
                    return;
                }
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional_with_sizes(&mut down, &mut up, BUF, BUF).await;
        });
    }
}

/// Problems printed to stderr at most once a second, so a flood of failing clients cannot
/// flood the terminal.
#[derive(Debug)]
struct Said {
    start: Instant,
    /// Milliseconds since `start` of the last line printed, plus one (0: none yet).
    last_ms: AtomicU64,
}

impl Default for Said {
    fn default() -> Said {
        Said {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Said {
    fn once_a_second(&self, line: &str) {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last == 0 || now >= last + 1000)
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            eprintln!("gabp-loadgen pipe: {line}");
        }
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

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client_and_the_pipe_serves_on() {
        // A port nobody listens on: bound, then closed.
        let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = gone.local_addr().expect("addr");
        drop(gone);
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = front.local_addr().expect("addr");
        let pipe = tokio::spawn(serve(front, upstream));
        for _ in 0..3 {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            let mut buf = [0; 1];
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
                .await
                .expect("closed in time")
                .unwrap_or(0);
            assert_eq!(n, 0, "the client's connection is closed");
        }
        assert!(!pipe.is_finished(), "the pipe still serves");
        pipe.abort();
    }
}
