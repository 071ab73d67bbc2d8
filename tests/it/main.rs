//! End-to-end tests against an in-process relay on loopback, one binary for the whole suite.

mod backpressure;
mod bounds;
mod harness;
mod hostile;
mod matrix;
mod recording;
mod semantics;
mod slow_bridges;
