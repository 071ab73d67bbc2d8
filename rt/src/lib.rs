//! Plumbing shared by the relay, the load generator and the simulator, so that the relay never
//! links the simulator:
//!
//! - [`net`]: addresses (`127.0.0.1:PORT`, `unix:PATH`), listeners and boxed byte streams.
//! - [`clock`]: wall-clock nanoseconds, the one time base shared across processes.
//! - [`log`]: the one `tracing` set-up every binary uses (`GABP_LOG` filter, stderr).

pub mod clock;
pub mod log;
pub mod net;

pub use net::{Addr, Conn, Listener};
