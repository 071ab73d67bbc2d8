//! The MCP front's GABP connection to a relay route: an ordinary bridge (hello with the route's
//! token, requests matched by id, events subscribed), so every relay limit, the recording and the
//! metrics apply to it. Many MCP requests share it at once; events go to the [`Buffer`], and
//! `relay/session` notices (a mod restart) are announced on a watch channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{encode_frame, message, GabpCodec};
use gabp_rt::net::{Addr, Conn};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::codec::FramedRead;

use super::events::Buffer;

/// How long one request may wait for its answer (the relay's own `--request-timeout` answers
/// first when it is shorter).
pub const REQUEST_WAIT: Duration = Duration::from_secs(120);

/// Where the route is and how to get in.
#[derive(Clone)]
pub struct Target {
    /// The route's bridge listener.
    pub addr: Addr,
    /// The route's bridge token (never logged).
    pub token: String,
    /// This client's name, sent in the hello's `clientInfo`.
    pub name: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("name", &self.name)
            .finish()
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum CallError {
    /// The relay or the mod answered with a GABP error.
    Gabp {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    /// No answer: the connection is gone or the wait ran out.
    Link(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Gabp { code, message, .. } => write!(f, "GABP error {code}: {message}"),
            CallError::Link(m) => f.write_str(m),
        }
    }
}

/// A live bridge connection.
pub struct Link {
    out: mpsc::Sender<Bytes>,
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>,
    closed: Arc<AtomicBool>,
    /// The welcome this bridge got (the mod's, with the relay's extension).
    pub welcome: Value,
    /// The route name from the welcome.
    pub route: String,
    /// Events delivered by the subscription.
    pub events: Arc<Buffer>,
    /// Counts mod sessions started since attaching (a restart bumps it).
    pub restarts: watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The front's connection slot (HTTP: one of the session cap), freed with the link.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for Link {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    id: Option<&'a str>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    payload: Option<Value>,
}

impl Link {
    /// Connects, says hello and subscribes to every channel the mod advertises; events are
    /// buffered up to `buffer_bytes`, and `slot` is held as long as the link.
    pub async fn connect(
        t: &Target,
        buffer_bytes: usize,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Arc<Link>> {
        let conn = Conn::connect(&t.addr)
            .await
            .with_context(|| format!("cannot connect to the relay at {}", t.addr))?;
        let pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Buffer::new(buffer_bytes));
        // Requests waiting for the writer: bounded, a full queue makes the next request wait.
        let (out, mut out_rx) = mpsc::channel::<Bytes>(1024);
        let (restart_tx, restarts) = watch::channel(0u64);
        let mut writer = conn.write;
        let writer_closed = closed.clone();
        let write_task = tokio::spawn(async move {
            while let Some(first) = out_rx.recv().await {
                // Batch what is queued into one write.
                let mut buf = BytesMut::from(&first[..]);
                while let Ok(more) = out_rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
                if writer.write_all(&buf).await.is_err() || writer.flush().await.is_err() {
                    break;
                }
            }
            writer_closed.store(true, Ordering::Release);
        });
        let mut reader = FramedRead::with_capacity(conn.read, GabpCodec::default(), 64 * 1024);
        let (rp, rc, rev) = (pending.clone(), closed.clone(), events.clone());
        let read_task = tokio::spawn(async move {
            while let Some(Ok(frame)) = reader.next().await {
                let body = frame.body;
                let Ok(msg) = serde_json::from_slice::<Incoming>(&body) else {
                    continue;
                };
                match msg.kind {
                    "response" => {
                        let waiter = msg.id.and_then(|id| rp.lock().remove(id));
                        if let (Some(w), Ok(v)) = (waiter, serde_json::from_slice(&body)) {
                            let _ = w.send(v);
                        }
                    }
                    "event" => {
                        let (Some(ch), Some(seq), Some(p)) = (msg.channel, msg.seq, msg.payload)
                        else {
                            continue;
                        };
                        if ch == "relay/session" {
                            if p["state"] == "started" {
                                if let Some(s) = p["sessionId"].as_str() {
                                    rev.new_session(s);
                                }
                                restart_tx.send_modify(|n| *n += 1);
                            }
                            continue;
                        }
                        rev.push(&ch, seq, p.to_string().into());
                    }
                    _ => {}
                }
            }
            rc.store(true, Ordering::Release);
            // Every waiter learns at once that no answer will come.
            rp.lock().clear();
        });
        let mut link = Link {
            out,
            pending,
            closed,
            welcome: Value::Null,
            route: String::new(),
            events,
            restarts,
            tasks: vec![write_task, read_task],
            _slot: slot,
        };
        let platform = match std::env::consts::OS {
            "macos" => "macos",
            "windows" => "windows",
            _ => "linux",
        };
        let hello = json!({
            "token": t.token,
            "bridgeVersion": format!("gabp-relay-mcp/{}", crate::route::VERSION),
            "platform": platform,
            "launchId": uuid::Uuid::new_v4().to_string(),
            "clientInfo": { "name": t.name, "version": crate::route::VERSION },
        });
        let welcome = match link.request("session/hello", hello).await {
            Ok(w) => w,
            Err(CallError::Gabp { message, .. }) => bail!("the relay refused the hello: {message}"),
            Err(e) => bail!("no welcome from the relay: {e}"),
        };
        let relay = &welcome["capabilities"]["extensions"]["relay"];
        link.route = relay["route"].as_str().unwrap_or("default").to_string();
        if let Some(s) = relay["sessionId"].as_str() {
            link.events.new_session(s);
        }
        link.welcome = welcome;
        let channels = link.channels();
        if !channels.is_empty() {
            link.request("events/subscribe", json!({ "channels": channels }))
                .await
                .map_err(|e| anyhow!("cannot subscribe to the mod's channels: {e}"))?;
        }
        Ok(Arc::new(link))
    }

    /// The channels the mod advertised in its welcome.
    pub fn channels(&self) -> Vec<String> {
        gabp_proto::message::advertised_channels(&self.welcome)
    }

    /// Whether the connection to the relay is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sends a request and waits for its result.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, CallError> {
        if self.is_closed() {
            return Err(CallError::Link(
                "the connection to the relay is closed".into(),
            ));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id.clone(), tx);
        let mut wire = BytesMut::new();
        encode_frame(&message::request(&id, method, params), &mut wire);
        if self.out.send(wire.freeze()).await.is_err() {
            self.pending.lock().remove(&id);
            return Err(CallError::Link(
                "the connection to the relay is closed".into(),
            ));
        }
        let answer = match tokio::time::timeout(REQUEST_WAIT, rx).await {
            Ok(Ok(v)) => v,
            Ok(Err(_)) => {
                return Err(CallError::Link(
                    "the connection to the relay closed before the answer; the request may or may not have taken effect".into(),
                ))
            }
            Err(_) => {
                self.pending.lock().remove(&id);
                return Err(CallError::Link(
                    "no answer in time; the request may or may not have taken effect".into(),
                ));
            }
        };
        match answer.get("error") {
            Some(e) if !e.is_null() => Err(CallError::Gabp {
                code: e["code"].as_i64().unwrap_or(-32603),
                message: e["message"].as_str().unwrap_or("error").to_string(),
                data: e.get("data").cloned(),
            }),
            _ => Ok(answer.get("result").cloned().unwrap_or(Value::Null)),
        }
    }
}
