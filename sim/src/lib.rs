//! The simulated GABP mod (a dev, test, demo and load-generator dependency; the relay engine
//! does not link it, the command line only for `demo` and `mod-sim`). Sockets and the clock
//! come from `gabp-rt`; the bridge side is `gabp-client`.
//!
//! - [`events`]: event bodies, the emission schedule and closed-loop pacing, shared with the
//!   load generator's broker publishers.
//! - [`modsim`]: a seeded simulated mod: channels, event rate and sizes, tool calls with latency,
//!   and the quirks of real mod libraries (seq from 1, `"error": null`, an event `timestamp`).
//!
//! The demo, the integration tests and `gabp-loadgen` all use this one implementation, so what
//! the tests prove is what the benchmarks measure.

pub mod events;
pub mod modsim;

pub use gabp_rt::{Addr, Conn, Listener};
pub use modsim::{ModSim, ModSimConfig};
