//! The user's mistakes: an error that is a usage problem found after parsing (a flag value, a
//! config key) and makes a command exit with 2 rather than 1. Shared by the commands and the
//! parts of the library that check what a user gave them.

use anyhow::anyhow;

/// A usage problem found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A usage error (exit 2) with `msg` as its line.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow!(UsageError(msg.into()))
}
