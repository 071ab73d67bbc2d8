//! `gabp-relay mcp`, and the flags `serve --mcp-listen` shares with it: which of the mod's
//! tools an MCP front offers, and where a stdio front connects.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use gabp_engine::identity;
use gabp_mcp::link::{Link, Shared, Target};
use gabp_mcp::listing::Offer;
use gabp_mcp::server::{Front, FrontConfig};
use gabp_mcp::{events, read_bridge_file, stdio};
use gabp_rt::Addr;
use rmcp::ServiceExt;

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
                None => gabp_engine::discovery::default_path(&self.route)
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
