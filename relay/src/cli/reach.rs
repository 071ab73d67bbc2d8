//! Reaching a running relay or replay as a short-lived bridge (`status`, `mark`,
//! `replay-control`): the connection within a bound, and a response read as its result or a
//! one-line error. What to say in the hello and what to ask is the command's.

use std::time::Duration;

use anyhow::{bail, Result};
use gabp_client::Client;
use gabp_rt::Addr;
use serde_json::Value;

/// Connects to `addr` within `wait`; each request on the connection then waits as long.
pub(super) async fn connect(addr: &Addr, wait: Duration) -> Result<Client> {
    let mut c = tokio::time::timeout(wait, Client::connect(addr))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "no answer from {addr} within {}",
                humantime::format_duration(wait)
            )
        })??;
    c.set_wait(wait);
    Ok(c)
}

/// A response's result, or its error as `CODE message` (the message made printable and cut to
/// 512 bytes: it comes from the peer).
pub(super) fn answered(response: Value) -> Result<Value> {
    match &response["error"] {
        Value::Null => Ok(response["result"].clone()),
        e => bail!(
            "{} {}",
            e["code"],
            gabp_rt::display::text(e["message"].as_str().unwrap_or_default(), 512)
        ),
    }
}
