//! `check-mod`: a conformance run against a live mod, as a bridge connected to it directly.
//!
//! The run opens connections one after another (each says hello first), so a check that leaves
//! a connection broken or wedged spoils only its own: the handshake and the read methods on
//! the first, then the framing probes (header forms, raw UTF-8, large frames), events flowing
//! under load, and last a connection dropped mid-request. Every wait ends at `--timeout`. Only
//! read methods are called (`session/hello`, `tools/list`, `events/list` and
//! `attention/current` when advertised, `events/subscribe`, a method that does not exist) and
//! the tools the user names; nothing here knows how the target is reached (a [`Target`]
//! connects) or prints anything.

mod flow;
mod framing;

use std::time::Duration;

use futures::future::BoxFuture;
use gabp_proto::ErrorCode;
use gabp_rt::net::Conn;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::report::{Check, Findings, Report, Verdict};
use crate::shapes;
use crate::wire::{self, Frame, Got, Header, Problem, Seen, Wire};

/// Where the mod is: each call of [`Target::connect`] is a new connection (for a stdio mod, a
/// new process).
pub trait Target: Send + Sync {
    /// A new connection to the mod.
    fn connect(&self) -> BoxFuture<'_, std::io::Result<Conn>>;
    /// How the target is said in the report.
    fn name(&self) -> String;
    /// One connection for the mod's life (a stdio child): a dropped connection ends it, so
    /// what a mod does after one is not asked.
    fn single_connection(&self) -> bool;
}

/// A tool the user names with `--call`.
#[derive(Debug, Clone)]
pub struct Call {
    /// The tool.
    pub tool: String,
    /// Its arguments (an object).
    pub arguments: Value,
}

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The token the mod expects in `session/hello`.
    pub token: String,
    /// How long any one answer may take.
    pub wait: Duration,
    /// Tools to call, as named (nothing else that can change the game is ever called).
    pub calls: Vec<Call>,
    /// The largest request tried, in bytes (at most the mod's advertised
    /// `limits.maxMessageSize`).
    pub large: usize,
    /// How long events are watched while requests are pipelined.
    pub flow: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: String::new(),
            wait: Duration::from_secs(5),
            calls: Vec::new(),
            large: 1 << 20,
            flow: Duration::from_secs(2),
        }
    }
}

/// The hint for a mod that counts characters.
pub const COUNT_BYTES_HINT: &str = "count Content-Length in bytes of the UTF-8 body (in C#: Encoding.UTF8.GetByteCount(json), not json.Length); until the mod is fixed, serve it with `gabp-relay serve --ascii-requests` (config: ascii_requests = true), which sends it every non-ASCII character as a \\uXXXX escape";

/// What a request got.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The response (its frame).
    Msg(Frame),
    /// No answer by the deadline.
    TimedOut,
    /// The mod closed the connection first.
    Closed,
    /// The stream broke before the answer.
    Broken(Problem),
}

impl Answer {
    /// What went wrong, said for a report, or `None` for an answer.
    fn failure(&self, wait: Duration) -> Option<String> {
        match self {
            Answer::Msg(_) => None,
            Answer::TimedOut => Some(format!("no answer within {}", secs(wait))),
            Answer::Closed => Some("the mod closed the connection instead of answering".into()),
            Answer::Broken(p) => Some(format!("the stream broke before the answer: {p}")),
        }
    }
}

/// `d` for a report: `5s`, `1.5s`, `250ms`.
pub(crate) fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// An open connection that said hello.
pub(crate) struct Peer {
    wire: Wire,
}

/// What every connection of the run saw, for the checks that look at all of it.
#[derive(Debug, Default)]
struct Log {
    /// Framing, over every connection closed so far.
    seen: Seen,
    /// Envelope findings over every response.
    answers: Findings,
    answers_seen: u64,
    /// Envelope findings over every event (the first few thousand).
    events: Findings,
    events_seen: u64,
    /// Responses to ids never sent, and frames of a type a mod does not send.
    strays: Findings,
}

/// The events judged one by one; later ones are only counted.
const EVENTS_JUDGED: u64 = 5_000;

/// A run in progress.
pub(crate) struct Runner<'a> {
    target: &'a dyn Target,
    opts: &'a Options,
    log: Log,
    checks: Vec<Check>,
    /// The first welcome's result, and whether it was checked.
    welcome: Value,
    welcomed: bool,
    /// `capabilities.methods`, `capabilities.events`.
    methods: Vec<String>,
    channels: Vec<String>,
    /// Whether `tools/list` answered with a result (it is then the pipelined request).
    tools_list_works: bool,
    tools: Vec<String>,
}

/// Runs every check against `target`.
pub async fn run(target: &dyn Target, opts: &Options) -> Report {
    let mut r = Runner {
        target,
        opts,
        log: Log::default(),
        checks: Vec::new(),
        welcome: Value::Null,
        welcomed: false,
        methods: Vec::new(),
        channels: Vec::new(),
        tools_list_works: false,
        tools: Vec::new(),
    };
    r.all().await;
    let peer = r.welcomed.then(|| {
        let w = &r.welcome;
        let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
        format!(
            "{} {} (agent {})",
            s(&w["app"]["name"]),
            s(&w["app"]["version"]),
            s(&w["agentId"])
        )
    });
    Report::new("mod", target.name(), peer, r.checks)
}

/// The platform as `session/hello` names it.
fn platform() -> &'static str {
    match std::env::consts::OS {
        "windows" => "windows",
        "macos" => "macos",
        _ => "linux",
    }
}

impl Runner<'_> {
    async fn all(&mut self) {
        let mut main = match self.open(Header::Relay).await {
            Ok(p) => p,
            Err(e) => {
                self.checks.push(
                    Check::new("handshake.welcome", "§4.1", Verdict::Fail, e)
                        .schema("methods/session.welcome.response.json")
                        .hint("is the address right, and the token the mod's? (--token)"),
                );
                return;
            }
        };
        self.check_tools_list(&mut main).await;
        self.check_advertised(&mut main, "events/list", "§4.3", None)
            .await;
        self.check_advertised(
            &mut main,
            "attention/current",
            "§4.6",
            Some("methods/attention.current.response.json"),
        )
        .await;
        self.check_unknown_method(&mut main).await;
        self.check_calls(&mut main).await;
        self.check_pipelined(&mut main).await;
        self.close(main).await;
        self.check_header_forms().await;
        self.check_utf8_request().await;
        self.check_large().await;
        self.check_flow().await;
        self.check_what_the_mod_writes();
        self.check_envelopes();
        self.check_drop().await;
    }

    /// A new connection, hello said with `header`, the welcome checked once (the first time).
    async fn open(&mut self, header: Header) -> Result<Peer, String> {
        let deadline = Instant::now() + self.opts.wait;
        let conn = loop {
            match self.target.connect().await {
                Ok(c) => break c,
                // A mod that serves one connection at a time may still be closing the last.
                Err(_) if Instant::now() + Duration::from_millis(100) < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(format!("cannot connect: {e}")),
            }
        };
        let mut peer = Peer {
            wire: Wire::new(conn),
        };
        let params = json!({
            "token": self.opts.token,
            "bridgeVersion": format!("gabp-relay-check/{}", env!("CARGO_PKG_VERSION")),
            "platform": platform(),
            "launchId": uuid::Uuid::new_v4().to_string(),
        });
        let answer = self
            .ask_with(&mut peer, "session/hello", &params, header)
            .await;
        let Answer::Msg(frame) = answer else {
            let why = answer.failure(self.opts.wait).unwrap_or_default();
            self.close(peer).await;
            return Err(format!("session/hello: {why}"));
        };
        if let Some(e) = frame.msg.get("error").filter(|e| !e.is_null()) {
            self.close(peer).await;
            return Err(format!("the mod refused session/hello: {e}"));
        }
        if !self.welcomed {
            self.welcomed = true;
            self.check_welcome(&frame.msg);
        }
        Ok(peer)
    }

    /// Ends a connection, keeping what it saw.
    async fn close(&mut self, mut peer: Peer) {
        peer.wire.close().await;
        self.log.seen.merge(std::mem::take(&mut peer.wire.seen));
    }

    /// Sends a request (the relay's header form) and waits for its answer.
    async fn ask(&mut self, peer: &mut Peer, method: &str, params: &Value) -> Answer {
        self.ask_with(peer, method, params, Header::Relay).await
    }

    async fn ask_with(
        &mut self,
        peer: &mut Peer,
        method: &str,
        params: &Value,
        header: Header,
    ) -> Answer {
        let id = uuid::Uuid::new_v4().to_string();
        if peer
            .wire
            .send(&wire::request(&id, method, params), header, self.opts.wait)
            .await
            .is_err()
        {
            return Answer::Closed;
        }
        let deadline = Instant::now() + self.opts.wait;
        self.answer_to(peer, &id, deadline).await
    }

    /// Reads until the response to `id`, noting every other frame.
    async fn answer_to(&mut self, peer: &mut Peer, id: &str, deadline: Instant) -> Answer {
        loop {
            match peer.wire.next(deadline).await {
                Got::Frame(f) => {
                    let mine = f.msg["type"] == "response" && f.msg["id"] == id;
                    self.note(&f, mine);
                    if mine {
                        return Answer::Msg(f);
                    }
                }
                Got::Broken(p) => return Answer::Broken(p),
                Got::Closed => return Answer::Closed,
                Got::TimedOut => return Answer::TimedOut,
            }
        }
    }

    /// Judges a frame's envelope; `expected` says a response answers a request of this run.
    fn note(&mut self, f: &Frame, expected: bool) {
        match f.msg["type"].as_str() {
            Some("response") => {
                self.log.answers_seen += 1;
                shapes::mod_answer(&mut self.log.answers, &f.body, &f.msg);
                if !expected {
                    self.log
                        .strays
                        .note(Verdict::Fail, "a response to an id this checker never sent");
                }
            }
            Some("event") => {
                self.log.events_seen += 1;
                if self.log.events_seen <= EVENTS_JUDGED {
                    shapes::mod_event(&mut self.log.events, &f.body, &f.msg);
                }
            }
            other => self.log.strays.note(
                Verdict::Fail,
                format!(
                    "a frame of type {} (a mod sends responses and events)",
                    other.map_or_else(|| "none".to_string(), |t| format!("{t:?}"))
                ),
            ),
        }
    }

    fn check_welcome(&mut self, msg: &Value) {
        const SCHEMA: &str = "methods/session.welcome.response.json";
        self.welcome = msg["result"].clone();
        let caps = &self.welcome["capabilities"];
        self.methods = gabp_proto::message::string_list(&caps["methods"]);
        self.channels = gabp_proto::message::advertised_channels(&self.welcome);
        let mut found = Findings::default();
        shapes::method_result(&mut found, SCHEMA, msg);
        let verdict = found.verdict().unwrap_or(Verdict::Pass);
        let w = &self.welcome;
        let mut detail = format!(
            "welcomed: schema {}, {} methods, {} channels",
            w["schemaVersion"].as_str().unwrap_or("?"),
            self.methods.len(),
            self.channels.len()
        );
        if verdict != Verdict::Pass {
            detail = format!("{detail}; {}", found.line(4));
        }
        self.checks
            .push(Check::new("handshake.welcome", "§4.1", verdict, detail).schema(SCHEMA));
    }

    async fn check_tools_list(&mut self, peer: &mut Peer) {
        const SCHEMA: &str = "methods/tools.list.response.json";
        let answer = self.ask(peer, "tools/list", &json!({})).await;
        let check = |v, d| Check::new("methods.tools-list", "§4.2", v, d).schema(SCHEMA);
        let Answer::Msg(frame) = answer else {
            let why = answer.failure(self.opts.wait).unwrap_or_default();
            self.checks
                .push(check(Verdict::Fail, format!("tools/list: {why}")));
            return;
        };
        if let Some(e) = frame.msg.get("error").filter(|e| !e.is_null()) {
            let offered = self.methods.iter().any(|m| m == "tools/list");
            let (v, d) = if offered {
                (
                    Verdict::Fail,
                    format!("advertised, but answered with an error: {e}"),
                )
            } else {
                (Verdict::Skip, format!("not offered (answered {e})"))
            };
            self.checks.push(check(v, d));
            return;
        }
        self.tools_list_works = true;
        self.tools = frame.msg["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let mut found = Findings::default();
        shapes::method_result(&mut found, SCHEMA, &frame.msg);
        let verdict = found.verdict().unwrap_or(Verdict::Pass);
        let mut detail = format!("{} tools", self.tools.len());
        if verdict != Verdict::Pass {
            detail = format!("{detail}; {}", found.line(4));
        }
        self.checks.push(check(verdict, detail));
    }

    /// An optional read method, called only when the welcome advertises it.
    async fn check_advertised(
        &mut self,
        peer: &mut Peer,
        method: &str,
        section: &'static str,
        schema: Option<&'static str>,
    ) {
        let id = format!("methods.{}", method.replace('/', "-"));
        let check = |v, d: String| {
            let mut c = Check::new(&id, section, v, d);
            c.schema = schema;
            c
        };
        if !self.methods.iter().any(|m| m == method) {
            let c = check(
                Verdict::Skip,
                format!("{method} is not advertised in capabilities.methods"),
            );
            self.checks.push(c);
            return;
        }
        let answer = self.ask(peer, method, &json!({})).await;
        let c = match answer {
            Answer::Msg(f) => match f.msg.get("error").filter(|e| !e.is_null()) {
                Some(e) => check(
                    Verdict::Fail,
                    format!("advertised, but answered with an error: {e}"),
                ),
                None => {
                    let mut found = Findings::default();
                    if let Some(file) = schema {
                        shapes::method_result(&mut found, file, &f.msg);
                    }
                    let v = found.verdict().unwrap_or(Verdict::Pass);
                    let d = if v == Verdict::Pass {
                        format!("{method} answered with a result")
                    } else {
                        found.line(4)
                    };
                    check(v, d)
                }
            },
            other => {
                let why = other.failure(self.opts.wait).unwrap_or_default();
                check(Verdict::Fail, format!("{method}: {why}"))
            }
        };
        self.checks.push(c);
    }

    async fn check_unknown_method(&mut self, peer: &mut Peer) {
        let answer = self.ask(peer, UNKNOWN_METHOD, &json!({})).await;
        let (v, d) = match answer {
            Answer::Msg(f) => match f.msg.get("error").filter(|e| !e.is_null()) {
                Some(e) if e["code"] == -32601 => (
                    Verdict::Pass,
                    format!("{UNKNOWN_METHOD} answered -32601"),
                ),
                Some(e) => (
                    Verdict::Tolerated,
                    format!("{UNKNOWN_METHOD} answered with error {}, not -32601 (method not found)", e["code"]),
                ),
                None => (
                    Verdict::Fail,
                    format!("{UNKNOWN_METHOD}, which no mod has, answered with a result"),
                ),
            },
            other => (
                Verdict::Fail,
                format!(
                    "{UNKNOWN_METHOD}: {} (a bridge calling a method the mod lacks waits for nothing)",
                    other.failure(self.opts.wait).unwrap_or_default()
                ),
            ),
        };
        self.checks
            .push(Check::new("errors.unknown-method", "§6", v, d));
    }

    async fn check_calls(&mut self, peer: &mut Peer) {
        const SCHEMA: &str = "methods/tools.call.response.json";
        for call in self.opts.calls.clone() {
            let id = format!("methods.tools-call {}", call.tool);
            let listed = if self.tools.contains(&call.tool) {
                ""
            } else {
                " (not in tools/list)"
            };
            let answer = self
                .ask(
                    peer,
                    "tools/call",
                    &json!({"name": call.tool, "arguments": call.arguments}),
                )
                .await;
            let (v, d) = match answer {
                Answer::Msg(f) => {
                    let mut found = Findings::default();
                    shapes::method_result(&mut found, SCHEMA, &f.msg);
                    let said = match f.msg.get("error").filter(|e| !e.is_null()) {
                        Some(e) => format!("answered with error {e}"),
                        None => "answered with a result".to_string(),
                    };
                    // A relay in front answers for a mod that did not: the call never got
                    // its answer, whatever the envelope looks like.
                    let code = f.msg["error"]["code"].as_i64();
                    let for_the_mod = [ErrorCode::OutcomeUnknown, ErrorCode::ModUnavailable]
                        .iter()
                        .find(|c| Some(c.code()) == code);
                    match (for_the_mod, found.verdict()) {
                        (Some(_), _) => (
                            Verdict::Fail,
                            format!(
                                "{said}{listed}: a relay answered for the mod, which did not answer"
                            ),
                        ),
                        (None, None) => (Verdict::Pass, format!("{said}{listed}")),
                        (None, Some(v)) => (v, format!("{said}{listed}; {}", found.line(4))),
                    }
                }
                other => (
                    Verdict::Fail,
                    format!(
                        "{}{listed}",
                        other.failure(self.opts.wait).unwrap_or_default()
                    ),
                ),
            };
            self.checks
                .push(Check::new(&id, "§4.2", v, d).schema(SCHEMA));
        }
    }

    /// A check about one thing the connections saw, over all of them.
    fn check_envelopes(&mut self) {
        let answers = &self.log.answers;
        let strays = &self.log.strays;
        let (v, d) = match (answers.verdict(), self.log.answers_seen) {
            (_, 0) => (Verdict::Skip, "no response arrived".to_string()),
            (None, n) => (
                Verdict::Pass,
                format!("{n} responses, each with one of result and error"),
            ),
            (Some(v), n) => (v, format!("{n} responses: {}", answers.line(4))),
        };
        let (v, d) = match strays.verdict() {
            Some(sv) => (v.worst(sv), format!("{d}; {}", strays.line(2))),
            None => (v, d),
        };
        self.checks.push(
            Check::new("envelope.answers", "§3.3", v, d)
                .schema("envelope.schema.json#/$defs/response"),
        );
        let events = &self.log.events;
        let (v, d) = match (events.verdict(), self.log.events_seen) {
            (_, 0) => (Verdict::Skip, "no event arrived".to_string()),
            (None, n) => (
                Verdict::Pass,
                format!("{n} events, each as the schema says"),
            ),
            (Some(v), n) => (v, format!("{n} events: {}", events.line(4))),
        };
        self.checks
            .push(Check::new("envelope.events", "§3.4", v, d).schema("events/event.message.json"));
    }

    async fn check_drop(&mut self) {
        let check = |v, d| Check::new("connection.drop", "§9", v, d);
        if self.target.single_connection() {
            self.checks.push(check(
                Verdict::Skip,
                "a stdio mod has one connection for its life".into(),
            ));
            return;
        }
        let peer = match self.open(Header::Relay).await {
            Ok(p) => p,
            Err(e) => {
                self.checks.push(check(
                    Verdict::Fail,
                    format!("no new connection before the drop: {e}"),
                ));
                return;
            }
        };
        let mut peer = peer;
        let id = uuid::Uuid::new_v4().to_string();
        let _ = peer
            .wire
            .send(
                &wire::request(&id, "tools/list", &json!({})),
                Header::Relay,
                self.opts.wait,
            )
            .await;
        // Gone before the answer: both halves closed at once.
        let seen = std::mem::take(&mut peer.wire.seen);
        drop(peer);
        self.log.seen.merge(seen);
        // Long enough for a mod to finish the request and find its connection gone.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let c = match self.open(Header::Relay).await {
            Ok(p) => {
                self.close(p).await;
                check(
                    Verdict::Pass,
                    "after a connection closed with a request unanswered, a new one was welcomed".into(),
                )
            }
            Err(e) => check(
                Verdict::Fail,
                format!("after a connection closed with a request unanswered, the mod no longer welcomes one ({e}): did it crash?"),
            )
            .hint("a bridge may close while its request is handled: drop that answer (or check the connection before writing it) and never let it end the mod"),
        };
        self.checks.push(c);
    }
}

/// A method no mod has, well-formed.
const UNKNOWN_METHOD: &str = "gabpcheck/nosuchmethod";
