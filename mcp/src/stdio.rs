//! `gabp-relay mcp`'s stdio transport: newline-delimited JSON-RPC, bounded per line.
//!
//! rmcp's own stdio transport drops unparsable lines and over-long lines silently (a log line
//! on stderr the client never sees). Here a line that is not JSON is answered with JSON-RPC's
//! parse error (-32700, id null), JSON that is not a JSON-RPC message with Invalid Request
//! (-32600), and a line longer than [`MAX_LINE`] with Invalid Request at once (the rest of the
//! line is skipped), so the client is never left waiting. Replies and rmcp's own messages share
//! one writer, each written whole.

use std::future::Future;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio_util::codec::{Decoder, FramedRead};

/// The longest line (one JSON-RPC message) accepted, in bytes.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// One input line, or the news that one was too long.
enum Line {
    Text(Bytes),
    TooLong,
}

/// Splits input at `\n`, never buffering more than `max` bytes of one line.
struct Lines {
    max: usize,
    discarding: bool,
    scanned: usize,
}

impl Decoder for Lines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        loop {
            let nl = memchr::memchr(b'\n', &buf[self.scanned..]).map(|i| i + self.scanned);
            self.scanned = 0;
            if self.discarding {
                match nl {
                    Some(i) => {
                        buf.advance(i + 1);
                        self.discarding = false;
                        continue;
                    }
                    None => {
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            return Ok(match nl {
                Some(i) if i <= self.max => Some(Line::Text(buf.split_to(i + 1).freeze())),
                Some(i) => {
                    buf.advance(i + 1);
                    Some(Line::TooLong)
                }
                None if buf.len() > self.max => {
                    // Answer now; the line's tail is skipped as it arrives.
                    buf.clear();
                    self.discarding = true;
                    Some(Line::TooLong)
                }
                None => {
                    self.scanned = buf.len();
                    None
                }
            });
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        let line = self.decode(buf)?;
        if line.is_none() {
            // An unterminated last line: nothing can answer it any more.
            buf.clear();
        }
        Ok(line)
    }
}

/// The transport over `read` and `write` (stdin and stdout).
pub struct LineTransport<R, W> {
    lines: FramedRead<R, Lines>,
    write: Arc<Mutex<W>>,
}

impl<R: AsyncRead, W> LineTransport<R, W> {
    /// A transport reading lines of at most `max` bytes.
    pub fn new(read: R, write: W, max: usize) -> Self {
        let codec = Lines {
            max,
            discarding: false,
            scanned: 0,
        };
        LineTransport {
            lines: FramedRead::new(read, codec),
            write: Arc::new(Mutex::new(write)),
        }
    }
}

async fn write_line<W: AsyncWrite + Unpin>(w: &Mutex<W>, mut line: Vec<u8>) -> std::io::Result<()> {
    line.push(b'\n');
    let mut w = w.lock().await;
    w.write_all(&line).await?;
    w.flush().await
}

/// An error reply to a message that could not be taken, written in its own task so that rmcp
/// cancelling `receive` never cuts a line in half.
fn reply_error<W: AsyncWrite + Unpin + Send + 'static>(
    w: &Arc<Mutex<W>>,
    id: Value,
    code: i64,
    msg: &str,
) {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": msg}});
    let w = w.clone();
    tokio::spawn(async move {
        let _ = write_line(&w, body.to_string().into_bytes()).await;
    });
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let w = self.write.clone();
        async move { write_line(&w, serde_json::to_vec(&item)?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let line = match self.lines.next().await? {
                Ok(Line::Text(l)) => l,
                Ok(Line::TooLong) => {
                    tracing::warn!(
                        limit = MAX_LINE,
                        "MCP: an incoming message was longer than the limit; answered with an error and skipped"
                    );
                    let msg = format!("Invalid Request: message longer than {MAX_LINE} bytes");
                    reply_error(&self.write, Value::Null, -32600, &msg);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "MCP: cannot read stdin");
                    return None;
                }
            };
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(text) {
                Ok(m) => match super::params::misshapen(&m) {
                    Some((id, why)) => reply_error(&self.write, id, -32602, &why),
                    None => return Some(m),
                },
                Err(_) => match serde_json::from_slice::<Value>(text) {
                    Err(_) => reply_error(&self.write, Value::Null, -32700, "Parse error"),
                    Ok(v) => {
                        let id = match &v["id"] {
                            id @ (Value::String(_) | Value::Number(_)) => id.clone(),
                            _ => Value::Null,
                        };
                        reply_error(&self.write, id, -32600, "Invalid Request");
                    }
                },
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
