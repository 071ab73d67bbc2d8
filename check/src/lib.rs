//! Conformance checks for GABP peers, as `gabp-relay check-mod` and `check-bridge` run them.
//!
//! - [`modcheck`]: connects to a mod as a bridge and runs the suite (framing, concurrency,
//!   shapes, seq, a dropped connection), calling only read methods and the tools named.
//! - [`bridge`]: listens as a simulated mod and reports what a bridge that connects sends.
//! - [`wire`]: framing that says how a stream broke instead of refusing it, every read bounded.
//! - [`schema`]: the vendored GABP 1.0 schemas, built in, and a validator for what they use.
//! - [`shapes`]: messages judged against the schemas and the relay's own readers.
//! - [`report`]: verdicts (pass, tolerated, fail, skip), text and JSON.
//!
//! Nothing here knows the relay's engine, a recording or how a target is started: the command
//! line hands a connector ([`modcheck::Target`]) or a bound listener, and prints the
//! [`report::Report`] it gets back.
#![warn(missing_docs)]

pub mod bridge;
pub mod modcheck;
pub mod report;
pub mod schema;
pub mod shapes;
pub mod wire;

pub use report::{Check, Report, Verdict};
