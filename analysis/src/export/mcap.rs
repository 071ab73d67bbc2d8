//! The MCAP export: one session as one file that Foxglove, Rerun and the ROS tools open, with
//! a timeline per event channel and per kind of call.
//!
//! Messages are the recorded frames themselves (JSON encoding), with log and publish time the
//! time the relay recorded them. What the mod said and was asked goes in:
//! - `/events/<channel>`: every event the mod published on that channel (MCAP sequence: the
//!   relay's seq);
//! - `/calls/<method>/request` and `/calls/<method>/response`: each request the relay sent the
//!   mod and the mod's answer to it; a `tools/call` goes to `/calls/tools/call/<tool>/…`, one
//!   pair of channels per tool;
//! - `/marks`: every mark the relay accepted (its label and data in `params`).
//!
//! Each channel has a JSON Schema: the GABP envelope, with the payload's schema from the mod's
//! last `events/list` answer, and a tool's `inputSchema`/`outputSchema` from its last
//! `tools/list` answer, exported before the channel's first message; else permissive. A
//! metadata record `gabp.session` holds the session's id, route, app and tags. Chunks are
//! LZ4-compressed and indexed (the writer's defaults otherwise).
//!
//! Bounded memory: at most [`MAX_TOOLS`] tools and [`crate::calls::MAX_METHODS`] methods get
//! channels of their own (the rest share `/calls/tools/call/(other tools)/…` and
//! `/calls/(other methods)/…`), at most [`crate::calls::MAX_OPEN`] requests await their answer
//! (an answer matched to none goes to `/calls/(unmatched)/response`), and the last list
//! answers are kept. Frames that were not valid JSON, the relay's own traffic with bridges and
//! requests it answered itself are not in the file: `export` (JSONL) has every frame.

use std::collections::{BTreeMap, HashMap};
use std::io::{Seek, Write};
use std::path::Path;

use ::mcap::records::{MessageHeader, Metadata};
use ::mcap::{McapError, WriteOptions, Writer};
use gabp_storage::{Direction, SessionMeta, Store};
use serde_json::{json, Value};

use super::{for_each_row, write_atomically, ExportError, ExportFilter, Kind, Row};
use crate::calls::{MAX_METHODS, MAX_OPEN, OTHER_METHODS};

/// Tools with channels of their own; later ones share one pair.
pub const MAX_TOOLS: usize = 256;
/// List answers (`tools/list`, `events/list`) awaited at once.
const MAX_LIST_REQUESTS: usize = 64;

/// What one export wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// Messages per topic.
    pub topics: BTreeMap<String, u64>,
    /// Messages in all.
    pub messages: u64,
}

fn mcap_err(e: McapError) -> ExportError {
    match e {
        McapError::Io(io) => ExportError::Io(io),
        other => ExportError::Mcap(other.to_string()),
    }
}

/// Which list a request asked for.
#[derive(Clone, Copy)]
enum List {
    Tools,
    Events,
}

/// The writer's channels and what is known to describe them.
struct Channels {
    /// Topic -> (MCAP channel id, messages so far).
    ids: HashMap<String, (u16, u64)>,
    /// A tool's (input, output) schema from the last `tools/list` answer.
    tools: HashMap<String, (Value, Value)>,
    /// A channel's payload schema from the last `events/list` answer.
    events: HashMap<String, Value>,
    /// Tools and methods given channels of their own.
    own_tools: usize,
    own_methods: std::collections::HashSet<String>,
    /// Awaited requests: upstream id -> the response's topic.
    open: HashMap<String, String>,
    /// Awaited list requests: upstream id -> which list.
    lists: HashMap<String, List>,
}

/// A JSON Schema of a GABP message whose members `props` are described (the others
/// allowed).
fn envelope(title: &str, props: Value) -> Value {
    let mut p = json!({
        "v": {"type": "string"},
        "id": {"type": "string"},
        "type": {"type": "string"},
    });
    if let (Some(p), Some(more)) = (p.as_object_mut(), props.as_object()) {
        p.extend(more.clone());
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "properties": p,
    })
}

/// A schema given by a mod, if it is one (an object or a boolean); else permissive.
fn given(v: Option<&Value>) -> Value {
    match v {
        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
        _ => json!({}),
    }
}

impl Channels {
    fn new() -> Channels {
        Channels {
            ids: HashMap::new(),
            tools: HashMap::new(),
            events: HashMap::new(),
            own_tools: 0,
            own_methods: Default::default(),
            open: HashMap::new(),
            lists: HashMap::new(),
        }
    }

    /// The channel of `topic`, added with `schema` if new; counts the message.
    fn channel<W: Write + Seek>(
        &mut self,
        w: &mut Writer<W>,
        topic: &str,
        schema: impl FnOnce(&Self) -> Value,
    ) -> Result<(u16, u32), ExportError> {
        if let Some((id, n)) = self.ids.get_mut(topic) {
            *n += 1;
            return Ok((*id, (*n - 1) as u32));
        }
        let text = serde_json::to_vec(&schema(self)).expect("serializable");
        let schema_id = w.add_schema(topic, "jsonschema", &text).map_err(mcap_err)?;
        let id = w
            .add_channel(schema_id, topic, "json", &BTreeMap::new())
            .map_err(mcap_err)?;
        self.ids.insert(topic.to_string(), (id, 1));
        Ok((id, 0))
    }

    /// The topic prefix of a call to `method` (`tool` for `tools/call`), taking a channel of
    /// its own while there are few.
    fn call_topic(&mut self, method: &str, tool: Option<&str>) -> String {
        if let (Some(tool), "tools/call") = (tool, method) {
            let topic = format!("/calls/tools/call/{tool}");
            if self.ids.contains_key(&format!("{topic}/request")) {
                return topic;
            }
            if self.own_tools < MAX_TOOLS {
                self.own_tools += 1;
                return topic;
            }
            return "/calls/tools/call/(other tools)".into();
        }
        if self.own_methods.contains(method) || self.own_methods.len() < MAX_METHODS {
            self.own_methods.insert(method.to_string());
            return format!("/calls/{method}");
        }
        format!("/calls/{OTHER_METHODS}")
    }

    /// Takes what a `tools/list` or `events/list` answer says.
    fn learn(&mut self, list: List, result: &Value) {
        let items = |key: &str| -> Vec<Value> {
            result
                .get(key)
                .or(Some(result))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        match list {
            List::Tools => {
                self.tools = items("tools")
                    .iter()
                    .filter_map(|t| {
                        let name = t.get("name")?.as_str()?.to_string();
                        Some((
                            name,
                            (given(t.get("inputSchema")), given(t.get("outputSchema"))),
                        ))
                    })
                    .take(MAX_TOOLS)
                    .collect();
            }
            List::Events => {
                self.events = items("events")
                    .iter()
                    .filter_map(|e| {
                        let name = e.get("channel").or(e.get("name"))?.as_str()?.to_string();
                        let schema = e.get("payloadSchema").or(e.get("schema"))?;
                        Some((name, given(Some(schema))))
                    })
                    .take(gabp_storage::catalog::MAX_CHANNELS)
                    .collect();
            }
        }
    }
}

/// Writes one session's rows as MCAP into `out`; `seeking` when `out` really seeks (a file
/// being written from its start), else the writer keeps each chunk in memory until done.
pub fn write_session<W: Write + Seek>(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    out: W,
    seeking: bool,
) -> Result<Written, ExportError> {
    let meta = &*store.with_details(meta)?;
    let opts = WriteOptions::new()
        .compression(Some(::mcap::Compression::Lz4))
        .library(format!("gabp-relay {}", env!("CARGO_PKG_VERSION")))
        .disable_seeking(!seeking);
    let mut w = Writer::with_options(out, opts).map_err(mcap_err)?;
    let mut info = BTreeMap::from([
        ("session".to_string(), meta.id.to_string()),
        ("route".to_string(), meta.route.clone()),
        ("startedNs".to_string(), meta.started_ns.to_string()),
        ("relayVersion".to_string(), meta.relay_version.clone()),
    ]);
    for (k, v) in [("app", &meta.app_name), ("appVersion", &meta.app_version)] {
        if let Some(v) = v {
            info.insert(k.to_string(), v.clone());
        }
    }
    for (k, v) in &meta.tags {
        info.insert(format!("tag.{k}"), v.clone());
    }
    w.write_metadata(&Metadata {
        name: "gabp.session".into(),
        metadata: info,
    })
    .map_err(mcap_err)?;
    let mut ch = Channels::new();
    let mut written = Written::default();
    for_each_row(store, meta, filter, |row| {
        let Some((topic, id, seq)) = place(&mut ch, &mut w, row)? else {
            return Ok(());
        };
        let header = MessageHeader {
            channel_id: id,
            sequence: seq,
            log_time: row.rec.time_ns,
            publish_time: row.rec.time_ns,
        };
        w.write_to_known_channel(&header, &row.rec.body)
            .map_err(mcap_err)?;
        *written.topics.entry(topic).or_default() += 1;
        written.messages += 1;
        Ok(())
    })?;
    w.finish().map_err(mcap_err)?;
    w.into_inner().flush()?;
    Ok(written)
}

/// The topic, channel and sequence of a row, if it goes in the file.
fn place<W: Write + Seek>(
    ch: &mut Channels,
    w: &mut Writer<W>,
    row: &Row<'_>,
) -> Result<Option<(String, u16, u32)>, ExportError> {
    let rec = row.rec;
    if !rec.json_ok {
        return Ok(None);
    }
    let placed = match (rec.dir, row.kind) {
        (Direction::ModToRelay, Kind::Event) => {
            let Some(channel) = row.channel else {
                return Ok(None);
            };
            let topic = format!("/events/{channel}");
            let (id, n) = ch.channel(w, &topic, |c| {
                let payload = c.events.get(channel).cloned().unwrap_or(json!({}));
                envelope(
                    &format!("GABP event on {channel}"),
                    json!({"channel": {"const": channel}, "seq": {"type": "integer"}, "payload": payload}),
                )
            })?;
            // The relay's seq, where it has one (MCAP's sequence is 32 bits: it wraps).
            let seq = rec.relay_seq.map_or(n, |s| s as u32);
            (topic, id, seq)
        }
        (Direction::BridgeToRelay, Kind::Mark) => {
            let topic = "/marks".to_string();
            let (id, n) = ch.channel(w, &topic, |_| {
                envelope(
                    "GABP relay/mark",
                    json!({"method": {"const": "relay/mark"}, "params": {"type": "object",
                        "properties": {"label": {"type": "string"}, "data": {}}, "required": ["label"]}}),
                )
            })?;
            (topic, id, n)
        }
        (Direction::RelayToMod, Kind::Request) => {
            let method = row.method.as_deref().unwrap_or("?");
            let tool = (method == "tools/call")
                .then(|| tool_name(row.payload.as_deref()))
                .flatten();
            let base = ch.call_topic(method, tool.as_deref());
            let list = match method {
                "tools/list" => Some(List::Tools),
                "events/list" => Some(List::Events),
                _ => None,
            };
            if let Some(id) = row.id.as_deref() {
                if ch.open.len() < MAX_OPEN {
                    ch.open.insert(id.to_string(), format!("{base}/response"));
                }
                if let Some(list) = list.filter(|_| ch.lists.len() < MAX_LIST_REQUESTS) {
                    ch.lists.insert(id.to_string(), list);
                }
            }
            let topic = format!("{base}/request");
            let (id, n) = ch.channel(w, &topic, |c| {
                let input = tool
                    .as_deref()
                    .and_then(|t| c.tools.get(t))
                    .map_or(json!({}), |s| s.0.clone());
                let params = match &tool {
                    Some(t) if base == format!("/calls/tools/call/{t}") => json!({"type": "object",
                        "properties": {"name": {"const": t}, "arguments": input}}),
                    _ => json!({}),
                };
                envelope(
                    &format!("GABP {method} request"),
                    json!({"method": {"const": method}, "params": params}),
                )
            })?;
            (topic, id, n)
        }
        (Direction::ModToRelay, Kind::Response) => {
            let upstream = row.id.as_deref().unwrap_or_default();
            if let Some(list) = ch.lists.remove(upstream) {
                if row.error_code.is_none() {
                    if let Some(result) = row
                        .payload
                        .as_deref()
                        .and_then(|p| serde_json::from_str::<Value>(p).ok())
                    {
                        ch.learn(list, &result);
                    }
                }
            }
            let topic = ch
                .open
                .remove(upstream)
                .unwrap_or_else(|| "/calls/(unmatched)/response".into());
            let (id, n) = ch.channel(w, &topic, |c| {
                let tool = topic
                    .strip_prefix("/calls/tools/call/")
                    .and_then(|t| t.strip_suffix("/response"));
                let output = tool
                    .and_then(|t| c.tools.get(t))
                    .map_or(json!({}), |s| s.1.clone());
                envelope(
                    &format!("GABP response on {topic}"),
                    json!({"result": output, "error": {"type": "object",
                        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}}}}),
                )
            })?;
            (topic, id, n)
        }
        _ => return Ok(None),
    };
    Ok(Some(placed))
}

/// A `tools/call`'s tool name, from its params' text.
fn tool_name(params: Option<&str>) -> Option<String> {
    let p = params?;
    let span = gabp_proto::scan::member_value(p.as_bytes(), "name")?;
    match serde_json::from_str::<Value>(&p[span]).ok()? {
        Value::String(s) => Some(s),
        _ => None,
    }
}

/// Whether `f` can be written by seeking: a regular file at its start, not opened to append
/// (standard output redirected with `>>`, a FIFO or a terminal cannot).
fn seekable(f: &mut std::fs::File) -> bool {
    let append = nix::fcntl::fcntl(&*f, nix::fcntl::FcntlArg::F_GETFL)
        .map(|fl| nix::fcntl::OFlag::from_bits_truncate(fl).contains(nix::fcntl::OFlag::O_APPEND))
        .unwrap_or(true);
    !append && f.metadata().is_ok_and(|m| m.is_file()) && f.stream_position().is_ok_and(|p| p == 0)
}

/// Exports one session into `path`, atomically (see [`write_atomically`]).
pub fn export_to_file(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    path: &Path,
) -> Result<Written, ExportError> {
    write_atomically(path, |f| {
        if seekable(f) {
            write_session(store, meta, filter, std::io::BufWriter::new(f), true)
        } else {
            let out = ::mcap::write::NoSeek::new(std::io::BufWriter::new(f));
            write_session(store, meta, filter, out, false)
        }
    })
}
