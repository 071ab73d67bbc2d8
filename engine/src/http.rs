//! The metrics port: `GET /metrics` (Prometheus text), `/healthz` and `/readyz`, over hyper.
//!
//! `/healthz` answers 200 while the process serves at all (systemd's watchdog, a liveness
//! probe). `/readyz` answers 200 only when every route's mod is connected (its welcome received)
//! and the recorder's last commit succeeded, else 503 with one short line saying why (a
//! readiness probe, a load balancer). Nothing here reads a peer's bytes beyond the request line
//! and headers, and nothing a peer sends reaches a label or a log.
//!
//! The port is bounded like the bridge ports: at most [`MAX_CONNS`] connections at once, each
//! closed after [`CONN_TIMEOUT`] whatever it does (one request per connection). A connection
//! that arrives while all are taken closes the oldest one that has not yet sent a whole
//! request ([`crate::conns`]), so idle or trickling connections never delay a probe or a
//! scrape; when every one is being answered, it waits for one to end. Accept errors
//! (out of descriptors) back off instead of spinning. This module must not touch routes'
//! state beyond reading it: it holds them weakly, so it never keeps a stopped route (or its
//! recorder handle) alive.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::conns::Conns;
use crate::route::Route;

/// Connections served at once; more wait in the listen backlog until one ends.
pub const MAX_CONNS: usize = 64;
/// The longest a connection may live: enough to send a request and read a big `/metrics`.
pub const CONN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait after a failed accept (out of descriptors and the like) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What `/readyz` looks at: the relay's routes, held weakly, filled in once they have started.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<RwLock<Vec<Weak<Route>>>>);

impl Readiness {
    /// Watches these routes (called once they have all started).
    pub fn watch(&self, routes: &[Arc<Route>]) {
        *self.0.write() = routes.iter().map(Arc::downgrade).collect();
    }

    /// `Ok` when every route's mod is connected and no recorder is failing; else why not.
    pub fn check(&self) -> Result<(), String> {
        let routes = self.0.read();
        if routes.is_empty() {
            return Err("starting".into());
        }
        for route in routes.iter() {
            let Some(route) = route.upgrade() else {
                return Err("shutting down".into());
            };
            if route.cancel.is_cancelled() {
                return Err("shutting down".into());
            }
            if route.current().is_none() {
                return Err(format!("route {}: mod not connected", route.cfg.name));
            }
            if route.recorder.as_ref().is_some_and(|r| !r.health().ok) {
                return Err("recorder failing".into());
            }
        }
        Ok(())
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the metrics port until cancelled.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    ready: Readiness,
    cancel: CancellationToken,
) {
    let conns = Conns::new(MAX_CONNS, MAX_CONNS);
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let (sock, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        // Full: the oldest connection still without a request was closed to make room; when
        // every one is being answered, wait (each ends within CONN_TIMEOUT).
        let sock_fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        let place = loop {
            if let Some(p) = conns.admit_socket(peer.ip(), Some(sock_fd)) {
                break p;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = conns.freed() => {}
            }
        };
        let (handle, ready) = (handle.clone(), ready.clone());
        tokio::spawn(async move {
            let served = place.served();
            let service = hyper::service::service_fn(move |req: Request<_>| {
                served.mark();
                let resp = respond(&req, &handle, &ready);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(CONN_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(sock), service);
            // Errors are the peer's (bad request, reset, timeout): nothing to log.
            tokio::select! {
                _ = tokio::time::timeout(CONN_TIMEOUT, conn) => {}
                _ = place.closed() => {}
            }
        });
    }
}

/// The answer to one request.
fn respond<B>(
    req: &Request<B>,
    handle: &PrometheusHandle,
    ready: &Readiness,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" | "/" => {
            let mut resp = text(StatusCode::OK, handle.render());
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match ready.check() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
