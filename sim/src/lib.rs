//! Simulated GABP peers and the transport plumbing they share with the relay.
//!
//! - [`net`]: addresses (`127.0.0.1:PORT`, `unix:PATH`), listeners and boxed byte streams.
//! - [`clock`]: wall-clock nanoseconds, the one time base shared across processes.
//! - [`events`]: event bodies, the emission schedule and closed-loop pacing, shared with the
//!   load generator's broker publishers.
//! - [`modsim`]: a seeded simulated mod: channels, event rate and sizes, tool calls with latency,
//!   and the quirks of real mod libraries (seq from 1, `"error": null`, an event `timestamp`).
//! - [`client`]: a bridge-side GABP client for tests, the demo and the load generator.
//!
//! The demo, the integration tests and `gabp-loadgen` all use this one implementation, so what
//! the tests prove is what the benchmarks measure.

pub mod client;
pub mod clock;
pub mod events;
pub mod modsim;
pub mod net;

pub use client::Client;
pub use modsim::{ModSim, ModSimConfig};
pub use net::{Addr, Conn, Listener};
