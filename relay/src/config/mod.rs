//! The relay's config file: TOML, layered with flags over defaults (flags over file over
//! defaults) into the engine's typed [`gabp_engine::RelayConfig`]. Parse errors name the file,
//! the line and the field. Token files are read only when their owner and mode can be trusted.

pub mod file;
mod trust;

pub use file::{ConfigError, FileConfig, FileRoute};
pub use gabp_engine::config::*;
