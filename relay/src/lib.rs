//! gabp-relay: many GABP bridges share one game mod, and every session is recorded.
//!
//! The API, re-exported here: [`Relay`] starts and stops a relay from a [`RelayConfig`] of
//! [`RouteConfig`]s (each an [`Upstream`] and a slow-bridge policy, [`OnSlow`]);
//! [`generate_token`] makes bridge tokens; [`private_file_modes`] sets the umask a recording
//! needs. The modules still `pub` below serve the command line, the benches and the
//! integration tests; the modules named without a link are internal (`pub(crate)`).
//!
//! No module imports one that imports it back (a child module and its parent aside).
//! Modules, in the direction data flows:
//! - [`cli`]: the command line (`gabp-relay`'s parsing, dispatch and one module per command).
//! - [`config`]: routes and policies, from flags or TOML.
//! - `auth`: tokens, constant-time checks, failed-hello throttling.
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
//! - `recorder`: the recorder thread in front of `gabp-storage`.
//! - [`metrics`]: metric names, bounded labels and per-route handles.
//! - `log_budget`: log lines a peer can cause, sampled per call site.
//! - `http`: the metrics port (`/metrics`, `/healthz`, `/readyz`).
//! - `conns`: places on an HTTP listener (metrics, MCP): totals, per-peer caps, and which
//!   connection is closed to make room.
//! - `server`: starting and stopping a relay.
//! - [`replay`], [`export`], [`stats`], [`report`]: reading recordings back; `calls`: what
//!   `stats` and the report share when they match answers to requests.
//! - `transport`: the stdio upstream (a mod started as a child process).
//! - `discovery`: the bridge discovery file.
//! - `display`: untrusted names made safe for tables.
//! - `wrap`: running the relay invisibly between a launcher and a game.
//! - `mcp`: the MCP front (an MCP server attached to a route as a bridge).
//! - [`identity`]: bridge identities, roles, tool globs and rates, and who may hold the lease.
//! - [`units`], [`route_name`], [`usage`], `private_files`: leaves every layer may use (sizes
//!   and durations, route names, usage errors, the file creation mode).
//! - [`ship`]: shipping recordings to NATS JetStream and collecting them into an archive.
//! - `demo`: the built-in demo (simulated mod, relay, bridges in one process).

pub(crate) mod auth;
pub mod bridge;
pub(crate) mod calls;
pub mod cli;
pub mod config;
pub(crate) mod conns;
pub(crate) mod demo;
pub(crate) mod direct;
pub(crate) mod discovery;
pub(crate) mod display;
pub mod export;
pub(crate) mod http;
pub mod hub;
pub mod identity;
pub(crate) mod log_budget;
pub(crate) mod mcp;
pub mod metrics;
pub mod outbox;
pub mod pending;
pub(crate) mod private_files;
pub(crate) mod recorder;
pub mod replay;
pub mod report;
pub mod route;
pub mod route_name;
pub(crate) mod server;
pub mod ship;
pub mod stats;
pub(crate) mod transport;
pub mod units;
pub(crate) mod upstream;
pub mod usage;
pub(crate) mod window;
pub(crate) mod wrap;

pub use auth::generate_token;
pub use config::{OnSlow, RelayConfig, RouteConfig, Upstream};
pub use recorder::private_file_modes;
pub use server::{Relay, ShutdownReport, StartError};
