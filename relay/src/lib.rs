//! The `gabp-relay` command line: parsing, config files, and one module per command, over the
//! engine (`gabp-engine`), the readers of recordings (`gabp-analysis`), shipping
//! (`gabp-ship`), the MCP front (`gabp-mcp`), the conformance checks (`gabp-check`, for
//! `check-mod` and `check-bridge`) and the simulated mod (`gabp-sim`, for `demo` and `mod-sim`
//! only). The only crate of the workspace's product that reads flags or TOML.
//!
//! - [`cli`]: parsing, dispatch and one module per command.
//! - [`config`]: the TOML config file, layered with flags over defaults into the engine's
//!   typed [`gabp_engine::RelayConfig`]; token files and their trust checks.
//! - [`usage`]: usage errors (exit 2).
//! - `demo`: the built-in demo (simulated mod, relay, bridges in one process).
//! - `wrap`: running the relay invisibly between a launcher and a game.

pub mod cli;
pub mod config;
pub(crate) mod demo;
pub mod usage;
pub(crate) mod wrap;
