//! Running a relay: routes, listeners, the recorder, metrics, retention and shutdown.
//!
//! [`Relay::start`] brings everything up and returns a handle; `gabp-relay serve` and the
//! integration tests both use it. Shutdown follows one deadline: stop accepting, let each
//! connection finish its frame, end sessions (answering what is pending), flush writers,
//! drain and sync the recorder, then ship what it wrote last (when shipping).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_proto::{frame_bytes, ErrorCode};
use gabp_rt::net::{Addr, Listener};
use gabp_storage::{Store, StoreOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::RelayConfig;
use crate::recorder::{Recorder, RecorderThread};
use crate::route::Backend;
use crate::route::Route;
use crate::upstream::{Connector, Live, SocketConnector};

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data dir could not be opened.
    #[error("{0}")]
    Store(#[from] gabp_storage::StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A stdio mod that cannot be started.
    #[error("route {route}: {why}")]
    StdioMod {
        /// The route.
        route: String,
        /// Why (one line).
        why: String,
    },
    /// A non-loopback listener without `--allow-remote`.
    #[error("refusing to listen on {0}: not a loopback address (pass --allow-remote to allow it)")]
    Remote(String),
}

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    /// Routes, in config order.
    pub routes: Vec<Arc<Route>>,
    /// Where each route listens (real ports when bound to port 0).
    pub addrs: Vec<Addr>,
    /// Where metrics are served, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    recorder_thread: Option<RecorderThread>,
    shipper: Option<Box<dyn crate::shipping::ShippingTask>>,
    shutdown_timeout: Duration,
}

impl Relay {
    /// Starts every route of `cfg`.
    pub async fn start(cfg: RelayConfig) -> Result<Relay, StartError> {
        Relay::start_with(cfg, Arc::new(SocketConnector)).await
    }

    /// Starts with a custom upstream connector (stdio, wrap).
    pub async fn start_with(
        cfg: RelayConfig,
        connector: Arc<dyn Connector>,
    ) -> Result<Relay, StartError> {
        for r in &cfg.routes {
            if !cfg.allow_remote && !r.listen.is_local() {
                return Err(StartError::Remote(r.listen.to_string()));
            }
            if let crate::config::Upstream::Stdio(cmd) = &r.upstream {
                crate::transport::check_command(cmd).map_err(|why| StartError::StdioMod {
                    route: r.name.clone(),
                    why,
                })?;
            }
            if !r.listen.is_local() {
                tracing::warn!(listen = %r.listen, "listening on a non-loopback address: anyone who can reach it may try tokens");
            }
        }
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let ready = crate::http::Readiness::default();
        // Metrics first: everything started below registers its handles with this recorder.
        let metrics_addr = match cfg.metrics {
            Some(addr) => {
                let listener =
                    crate::http::bind(addr)
                        .await
                        .map_err(|source| StartError::Bind {
                            addr: addr.to_string(),
                            source,
                        })?;
                let bound = listener.local_addr().ok();
                if let Some(handle) = crate::metrics::install() {
                    tracker.spawn(crate::http::serve(
                        listener,
                        handle,
                        ready.clone(),
                        cancel.clone(),
                    ));
                } else {
                    tracing::warn!("a metrics recorder is already installed in this process; /metrics not served");
                }
                bound
            }
            None => None,
        };
        let (recorder, recorder_thread, shipper) = if cfg.records() {
            crate::recorder::private_file_modes();
            let store = Store::open(
                &cfg.data_dir,
                StoreOptions {
                    durability: cfg.durability,
                    compression: cfg.compression,
                    read_only: false,
                    wal_compression: cfg.wal_compression,
                    allow_symlinked_dir: cfg.allow_symlinked_data_dir,
                },
            )?;
            apply_retention(&store, &cfg);
            // The recorder thread holds the only handle (it reopens the store after I/O
            // errors), so later retention runs there too.
            let (rec, thread) = Recorder::start(store, cfg.on_record_error, cfg.record_queue);
            let shipment = cfg.ship.as_ref().map(|s| s.start(rec.store_slot()));
            let status = shipment.as_ref().map(|s| s.status.clone());
            if let Some(status) = &status {
                rec.set_ship(status.clone());
            }
            let r = cfg.retain;
            if r.max_age.is_some() || r.max_bytes.is_some() {
                let (rec, c, keep) = (rec.clone(), cancel.clone(), keep_unshipped(&cfg));
                let status = status.clone();
                tracker.spawn(async move {
                    loop {
                        tokio::select! { _ = c.cancelled() => return, _ = tokio::time::sleep(Duration::from_secs(60)) => {} }
                        // Shipped means: to the destination shipping reaches now.
                        let to = status.as_ref().and_then(|s| s.destination());
                        rec.send(crate::recorder::RecMsg::Retain {
                            max_age_ns: r.max_age.map(|d| d.as_nanos() as u64),
                            max_bytes: r.max_bytes,
                            keep_unshipped: keep.then_some(to),
                        })
                        .await;
                    }
                });
            }
            let shipper = shipment.map(|s| s.task);
            (Some(rec), Some(thread), shipper)
        } else {
            (None, None, None)
        };
        let mut routes = Vec::new();
        let mut addrs = Vec::new();
        for rc in cfg.routes.clone() {
            let listener = Listener::bind(&rc.listen)
                .await
                .map_err(|source| StartError::Bind {
                    addr: rc.listen.to_string(),
                    source,
                })?;
            addrs.push(listener.local_addr().map_err(|source| StartError::Bind {
                addr: rc.listen.to_string(),
                source,
            })?);
            let backend = Arc::new(Live::new(connector.clone()));
            let route = Route::new(rc, recorder.clone(), cancel.child_token(), backend);
            serve_route(&route, listener, &tracker);
            routes.push(route);
        }
        drop(recorder);
        ready.watch(&routes);
        Ok(Relay {
            routes,
            addrs,
            metrics_addr,
            cancel,
            tracker,
            recorder_thread,
            shipper,
            shutdown_timeout: cfg.shutdown_timeout,
        })
    }

    /// Shuts down within the configured bound; returns whether everything finished in time.
    pub async fn shutdown(self) -> bool {
        self.shutdown_report().await.clean
    }

    /// Shuts down within the configured bound, saying what did not finish.
    pub async fn shutdown_report(mut self) -> ShutdownReport {
        let deadline = Instant::now() + self.shutdown_timeout;
        for route in &self.routes {
            let _ = route.stop_by.set(deadline);
        }
        self.cancel.cancel();
        if let Some(t) = &self.recorder_thread {
            t.begin_stop(deadline);
        }
        self.tracker.close();
        let clean = tokio::time::timeout_at(deadline.into(), self.tracker.wait())
            .await
            .is_ok();
        // Routes (and their recorder handles) go away; the recorder drains and syncs.
        self.routes.clear();
        let mut unrecorded = 0;
        if let Some(thread) = self.recorder_thread.take() {
            // Never past the bound: the recorder gave up on a failing disk before it, and a
            // thread still busy then is cut by the exit like a crash (RocksDB recovers).
            let left = deadline.saturating_duration_since(Instant::now());
            let join = tokio::task::spawn_blocking(move || thread.join());
            match tokio::time::timeout(left, join).await {
                Ok(Ok(n)) => unrecorded = n,
                _ => {
                    tracing::error!("recorder did not finish within the shutdown bound");
                    if let Some(s) = self.shipper.take() {
                        s.stop();
                    }
                    return ShutdownReport {
                        clean: false,
                        unrecorded,
                    };
                }
            }
        }
        // What the recorder wrote last (the final frames, every session's end) ships now,
        // within what is left of the bound; the rest waits for the next run.
        if let Some(s) = self.shipper.take() {
            s.finish(deadline).await;
        }
        ShutdownReport { clean, unrecorded }
    }
}

/// How a shutdown went.
#[derive(Debug, Clone, Copy)]
pub struct ShutdownReport {
    /// Whether every task finished within the bound.
    pub clean: bool,
    /// Frames not recorded because writes still failed when the bound was near.
    pub unrecorded: u64,
}

fn apply_retention(store: &Store, cfg: &RelayConfig) {
    let r = cfg.retain;
    if r.max_age.is_none() && r.max_bytes.is_none() {
        return;
    }
    // Before shipping has reached its destination nothing counts as shipped.
    crate::recorder::apply_retention(
        store,
        r.max_age.map(|d| d.as_nanos() as u64),
        r.max_bytes,
        keep_unshipped(cfg).then_some(None),
    );
}

/// Whether retention must keep sessions not fully shipped.
fn keep_unshipped(cfg: &RelayConfig) -> bool {
    cfg.ship.is_some() && !cfg.retain_unshipped
}

/// How often the recorder is asked to mark what is committed: at most this much of a recording
/// can go missing later without every command refusing the data dir.
const MARK_EVERY: Duration = Duration::from_secs(1);

/// Serves `route` on `listener`: its backend, the bridge front, and the sweeper, all tracked by
/// `tracker` and stopped by the route's cancellation. The one way any route is served, live or
/// replayed.
pub fn serve_route(route: &Arc<Route>, listener: Listener, tracker: &TaskTracker) {
    let backend: Arc<dyn Backend> = route.backend.clone();
    tracker.spawn(backend.run(route.clone()));
    tracker.spawn(crate::bridge::accept_loop(
        route.clone(),
        listener,
        tracker.clone(),
    ));
    tracker.spawn(sweeper(route.clone()));
}

/// Times out pending requests, publishes queue-depth gauges, and asks the recorder to move its
/// committed mark about once a second.
async fn sweeper(route: Arc<Route>) {
    let period = (route.cfg.request_timeout / 10)
        .clamp(Duration::from_millis(10), Duration::from_millis(250));
    let mut tick = tokio::time::interval(period);
    let mut marked = Instant::now();
    loop {
        tokio::select! { _ = route.cancel.cancelled() => return, _ = tick.tick() => {} }
        if let Some(r) = route
            .recorder
            .as_ref()
            .filter(|_| marked.elapsed() >= MARK_EVERY)
        {
            marked = Instant::now();
            // Never waits: a recorder with no room has a mark request queued already or soon.
            let _ = r.try_send_batch(vec![crate::recorder::RecMsg::Mark]);
        }
        for entry in route.pending.expire(Instant::now()) {
            let (_, count) = route.request_metrics(&entry.method, "timeout");
            count.increment(1);
            let msg = format!(
                "no answer from the mod within {:?}; the request may or may not have taken effect",
                route.cfg.request_timeout
            );
            if let Some((conn, outbox, body)) = entry.error_reply(ErrorCode::OutcomeUnknown, &msg) {
                // Recorded if the bridge is still there to be told, without waiting, so a
                // stalled disk does not hold later timeouts.
                if outbox.push_control(frame_bytes(&body)) {
                    route.record_reply_detached(entry.session, conn, body);
                }
            }
        }
        let deepest = route
            .bridges
            .lock()
            .values()
            .map(|b| b.outbox.depth().events)
            .max()
            .unwrap_or(0);
        route.metrics.outbox_events.set(deepest as f64);
        if let Some(r) = &route.recorder {
            route.metrics.recorder_lag.set(r.lag() as f64);
            route.metrics.recorder_lag_bytes.set(r.lag_bytes() as f64);
        }
    }
}
