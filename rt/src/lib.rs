//! Plumbing shared by the relay, the load generator and the simulator, so that the relay never
//! links the simulator:
//!
//! - [`net`]: addresses (`127.0.0.1:PORT`, `unix:PATH`), listeners and boxed byte streams.
//! - [`clock`]: wall-clock nanoseconds, the one time base shared across processes.
//! - [`log`]: the one `tracing` set-up every binary uses (`GABP_LOG` filter, stderr).
//! - [`log_budget`]: log lines a peer can cause, sampled per call site.
//! - [`units`]: sizes and durations as flags and config files write them.
//! - [`route_name`]: what a route name may be, and how an error shows one.
//! - [`display`]: untrusted text (names, labels, a mod's strings) made safe for a terminal or a
//!   page: the one list of invisible and text-direction characters.
//! - [`private_files`]: the process's file creation mode.

pub mod clock;
pub mod display;
pub mod log;
pub mod log_budget;
pub mod net;
pub mod private_files;
pub mod route_name;
pub mod units;

pub use net::{Addr, Conn, Listener};
