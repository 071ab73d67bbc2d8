//! A simulated GABP mod: seeded, rate-controlled, and as quirky as real mod libraries.
//!
//! It runs on plain OS threads with blocking sockets rather than on tokio: fixed-rate emission
//! needs sleeps finer than tokio's 1 ms timer, or the mod's own scheduling would show up as
//! relay latency. Each event's payload carries `t`, its *scheduled* send time in wall-clock
//! nanoseconds, so latency is measured without coordinated omission.
//!
//! Methods: `session/hello` (token checked, -31000 on mismatch, -31001 for anything before it),
//! `tools/list`, `tools/call` (`sim/echo` returns its arguments or legacy `parameters`,
//! `sim/fail` errors, `sim/emit` emits `count` events on `channel` as fast as possible;
//! `sim/twice` answers twice and `sim/stray` also answers an id nobody sent, for fault tests),
//! `events/subscribe`, `events/unsubscribe`, `state/get`. Emission starts with the first
//! subscription when `autostart` is set; otherwise only `sim/emit` produces events.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use gabp_proto::{encode_frame, message, GabpCodec, Mode, Parser};
use serde_json::{json, Value};
use tokio_util::codec::Decoder;

use crate::events::{EventTemplate, Pace, Schedule};
use gabp_rt::clock::now_ns;
use gabp_rt::net::Addr;

/// How the simulated mod behaves.
#[derive(Debug, Clone)]
pub struct ModSimConfig {
    /// The token bridges must present.
    pub token: String,
    /// The channels advertised in the welcome.
    pub channels: Vec<String>,
    /// Events per second across all channels once streaming; `None` is as fast as possible.
    pub rate: Option<f64>,
    /// Target size of each event body in bytes (the padding is adjusted to reach it).
    pub payload_bytes: usize,
    /// Seed for payload contents and channel choice.
    pub seed: u64,
    /// Delay before answering `tools/call`.
    pub tool_latency: Duration,
    /// First seq per channel (a widely used mod library starts at 1).
    pub seq_start: u64,
    /// Write `"error": null` in successes, `"result": null` in errors and an event `timestamp`.
    pub quirks: bool,
    /// Start streaming at the first subscription.
    pub autostart: bool,
    /// Stop streaming after this many events per connection.
    pub max_events: Option<u64>,
    /// `app.name` in the welcome.
    pub app_name: String,
    /// At max rate, stay within a window of the slowest reader (see [`crate::events`]).
    pub pace: Option<Arc<Pace>>,
}

impl Default for ModSimConfig {
    fn default() -> Self {
        ModSimConfig {
            token: String::new(),
            channels: vec![
                "world/tick".into(),
                "player/move".into(),
                "chat/message".into(),
            ],
            rate: Some(1000.0),
            payload_bytes: 256,
            seed: 1,
            tool_latency: Duration::ZERO,
            seq_start: 0,
            quirks: false,
            autostart: true,
            max_events: None,
            app_name: "SimGame".into(),
            pace: None,
        }
    }
}

/// A running simulated mod.
#[derive(Debug, Clone)]
pub struct ModSim {
    addr: Addr,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    cfg: ModSimConfig,
    stopped: AtomicBool,
    conns: Mutex<Vec<Stream>>,
    accepted: AtomicUsize,
    emitted: AtomicU64,
    calls: AtomicU64,
}

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    // Delegation inside a `Write` impl: callers use `write_all`, which loops over this.
    #[allow(clippy::disallowed_methods)]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ModSim {
    /// Binds `addr` and starts accepting bridges (normally the relay) on a background thread.
    pub fn start(addr: &Addr, cfg: ModSimConfig) -> std::io::Result<ModSim> {
        let shared = Arc::new(Shared {
            cfg,
            stopped: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
            emitted: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        });
        let (bound, accept): (Addr, Box<dyn FnMut() -> std::io::Result<Stream> + Send>) = match addr
        {
            Addr::Tcp(a) => {
                let l = TcpListener::bind(a)?;
                let bound = Addr::Tcp(l.local_addr()?);
                (
                    bound,
                    Box::new(move || {
                        l.accept().map(|(s, _)| {
                            let _ = s.set_nodelay(true);
                            Stream::Tcp(s)
                        })
                    }),
                )
            }
            Addr::Unix(p) => {
                gabp_rt::net::remove_stale_socket(p)?;
                let l = UnixListener::bind(p)?;
                (
                    addr.clone(),
                    Box::new(move || l.accept().map(|(s, _)| Stream::Unix(s))),
                )
            }
        };
        let sh = shared.clone();
        thread::Builder::new()
            .name("modsim-accept".into())
            .spawn(move || {
                let mut accept = accept;
                while let Ok(stream) = accept() {
                    if sh.stopped.load(Ordering::Acquire) {
                        stream.shutdown();
                        break;
                    }
                    sh.accepted.fetch_add(1, Ordering::Relaxed);
                    if let Ok(c) = stream.try_clone() {
                        sh.conns.lock().expect("conn list lock").push(c);
                    }
                    let sh = sh.clone();
                    let _ = thread::Builder::new()
                        .name("modsim-conn".into())
                        .spawn(move || serve(sh, stream));
                }
            })?;
        Ok(ModSim {
            addr: bound,
            shared,
        })
    }

    /// Serves one already-connected peer on the current thread (the stdio transport uses this).
    pub fn serve_stdio(cfg: ModSimConfig) {
        let shared = Arc::new(Shared {
            cfg,
            stopped: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(1),
            emitted: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        });
        let out = Arc::new(Mutex::new(
            Box::new(std::io::stdout()) as Box<dyn Write + Send>
        ));
        run_session(shared, Box::new(std::io::stdin()), out);
    }

    /// The address the mod listens on.
    pub fn addr(&self) -> &Addr {
        &self.addr
    }

    /// How many connections it has accepted.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// How many events it has written.
    pub fn emitted(&self) -> u64 {
        self.shared.emitted.load(Ordering::Relaxed)
    }

    /// How many `tools/call` requests it has answered.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Drops every open connection, as a crashing game would.
    pub fn kill_connections(&self) {
        for c in self.shared.conns.lock().expect("conn list lock").drain(..) {
            c.shutdown();
        }
    }

    /// Stops accepting and drops every connection.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.kill_connections();
        // Wake the accept loop so it sees the flag.
        match &self.addr {
            Addr::Tcp(a) => drop(TcpStream::connect(a)),
            Addr::Unix(p) => {
                drop(UnixStream::connect(p));
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

type SharedWriter = Arc<Mutex<Box<dyn Write + Send>>>;

fn serve(shared: Arc<Shared>, stream: Stream) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let out: SharedWriter = Arc::new(Mutex::new(Box::new(write_half)));
    run_session(shared, Box::new(stream), out);
}

struct Session {
    subscribed: Mutex<HashSet<String>>,
    streaming: AtomicBool,
    closed: AtomicBool,
}

fn write_frames(out: &SharedWriter, wire: &[u8]) -> bool {
    // Flush: on the stdio transport stdout is line-buffered and a body has no newline.
    let mut w = out.lock().expect("writer lock");
    w.write_all(wire).is_ok() && w.flush().is_ok()
}

fn run_session(shared: Arc<Shared>, mut input: Box<dyn Read + Send>, out: SharedWriter) {
    let session = Arc::new(Session {
        subscribed: Mutex::new(HashSet::new()),
        streaming: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    let seqs: Arc<Vec<AtomicU64>> = Arc::new(
        shared
            .cfg
            .channels
            .iter()
            .map(|_| AtomicU64::new(shared.cfg.seq_start))
            .collect(),
    );
    let mut codec = GabpCodec::default();
    let mut parser = Parser::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut hello_ok = false;
    let mut chunk = vec![0u8; 64 * 1024];
    'read: loop {
        let n = match input.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        loop {
            let frame = match codec.decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => break 'read,
            };
            let view = match parser.parse(&frame.body, Mode::Tolerant) {
                Ok(v) => v,
                Err(e) => {
                    reply(&out, &shared.cfg, None, Err((-32600, e.to_string())));
                    continue;
                }
            };
            let id = view.id.as_deref().unwrap_or(message::NIL_ID).to_string();
            let method = view.method.as_deref().unwrap_or("").to_string();
            let params: Value = view
                .params
                .clone()
                .and_then(|span| serde_json::from_slice(&frame.body[span]).ok())
                .unwrap_or(Value::Null);
            if method == "session/hello" {
                if params["token"].as_str() == Some(shared.cfg.token.as_str()) {
                    hello_ok = true;
                    reply(&out, &shared.cfg, Some(&id), Ok(welcome(&shared.cfg)));
                } else {
                    reply(
                        &out,
                        &shared.cfg,
                        Some(&id),
                        Err((-31000, "invalid token".into())),
                    );
                }
                continue;
            }
            if !hello_ok {
                reply(
                    &out,
                    &shared.cfg,
                    Some(&id),
                    Err((-31001, "no session: send session/hello first".into())),
                );
                continue;
            }
            let answer = handle(&shared, &session, &seqs, &out, &method, &params);
            if method == "tools/call" && !shared.cfg.tool_latency.is_zero() {
                // Answer later without blocking the reader, as a game's main thread would.
                let (out, cfg, delay) = (out.clone(), shared.cfg.clone(), shared.cfg.tool_latency);
                thread::spawn(move || {
                    thread::sleep(delay);
                    reply(&out, &cfg, Some(&id), answer);
                });
            } else {
                // Misbehaviour on request, for fault tests: a response to an id nobody sent,
                // and a second answer to the same request.
                let tool = params["name"].as_str().unwrap_or_default();
                if method == "tools/call" && tool == "sim/stray" {
                    reply(
                        &out,
                        &shared.cfg,
                        Some(&uuid::Uuid::new_v4().to_string()),
                        Ok(json!({"stray": true})),
                    );
                }
                let twice = (method == "tools/call" && tool == "sim/twice").then(|| answer.clone());
                reply(&out, &shared.cfg, Some(&id), answer);
                if let Some(again) = twice {
                    reply(&out, &shared.cfg, Some(&id), again);
                }
            }
            if method == "events/subscribe"
                && shared.cfg.autostart
                && !session.streaming.swap(true, Ordering::AcqRel)
            {
                let (sh, se, sq, o) = (shared.clone(), session.clone(), seqs.clone(), out.clone());
                thread::Builder::new()
                    .name("modsim-emit".into())
                    .spawn(move || stream_events(&sh, &se, &sq, &o))
                    .ok();
            }
        }
    }
    session.closed.store(true, Ordering::Release);
}

fn welcome(cfg: &ModSimConfig) -> Value {
    json!({
        "agentId": "gabp-sim",
        "app": { "name": cfg.app_name, "version": "1.0.0" },
        "capabilities": {
            "methods": ["tools/list", "tools/call", "events/subscribe", "events/unsubscribe", "state/get"],
            "events": cfg.channels,
            "resources": [],
            "x-sim": { "seed": cfg.seed }
        },
        "schemaVersion": "1.0",
        "x-unknown-field": true
    })
}

fn reply(
    out: &SharedWriter,
    cfg: &ModSimConfig,
    id: Option<&str>,
    answer: Result<Value, (i64, String)>,
) {
    let id = id.unwrap_or(message::NIL_ID);
    let body = match answer {
        Ok(result) if cfg.quirks => {
            json!({"v": "gabp/1", "id": id, "type": "response", "result": result, "error": null})
        }
        Ok(result) => json!({"v": "gabp/1", "id": id, "type": "response", "result": result}),
        Err((code, msg)) if cfg.quirks => {
            json!({"v": "gabp/1", "id": id, "type": "response", "result": null, "error": {"code": code, "message": msg}})
        }
        Err((code, msg)) => {
            json!({"v": "gabp/1", "id": id, "type": "response", "error": {"code": code, "message": msg}})
        }
    };
    let mut wire = BytesMut::new();
    encode_frame(&message::to_ascii_json(&body), &mut wire);
    write_frames(out, &wire);
}

fn handle(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    seqs: &Arc<Vec<AtomicU64>>,
    out: &SharedWriter,
    method: &str,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let channel_list = || -> Vec<String> {
        params["channels"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    match method {
        "tools/list" => Ok(json!({"tools": [
            {"name": "sim/echo", "title": "Echo", "description": "Returns its arguments", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
            {"name": "sim/fail", "title": "Fail", "description": "Always fails", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
            {"name": "sim/emit", "title": "Emit", "description": "Emits count events on channel", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}}
        ]})),
        "tools/call" => {
            shared.calls.fetch_add(1, Ordering::Relaxed);
            let args = if params.get("arguments").is_some() {
                &params["arguments"]
            } else {
                &params["parameters"]
            };
            match params["name"].as_str() {
                Some("sim/echo" | "sim/twice" | "sim/stray") => Ok(json!({"echo": args})),
                Some("sim/fail") => Err((-32000, "tool failed on purpose".into())),
                Some("sim/emit") => {
                    let count = args["count"].as_u64().unwrap_or(1);
                    let channel = args["channel"].as_str().unwrap_or("world/tick").to_string();
                    let idx = shared.cfg.channels.iter().position(|c| *c == channel);
                    let mut template = EventTemplate::new(
                        std::slice::from_ref(&channel),
                        shared.cfg.payload_bytes,
                        shared.cfg.seed,
                        shared.cfg.quirks,
                    );
                    let mut wire = BytesMut::with_capacity(256 * 1024);
                    for _ in 0..count {
                        let seq = idx.map_or(0, |i| seqs[i].fetch_add(1, Ordering::Relaxed));
                        template.write_frame(0, seq, now_ns(), &mut wire);
                        if wire.len() > 192 * 1024 {
                            if !write_frames(out, &wire) {
                                break;
                            }
                            wire.clear();
                        }
                    }
                    write_frames(out, &wire);
                    shared.emitted.fetch_add(count, Ordering::Relaxed);
                    Ok(json!({"emitted": count}))
                }
                _ => Err((-32601, "unknown tool".into())),
            }
        }
        "events/subscribe" => {
            let chans = channel_list();
            session
                .subscribed
                .lock()
                .expect("subscription lock")
                .extend(chans.iter().cloned());
            Ok(json!({"subscribed": chans}))
        }
        "events/unsubscribe" => {
            let chans = channel_list();
            let mut subs = session.subscribed.lock().expect("subscription lock");
            for c in &chans {
                subs.remove(c);
            }
            Ok(json!({"unsubscribed": chans}))
        }
        // The sim never opens an attention item: nothing current, an ack finds nothing to ack.
        "attention/current" => Ok(json!({ "attention": null })),
        "attention/ack" => Ok(
            json!({"acknowledged": false, "attentionId": params["attentionId"], "currentAttention": null}),
        ),
        "state/get" => Ok(
            json!({"state": {"tick": shared.emitted.load(Ordering::Relaxed)}, "timestamp": now_ns() / 1_000_000_000}),
        ),
        _ => Err((-32601, "method not found".into())),
    }
}

fn stream_events(shared: &Shared, session: &Session, seqs: &[AtomicU64], out: &SharedWriter) {
    let cfg = &shared.cfg;
    if cfg.channels.is_empty() {
        return;
    }
    let mut template = EventTemplate::new(&cfg.channels, cfg.payload_bytes, cfg.seed, cfg.quirks);
    let mut schedule = Schedule::new(
        cfg.rate,
        cfg.max_events.unwrap_or(u64::MAX),
        cfg.pace.clone(),
    );
    let mut wire = BytesMut::with_capacity(256 * 1024);
    let stop = || session.closed.load(Ordering::Acquire) || shared.stopped.load(Ordering::Acquire);
    let mut emitted: u64 = 0;
    while let Some(due) = schedule.next(emitted, &stop) {
        wire.clear();
        let subs = session
            .subscribed
            .lock()
            .expect("subscription lock")
            .clone();
        let n = due.end - due.start;
        for i in due {
            let ch = template.next_channel();
            let seq = seqs[ch].fetch_add(1, Ordering::Relaxed);
            if subs.contains(&cfg.channels[ch]) {
                template.write_frame(ch, seq, schedule.stamp(i), &mut wire);
            }
        }
        emitted += n;
        if !wire.is_empty() && !write_frames(out, &wire) {
            break;
        }
        shared.emitted.fetch_add(n, Ordering::Relaxed);
    }
}
