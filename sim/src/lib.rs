//! The simulated GABP mod (a dev, test, demo and load-generator dependency; the relay engine
//! does not link it, the command line only for `demo` and `mod-sim`). Sockets and the clock
//! come from `gabp-rt`; the bridge side is `gabp-client`.
//!
//! - [`events`]: event bodies, the emission schedule and closed-loop pacing, shared with the
//!   load generator's broker publishers.
//! - [`modsim`]: a seeded simulated mod: channels, event rate and sizes, tool calls with latency,
//!   the quirks of real mod libraries the relay passes through (seq from 1, `"error": null`, an
//!   event `timestamp`), and their defects that break peers, each on a switch of its own
//!   ([`Defects`]: `Content-Length` counted in characters, header and body written apart, a
//!   crash when a connection drops mid-request, both `result` and `error`).
//!
//! The demo, the integration tests and `gabp-loadgen` all use this one implementation, so what
//! the tests prove is what the benchmarks measure.

pub mod events;
pub mod modsim;

pub use gabp_rt::{Addr, Conn, Listener};
pub use modsim::{Defects, ModSim, ModSimConfig};
