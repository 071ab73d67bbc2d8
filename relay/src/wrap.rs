//! `gabp-relay wrap -- GAME…`: make the relay invisible to a launcher.
//!
//! Launchers start a game with `GABP_SERVER_PORT` and `GABP_TOKEN` (and `GABS_GAME_ID`) in its
//! environment and then connect to 127.0.0.1 on that port with that token. `wrap` takes those
//! values for itself (it listens there, for that token), starts the real game with a fresh free
//! port and a fresh token in the same variables (everything else passed through), connects to it
//! as the upstream (the usual reconnect loop covers the game's start-up), records under
//! `GABS_GAME_ID`, forwards SIGINT/SIGTERM to the game, and exits with the game's exit code
//! (128 + N when signal N killed it, as a shell reports it).

use std::process::Stdio;

use tokio::process::Command;

/// What the launcher handed over, read from the environment.
#[derive(Debug, Clone)]
pub struct LaunchEnv {
    /// Port the launcher will connect to.
    pub port: u16,
    /// Token the launcher will present.
    pub token: String,
    /// Game id, used as the route name.
    pub game_id: Option<String>,
}

/// Why wrapping could not start.
#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    /// A required variable is missing or invalid.
    #[error("{0}")]
    Env(String),
    /// The game could not be started.
    #[error("cannot start the game: {0}")]
    Spawn(std::io::Error),
}

impl LaunchEnv {
    /// Reads `GABP_SERVER_PORT`, `GABP_TOKEN` and `GABS_GAME_ID`.
    pub fn from_env() -> Result<LaunchEnv, WrapError> {
        let port = std::env::var("GABP_SERVER_PORT").map_err(|_| {
            WrapError::Env(
                "GABP_SERVER_PORT is not set: wrap runs under a launcher that sets it".into(),
            )
        })?;
        // Port 0 would listen where the launcher, which connects to the port it gave, never
        // looks.
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| {
                WrapError::Env(format!(
                    "GABP_SERVER_PORT={port:?} is not a port number from 1 to 65535"
                ))
            })?;
        // An empty token would let anyone in: refused, as `serve --token ''` is.
        let token = std::env::var("GABP_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                WrapError::Env(
                    "GABP_TOKEN is not set or empty: wrap runs under a launcher that sets it"
                        .into(),
                )
            })?;
        let game_id = std::env::var("GABS_GAME_ID").ok().filter(|s| !s.is_empty());
        Ok(LaunchEnv {
            port,
            token,
            game_id,
        })
    }
}

/// A free loopback port for the game.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the game with its own port and token in the GABP variables.
pub fn spawn_game(
    cmd: &[String],
    port: u16,
    token: &str,
) -> Result<tokio::process::Child, WrapError> {
    let (program, args) = cmd
        .split_first()
        .ok_or_else(|| WrapError::Env("no game command after --".into()))?;
    Command::new(program)
        .args(args)
        .env("GABP_SERVER_PORT", port.to_string())
        .env("GABP_TOKEN", token)
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(WrapError::Spawn)
}

/// Sends the signal named `sig` (`SIGINT`, else SIGTERM) to the game, if it still runs.
pub fn forward_signal(game: &tokio::process::Child, sig: &str) {
    use nix::sys::signal::{kill, Signal};
    let signal = if sig == "SIGINT" {
        Signal::SIGINT
    } else {
        Signal::SIGTERM
    };
    if let Some(pid) = game.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}
