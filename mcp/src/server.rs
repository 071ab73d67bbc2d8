//! The MCP server itself (rmcp's `ServerHandler`): the mod's tools mirrored under strict-safe
//! names, the relay's own tools, and the channels, welcome and stats as resources. Every call
//! goes through the front's GABP [`Link`], so it is one more bridge to the relay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::events::Query;
use super::link::{CallError, Link, Shared, Target};
use super::listing::{self, Offer};
use super::names;
use super::tools::own_tools;
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerCapabilities, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};

/// The `_meta` key of a tool listing without the game's tools: why they are missing.
pub const GAME_TOOLS_MISSING: &str = "gabp-relay/gameToolsMissing";

/// The relay's own tools (a mod tool mapping to one of these gets a suffix).
pub const OWN_TOOLS: [&str; 8] = [
    "events_poll",
    "attention_get",
    "attention_ack",
    "relay_status",
    "sessions_list",
    "relay_lease",
    "mark",
    "relay_replay",
];

/// Most events one `events_poll` returns.
pub const POLL_MAX: usize = 5000;
/// Longest wait one `events_poll` may ask for.
pub const POLL_WAIT_MAX: Duration = Duration::from_secs(30);
/// Events a channel resource shows.
const RESOURCE_EVENTS: usize = 100;

/// What every MCP session of one front shares.
#[derive(Debug)]
pub struct FrontConfig {
    /// The route to attach to.
    pub target: Target,
    /// A data dir to list sessions from (read-only), if given.
    pub data_dir: Option<PathBuf>,
    /// The route's name (shown in `serverInfo.title`).
    pub route: String,
    /// Each session's event buffer budget in bytes.
    pub buffer_bytes: usize,
    /// Bridge connections this front may hold at once (HTTP: the session cap), if bounded.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Which of the mod's tools are offered, and whether with their output schemas.
    pub offer: Offer,
}

/// The bridge token an HTTP request authenticated with (any identity of the route), put in the
/// request's extensions by the HTTP front: the session started by that request connects its
/// bridge with it, so the relay applies that identity's role, tools and rate. Never logged.
#[derive(Clone)]
pub struct SessionToken(pub String);

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionToken(..)")
    }
}

/// One MCP session: its own bridge connection (made at first use, made again when cut) and
/// tool-name map.
#[derive(Clone)]
pub struct Front {
    cfg: Arc<FrontConfig>,
    link: Arc<tokio::sync::Mutex<Held>>,
    /// MCP name -> mod name, from the last tool listing.
    tools: Arc<Mutex<BTreeMap<String, String>>>,
    watcher: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// The MCP client's own name (`clientInfo.name`), used when the config names none.
    client_name: Arc<Mutex<Option<String>>>,
    /// The token this session's HTTP client authenticated with, used instead of the config's.
    token: Arc<Mutex<Option<SessionToken>>>,
}

impl Drop for Front {
    fn drop(&mut self) {
        // The last clone gone: stop announcing restarts (the link closes with its last holder).
        if Arc::strong_count(&self.watcher) == 1 {
            if let Some(w) = self.watcher.lock().take() {
                w.abort();
            }
        }
    }
}

/// A front's connection to the relay, what outlives it, and its slot.
#[derive(Default)]
struct Held {
    link: Option<Arc<Link>>,
    shared: Option<Arc<Shared>>,
    /// One of the front's connection slots (HTTP: the session cap), held while the front lives.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

fn text_result(text: String, structured: Option<Value>, is_error: bool) -> CallToolResult {
    let mut v = json!({ "content": [{ "type": "text", "text": text }], "isError": is_error });
    if let Some(s) = structured.filter(Value::is_object) {
        v["structuredContent"] = s;
    }
    serde_json::from_value(v).unwrap_or_else(|_| CallToolResult::error(Vec::new()))
}

fn json_result(v: Value) -> CallToolResult {
    let text = serde_json::to_string(&v).unwrap_or_default();
    text_result(text, Some(v), false)
}

/// A GABP error (or a lost answer) as an MCP tool error the assistant can read.
fn error_result(e: &CallError) -> CallToolResult {
    let structured = match e {
        CallError::Gabp {
            code,
            message,
            data,
        } => json!({ "error": { "code": code, "message": message, "data": data } }),
        CallError::Link(m) | CallError::NotSent(m) => json!({ "error": { "message": m } }),
    };
    text_result(e.to_string(), Some(structured), true)
}

/// A relay's or mod's answer to a tool call, as its result.
fn answer_result(r: Result<Value, CallError>) -> CallToolResult {
    match r {
        Ok(v) => json_result(v),
        Err(e) => error_result(&e),
    }
}

fn internal(msg: impl Into<String>) -> McpError {
    McpError::internal_error(msg.into(), None)
}

impl Front {
    /// A front for `cfg`; its bridge connection is made at first use.
    pub fn new(cfg: Arc<FrontConfig>) -> Front {
        Front::with_held(cfg, Held::default())
    }

    /// A front over an already connected link (stdio connects before serving).
    pub fn with_link(cfg: Arc<FrontConfig>, link: Arc<Link>) -> Front {
        let held = Held {
            shared: Some(link.shared.clone()),
            link: Some(link),
            slot: None,
        };
        Front::with_held(cfg, held)
    }

    fn with_held(cfg: Arc<FrontConfig>, held: Held) -> Front {
        Front {
            cfg,
            link: Arc::new(tokio::sync::Mutex::new(held)),
            tools: Arc::default(),
            watcher: Arc::default(),
            client_name: Arc::default(),
            token: Arc::default(),
        }
    }

    /// The connection to the relay: the live one, or a new one (resuming the one that was
    /// cut, if any).
    async fn link(&self) -> Result<Arc<Link>, McpError> {
        let mut held = self.link.lock().await;
        if let Some(link) = held.link.as_ref().filter(|l| !l.is_closed()) {
            return Ok(link.clone());
        }
        let mut target = self.cfg.target.clone();
        if target.name.is_empty() {
            let client = self.client_name.lock().clone();
            target.name = client.unwrap_or_else(|| "mcp".into());
        }
        if let Some(SessionToken(t)) = self.token.lock().clone() {
            target.token = t;
        }
        if target.token.is_empty() {
            return Err(internal("this MCP session has no bridge token"));
        }
        if held.slot.is_none() {
            if let Some(slots) = &self.cfg.slots {
                held.slot = Some(slots.clone().try_acquire_owned().map_err(|_| {
                    internal("too many MCP sessions are attached to the relay; close one")
                })?);
            }
        }
        let shared = held
            .shared
            .get_or_insert_with(|| Shared::new(self.cfg.buffer_bytes))
            .clone();
        let link = Link::connect(&target, shared, held.link.as_deref())
            .await
            .map_err(|e| internal(format!("{e:#}")))?;
        if held.link.is_some() {
            tracing::info!(route = %link.route, "MCP front reconnected to the relay");
        }
        held.link = Some(link.clone());
        Ok(link)
    }

    /// The mod's tools (from `tools/list` through the relay), renamed; refreshes the name map.
    async fn mod_tools(&self) -> Result<Vec<Value>, CallError> {
        let link = self
            .link()
            .await
            .map_err(|e| CallError::Link(e.message.to_string()))?;
        let listed = link.request("tools/list", json!({})).await?;
        let tools: Vec<Value> = listed["tools"].as_array().cloned().unwrap_or_default();
        let originals: Vec<String> = tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        // Names are given over every tool the mod lists, so a tool keeps its name whatever
        // `--mcp-tools` leaves out; a tool not offered is neither listed nor callable.
        let mut map = names::map(&originals, &OWN_TOOLS);
        map.retain(|_, original| self.cfg.offer.offers(original));
        let by_original: BTreeMap<&String, &String> = map.iter().map(|(k, v)| (v, k)).collect();
        let out = tools
            .iter()
            .filter_map(|t| {
                let original = t["name"].as_str()?;
                let name = by_original.get(&original.to_string())?;
                Some(listing::entry(t, name, original, &self.cfg.offer))
            })
            .collect();
        *self.tools.lock() = map;
        Ok(out)
    }

    /// Announces `tools/list_changed` each time the mod's session restarts.
    fn watch_restarts(&self, link: &Arc<Link>, peer: rmcp::Peer<RoleServer>) {
        let mut rx = link.shared.restarts.subscribe();
        let me = Front {
            cfg: self.cfg.clone(),
            link: self.link.clone(),
            tools: self.tools.clone(),
            watcher: Arc::default(),
            client_name: self.client_name.clone(),
            token: self.token.clone(),
        };
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                // Refresh the map first so a call right after the notice finds the new names.
                let _ = me.mod_tools().await;
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
                let _ = peer.notify_resource_list_changed().await;
            }
        });
        if let Some(old) = self.watcher.lock().replace(task) {
            old.abort();
        }
    }

    async fn poll(&self, link: &Link, args: &Value) -> CallToolResult {
        let (q, wait) = match poll_query(args) {
            Ok(q) => q,
            Err(why) => return text_result(format!("events_poll: {why}"), None, true),
        };
        // The events are the front's own, but a poll is a call like any other: the relay
        // takes it from the identity's rate, and its refusal (-32007, `retryAfterMs`) is the
        // poll's answer. A relay that names no ping has nothing to count it with.
        if link.relay_offers(gabp_engine::bridge::PING) {
            if let Err(e) = link.request(gabp_engine::bridge::PING, json!({})).await {
                return error_result(&e);
            }
        }
        // Text only: re-parsing thousands of events for structuredContent would cost more
        // than the poll itself.
        text_result(link.shared.events.poll(&q, wait).await, None, false)
    }

    async fn sessions(&self, link: &Link) -> CallToolResult {
        if let Some(dir) = &self.cfg.data_dir {
            let dir = dir.clone();
            let listed = tokio::task::spawn_blocking(move || -> anyhow::Result<Value> {
                let store = gabp_storage::Store::open_for_reading(&dir)?;
                let list: Vec<Value> = store
                    .sessions()?
                    .iter()
                    .map(|m| {
                        json!({
                            "id": m.id.to_string(), "route": m.route, "app": m.app_name,
                            "appVersion": m.app_version, "startedNs": m.started_ns,
                            "endedNs": m.ended_ns, "frames": m.frames, "events": m.events,
                            "bridges": m.bridges.len(), "end": m.end_label(),
                        })
                    })
                    .collect();
                Ok(json!({ "sessions": list }))
            })
            .await;
            return match listed {
                Ok(Ok(v)) => json_result(v),
                Ok(Err(e)) => text_result(format!("cannot list sessions: {e}"), None, true),
                Err(_) => text_result("cannot list sessions".into(), None, true),
            };
        }
        match link.request("relay/status", json!({})).await {
            Ok(s) => json_result(json!({ "route": s["route"], "sessions": [s["session"]] })),
            Err(e) => error_result(&e),
        }
    }
}

impl ServerHandler for Front {
    fn get_info(&self) -> InitializeResult {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .build();
        InitializeResult::new(caps)
            .with_server_info(
                Implementation::new("gabp-relay", gabp_engine::route::VERSION)
                    .with_title(format!("gabp-relay MCP front ({})", self.cfg.route)),
            )
            .with_instructions(
                "A game reached through gabp-relay. The game's own tools are listed with `/` \
                 replaced by `_`. Poll `events_poll` with the cursor it returns to follow the \
                 game's events; `relay_status` shows the route; tools the route leases need \
                 the lease, taken with `relay_lease`.",
            )
    }

    /// The client's name is taken here, not at `notifications/initialized`: a client may call
    /// a tool before that notification arrives (over HTTP it is a request of its own, and
    /// some clients never send it), and the bridge it attaches then is named for good.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let name: String = request.client_info.name.chars().take(128).collect();
        *self.client_name.lock() = Some(name);
        let http = context.extensions.get::<hyper::http::request::Parts>();
        if let Some(t) = http.and_then(|p| p.extensions.get::<SessionToken>()) {
            *self.token.lock() = Some(t.clone());
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok(link) = self.link().await {
            self.watch_restarts(&link, context.peer);
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // The relay's own tools are listed even when the mod's cannot be (the mod is down, or
        // the relay itself is, until it is back): `tools/list_changed` follows when the mod's
        // session starts.
        static LOG: gabp_rt::log_budget::LogBudget = gabp_rt::log_budget::LogBudget::new(5);
        let mut missing = None;
        let mut tools = match self.mod_tools().await {
            Ok(tools) => tools,
            // The mod's answer is refused (over --max-body, say) or the mod is not there: the
            // assistant still gets the relay's own tools, the listing's `_meta` says why the
            // game's are missing, and so does the log.
            Err(e) => {
                if let Some(earlier_unlogged) = LOG.admit() {
                    tracing::warn!(
                        earlier_unlogged,
                        "the game's tools cannot be listed, only the relay's are: {e}"
                    );
                }
                missing = Some(e.to_string());
                Vec::new()
            }
        };
        tools.extend(own_tools());
        let tools: Vec<Tool> = tools
            .into_iter()
            .filter_map(|t| {
                let name = t["name"].as_str().unwrap_or_default().to_string();
                serde_json::from_value(t)
                    .map_err(|e| {
                        if let Some(earlier_unlogged) = LOG.admit() {
                            tracing::warn!(earlier_unlogged, tool = %name, "a game tool is left out of the listing: {e}");
                        }
                    })
                    .ok()
            })
            .collect();
        let mut listing = json!({ "tools": tools });
        if let Some(why) = missing {
            listing["_meta"][GAME_TOOLS_MISSING] = Value::String(why);
        }
        serde_json::from_value(listing).map_err(|e| internal(e.to_string()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // A relay that cannot be reached (stopped, restarting) is the call's answer, as a
        // mod that is down is: the front itself goes on and connects again on the next call.
        let link = match self.link().await {
            Ok(link) => link,
            Err(e) => {
                let why = format!("the relay cannot be reached: {}", e.message);
                return Ok(error_result(&CallError::Link(why)).into());
            }
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let result = match &*request.name {
            "events_poll" => self.poll(&link, &args).await,
            "attention_get" => answer_result(link.request("attention/current", json!({})).await),
            "attention_ack" => {
                let Some(id) = args["attentionId"].as_str() else {
                    return Err(McpError::invalid_params("attentionId is required", None));
                };
                answer_result(
                    link.request("attention/ack", json!({ "attentionId": id }))
                        .await,
                )
            }
            "relay_status" => answer_result(link.request("relay/status", json!({})).await),
            "sessions_list" => self.sessions(&link).await,
            // The relay answers (and records) these; they never reach the mod.
            "relay_lease" => answer_result(link.request("relay/lease", args.clone()).await),
            "mark" => answer_result(link.request("relay/mark", args.clone()).await),
            "relay_replay" => answer_result(link.request("relay/replay", args.clone()).await),
            name => {
                let mut original = self.tools.lock().get(name).cloned();
                if original.is_none() {
                    // Called without a listing first (or after a restart): list, then map.
                    // A listing that failed (the mod is down) is the call's answer.
                    if let Err(e) = self.mod_tools().await {
                        return Ok(error_result(&e).into());
                    }
                    original = self.tools.lock().get(name).cloned();
                }
                let Some(original) = original else {
                    return Err(McpError::invalid_params(
                        format!("unknown tool {name}"),
                        None,
                    ));
                };
                match link
                    .request("tools/call", json!({ "name": original, "arguments": args }))
                    .await
                {
                    Ok(v) => {
                        let text = serde_json::to_string(&v).unwrap_or_default();
                        text_result(text, Some(v), false)
                    }
                    Err(e) => error_result(&e),
                }
            }
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let link = self.link().await?;
        let route = &link.route;
        let mut list = vec![
            json!({ "uri": format!("gabp://{route}/welcome"), "name": "welcome", "title": "The mod's welcome", "mimeType": "application/json" }),
            json!({ "uri": format!("gabp://{route}/stats"), "name": "stats", "title": "The route's session and channel counts", "mimeType": "application/json" }),
        ];
        for c in link.channels() {
            // The mod names its channels: the URI escapes what is not plainly printable, and
            // the texts a model reads are stripped like the tool list's.
            let shown = gabp_rt::display::strip(&c, false);
            list.push(json!({
                "uri": format!("gabp://{route}/channels/{}", listing::uri_escape(&c)),
                "name": format!("channel {shown}"),
                "title": format!("Latest events on {shown}"),
                "mimeType": "application/json",
            }));
        }
        serde_json::from_value(json!({ "resources": list })).map_err(|e| internal(e.to_string()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let link = self.link().await?;
        let prefix = format!("gabp://{}/", link.route);
        let Some(rest) = request.uri.strip_prefix(&prefix) else {
            return Err(McpError::resource_not_found("no such resource", None));
        };
        let text = if rest == "welcome" {
            // The welcome as this bridge got it, its texts cleaned as the tool list's are; it
            // carries no token, but be sure.
            let mut w = listing::plain(&link.welcome);
            if let Some(o) = w.as_object_mut() {
                o.remove("token");
            }
            serde_json::to_string(&w).unwrap_or_default()
        } else if rest == "stats" {
            match link.request("relay/status", json!({})).await {
                Ok(s) => serde_json::to_string(&json!({
                    "route": s["route"],
                    "session": s["session"],
                    "recording": s["recording"],
                    "bridges": s["bridges"].as_array().map_or(0, Vec::len),
                }))
                .unwrap_or_default(),
                Err(e) => return Err(internal(e.to_string())),
            }
        } else if let Some(channel) = rest.strip_prefix("channels/") {
            let channel = listing::uri_unescape(channel)
                .ok_or_else(|| McpError::resource_not_found("no such channel", None))?;
            let channel = channel.as_str();
            if !link.channels().iter().any(|c| c == channel) {
                return Err(McpError::resource_not_found("no such channel", None));
            }
            link.shared.events.latest(channel, RESOURCE_EVENTS)
        } else {
            return Err(McpError::resource_not_found("no such resource", None));
        };
        let result: ReadResourceResult = serde_json::from_value(json!({
            "contents": [{ "uri": request.uri, "mimeType": "application/json", "text": text }]
        }))
        .map_err(|e| internal(e.to_string()))?;
        Ok(result.into())
    }
}

/// `events_poll`'s arguments, checked: a field of the wrong type is refused by name rather than
/// read as absent (a `channels: "a/b"` would otherwise poll every channel).
fn poll_query(args: &Value) -> Result<(Query, Duration), String> {
    let channels = match &args["channels"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|c| c.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .ok_or("`channels` must be an array of channel names")?,
        _ => return Err("`channels` must be an array of channel names".into()),
    };
    let cursor = match &args["cursor"] {
        Value::Null => Default::default(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
            .collect::<Option<_>>()
            .ok_or("`cursor` must map channel names to the next seq (integers >= 0)")?,
        _ => return Err("`cursor` must be the object a previous poll returned".into()),
    };
    let session = match &args["session"] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        _ => return Err("`session` must be the session id a previous poll returned".into()),
    };
    // Within the ranges the tool's schema declares, or refused by name: a `max: 0` quietly
    // read as 1 would be a different question answered.
    let int = |key: &str, lo: u64, hi: u64| match &args[key] {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .filter(|n| (lo..=hi).contains(n))
            .map(Some)
            .ok_or(format!("`{key}` must be an integer from {lo} to {hi}")),
    };
    let max = int("max", 1, POLL_MAX as u64)?.map_or(100, |m| m as usize);
    let wait_ms = int("waitMs", 0, POLL_WAIT_MAX.as_millis() as u64)?;
    let wait = Duration::from_millis(wait_ms.unwrap_or(0));
    Ok((
        Query {
            channels,
            cursor,
            session,
            max,
        },
        wait,
    ))
}
