//! The MCP front: AI assistants attach to a route as one more bridge.
//!
//! `gabp-relay mcp` speaks MCP on stdio and connects to a running route (through its discovery
//! file, or `--connect ADDR --token T`); `serve --mcp-listen` serves MCP's Streamable HTTP
//! transport from the relay process ([`http`]). Either way each MCP client is a GABP bridge
//! ([`link`]), so the relay's limits, the recording and the metrics apply to it. The command
//! line's flags for it live with the command line; this crate takes what they describe.
//! - [`server`]: the MCP handler (mirrored tools, the relay's own tools, resources).
//! - [`names`]: strict-safe tool names and their collision rule.
//! - [`listing`]: the mod's tools as clients see them (offered, cleaned, bounded).
//! - [`events`]: the bounded buffer `events_poll` reads.
//! - [`stdio`]: the stdio transport (bounded lines, parse errors answered).
//! - [`params`]: standard requests with params of the wrong shape, answered -32602.

pub mod events;
pub mod http;
pub mod link;
pub mod listing;
pub mod names;
pub mod params;
pub mod server;
pub mod stdio;
mod tools;

use anyhow::{anyhow, Context, Result};
use gabp_rt::Addr;

/// The route's address and token from a discovery file.
pub fn read_bridge_file(path: &std::path::Path) -> Result<(Addr, String)> {
    let raw = std::fs::read(path).with_context(|| {
        format!(
            "no discovery file at {} (is `gabp-relay serve` running for this route?)",
            path.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_slice(&raw)
        .map_err(|_| anyhow!("{} is not a discovery file", path.display()))?;
    let token = v["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("{} holds no token", path.display()))?;
    let addr = v["transport"]["address"]
        .as_str()
        .ok_or_else(|| anyhow!("{} holds no address", path.display()))?
        .parse::<Addr>()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok((addr, token.to_string()))
}
