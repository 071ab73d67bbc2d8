//! gabp-relay: many GABP bridges share one game mod, and every session is recorded.
//!
//! Modules, in the direction data flows:
//! - [`config`]: routes and policies, from flags or TOML.
//! - [`auth`]: tokens, constant-time checks, failed-hello throttling.
//! - [`upstream`]: the mod connection (connect, hello, read, route, reconnect).
//! - [`hub`]: per-channel relay seq and fan-out of one shared frame.
//! - [`outbox`]: each bridge's bounded queue and its slow-consumer policy.
//! - [`sink`]: each bridge's socket and the frames on their way into it (written by the mod
//!   reader directly when the bridge's writer is idle).
//! - [`bridge`]: a bridge connection (strict reading, handshake, forwarding, writers).
//! - [`pending`]: forwarded requests awaiting the mod's answer.
//! - [`route`]: one route's shared state and status.
//! - [`recorder`]: the recorder thread in front of `gabp-storage`.
//! - [`metrics`]: metric handles and the Prometheus endpoint.
//! - [`server`]: starting and stopping a relay.
//! - [`replay`], [`export`], [`stats`]: reading recordings back.
//! - [`transport`]: the stdio upstream (a mod started as a child process).
//! - [`discovery`]: the bridge discovery file.
//! - [`display`]: untrusted names made safe for tables.
//! - [`wrap`]: running the relay invisibly between a launcher and a game.
//! - [`demo`]: the built-in demo (simulated mod, relay, bridges in one process).

pub mod auth;
pub mod bridge;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod display;
pub mod export;
pub mod hub;
pub mod mcp;
pub mod metrics;
pub mod outbox;
pub mod pending;
pub mod recorder;
pub mod replay;
pub mod route;
pub mod server;
pub mod sink;
pub mod stats;
pub mod transport;
pub mod upstream;
pub mod wrap;

pub use config::{OnSlow, RelayConfig, RouteConfig, Upstream};
pub use server::Relay;
