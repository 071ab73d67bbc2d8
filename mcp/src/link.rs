//! The MCP front's GABP connection to a relay route: an ordinary bridge (hello with the route's
//! token, requests matched by id, events subscribed), so every relay limit, the recording and the
//! metrics apply to it. Many MCP requests share it at once; events go to the [`Buffer`], and
//! a new mod session is announced on a watch channel. Both outlive one connection
//! ([`Shared`]): a link that was cut is replaced by one that resumes where it left off (the
//! relay's `relay.resume`), so the buffer has every event the relay still holds, in order.
//! A request larger than the relay accepts (`--max-body`, from the welcome) is refused here,
//! never sent: the relay would close the connection for it.

use std::collections::HashMap;
use std::path::PathBuf;
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

/// The largest request body a relay that does not say its `--max-body` accepts (the default).
const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Where the route is and how to get in.
#[derive(Clone)]
pub struct Target {
    /// The route's bridge listener.
    pub addr: Addr,
    /// The route's bridge token (never logged).
    pub token: String,
    /// This client's name, sent in the hello's `clientInfo`.
    pub name: String,
    /// The discovery file `addr` and `token` came from, read again for each new connection
    /// (a restarted relay listens on a new port, with a new token unless it was fixed).
    pub file: Option<PathBuf>,
}

impl Target {
    /// This target with the address and token its discovery file holds now.
    fn current(&self) -> Result<Target> {
        let mut t = self.clone();
        if let Some(f) = &self.file {
            (t.addr, t.token) = super::read_bridge_file(f)?;
        }
        Ok(t)
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("name", &self.name)
            .field("file", &self.file)
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
    /// Refused before it was sent (it cannot have taken effect).
    NotSent(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Gabp { code, message, .. } => write!(f, "GABP error {code}: {message}"),
            CallError::Link(m) | CallError::NotSent(m) => f.write_str(m),
        }
    }
}

/// What a front keeps across its connections to the relay.
pub struct Shared {
    /// Events delivered by the subscription.
    pub events: Buffer,
    /// Counts mod sessions started since attaching (a restart, or a reconnection that finds
    /// another session, bumps it).
    pub restarts: watch::Sender<u64>,
}

impl Shared {
    /// An empty event buffer of `buffer_bytes`, no session yet.
    pub fn new(buffer_bytes: usize) -> Arc<Shared> {
        Arc::new(Shared {
            events: Buffer::new(buffer_bytes),
            restarts: watch::channel(0).0,
        })
    }

    /// Makes `session` the current one; announces it when it replaces another.
    fn enter_session(&self, session: &str) {
        if self.events.new_session(session) {
            self.restarts.send_modify(|n| *n += 1);
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
    /// The largest request body the relay accepts.
    max_body: usize,
    /// The event buffer and restart count, shared with the links before and after this one.
    pub shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
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

/// What a connection's hello asks for.
enum Hello {
    /// A bridge, resuming from this point when given one.
    Bridge(Option<Value>),
    /// A relay-only bridge (`withoutMod`): only to read the route's current session.
    Probe,
}

impl Link {
    /// Connects, says hello and subscribes to every channel the mod advertises, delivering
    /// events into `shared`. After `before` (a link that was cut) it resumes instead: every
    /// channel `shared` has seen continues from its last seq, so nothing the relay still holds
    /// is missed or repeated; when the mod's session changed meanwhile (a restarted relay or
    /// mod), the new session is resumed from its first event, which a relay-only probe of
    /// the route names first.
    pub async fn connect(
        t: &Target,
        shared: Arc<Shared>,
        before: Option<&Link>,
    ) -> Result<Arc<Link>> {
        let t = t.current()?;
        let mut resume = before.and_then(|b| b.resume_point());
        if let Some(r) = &mut resume {
            let probe = Self::open(&t, shared.clone(), Hello::Probe).await?;
            let now = probe.welcome["capabilities"]["extensions"]["relay"]["sessionId"]
                .as_str()
                .map(String::from);
            if let Some(now) = now.filter(|n| r["session"].as_str() != Some(n)) {
                let channels: serde_json::Map<String, Value> = probe
                    .channels()
                    .into_iter()
                    .map(|c| (c, json!(-1)))
                    .collect();
                *r = json!({ "session": now, "channels": channels });
            }
        }
        let link = Self::open(&t, shared, Hello::Bridge(resume)).await?;
        Ok(Arc::new(link))
    }

    /// One connection and its hello: a bridge (resuming when given a resume point, else
    /// subscribing to every advertised channel), or a relay-only probe that subscribes to
    /// nothing and leaves `shared` alone.
    async fn open(t: &Target, shared: Arc<Shared>, kind: Hello) -> Result<Link> {
        let probe = matches!(kind, Hello::Probe);
        let conn = Conn::connect(&t.addr)
            .await
            .with_context(|| format!("cannot connect to the relay at {}", t.addr))?;
        let pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        // Requests waiting for the writer: bounded, a full queue makes the next request wait.
        let (out, mut out_rx) = mpsc::channel::<Bytes>(1024);
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
        let (rp, rc, rs) = (pending.clone(), closed.clone(), shared.clone());
        let read_task = tokio::spawn(async move {
            while let Some(Ok(frame)) = reader.next().await {
                let body = frame.body;
                let Ok(msg) = serde_json::from_slice::<Incoming>(&body) else {
                    continue;
                };
                match msg.kind {
                    "response" => {
                        let waiter = msg.id.and_then(|id| rp.lock().remove(id));
                        if let (Some(w), Ok(v)) = (waiter, serde_json::from_slice::<Value>(&body)) {
                            // The welcome's session is entered here, before any event read
                            // after it (a resume's history) reaches the buffer.
                            let relay = &v["result"]["capabilities"]["extensions"]["relay"];
                            if let (Some(s), false) = (relay["sessionId"].as_str(), probe) {
                                rs.enter_session(s);
                            }
                            let _ = w.send(v);
                        }
                    }
                    "event" if probe => {}
                    "event" => {
                        let (Some(ch), Some(seq), Some(p)) = (msg.channel, msg.seq, msg.payload)
                        else {
                            continue;
                        };
                        if ch == "relay/session" {
                            if p["state"] == "started" {
                                if let Some(s) = p["sessionId"].as_str() {
                                    rs.enter_session(s);
                                }
                            }
                            continue;
                        }
                        rs.events.push(&ch, seq, p.to_string().into());
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
            max_body: DEFAULT_MAX_BODY,
            shared,
            tasks: vec![write_task, read_task],
        };
        let platform = match std::env::consts::OS {
            "macos" => "macos",
            "windows" => "windows",
            _ => "linux",
        };
        let mut hello = json!({
            "token": t.token,
            "bridgeVersion": format!("gabp-relay-mcp/{}", gabp_engine::route::VERSION),
            "platform": platform,
            "launchId": uuid::Uuid::new_v4().to_string(),
            "clientInfo": { "name": t.name, "version": gabp_engine::route::VERSION },
        });
        let resume = match kind {
            Hello::Probe => {
                hello["relay"] = json!({ "withoutMod": true });
                None
            }
            Hello::Bridge(r) => r,
        };
        let resumed: Vec<String> = match resume {
            Some(resume) => {
                let names = resume["channels"]
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default();
                hello["relay"] = json!({ "resume": resume });
                names
            }
            None => Vec::new(),
        };
        let welcome = match link.request("session/hello", hello).await {
            Ok(w) => w,
            Err(CallError::Gabp { message, .. }) => bail!("the relay refused the hello: {message}"),
            Err(e) => bail!("no welcome from the relay: {e}"),
        };
        let relay = &welcome["capabilities"]["extensions"]["relay"];
        link.route = relay["route"].as_str().unwrap_or("default").to_string();
        link.max_body = relay["maxBodyBytes"]
            .as_u64()
            .map_or(DEFAULT_MAX_BODY, |n| n as usize);
        link.welcome = welcome;
        if probe {
            return Ok(link);
        }
        // A resume subscribed its channels already.
        let channels: Vec<String> = link
            .channels()
            .into_iter()
            .filter(|c| !resumed.contains(c))
            .collect();
        if !channels.is_empty() {
            link.request("events/subscribe", json!({ "channels": channels }))
                .await
                .map_err(|e| anyhow!("cannot subscribe to the mod's channels: {e}"))?;
        }
        Ok(link)
    }

    /// The `relay.resume` that continues this link's subscription: the buffer's session, and
    /// per channel subscribed the last seq the buffer got in it (`-1`: none yet); `None`
    /// before a session.
    fn resume_point(&self) -> Option<Value> {
        let (session, last) = self.shared.events.last_seqs()?;
        let channels: serde_json::Map<String, Value> = self
            .channels()
            .into_iter()
            .map(|c| {
                let seq = last.get(&c).map_or(json!(-1), |s| json!(s));
                (c, seq)
            })
            .collect();
        Some(json!({ "session": session, "channels": channels }))
    }

    /// The channels the mod advertised in its welcome.
    pub fn channels(&self) -> Vec<String> {
        gabp_proto::message::advertised_channels(&self.welcome)
    }

    /// Whether the relay's welcome names `method` among its own (`relay.methods`).
    pub fn relay_offers(&self, method: &str) -> bool {
        self.welcome["capabilities"]["extensions"]["relay"]["methods"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == method))
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
        let body = message::request(&id, method, params);
        if body.len() > self.max_body {
            return Err(CallError::NotSent(format!(
                "the request is {} bytes, over the relay's --max-body of {} bytes; it was not sent",
                body.len(),
                self.max_body
            )));
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id.clone(), tx);
        let mut wire = BytesMut::new();
        encode_frame(&body, &mut wire);
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
