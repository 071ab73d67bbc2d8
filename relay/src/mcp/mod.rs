//! The MCP front: AI assistants attach to a route as one more bridge.
//!
//! `gabp-relay mcp` speaks MCP on stdio and connects to a running route (through its discovery
//! file, or `--connect ADDR --token T`); `serve --mcp-listen` serves MCP's Streamable HTTP
//! transport from the relay process ([`http`]). Either way each MCP client is a GABP bridge
//! ([`link`]), so the relay's limits, the recording and the metrics apply to it.
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

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use gabp_rt::Addr;
use rmcp::ServiceExt;

use crate::identity;

use link::{Link, Shared, Target};
use listing::Offer;
use server::{Front, FrontConfig};

/// Which of the mod's tools an MCP front offers (flags of `mcp`, and of `serve` for
/// `--mcp-listen`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OfferArgs {
    /// Offer the assistant only the mod's tools these globs allow, by the mod's names
    /// ('inventory/*,!admin/*'; `!` denies, deny wins); the relay's own tools are always
    /// offered [default: all].
    #[arg(long, value_name = "GLOB,...", value_delimiter = ',')]
    pub mcp_tools: Vec<String>,
    /// Leave the mod's `outputSchema` out of the tool list (for clients that refuse results
    /// a mod's schema describes inexactly).
    #[arg(long)]
    pub mcp_strip_output_schema: bool,
}

impl OfferArgs {
    /// Whether any of these flags was given.
    pub fn given(&self) -> bool {
        !self.mcp_tools.is_empty() || self.mcp_strip_output_schema
    }

    /// The offer these flags describe (a glob that is empty or a bare `!` is refused).
    pub fn offer(&self) -> Result<Offer> {
        let globs: Vec<String> = self
            .mcp_tools
            .iter()
            .map(|g| g.trim().to_string())
            .collect();
        let tools = identity::ToolRules::parse(&globs)
            .map_err(|e| crate::usage::usage(format!("--mcp-tools: {e}")))?;
        Ok(Offer {
            tools,
            strip_output_schema: self.mcp_strip_output_schema,
        })
    }
}

/// `gabp-relay mcp`: an MCP server on stdio attached to a running relay route.
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// The route whose discovery file to read ($XDG_CONFIG_HOME/gabp-relay/bridge-{route}.json).
    #[arg(long, default_value = "default")]
    pub route: String,
    /// Read this discovery file instead.
    #[arg(long, conflicts_with = "connect")]
    pub bridge_file: Option<PathBuf>,
    /// Connect to this bridge listener (HOST:PORT or unix:PATH) instead; needs --token.
    #[arg(long, requires = "token")]
    pub connect: Option<String>,
    /// The route's bridge token (with --connect).
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// This client's name, sent in the hello (`clientInfo.name`): its label beside its identity
    /// in `status`, `stats`, reports and the recording.
    #[arg(long, default_value = "mcp")]
    pub name: String,
    /// A data dir for `sessions_list` to read (read-only); without it the tool shows the
    /// route's current session.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub offer: OfferArgs,
}

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

impl McpArgs {
    /// Where to connect, from the flags.
    pub fn target(&self) -> Result<Target> {
        let (addr, token, file) = if let Some(c) = &self.connect {
            let addr = c.parse::<Addr>().map_err(|e| anyhow!(e))?;
            let Some(token) = self.token.clone().filter(|t| !t.is_empty()) else {
                bail!("--connect needs --token");
            };
            (addr, token, None)
        } else {
            let path = match &self.bridge_file {
                Some(p) => p.clone(),
                None => crate::discovery::default_path(&self.route)
                    .ok_or_else(|| anyhow!("no HOME or XDG_CONFIG_HOME to find the discovery file in; use --bridge-file or --connect"))?,
            };
            let (addr, token) = read_bridge_file(&path)?;
            (addr, token, Some(path))
        };
        Ok(Target {
            addr,
            token,
            name: self.name.chars().take(128).collect(),
            file,
        })
    }
}

/// Runs `gabp-relay mcp` until the assistant closes stdin, or SIGINT / SIGTERM (exit 0, like
/// the other commands).
pub async fn run(args: McpArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let on = |k| signal(k).context("cannot install the signal handlers");
    let (mut int, mut term) = (on(SignalKind::interrupt())?, on(SignalKind::terminate())?);
    let stop = async move {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    };
    tokio::pin!(stop);
    let offer = args.offer.offer()?;
    let target = args.target()?;
    let link = tokio::select! {
        l = Link::connect(&target, Shared::new(events::STDIO_BYTES), None) => l?,
        sig = &mut stop => {
            tracing::info!("{sig} received: stopping");
            return Ok(());
        }
    };
    tracing::info!(route = %link.route, name = %target.name, "MCP front attached");
    let cfg = Arc::new(FrontConfig {
        target,
        data_dir: args.data_dir,
        route: link.route.clone(),
        buffer_bytes: events::STDIO_BYTES,
        slots: None,
        offer,
    });
    // Pipes (how MCP clients start servers) are read without a blocking thread, so a signal
    // never waits for stdin.
    let (read, write) = rmcp::transport::stdio_pipes();
    let transport = stdio::LineTransport::new(read, write, stdio::MAX_LINE);
    let service = tokio::select! {
        s = Front::with_link(cfg, link).serve(transport) => {
            s.map_err(|e| anyhow!("MCP session failed to start: {e}"))?
        }
        sig = &mut stop => {
            tracing::info!("{sig} received: stopping");
            return Ok(());
        }
    };
    let token = service.cancellation_token();
    tokio::select! {
        r = service.waiting() => {
            r.map_err(|_| anyhow!("MCP session ended abnormally"))?;
        }
        sig = &mut stop => {
            tracing::info!("{sig} received: stopping");
            token.cancel();
        }
    }
    Ok(())
}
