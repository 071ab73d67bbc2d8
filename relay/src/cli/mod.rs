//! The commands of the `gabp-relay` binary, one module each, and what they share: usage
//! errors (exit 2), one-line error text, output that survives a closed pipe, the stop signals,
//! and the flag value checks that keep the original text for layering over a config file.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

/// `println!` for a command's output that returns an error instead of panicking when stdout
/// is closed or full (a broken pipe then ends the command quietly, see `main`).
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*).map_err(anyhow::Error::from)?
    };
}

mod app;
pub(crate) mod check_bridge;
pub(crate) mod check_mod;
pub(crate) mod collect;
pub(crate) mod demo;
pub(crate) mod episodes;
pub(crate) mod export;
pub(crate) mod fleet_key;
pub(crate) mod mark;
pub(crate) mod mcp;
pub(crate) mod mod_sim;
pub(crate) mod progress;
pub(crate) mod prune;
mod reach;
pub(crate) mod reload;
pub(crate) mod repair;
pub(crate) mod replay;
pub(crate) mod replay_calls;
pub(crate) mod replay_control;
pub(crate) mod report;
pub(crate) mod select;
pub(crate) mod serve;
pub(crate) mod sessions;
pub(crate) mod ship;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod wrap;

pub use app::main;

pub use crate::usage::{usage, UsageError};

/// The data dir and output form shared by the commands that read recordings.
#[derive(Args, Debug, Clone)]
pub struct DataDir {
    /// Where recordings live.
    #[arg(
        long,
        global = true,
        env = "GABP_RELAY_DATA_DIR",
        default_value = "gabp-data"
    )]
    pub data_dir: PathBuf,
}

/// `--json` for the commands whose output has a JSON form.
#[derive(Args, Debug, Clone, Copy)]
pub struct Json {
    /// Print one JSON document (camelCase keys) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The exit code for an error: 2 for usage and config errors, 1 for everything else.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    let usage = e.downcast_ref::<UsageError>().is_some()
        || e.downcast_ref::<crate::config::ConfigError>().is_some();
    if usage {
        2
    } else {
        1
    }
}

/// Whether the error is a reader that went away (`gabp-relay sessions | head -1`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes as one line, each cause said once: a cause whose text the line
/// already holds (an error that prints its source) is left out, as is the `(os error N)` tail.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let mut text = cause.to_string();
        // Only the errno's parenthesis goes: what follows it (a path, a copy kept) stays.
        while let Some(i) = text.find(" (os error") {
            let end = text[i..].find(')').map_or(text.len(), |j| i + j + 1);
            text.replace_range(i..end, "");
        }
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line += ": ";
        }
        line += &text;
    }
    line.replace(['\n', '\r'], " ")
}

/// Writes text to stdout best effort: a closed stdout (a supervisor that stopped reading)
/// never takes a running relay down.
pub fn print_best_effort(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Prints a JSON document on stdout.
pub fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A token is sent in a JSON hello and compared exactly: whitespace or control characters in
/// it are a copy-paste accident (a trailing newline), never a secret worth accepting. Checked
/// after parsing, not by clap, whose message would echo the token.
pub fn check_token(t: &str) -> anyhow::Result<&str> {
    if t.trim().is_empty() {
        return Err(usage("--token must not be empty"));
    }
    if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(usage(
            "--token contains whitespace or control characters (a pasted newline?)",
        ));
    }
    Ok(t)
}

/// Events per second: a finite number from 0 up to a billion.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1e9).contains(&r) => Ok(r),
        _ => Err(format!(
            "invalid rate {s:?}: expected events per second from 0 to 1000000000"
        )),
    }
}

/// The stop signals of a long-running command.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// SIGINT, SIGTERM and SIGHUP.
fn stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

/// Holds the stop signals pending, from the first line of `main` (and in every thread started
/// meanwhile) until the command installs its handlers or [`release_stop_signals`] is called: a
/// signal sent while the process starts is then handled like one sent later, not the default
/// death of a half-started process (a `replay` or `collect` stopped in its first milliseconds).
pub fn hold_stop_signals() {
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&stop_signals()),
        None,
    );
}

/// Lets the stop signals act on this (the main) thread again: a command without handlers of
/// its own then stops as any program does; one with handlers gets the pending signal there.
/// Threads started while they were held keep them held, so the signal reaches this thread.
pub fn release_stop_signals() {
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
        Some(&stop_signals()),
        None,
    );
}

impl Signals {
    /// Installed before anything else starts, so a SIGHUP (a closed terminal, `systemctl
    /// reload`) never kills the process with the discovery file left behind: SIGINT and SIGTERM
    /// shut down cleanly; SIGHUP makes `serve` re-read its identities (other commands log it).
    /// A signal held since the process started ([`hold_stop_signals`]) arrives here.
    pub fn install() -> anyhow::Result<Signals> {
        use anyhow::Context;
        use tokio::signal::unix::{signal, SignalKind};
        let on = |k| signal(k).context("cannot install the signal handlers");
        let signals = Signals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        };
        release_stop_signals();
        Ok(signals)
    }

    /// Waits for SIGINT or SIGTERM; returns its name. SIGHUP is logged and ignored (only
    /// `serve` reloads, through [`Signals::next`]).
    pub async fn shutdown(&mut self) -> &'static str {
        loop {
            match self.next().await {
                Signal::Shutdown(name) => return name,
                Signal::Reload => tracing::warn!(
                    "SIGHUP received: this command has nothing to reload; still running"
                ),
            }
        }
    }

    /// Waits for the next signal: SIGINT or SIGTERM (shut down) or SIGHUP (reload).
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::Shutdown("SIGINT"),
            _ = self.term.recv() => Signal::Shutdown("SIGTERM"),
            _ = self.hup.recv() => Signal::Reload,
        }
    }
}

/// What a signal asks for.
pub enum Signal {
    /// Shut down (the signal's name).
    Shutdown(&'static str),
    /// Re-read the configuration (SIGHUP).
    Reload,
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn one_line_drops_the_errno_but_keeps_what_follows_it() {
        let io = std::io::Error::from_raw_os_error(13);
        let e = anyhow::anyhow!("cannot write: {io}; the untouched copy is at /x.bak-1");
        let line = one_line(&e.context("repair failed"));
        assert_eq!(
            line,
            "repair failed: cannot write: Permission denied; the untouched copy is at /x.bak-1"
        );
    }
}
