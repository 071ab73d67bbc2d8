//! `check-bridge`: a simulated mod a bridge connects to, reporting what the bridge sends. It
//! answers as a conformant mod would (a welcome, `check/echo` and `check/fail`, events on the
//! channels subscribed), with the additions GABP 1.x allows a peer to make (an unknown member
//! in the welcome and in an event) and an error answer, then watches whether the bridge goes
//! on. Each request is read as the relay reads a bridge's (strictly) and against the schemas:
//! what the relay refuses fails, what only a schema refuses is tolerated.
//!
//! It serves `connections` bridges (concurrently, each in its own task) and reports when they
//! have closed or at `timeout`, whichever is first; it knows nothing of how it was started.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gabp_proto::{message, ErrorCode};
use gabp_rt::net::{Conn, Listener};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::report::{count, Check, Findings, Report, Verdict};
use crate::shapes;
use crate::wire::{Got, Header, Problem, Seen, Wire};

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The token bridges must present.
    pub token: String,
    /// Report once this many bridge connections have closed.
    pub connections: usize,
    /// Report after this long whatever the bridges do.
    pub timeout: Duration,
    /// The channels the welcome advertises.
    pub channels: Vec<String>,
    /// Events sent on each channel a bridge subscribes to.
    pub events: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: String::new(),
            connections: 1,
            timeout: Duration::from_secs(60),
            channels: vec!["check/tick".into(), "check/notice".into()],
            events: 5,
        }
    }
}

/// The member GABP 1.x lets a peer add, which a bridge must ignore.
const UNKNOWN_MEMBER: &str = "x-gabp-check";

/// What every connection saw.
#[derive(Debug, Default)]
struct Log {
    connections: usize,
    seen: Seen,
    hello: Findings,
    hellos: u64,
    envelope: Findings,
    requests: u64,
    calls: Findings,
    call_count: u64,
    subscribe: Findings,
    subscribes: u64,
    /// Requests per method.
    methods: BTreeMap<String, u64>,
    versions: Vec<String>,
    /// What the bridge was sent that it must cope with, and what it did after.
    probes: Vec<&'static str>,
    after_probes: u64,
    /// Connections that ended right after a probe with nothing more sent.
    quit_after_probe: u64,
    still_open: usize,
}

/// Serves bridges on `listener` and reports what they sent.
pub async fn run(listener: Listener, opts: &Options) -> Report {
    let target = listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    let log = Arc::new(Mutex::new(Log::default()));
    let deadline = Instant::now() + opts.timeout;
    let mut tasks = JoinSet::new();
    let (mut accepted, mut ended) = (0, 0);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => break,
            conn = listener.accept(), if accepted < opts.connections => {
                if let Ok(conn) = conn {
                    accepted += 1;
                    tasks.spawn(serve(conn, log.clone(), opts.clone(), deadline));
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                ended += 1;
                if ended >= opts.connections {
                    break;
                }
            }
        }
    }
    let open = tasks.len();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let mut log = std::mem::take(
        &mut *log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    log.still_open = open;
    let peer = (!log.versions.is_empty()).then(|| {
        let mut v = log.versions.clone();
        v.dedup();
        format!(
            "{} ({})",
            v.join(", "),
            count(log.connections as u64, "connection")
        )
    });
    Report::new(
        "bridge",
        format!("listening on {target}"),
        peer,
        checks(&log, opts),
    )
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One bridge connection, until it closes or `deadline`.
async fn serve(conn: Conn, log: Arc<Mutex<Log>>, opts: Options, deadline: Instant) {
    lock(&log).connections += 1;
    let mut wire = Wire::new(conn);
    let mut hello_ok = false;
    let mut ids = HashSet::new();
    let mut probed = false;
    let mut after = 0u64;
    let mut framing_seen = 0;
    let closed = loop {
        let got = wire.next(deadline).await;
        {
            // What the reader noted, as it goes (a connection open at the deadline is cut).
            let mut l = lock(&log);
            let new: Vec<Problem> = wire.seen.problems[framing_seen..].to_vec();
            framing_seen = wire.seen.problems.len();
            let mut add = Seen {
                problems: new,
                ..Seen::default()
            };
            if let Got::Frame(f) = &got {
                add.frames = 1;
                add.raw_utf8 = u64::from(!f.body.is_ascii());
                add.largest = f.body.len();
                add.header_forms.insert(f.header.clone(), 1);
            }
            l.seen.merge(add);
        }
        let f = match got {
            Got::Frame(f) => f,
            Got::Broken(_) => continue,
            Got::Closed => break true,
            Got::TimedOut => break false,
        };
        if probed {
            after += 1;
        }
        let answers = handle(
            &f.body,
            &f.msg,
            &log,
            &opts,
            &mut hello_ok,
            &mut ids,
            &mut probed,
        );
        for a in answers {
            if wire
                .send(&a, Header::Relay, Duration::from_secs(5))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let mut l = lock(&log);
    l.after_probes += after;
    if closed && probed && after == 0 {
        l.quit_after_probe += 1;
    }
}

/// The schema a request of `method` is checked against beside the envelope's.
fn schema_of(method: &str) -> Option<&'static str> {
    Some(match method {
        "session/hello" => "methods/session.hello.request.json",
        "tools/list" => "methods/tools.list.request.json",
        "tools/call" => "methods/tools.call.request.json",
        "events/subscribe" => "methods/events.subscribe.request.json",
        "events/unsubscribe" => "methods/events.unsubscribe.request.json",
        "attention/current" => "methods/attention.current.request.json",
        _ => return None,
    })
}

/// Judges one frame and answers it (answers, then events, in order).
fn handle(
    body: &[u8],
    msg: &Value,
    log: &Mutex<Log>,
    opts: &Options,
    hello_ok: &mut bool,
    ids: &mut HashSet<String>,
    probed: &mut bool,
) -> Vec<Vec<u8>> {
    let mut l = lock(log);
    l.requests += 1;
    if msg["type"] != "request" {
        let t = msg["type"]
            .as_str()
            .map_or_else(|| "none".into(), |t| format!("{t:?}"));
        l.envelope.note(
            Verdict::Fail,
            format!("a frame of type {t} (a bridge sends requests)"),
        );
        return Vec::new();
    }
    let method = msg["method"].as_str().unwrap_or("").to_string();
    *l.methods.entry(method.clone()).or_default() += 1;
    let id = msg["id"].as_str().map(String::from);
    if let Some(id) = &id {
        if !ids.insert(id.clone()) {
            l.envelope.note(
                Verdict::Tolerated,
                "a request id used twice on one connection (the relay accepts it; a mod matching answers by id may not)",
            );
        }
    }
    let reply_id = id.as_deref();
    let mut judged = msg.clone();
    let log_for: fn(&mut Log) -> &mut Findings = match method.as_str() {
        "session/hello" => |l| &mut l.hello,
        "tools/call" => |l| &mut l.calls,
        "events/subscribe" => |l| &mut l.subscribe,
        _ => |l| &mut l.envelope,
    };
    if method == "tools/call" {
        let params = &msg["params"];
        if params.get("parameters").is_some() && params.get("arguments").is_none() {
            l.calls.note(
                Verdict::Tolerated,
                "tools/call with the legacy `parameters` instead of `arguments` (the relay passes it through; a mod reading only `arguments` sees none)",
            );
            if let Some(p) = judged["params"].as_object_mut() {
                if let Some(v) = p.remove("parameters") {
                    p.insert("arguments".into(), v);
                }
            }
        }
    }
    shapes::bridge_request(log_for(&mut l), body, &judged, schema_of(&method));
    let error =
        |code: ErrorCode, text: &str| message::error_response(reply_id, code, text, None).to_vec();
    if method == "session/hello" {
        l.hellos += 1;
        if msg["params"]["token"].as_str() != Some(opts.token.as_str()) {
            l.hello.note(
                Verdict::Fail,
                "session/hello with a token other than --token",
            );
            return vec![error(ErrorCode::BadToken, "invalid token")];
        }
        if *hello_ok {
            l.hello.note(
                Verdict::Tolerated,
                "a second session/hello on one connection",
            );
        }
        *hello_ok = true;
        if let Some(v) = msg["params"]["bridgeVersion"].as_str() {
            l.versions.push(v.to_string());
        }
        *probed = true;
        if !l.probes.contains(&"an unknown member in the welcome") {
            l.probes.push("an unknown member in the welcome");
        }
        let welcome = json!({
            "agentId": "gabp-check",
            "app": {"name": "gabp-relay check-bridge", "version": env!("CARGO_PKG_VERSION")},
            "capabilities": {
                "methods": ["tools/list", "tools/call", "events/subscribe", "events/unsubscribe"],
                "events": opts.channels,
            },
            "schemaVersion": "1.0",
            UNKNOWN_MEMBER: "an unknown member: GABP 1.x adds members, a bridge ignores them",
        });
        return vec![
            message::result_response(reply_id.unwrap_or(message::NIL_ID), welcome).to_vec(),
        ];
    }
    if !*hello_ok {
        l.hello.note(
            Verdict::Fail,
            format!("{} before session/hello", shown(&method)),
        );
        return vec![error(
            ErrorCode::NoSession,
            "no session: send session/hello first",
        )];
    }
    let ok = |result: Value| {
        message::result_response(reply_id.unwrap_or(message::NIL_ID), result).to_vec()
    };
    match method.as_str() {
        "tools/list" => vec![ok(json!({"tools": [
            {"name": "check/echo", "title": "Echo", "description": "Returns its arguments",
             "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
            {"name": "check/fail", "title": "Fail", "description": "Always answers an error",
             "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}}
        ]}))],
        "tools/call" => {
            l.call_count += 1;
            let args = judged["params"]["arguments"].clone();
            match msg["params"]["name"].as_str() {
                Some("check/echo") => vec![ok(json!({ "echo": args }))],
                Some("check/fail") => {
                    *probed = true;
                    if !l.probes.contains(&"an error answer") {
                        l.probes.push("an error answer");
                    }
                    vec![error(
                        ErrorCode::InternalError,
                        "check/fail fails on purpose",
                    )]
                }
                _ => vec![error(ErrorCode::MethodNotFound, "unknown tool")],
            }
        }
        "events/subscribe" => {
            l.subscribes += 1;
            let asked = message::string_list(&msg["params"]["channels"]);
            let (known, unknown): (Vec<String>, Vec<String>) =
                asked.into_iter().partition(|c| opts.channels.contains(c));
            for c in &unknown {
                l.subscribe.note(
                    Verdict::Tolerated,
                    format!(
                        "subscribes to {}, which the mod does not advertise",
                        shown(c)
                    ),
                );
            }
            let mut out = vec![ok(json!({ "subscribed": known }))];
            for c in &known {
                for seq in 0..opts.events {
                    let mut ev = json!({
                        "v": "gabp/1", "id": uuid::Uuid::new_v4().to_string(), "type": "event",
                        "channel": c, "seq": seq, "payload": {"n": seq},
                    });
                    if seq == 0 {
                        ev[UNKNOWN_MEMBER] = json!("an unknown member a bridge ignores");
                    }
                    out.push(message::to_ascii_json(&ev));
                }
            }
            if !known.is_empty() && opts.events > 0 {
                *probed = true;
                if !l.probes.contains(&"events with an unknown member") {
                    l.probes.push("events with an unknown member");
                }
            }
            out
        }
        "events/unsubscribe" => {
            let chans = message::string_list(&msg["params"]["channels"]);
            vec![ok(json!({ "unsubscribed": chans }))]
        }
        _ => vec![error(ErrorCode::MethodNotFound, "method not found")],
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// A name a bridge chose, short and quoted.
fn shown(s: &str) -> String {
    format!("{:?}", gabp_rt::display::text(s, 60))
}

/// The checks, from what every connection saw.
fn checks(log: &Log, opts: &Options) -> Vec<Check> {
    if log.connections == 0 {
        return vec![Check::new(
            "bridge.connected",
            "§9",
            Verdict::Fail,
            format!(
                "no bridge connected within {}",
                crate::modcheck::secs(opts.timeout)
            ),
        )];
    }
    let mut out = Vec::new();
    let verdict_of = |f: &Findings| f.verdict().unwrap_or(Verdict::Pass);
    // Framing.
    let counted = log
        .seen
        .problems
        .iter()
        .find(|p| matches!(p, Problem::CharCounted { .. }));
    let forms: Vec<String> = log
        .seen
        .header_forms
        .iter()
        .map(|(f, n)| format!("{f} (×{n})"))
        .collect();
    let c = match (counted, log.seen.problems.first()) {
        (Some(p), _) => Check::new("framing.requests", "§12.2", Verdict::Fail, format!("{p}"))
            .hint("write Content-Length as the byte count of the UTF-8 body (or escape non-ASCII as \\uXXXX)"),
        (None, Some(p)) => Check::new(
            "framing.requests",
            "§12.2",
            Verdict::Fail,
            format!(
                "{}, e.g. {p}",
                count(log.seen.problems.len() as u64, "broken frame")
            ),
        ),
        (None, None) => Check::new(
            "framing.requests",
            "§12.2",
            Verdict::Pass,
            format!(
                "{} frames ({} with raw UTF-8), headers: {}",
                log.seen.frames,
                log.seen.raw_utf8,
                forms.join(", ")
            ),
        ),
    };
    out.push(c);
    // The hello.
    let (v, d) = if log.hellos == 0 {
        (Verdict::Fail, "no session/hello".to_string())
    } else {
        match log.hello.verdict() {
            None => (
                Verdict::Pass,
                format!("{}, as the schema says", count(log.hellos, "hello")),
            ),
            Some(v) => (v.worst(Verdict::Pass), log.hello.line(4)),
        }
    };
    out.push(
        Check::new("handshake.hello", "§4.1", v, d).schema("methods/session.hello.request.json"),
    );
    // Every request's envelope.
    let methods: Vec<String> = log
        .methods
        .iter()
        .map(|(m, n)| format!("{} ×{n}", shown(m)))
        .collect();
    let said = format!(
        "{} ({})",
        count(log.requests, "request"),
        methods.join(", ")
    );
    let c = match log.envelope.verdict() {
        None => Check::new("envelope.requests", "§3.2", Verdict::Pass, said),
        Some(v) => Check::new(
            "envelope.requests",
            "§3.2",
            v,
            format!("{said}: {}", log.envelope.line(4)),
        ),
    }
    .schema("envelope.schema.json#/$defs/request");
    out.push(c);
    // tools/call and events/subscribe, when used.
    for (id, section, schema, n, f, what) in [
        (
            "methods.tools-call",
            "§4.2",
            "methods/tools.call.request.json",
            log.call_count,
            &log.calls,
            "tools/call",
        ),
        (
            "events.subscribe",
            "§4.3",
            "methods/events.subscribe.request.json",
            log.subscribes,
            &log.subscribe,
            "events/subscribe",
        ),
    ] {
        let c = if n == 0 {
            Check::new(
                id,
                section,
                Verdict::Skip,
                format!("the bridge sent no {what}"),
            )
        } else if f.verdict().is_none() {
            Check::new(
                id,
                section,
                Verdict::Pass,
                format!("{n} × {what}, each as the schema says"),
            )
        } else {
            Check::new(
                id,
                section,
                verdict_of(f),
                format!("{n} × {what}: {}", f.line(4)),
            )
        };
        out.push(c.schema(schema));
    }
    // What it did after the additions and errors it must cope with.
    let c = if log.probes.is_empty() {
        Check::new(
            "robustness",
            "§7.2",
            Verdict::Skip,
            "the bridge never got far enough to be sent anything unusual".into(),
        )
    } else if log.after_probes > 0 || log.still_open > 0 {
        Check::new(
            "robustness",
            "§7.2",
            Verdict::Pass,
            format!(
                "after {}, the bridge went on ({} after them{})",
                and_list(&log.probes),
                count(log.after_probes, "request"),
                if log.still_open > 0 {
                    ", still connected at the end"
                } else {
                    ""
                }
            ),
        )
    } else {
        Check::new(
            "robustness",
            "§7.2",
            Verdict::Skip,
            format!(
                "after {}, the bridge closed without another request, so whether it copes is not shown",
                and_list(&log.probes)
            ),
        )
    };
    out.push(c);
    out
}
