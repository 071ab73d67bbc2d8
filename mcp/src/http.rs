//! `serve --mcp-listen`: MCP's Streamable HTTP transport served from the relay process.
//!
//! Each MCP session gets its own bridge connection to the route's listener (so it is one more
//! bridge, recorded and limited like any other). Every HTTP request must carry a token of one of
//! the route's bridge identities (its `token`, or a `[[route.bridge]]` one) as
//! `Authorization: Bearer T` (scheme in any case; compared with every identity's in constant
//! time, as hellos are). The session's bridge presents that same token, so the relay applies
//! that identity's role, tools, rate and lease and records its name; a session is bound to the
//! identity that opened it (a request naming it with another identity's token is answered as for
//! an unknown session). Wrong tokens are throttled per source and counted like failed hellos on
//! the bridge port, and logged once per burst; their connection is closed after the answer. The
//! listener is loopback-only unless the operator allows remote listeners.
//!
//! Bounds: [`MAX_CONNS`] connections at once and [`PER_PEER`] from one address; one arriving at
//! either bound closes the oldest connection in its way that has not yet sent an authenticated
//! request ([`gabp_engine::conns`]), so idle connections never keep out a client with a token (when
//! all are authenticated, the new one is closed at once). An authenticated connection belongs
//! to the identity of its latest request, and one identity holds at most [`CONNS_PER_IDENTITY`]
//! of them (one more closes its oldest), so no token holder, however many connections it
//! opens, fills the listener or an address's places for every other identity.
//! [`HEADER_TIMEOUT`] to send a request's headers (an idle keep-alive connection is closed
//! after it) and [`BODY_TIMEOUT`] for its body
//! (a connection counts as authenticated only once its request is whole), [`MAX_SESSIONS`] MCP
//! sessions (and bridge connections) at once and [`SESSIONS_PER_IDENTITY`] of one identity's,
//! a session closed after [`IDLE`] without a request
//! (`GABP_RELAY_MCP_IDLE_MS` shortens it, for tests), bodies up to [`MAX_BODY`]; a body that is
//! not a JSON-RPC message gets a short JSON-RPC error.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::listing::Offer;
use super::server::{Front, FrontConfig, SessionToken};
use gabp_engine::conns::{Conns, Served};
use gabp_engine::identity::Identity;
use gabp_engine::route::Route;
use gabp_rt::log_budget::LogBudget;

/// The path the MCP endpoint is served at.
pub const PATH: &str = "/mcp";
/// Connections open at once (the oldest not yet authenticated is closed to make room).
pub const MAX_CONNS: usize = 128;
/// Connections open at once from one address (the same rule within them).
pub const PER_PEER: usize = 64;
/// Authenticated connections one identity holds at once (one more closes its oldest): half an
/// address's places, a quarter of all.
pub const CONNS_PER_IDENTITY: usize = 32;
/// How long a connection may take to send a request's headers (or sit idle between requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive once its headers have.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// MCP sessions (each a bridge connection) at once.
pub const MAX_SESSIONS: usize = 32;
/// MCP sessions one identity may hold at once.
pub const SESSIONS_PER_IDENTITY: usize = 8;
/// A session without a request for this long is closed (its bridge with it).
pub const IDLE: Duration = Duration::from_secs(300);
/// The largest request body.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// How long a finished request's answer is kept for a client resuming its stream: short, as
/// every kept answer (an `events_poll` can be megabytes) is memory.
const RESUME_TTL: Duration = Duration::from_secs(2);

type Body = BoxBody<Bytes, Infallible>;

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        // A connection that failed authentication is not kept for another try.
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A JSON-RPC error as the whole answer (a body that is not a message).
fn rpc_error(id: Value, code: i64, msg: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": msg}});
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The token of an `Authorization: Bearer T` header (scheme in any case).
fn bearer<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
}

/// The token check: the route's identities, its throttle and failure counter, and a log line
/// per burst.
struct Gate {
    route: Weak<Route>,
    /// Wrong tokens are logged once per `log_budget::WINDOW`, with the count since.
    burst: LogBudget,
}

/// What a request's token says.
enum Verdict {
    /// An identity of the route.
    Known(Arc<Identity>),
    /// No identity's token.
    Unknown,
    /// The route is gone (shutting down).
    Gone,
}

impl Gate {
    /// The identity whose token `req` carries (every identity compared, in constant time).
    fn identify<B>(&self, req: &Request<B>) -> Verdict {
        let Some(route) = self.route.upgrade() else {
            return Verdict::Gone;
        };
        match bearer(req).and_then(|t| route.access().table().find(t)) {
            Some(id) => Verdict::Known(id),
            None => Verdict::Unknown,
        }
    }

    /// How long to wait before answering a failure from `peer` (`None`: the route is gone).
    fn fail(&self, peer: &SocketAddr) -> Option<Duration> {
        let route = self.route.upgrade()?;
        let delay = route.auth_failed(&peer.ip().to_string());
        if let Some(earlier_unlogged) = self.burst.admit() {
            tracing::warn!(
                route = %route.cfg().name, source = %peer.ip(), earlier_unlogged,
                "security: MCP request without a bridge token of the route (more in the next 10 s are counted in gabp_auth_failures_total, not logged)"
            );
        }
        Some(delay)
    }

    fn succeed(&self, peer: &SocketAddr) {
        if let Some(route) = self.route.upgrade() {
            route.auth_succeeded(&peer.ip().to_string());
        }
    }
}

/// What every connection shares.
struct Shared {
    gate: Gate,
    service: StreamableHttpService<Front, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    /// Which identity (by name; `None` the route's own token) opened each session.
    owners: Mutex<HashMap<String, Option<String>>>,
}

impl Shared {
    /// Whether `session` may be used by `identity`: a session opened by another identity is
    /// refused as unknown. Sessions this front does not know are left to rmcp (404).
    fn owned_by(&self, session: &str, identity: &Identity) -> bool {
        self.owners
            .lock()
            .get(session)
            .is_none_or(|owner| *owner == identity.name)
    }

    /// Live sessions `identity` opened.
    async fn held_by(&self, identity: &Identity) -> usize {
        let live = self.sessions.sessions.read().await;
        self.owners
            .lock()
            .iter()
            .filter(|(id, owner)| {
                **owner == identity.name && live.keys().any(|k| k.as_ref() == id.as_str())
            })
            .count()
    }

    /// Notes that `identity` opened `session`, forgetting sessions that have ended.
    async fn opened(&self, session: &str, identity: &Identity) {
        let live = self.sessions.sessions.read().await;
        let mut owners = self.owners.lock();
        owners.retain(|id, _| live.keys().any(|k| k.as_ref() == id.as_str()));
        owners.insert(session.to_string(), identity.name.clone());
    }
}

/// The idle timeout: [`IDLE`], or `GABP_RELAY_MCP_IDLE_MS` when set.
fn idle() -> Duration {
    std::env::var("GABP_RELAY_MCP_IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(IDLE, Duration::from_millis)
}

async fn respond(
    shared: Arc<Shared>,
    peer: SocketAddr,
    served: Served,
    mut req: Request<Incoming>,
) -> Response<Body> {
    if req.uri().path() != PATH {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    let identity = match shared.gate.identify(&req) {
        Verdict::Known(id) => id,
        Verdict::Gone => return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
        Verdict::Unknown => {
            let Some(delay) = shared.gate.fail(&peer) else {
                return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
            };
            tokio::time::sleep(delay).await;
            return plain(StatusCode::UNAUTHORIZED, "a bearer token is required\n");
        }
    };
    shared.gate.succeed(&peer);
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    if session
        .as_deref()
        .is_some_and(|s| !shared.owned_by(s, &identity))
    {
        return plain(StatusCode::NOT_FOUND, "Not Found: Session not found\n");
    }
    req.extensions_mut()
        .insert(SessionToken(identity.token().to_string()));
    if req.method() != Method::POST {
        // A connection with a good token and a whole request is never closed to make room
        // (only for one more of its identity's beyond that identity's share).
        served.mark_by(identity.label());
        return shared.service.handle(req).await;
    }
    let (parts, body) = req.into_parts();
    // The body, whole, within BODY_TIMEOUT: a token holder trickling a body holds no place
    // for longer, and until it is whole the connection may be closed to make room.
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => {
                return plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("the request body is larger than {MAX_BODY} bytes or was cut off\n"),
                )
            }
            Err(_) => {
                let mut r = plain(
                    StatusCode::REQUEST_TIMEOUT,
                    &format!("the request body did not arrive within {BODY_TIMEOUT:?}\n"),
                );
                r.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
        };
    served.mark_by(identity.label());
    // A body rmcp cannot take gets a JSON-RPC error here, without the parser's internals.
    let Ok(msg) = serde_json::from_slice::<ClientJsonRpcMessage>(&body) else {
        return match serde_json::from_slice::<Value>(&body) {
            Err(_) => rpc_error(Value::Null, -32700, "Parse error"),
            Ok(v) => {
                let id = match &v["id"] {
                    id @ (Value::String(_) | Value::Number(_)) => id.clone(),
                    _ => Value::Null,
                };
                rpc_error(id, -32600, "Invalid Request")
            }
        };
    };
    if let Some((id, why)) = super::params::misshapen(&msg) {
        let mut r = rpc_error(id, -32602, &why);
        // A well-formed JSON-RPC request with its answer: not an HTTP-level failure.
        *r.status_mut() = StatusCode::OK;
        return r;
    }
    let initialize = matches!(&msg, ClientJsonRpcMessage::Request(r)
        if matches!(r.request, ClientRequest::InitializeRequest(_)));
    if initialize
        && !parts.headers.contains_key("mcp-session-id")
        && shared.sessions.sessions.read().await.len() >= MAX_SESSIONS
    {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("too many MCP sessions ({MAX_SESSIONS}); close one (HTTP DELETE) or wait for idle ones to expire\n"),
        );
    }
    // One identity holds at most a share of the sessions: its assistants cannot keep every
    // other identity's out.
    if initialize
        && !parts.headers.contains_key("mcp-session-id")
        && shared.held_by(&identity).await >= SESSIONS_PER_IDENTITY
    {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "bridge {:?} holds {SESSIONS_PER_IDENTITY} MCP sessions, as many as one identity may; close one (HTTP DELETE) or wait for idle ones to expire\n",
                identity.label()
            ),
        );
    }
    let resp = shared
        .service
        .handle(Request::from_parts(parts, Full::new(body)))
        .await;
    if initialize {
        let opened = resp.headers().get("mcp-session-id");
        if let Some(id) = opened.and_then(|v| v.to_str().ok()) {
            shared.opened(id, &identity).await;
        }
    }
    resp
}

/// Binds `addr` and serves MCP there in the background; returns the bound address.
pub async fn listen(
    addr: SocketAddr,
    allow_remote: bool,
    cfg: FrontConfig,
    route: Weak<Route>,
) -> Result<SocketAddr> {
    if !addr.ip().is_loopback() && !allow_remote {
        bail!("--mcp-listen {addr} is not a loopback address (add --allow-remote to allow it)");
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for MCP on {addr}"))?;
    let bound = listener.local_addr()?;
    let cfg = Arc::new(cfg);
    let mut config = StreamableHttpServerConfig::default();
    if allow_remote {
        // The bearer token is the gate then; the host check would refuse every remote name.
        config = config.disable_allowed_hosts();
    }
    config.max_request_body_bytes = MAX_BODY;
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(idle());
    sessions.session_config.completed_cache_ttl = RESUME_TTL;
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        move || Ok(Front::new(cfg.clone())),
        sessions.clone(),
        config,
    );
    let shared = Arc::new(Shared {
        gate: Gate {
            route,
            burst: LogBudget::new(1),
        },
        service,
        sessions,
        owners: Mutex::default(),
    });
    let conns = Conns::new(MAX_CONNS, PER_PEER).per_identity(CONNS_PER_IDENTITY);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: back off instead of spinning on the error.
                    tracing::warn!(error = %e, "MCP listener cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
            let Some(place) = conns.admit_socket(peer.ip(), Some(fd)) else {
                // Every connection in the way is authenticated: closed at once, so a flood
                // never holds descriptors.
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let shared = shared.clone();
            tokio::spawn(async move {
                let served = place.served();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (shared, served) = (shared.clone(), served.clone());
                    async move { Ok::<_, Infallible>(respond(shared, peer, served, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = place.closed() => {}
                }
            });
        }
    });
    Ok(bound)
}

/// Serves MCP for the relay's first route, each MCP session a bridge of that route.
pub async fn serve_route(
    relay: &gabp_engine::Relay,
    addr: SocketAddr,
    allow_remote: bool,
    data_dir: Option<std::path::PathBuf>,
    offer: Offer,
) -> Result<SocketAddr> {
    let (Some(route), Some(bridges)) = (relay.routes.first(), relay.addrs.first()) else {
        bail!("--mcp-listen needs a route");
    };
    let cfg = FrontConfig {
        target: super::link::Target {
            addr: bridges.clone(),
            // Each session presents the token its client authenticated with.
            token: String::new(),
            // Each session is named after its MCP client (`clientInfo.name`).
            name: String::new(),
            file: None,
        },
        data_dir,
        route: route.cfg().name.clone(),
        buffer_bytes: super::events::HTTP_BYTES,
        slots: Some(Arc::new(Semaphore::new(MAX_SESSIONS))),
        offer,
    };
    listen(addr, allow_remote, cfg, Arc::downgrade(route)).await
}
