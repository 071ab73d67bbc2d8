//! End-to-end tests against an in-process relay on loopback, one binary for the whole suite.

mod harness;
mod hostile;
mod recording;
mod semantics;
