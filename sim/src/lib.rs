//! Simulated GABP peers (a dev, test, demo and load-generator dependency; the relay's core does
//! not link it). Sockets and the clock come from `gabp-rt`.
//!
//! - [`events`]: event bodies, the emission schedule and closed-loop pacing, shared with the
//!   load generator's broker publishers.
//! - [`modsim`]: a seeded simulated mod: channels, event rate and sizes, tool calls with latency,
//!   and the quirks of real mod libraries (seq from 1, `"error": null`, an event `timestamp`).
//! - [`client`]: a bridge-side GABP client for tests, the demo and the load generator.
//!
//! The demo, the integration tests and `gabp-loadgen` all use this one implementation, so what
//! the tests prove is what the benchmarks measure.

pub mod client;
pub mod events;
pub mod modsim;

pub use client::Client;
pub use gabp_rt::{Addr, Conn, Listener};
pub use modsim::{ModSim, ModSimConfig};
