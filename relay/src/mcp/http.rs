//! `serve --mcp-listen`: MCP's Streamable HTTP transport served from the relay process.
//!
//! Each MCP session gets its own bridge connection to the route's listener (so it is one more
//! bridge, recorded and limited like any other). Every HTTP request must carry the route's token
//! as `Authorization: Bearer T` (checked in constant time); the listener is loopback-only
//! unless the operator allows remote listeners.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::server::{Front, FrontConfig};

/// The path the MCP endpoint is served at.
pub const PATH: &str = "/mcp";

fn plain(
    status: StatusCode,
    text: &'static str,
) -> Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *r.status_mut() = status;
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

fn bearer_ok(req: &Request<Incoming>, token: &str) -> bool {
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| crate::auth::token_matches(token, t.trim()))
}

/// Binds `addr` and serves MCP there in the background; returns the bound address.
pub async fn listen(addr: SocketAddr, allow_remote: bool, cfg: FrontConfig) -> Result<SocketAddr> {
    if !addr.ip().is_loopback() && !allow_remote {
        bail!("--mcp-listen {addr} is not a loopback address (add --allow-remote to allow it)");
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for MCP on {addr}"))?;
    let bound = listener.local_addr()?;
    let token: Arc<str> = Arc::from(cfg.target.token.as_str());
    let cfg = Arc::new(cfg);
    let mut config = StreamableHttpServerConfig::default();
    if allow_remote {
        // The bearer token is the gate then; the host check would refuse every remote name.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(Front::new(cfg.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: back off instead of spinning on the error.
                    tracing::warn!(error = %e, "MCP listener cannot accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (service, token) = (service.clone(), token.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (service, token) = (service.clone(), token.clone());
                    async move {
                        if req.uri().path() != PATH {
                            return Ok::<_, Infallible>(plain(
                                StatusCode::NOT_FOUND,
                                "not found\n",
                            ));
                        }
                        if !bearer_ok(&req, &token) {
                            tracing::warn!(
                                "security: MCP request without the route's bearer token"
                            );
                            return Ok(plain(
                                StatusCode::UNAUTHORIZED,
                                "a bearer token is required\n",
                            ));
                        }
                        Ok(service.handle(req).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(bound)
}

/// Serves MCP for the relay's first route, each MCP session a bridge of that route.
pub async fn serve_route(
    relay: &crate::Relay,
    addr: SocketAddr,
    allow_remote: bool,
    data_dir: Option<std::path::PathBuf>,
) -> Result<SocketAddr> {
    let (Some(route), Some(bridges)) = (relay.routes.first(), relay.addrs.first()) else {
        bail!("--mcp-listen needs a route");
    };
    let cfg = FrontConfig {
        target: super::link::Target {
            addr: bridges.clone(),
            token: route.cfg.token.clone(),
            // Each session is named after its MCP client (`clientInfo.name`).
            name: String::new(),
        },
        data_dir,
    };
    listen(addr, allow_remote, cfg).await
}
