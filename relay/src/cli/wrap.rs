//! `gabp-relay wrap [serve flags] -- GAME…`: the relay between a launcher and its game.
//!
//! The route comes from the launcher's environment (see `crate::wrap`); every serve flag
//! applies to it through the same layering as `serve`.

use std::time::Duration;

use crate::config::file::Layer;
use crate::config::FileConfig;
use crate::wrap::{forward_signal, free_port, spawn_game, LaunchEnv};
use anyhow::Result;
use clap::Args;
use gabp_engine::Relay;

use super::serve::{GlobalFlags, PolicyFlags};
use super::{usage, Signals};

#[derive(Args, Debug)]
pub struct WrapArgs {
    /// Route name [default: GABS_GAME_ID, else `default`].
    #[arg(long)]
    pub route_name: Option<String>,
    #[command(flatten)]
    pub globals: GlobalFlags,
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// The game's command and arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs the game behind the relay; returns the game's exit code.
pub async fn run(a: WrapArgs) -> Result<i32> {
    let mut signals = Signals::install()?;
    let env = LaunchEnv::from_env().map_err(|e| usage(e.to_string()))?;
    let game_port = free_port()?;
    let game_token = gabp_engine::auth::generate_token();
    let (name, from) = match (a.route_name, env.game_id.clone()) {
        (Some(n), _) => (n, "--route-name"),
        (None, Some(g)) => (g, "GABS_GAME_ID"),
        (None, None) => ("default".into(), "the default"),
    };
    crate::config::check_route_name(&name).map_err(|m| {
        let shown = crate::config::shown_route_name(&name);
        usage(format!("{from} {shown:?} as the route name: {m}"))
    })?;
    let mut route = toml::Table::new();
    route.insert("name".into(), name.clone().into());
    route.insert("upstream".into(), format!("127.0.0.1:{game_port}").into());
    route.insert("listen".into(), format!("127.0.0.1:{}", env.port).into());
    route.insert("token".into(), env.token.clone().into());
    route.insert("upstream_token".into(), game_token.clone().into());
    let layer = Layer {
        globals: toml::Table::try_from(&a.globals).unwrap_or_default(),
        policy: toml::Table::try_from(&a.policy).unwrap_or_default(),
        route: Some(route),
    };
    let cfg = FileConfig::layered(None, layer)?.relay_config("command line")?;
    let relay = Relay::start(cfg).await?;
    let mut game = spawn_game(&a.command, game_port, &game_token)?;
    tracing::info!(route = %name, listen = %relay.addrs[0], game_port, "wrapping the game; launchers connect to the relay");
    let status = tokio::select! {
        s = game.wait() => s?,
        sig = signals.shutdown() => {
            // Forward the signal and let the game decide how to end.
            forward_signal(&game, sig);
            match tokio::time::timeout(Duration::from_secs(10), game.wait()).await {
                Ok(s) => s?,
                Err(_) => {
                    let _ = game.start_kill();
                    game.wait().await?
                }
            }
        }
    };
    relay.shutdown().await;
    Ok(exit_code_of(status))
}

/// The code a shell would report for the game: its own exit code, or 128 + the signal that
/// killed it (137 for SIGKILL), which is said on stderr too, so a launcher can tell a crash
/// from an exit 1.
fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return code;
    }
    match status.signal() {
        Some(sig) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| format!("signal {sig}"));
            tracing::error!("the game was killed by {name}; exiting with {}", 128 + sig);
            128 + sig
        }
        None => 1,
    }
}
