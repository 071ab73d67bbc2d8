//! The relay engine: many GABP bridges share one game mod, and every session is recorded.
//!
//! [`Relay`] starts and stops a relay from a [`RelayConfig`] of [`RouteConfig`]s (each an
//! [`Upstream`] and a slow-bridge policy, [`OnSlow`]); [`generate_token`] makes bridge tokens.
//! The engine takes typed settings only: reading flags and config files is the command line's
//! (`gabp-relay`), reading recordings back is `gabp-analysis`'s, and shipping reaches it
//! through the [`shipping`] hook, so none of clap, toml, Parquet, NATS or MCP is linked here.
//!
//! No module imports one that imports it back (a child module and its parent aside).
//! Modules, in the direction data flows:
//! - [`config`]: routes, policies and the relay's settings, as typed values.
//! - [`auth`]: tokens, constant-time checks, failed-hello throttling.
//! - `upstream`: the backends behind the bridge front (the live mod; a recorded session).
//! - [`hub`]: per-channel relay seq and fan-out of one shared frame.
//! - `window`: the route's recent events, kept for bridges that resume after a drop.
//! - [`outbox`]: each bridge's bounded queue and its slow-consumer policy.
//!   Its `socket`: each bridge's socket, the frames on their way into it, and the slot that
//!   decides who writes.
//! - `direct`: the mod reader's direct write to a bridge whose writer is idle.
//! - [`bridge`]: a bridge connection (strict reading, handshake, forwarding, writers).
//! - [`pending`]: forwarded requests awaiting the mod's answer.
//! - [`route`]: one route's shared state and status, the [`route::Backend`] trait the
//!   upstreams implement, and the route's controller lease ([`route::lease`], `relay/lease`).
//! - [`recorder`]: the recorder thread in front of `gabp-storage`.
//! - [`shipping`]: the hook through which what is recorded is shipped elsewhere.
//! - [`metrics`]: metric names, bounded labels and per-route handles.
//! - `http`: the metrics port (`/metrics`, `/healthz`, `/readyz`).
//! - [`conns`]: places on an HTTP listener (metrics, MCP): totals, per-peer caps, and which
//!   connection is closed to make room.
//! - `server`: starting and stopping a relay.
//! - [`replay`]: serving a recorded session as a mod.
//! - `transport`: the stdio upstream (a mod started as a child process).
//! - [`discovery`]: the bridge discovery file.
//! - [`identity`]: bridge identities, roles, tool globs and rates, and who may hold the lease.

pub mod auth;
pub mod bridge;
pub mod config;
pub mod conns;
pub(crate) mod direct;
pub mod discovery;
pub mod http;
pub mod hub;
pub mod identity;
pub mod metrics;
pub mod outbox;
pub mod pending;
pub mod recorder;
pub mod replay;
pub mod route;
pub(crate) mod server;
pub mod shipping;
pub mod transport;
pub(crate) mod upstream;
pub(crate) mod window;

pub use auth::generate_token;
pub use config::{OnSlow, RelayConfig, RouteConfig, Upstream};
pub use gabp_rt::private_files::private_file_modes;
pub use server::{Relay, ShutdownReport, StartError};
