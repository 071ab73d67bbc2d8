//! The command line: parsing and dispatch. Each command lives in its own module beside this
//! one; the rest of the library does the work.
//!
//! Exit codes: 0 ok, 2 usage, 1 runtime failure with a one-line reason on stderr; a reader
//! that went away (a broken pipe) ends a command quietly with 0.

use std::io::Write;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use super::{
    check_bridge, check_mod, collect, demo, episodes, export, fleet_key, mark, mcp, mod_sim,
    reload, repair, replay, replay_control, report, serve, sessions, ship, stats, status, wrap,
};

#[derive(Parser, Debug)]
#[command(
    name = "gabp-relay",
    version,
    about = "Relay and recorder for GABP: many bridges share one game mod"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Show no progress bars (long commands show them on stderr when it is a terminal).
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Relay bridges to a mod and record every session.
    Serve(Box<serve::ServeArgs>),
    /// Show what running relays are doing: mod, session, bridges, queues, recorder.
    Status(status::StatusArgs),
    /// Make a running relay re-read its bridge identities and tokens (as SIGHUP does).
    Reload(reload::ReloadArgs),
    /// Run a simulated mod, the relay and simulated bridges for a few seconds.
    Demo(demo::DemoArgs),
    /// Mark the session a running route records (an episode's start or end, a note).
    Mark(mark::MarkArgs),
    /// List, check or remove recorded sessions.
    Sessions(sessions::SessionsArgs),
    /// Per-channel and per-method figures of a recorded session.
    Stats(stats::StatsArgs),
    /// List the episodes of recorded sessions (from a start mark to the next end mark).
    Episodes(episodes::EpisodesArgs),
    /// Write recorded sessions as JSON lines, Parquet or MCAP (one session, a selection, or all).
    Export(export::ExportArgs),
    /// Write recorded sessions as one self-contained HTML report with charts (one session, or an experiment).
    Report(report::ReportArgs),
    /// Serve a recorded session as a GABP mod.
    Replay(replay::ReplayArgs),
    /// Pause, resume, seek, step or pace a running replay for all its bridges, or show its state.
    ReplayControl(replay_control::ReplayControlArgs),
    /// Repair a damaged data dir, after copying it aside to DIR.bak-<time>.
    Repair(repair::RepairArgs),
    /// Run a game behind the relay where a launcher expects the game (GABP_SERVER_PORT, GABP_TOKEN).
    Wrap(Box<wrap::WrapArgs>),
    /// Run the built-in simulated mod on its own.
    ModSim(mod_sim::ModSimArgs),
    /// Check a mod against GABP 1.0 as a bridge connected to it: framing, concurrency, shapes,
    /// seq, a dropped connection; exit 1 on a failure.
    CheckMod(Box<check_mod::CheckModArgs>),
    /// Be a simulated mod for a bridge to connect to, and report where the bridge deviates
    /// from GABP 1.0; exit 1 on a failure.
    CheckBridge(check_bridge::CheckBridgeArgs),
    /// Print a fresh 128-bit token.
    Token,
    /// Send recorded sessions to a NATS JetStream cluster (backfill; shipping twice changes nothing).
    Ship(ship::ShipArgs),
    /// Write what relays ship to NATS JetStream into an archive data dir.
    Collect(collect::CollectArgs),
    /// Make the fleet key relays sign what they ship with and collectors check, or show its id.
    FleetKey(fleet_key::FleetKeyArgs),
    /// Serve MCP on stdio for an AI assistant, attached to a running route as a bridge.
    Mcp(mcp::McpArgs),
    /// Print a shell completion script, e.g. `gabp-relay completions bash > /etc/bash_completion.d/gabp-relay`.
    Completions(CompletionsArgs),
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell the script is for.
    shell: Shell,
}

/// The shells `completions` writes for.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The completion script for `shell`, generated from the same definitions the parser uses.
fn completions(shell: Shell) -> Vec<u8> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "gabp-relay", &mut script);
    script
}

impl Cmd {
    /// Whether the command installs stop-signal handlers ([`super::Signals::install`]) on the
    /// main thread before anything else; the others let the signals act as usual at once.
    fn handles_signals(&self) -> bool {
        matches!(
            self,
            Cmd::Serve(_)
                | Cmd::Demo(_)
                | Cmd::Replay(_)
                | Cmd::Wrap(_)
                | Cmd::ModSim(_)
                | Cmd::Collect(_)
        )
    }
}

/// A clap usage error as one line, like every other error: its first paragraph (which for a
/// missing argument lists the arguments on indented lines of their own) joined, without the
/// usage line and the hint to see --help that follow it.
pub fn one_line(rendered: &str) -> String {
    let parts: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
        .map(str::trim)
        .collect();
    if parts.is_empty() {
        return "error: invalid usage (see --help)".into();
    }
    let mut line = parts[0].to_string();
    for p in &parts[1..] {
        // "…were not provided:" is followed by the list.
        line.push_str(if line.ends_with(':') { " " } else { ", " });
        line.push_str(p);
    }
    line
}

/// The `gabp-relay` binary's `main`: parses, runs the command, exits with its code.
pub fn main() -> ! {
    super::hold_stop_signals();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            let _ = writeln!(std::io::stderr(), "{}", one_line(&e.render().to_string()));
            std::process::exit(2);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            std::process::exit(0);
        }
    };
    super::progress::set_quiet(cli.quiet);
    if !cli.cmd.handles_signals() {
        super::release_stop_signals();
    }
    // The NATS client logs its own (re)connections and errors (ours are the one line), and at
    // debug level the server addresses with their credentials; the MCP library logs a line per
    // failed client request with the client's text in it, unbudgeted: off, whatever GABP_LOG
    // says.
    gabp_rt::log::init_silencing("info", &["async_nats", "rmcp"]);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gabp-relay")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "gabp-relay: cannot start: {e}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) if super::is_broken_pipe(&e) => 0,
        Err(e) => {
            // Never panics on a closed stderr (eprintln! would: exit 101).
            let _ = writeln!(std::io::stderr(), "gabp-relay: {}", super::one_line(&e));
            super::exit_code(&e)
        }
    };
    // Tasks still running (a replay's bridges) and blocking threads (a recorder `serve` gave
    // up waiting for at its shutdown bound) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}

/// Runs the command; returns the exit code (a wrapped game's own, else 0).
async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Serve(a) => serve::run(*a).await?,
        Cmd::Status(a) => status::run(a).await?,
        Cmd::Reload(a) => reload::run(a).await?,
        Cmd::Demo(a) => demo::run(a).await?,
        Cmd::Mark(a) => mark::run(a).await?,
        Cmd::Sessions(a) => sessions::run(a)?,
        Cmd::Stats(a) => stats::run(a)?,
        Cmd::Episodes(a) => episodes::run(a)?,
        Cmd::Export(a) => export::run(a)?,
        Cmd::Report(a) => report::run(a)?,
        Cmd::Replay(a) => replay::run(a).await?,
        Cmd::ReplayControl(a) => replay_control::run(a).await?,
        Cmd::Repair(a) => repair::run(a)?,
        Cmd::Wrap(a) => return wrap::run(*a).await,
        Cmd::ModSim(a) => mod_sim::run(a).await?,
        Cmd::CheckMod(a) => return check_mod::run(*a).await,
        Cmd::CheckBridge(a) => return check_bridge::run(a).await,
        Cmd::Mcp(a) => mcp::run(a).await?,
        Cmd::Ship(a) => ship::run(a).await?,
        Cmd::Collect(a) => collect::run(a).await?,
        Cmd::FleetKey(a) => fleet_key::run(a)?,
        Cmd::Token => {
            use std::io::Write;
            writeln!(std::io::stdout(), "{}", gabp_engine::auth::generate_token())?;
        }
        Cmd::Completions(a) => std::io::stdout().write_all(&completions(a.shell))?,
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_line(args: &[&str]) -> String {
        let e = Cli::try_parse_from(args).expect_err("a usage error");
        one_line(&e.render().to_string())
    }

    #[test]
    fn a_missing_argument_is_named_on_the_one_line() {
        let line = usage_line(&["gabp-relay", "sessions", "tag"]);
        assert!(line.contains("<SESSION>"), "{line}");
        assert!(!line.contains('\n') && !line.contains("Usage"), "{line}");
    }

    /// docs/reference/cli.md, rendered from the definitions above: every command and flag with
    /// its help, so the reference cannot drift from the binary.
    #[test]
    fn the_command_reference_is_the_one_these_definitions_render() {
        let options = clap_markdown::MarkdownOptions::new()
            .title("Command reference".into())
            .show_footer(false);
        let rendered = format!(
            "<!-- Generated from relay/src/cli by `UPDATE_DOCS=1 cargo test --release -p gabp-relay --lib cli::`; do not edit. -->\n\n{}",
            clap_markdown::help_markdown_custom::<Cli>(&options)
        );
        // The clone this runs in, not the one that compiled it (see relay/tests/it/deploy.rs).
        let path = std::path::Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
            || env!("CARGO_MANIFEST_DIR").into(),
            std::path::PathBuf::from,
        ))
        .join("../docs/reference/cli.md");
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &rendered).expect("write docs/reference/cli.md");
            return;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "docs/reference/cli.md does not match the command line's definitions: regenerate it with \
             `UPDATE_DOCS=1 cargo test --release -p gabp-relay --lib cli::` and commit it"
        );
    }

    #[test]
    fn completions_cover_every_command() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).expect("UTF-8");
            for cmd in Cli::command().get_subcommands() {
                assert!(
                    script.contains(cmd.get_name()),
                    "{shell:?} completions lack {}",
                    cmd.get_name()
                );
            }
        }
    }

    #[test]
    fn an_unknown_flag_is_one_line_without_the_hint() {
        let line = usage_line(&["gabp-relay", "stats", "--bogus"]);
        assert!(
            line.starts_with("error:") && line.contains("--bogus"),
            "{line}"
        );
        assert!(!line.contains("--help") && !line.contains('\n'), "{line}");
    }
}
