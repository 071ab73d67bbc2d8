//! The store through its public API: one test binary, a module per area.

mod catalog;
mod retention;
mod store;
mod support;
