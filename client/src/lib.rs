//! A bridge-side GABP client: hello, requests matched by id, events buffered in arrival order.
//!
//! Tests use it to drive the relay the way an agent would, and can drop to raw bytes to play a
//! hostile or quirky peer. Bodies are parsed with serde_json here: this is a test and tooling
//! client, not the relay's hot path.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{encode_frame, message, GabpCodec};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

use gabp_rt::net::{Addr, BoxRead, BoxWrite, Conn};

/// How long a client waits for any one answer before giving up.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// A connected bridge.
pub struct Client {
    reader: FramedRead<BoxRead, GabpCodec>,
    writer: BoxWrite,
    events: VecDeque<Value>,
    wait: Duration,
    /// Write only `Content-Length` headers, as a widely used bridge does.
    pub length_only_headers: bool,
    /// Events arriving while a response is awaited are dropped, not buffered: a caller that
    /// is subscribed only to carry the event load (`gabp-loadgen call --subscribe`).
    pub discard_events: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("buffered_events", &self.events.len())
            .finish()
    }
}

/// A fresh request id.
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Client {
    /// Connects without saying hello.
    pub async fn connect(addr: &Addr) -> Result<Client> {
        let conn = Conn::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
        Ok(Client::from_conn(conn))
    }

    /// Wraps an established connection.
    pub fn from_conn(conn: Conn) -> Client {
        Client {
            reader: FramedRead::with_capacity(conn.read, GabpCodec::default(), 64 * 1024),
            writer: conn.write,
            events: VecDeque::new(),
            wait: DEFAULT_WAIT,
            length_only_headers: false,
            discard_events: false,
        }
    }

    /// Connects and completes `session/hello`, returning the welcome result.
    pub async fn connect_hello(addr: &Addr, token: &str) -> Result<(Client, Value)> {
        let mut c = Client::connect(addr).await?;
        let welcome = c.hello(token).await?;
        Ok((c, welcome))
    }

    /// Sets how long to wait for each answer.
    pub fn set_wait(&mut self, wait: Duration) {
        self.wait = wait;
    }

    /// Sends raw bytes exactly as given (for hostile-peer tests).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer.write_all(bytes).await?;
        self.writer.flush().await?;
        Ok(())
    }

    /// Frames and sends one body.
    pub async fn send_body(&mut self, body: &[u8]) -> Result<()> {
        let mut wire = BytesMut::new();
        if self.length_only_headers {
            wire.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            wire.extend_from_slice(body);
        } else {
            encode_frame(body, &mut wire);
        }
        self.send_raw(&wire).await
    }

    /// Reads the next frame body, or `None` when the peer closed.
    pub async fn next_frame(&mut self) -> Result<Option<Bytes>> {
        match tokio::time::timeout(self.wait, self.reader.next()).await {
            Err(_) => bail!("no frame within {:?}", self.wait),
            Ok(None) => Ok(None),
            Ok(Some(Ok(f))) => Ok(Some(f.body)),
            Ok(Some(Err(e))) => Err(anyhow!("framing: {e}")),
        }
    }

    /// Reads the next message as JSON, or `None` when the peer closed.
    pub async fn next_message(&mut self) -> Result<Option<Value>> {
        match self.next_frame().await? {
            None => Ok(None),
            Some(b) => Ok(Some(
                serde_json::from_slice(&b).context("peer sent invalid JSON")?,
            )),
        }
    }

    /// How many events arrived before a response and wait in the buffer (for order checks).
    pub fn buffered(&self) -> usize {
        self.events.len()
    }

    /// Waits for the response to `id`, buffering events that arrive first.
    pub async fn response_to(&mut self, id: &str) -> Result<Value> {
        loop {
            if self.discard_events {
                let body = self
                    .next_frame()
                    .await?
                    .ok_or_else(|| anyhow!("connection closed before response"))?;
                // Only a frame naming the id can be its response: events are skipped unparsed.
                if memchr::memmem::find(&body, id.as_bytes()).is_none() {
                    continue;
                }
                let msg: Value = serde_json::from_slice(&body).context("peer sent invalid JSON")?;
                if msg["type"] == "response" && msg["id"] == id {
                    return Ok(msg);
                }
                continue;
            }
            let msg = self
                .next_message()
                .await?
                .ok_or_else(|| anyhow!("connection closed before response"))?;
            match msg["type"].as_str() {
                Some("event") => self.events.push_back(msg),
                Some("response") if msg["id"] == id => return Ok(msg),
                _ => {}
            }
        }
    }

    /// Sends a request and returns the whole response message.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = new_id();
        self.send_body(&message::request(&id, method, params))
            .await?;
        self.response_to(&id).await
    }

    /// Sends a request and returns its result, or fails with the error it got.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let resp = self.request(method, params).await?;
        if resp.get("error").is_some_and(|e| !e.is_null()) {
            bail!("{method} failed: {}", resp["error"]);
        }
        Ok(resp["result"].clone())
    }

    /// Completes `session/hello`, returning the welcome result.
    pub async fn hello(&mut self, token: &str) -> Result<Value> {
        self.call(
            "session/hello",
            json!({"token": token, "bridgeVersion": "gabp-sim/0.1", "platform": "linux", "launchId": new_id()}),
        )
        .await
    }

    /// Subscribes to `channels`.
    pub async fn subscribe(&mut self, channels: &[&str]) -> Result<Value> {
        self.call("events/subscribe", json!({ "channels": channels }))
            .await
    }

    /// The next event, from the buffer or the wire.
    pub async fn next_event(&mut self) -> Result<Value> {
        if let Some(e) = self.events.pop_front() {
            return Ok(e);
        }
        loop {
            let msg = self
                .next_message()
                .await?
                .ok_or_else(|| anyhow!("connection closed while waiting for an event"))?;
            if msg["type"] == "event" {
                return Ok(msg);
            }
        }
    }

    /// Gives up the client: the framed reader (with anything it buffered), the writer, and
    /// events already read while waiting for responses.
    pub fn into_parts(self) -> (FramedRead<BoxRead, GabpCodec>, BoxWrite, VecDeque<Value>) {
        (self.reader, self.writer, self.events)
    }

    /// Closes the write side.
    pub async fn close(mut self) -> Result<()> {
        self.writer.shutdown().await?;
        Ok(())
    }
}
