//! One connection to the simulated mod: the handshake, the methods it answers (with their
//! latency and quirks), and the event stream it paces. Runs on the connection's own thread and
//! must not touch the listener (that is [`super`]'s).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::BytesMut;
use gabp_proto::{encode_frame, message, GabpCodec, Mode, Parser};
use gabp_rt::clock::now_ns;
use serde_json::{json, Value};
use tokio_util::codec::Decoder;

use super::{ModSimConfig, Shared, Stream};
use crate::events::{EventTemplate, Schedule};

/// Where a session writes its frames (shared with the emitting thread).
pub(super) type SharedWriter = Arc<Mutex<Box<dyn Write + Send>>>;

/// Serves one accepted connection on the current thread.
pub(super) fn serve(shared: Arc<Shared>, stream: Stream) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let out: SharedWriter = Arc::new(Mutex::new(Box::new(write_half)));
    run_session(shared, Box::new(stream), out);
}

pub(super) struct Session {
    pub(super) subscribed: Mutex<HashSet<String>>,
    pub(super) streaming: AtomicBool,
    pub(super) closed: AtomicBool,
}

/// Writes whole frames: in one write under the writer lock, or, with
/// [`Defects::split_writes`](super::Defects), each header and each body in a write of its own
/// with the lock let go between them (another thread's frame can then land in the middle).
pub(super) fn write_frames(out: &SharedWriter, wire: &[u8], split: bool) -> bool {
    // Flush: on the stdio transport stdout is line-buffered and a body has no newline.
    let write = |bytes: &[u8]| {
        let mut w = out.lock().expect("writer lock");
        w.write_all(bytes).is_ok() && w.flush().is_ok()
    };
    if !split {
        return write(wire);
    }
    let mut rest = wire;
    while !rest.is_empty() {
        let Some(head) = memchr::memmem::find(rest, b"\r\n\r\n").map(|i| i + 4) else {
            return write(rest);
        };
        // Frames here are the sim's own, one per reply, so a length it cannot read (counted in
        // characters) means the body is the rest.
        let end = GabpCodec::default()
            .extent(rest)
            .ok()
            .flatten()
            .map_or(rest.len(), |(h, len)| (h + len).min(rest.len()));
        if !write(&rest[..head]) {
            return false;
        }
        // Long enough for a thread writing a frame of its own to take the lock meanwhile.
        thread::sleep(std::time::Duration::from_micros(100));
        if !write(&rest[head..end.max(head)]) {
            return false;
        }
        rest = &rest[end.max(head)..];
    }
    true
}

/// The frame of the body at the start of `buf` with its `Content-Length` counted in
/// characters ([`Defects::count_chars`](super::Defects)): `None` until that many characters
/// (the last one whole) have arrived. An unreadable header is an error, as the codec's is.
fn decode_counting_chars(buf: &mut BytesMut) -> Result<Option<bytes::Bytes>, ()> {
    let Some(head) = memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4) else {
        return if buf.len() > gabp_proto::DEFAULT_MAX_HEADER {
            Err(())
        } else {
            Ok(None)
        };
    };
    let header = std::str::from_utf8(&buf[..head]).map_err(|_| ())?;
    let chars: usize = header
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .ok_or(())?;
    // Walk the body character by character (a lead byte starts one), as a reader decoding
    // UTF-8 and counting what it decoded would.
    let mut seen = 0;
    let mut end = head;
    while seen < chars {
        let Some(&b) = buf.get(end) else {
            return Ok(None);
        };
        let len = match b {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        if buf.len() < end + len {
            return Ok(None);
        }
        end += len;
        seen += 1;
    }
    let mut frame = buf.split_to(end);
    Ok(Some(frame.split_off(head).freeze()))
}

/// The frame of `body` as this sim writes it: `Content-Length` in bytes, or in characters
/// with [`Defects::count_chars`](super::Defects).
fn frame_of(cfg: &ModSimConfig, body: &[u8]) -> BytesMut {
    let mut wire = BytesMut::new();
    if cfg.defects.count_chars {
        let chars = String::from_utf8_lossy(body).chars().count();
        wire.extend_from_slice(format!("Content-Length: {chars}\r\n\r\n").as_bytes());
        wire.extend_from_slice(body);
    } else {
        encode_frame(body, &mut wire);
    }
    wire
}

pub(super) fn run_session(shared: Arc<Shared>, mut input: Box<dyn Read + Send>, out: SharedWriter) {
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
            let decoded = if shared.cfg.defects.count_chars {
                decode_counting_chars(&mut buf).map(|b| b.map(|body| gabp_proto::Frame { body }))
            } else {
                codec.decode(&mut buf).map_err(|_| ())
            };
            let frame = match decoded {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(()) => break 'read,
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
            let tool = params["name"].as_str().unwrap_or_default();
            // The echo tools answer with the request's own argument text.
            let echoed = (method == "tools/call" && ECHO_TOOLS.contains(&tool))
                .then(|| raw_arguments(&frame.body, view.params.clone()))
                .flatten();
            let mut delay = if method == "tools/call" {
                shared.cfg.tool_latency
            } else {
                std::time::Duration::ZERO
            };
            if shared.cfg.defects.crash_on_drop {
                delay = delay.max(super::CRASH_WINDOW);
            }
            if !delay.is_zero() {
                // Answer later without blocking the reader, as a game's main thread would.
                let (out, sh, se) = (out.clone(), shared.clone(), session.clone());
                thread::spawn(move || {
                    thread::sleep(delay);
                    if sh.cfg.defects.crash_on_drop && se.closed.load(Ordering::Acquire) {
                        // A widely used mod library throws here ("connection is not active")
                        // and takes the game's mod down with it.
                        sh.crash();
                        return;
                    }
                    reply_answer(&out, &sh.cfg, &id, answer, echoed.as_deref());
                });
            } else {
                // Misbehaviour on request, for fault tests: a response to an id nobody sent,
                // and a second answer to the same request.
                if method == "tools/call" && tool == "sim/stray" {
                    reply(
                        &out,
                        &shared.cfg,
                        Some(&uuid::Uuid::new_v4().to_string()),
                        Ok(json!({"stray": true})),
                    );
                }
                let twice = (method == "tools/call" && tool == "sim/twice").then(|| answer.clone());
                reply_answer(&out, &shared.cfg, &id, answer, echoed.as_deref());
                if let Some(again) = twice {
                    reply_answer(&out, &shared.cfg, &id, again, echoed.as_deref());
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

pub(super) fn welcome(cfg: &ModSimConfig) -> Value {
    let mut welcome = json!({
        "agentId": "gabp-sim",
        "app": { "name": cfg.app_name, "version": "1.0.0" },
        "capabilities": {
            "methods": ["tools/list", "tools/call", "events/subscribe", "events/unsubscribe", "state/get", "attention/current", "attention/ack"],
            "events": cfg.channels,
            "resources": []
        },
        "schemaVersion": "1.0"
    });
    if cfg.quirks {
        // Members the schema does not name, as libraries add them: they pass through.
        welcome["capabilities"]["x-sim"] = json!({ "seed": cfg.seed });
        welcome["x-unknown-field"] = json!(true);
    }
    welcome
}

/// The tools that answer `{"echo": <their arguments>}`.
const ECHO_TOOLS: &[&str] = &["sim/echo", "sim/twice", "sim/stray", "sim/hostile"];

/// The text of a `tools/call`'s `arguments` (or legacy `parameters`, as [`handle`] reads them)
/// in `body`, non-ASCII escaped as GABP peers expect: what an echo gives back, exactly as sent
/// (a parsed `Value` would round an integer beyond a double's precision).
fn raw_arguments(body: &[u8], params: Option<std::ops::Range<usize>>) -> Option<String> {
    let obj = body.get(params?)?;
    let span = gabp_proto::scan::member_value(obj, "arguments")
        .or_else(|| gabp_proto::scan::member_value(obj, "parameters"))?;
    let text = std::str::from_utf8(&obj[span]).ok()?;
    Some(message::ascii_escaped(text.to_string()))
}

/// [`reply`], except that an echo's result is written around the request's own argument text.
fn reply_answer(
    out: &SharedWriter,
    cfg: &ModSimConfig,
    id: &str,
    answer: Result<Value, (i64, String)>,
    echoed: Option<&str>,
) {
    let (Ok(_), Some(args)) = (&answer, echoed) else {
        return reply(out, cfg, Some(id), answer);
    };
    let id = String::from_utf8(message::to_ascii_json(&Value::from(id))).expect("ASCII");
    let quirk = if cfg.quirks || cfg.defects.both_result_and_error {
        r#","error":null"#
    } else {
        ""
    };
    let body = format!(
        r#"{{"v":"gabp/1","id":{id},"type":"response","result":{{"echo":{args}}}{quirk}}}"#
    );
    write_frames(
        out,
        &frame_of(cfg, body.as_bytes()),
        cfg.defects.split_writes,
    );
}

pub(super) fn reply(
    out: &SharedWriter,
    cfg: &ModSimConfig,
    id: Option<&str>,
    answer: Result<Value, (i64, String)>,
) {
    let id = id.unwrap_or(message::NIL_ID);
    let both = cfg.quirks || cfg.defects.both_result_and_error;
    let body = match answer {
        Ok(result) if both => {
            json!({"v": "gabp/1", "id": id, "type": "response", "result": result, "error": null})
        }
        Ok(result) => json!({"v": "gabp/1", "id": id, "type": "response", "result": result}),
        Err((code, msg)) if both => {
            json!({"v": "gabp/1", "id": id, "type": "response", "result": null, "error": {"code": code, "message": msg}})
        }
        Err((code, msg)) => {
            json!({"v": "gabp/1", "id": id, "type": "response", "error": {"code": code, "message": msg}})
        }
    };
    // A library counting characters writes its non-ASCII raw: only then do the counts differ.
    let json = if cfg.defects.count_chars {
        serde_json::to_vec(&body).expect("a Value serializes")
    } else {
        message::to_ascii_json(&body)
    };
    write_frames(out, &frame_of(cfg, &json), cfg.defects.split_writes);
}

pub(super) fn handle(
    shared: &Arc<Shared>,
    session: &Arc<Session>,
    seqs: &Arc<Vec<AtomicU64>>,
    out: &SharedWriter,
    method: &str,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let channel_list = || gabp_proto::message::string_list(&params["channels"]);
    match method {
        "tools/list" => {
            let mut tools = json!([
                {"name": "sim/echo", "title": "Echo", "description": "Returns its arguments", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
                {"name": "sim/fail", "title": "Fail", "description": "Always fails", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
                {"name": "sim/emit", "title": "Emit", "description": "Emits count events on channel", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}}
            ]);
            if shared.cfg.hostile_tool {
                let text = format!("{}{}", super::HOSTILE_TEXT, "!".repeat(64 * 1024));
                tools.as_array_mut().expect("an array").push(json!({
                    "name": "sim/hostile", "title": text, "description": text,
                    "inputSchema": {"type": "object", "description": text, "properties": {"area": {"type": "string", "description": text}}},
                    "outputSchema": {"type": "object", "description": text},
                    "annotations": {"title": text, "readOnlyHint": true, "x-note": text}
                }));
            }
            Ok(json!({ "tools": tools }))
        }
        "tools/call" => {
            shared.calls.fetch_add(1, Ordering::Relaxed);
            let args = if params.get("arguments").is_some() {
                &params["arguments"]
            } else {
                &params["parameters"]
            };
            match params["name"].as_str() {
                Some(t) if ECHO_TOOLS.contains(&t) => Ok(json!({"echo": args})),
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
                            if !write_frames(out, &wire, shared.cfg.defects.split_writes) {
                                break;
                            }
                            wire.clear();
                        }
                    }
                    write_frames(out, &wire, shared.cfg.defects.split_writes);
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

pub(super) fn stream_events(
    shared: &Shared,
    session: &Session,
    seqs: &[AtomicU64],
    out: &SharedWriter,
) {
    let cfg = &shared.cfg;
    if cfg.channels.is_empty() {
        return;
    }
    let mut template = EventTemplate::new(&cfg.channels, cfg.payload_bytes, cfg.seed, cfg.quirks);
    let mut schedule = Schedule::new(
        cfg.rate,
        cfg.max_events.unwrap_or(u64::MAX),
        cfg.pace.clone(),
    )
    .with_tick(cfg.tick);
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
        if !wire.is_empty() && !write_frames(out, &wire, cfg.defects.split_writes) {
            break;
        }
        shared.emitted.fetch_add(n, Ordering::Relaxed);
    }
}
