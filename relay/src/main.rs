//! The `gabp-relay` binary: parsing and dispatch. Each command lives in its own module under
//! `cli/`; the library does the work.
//!
//! Exit codes: 0 ok, 2 usage, 1 runtime failure with a one-line reason on stderr; a reader
//! that went away (a broken pipe) ends a command quietly with 0.

use clap::{Parser, Subcommand};

mod cli;

use cli::{demo, export, mod_sim, repair, replay, serve, sessions, stats, status, wrap};

// mimalloc keeps freed memory for reuse: with glibc's allocator the relay's read buffers and
// per-batch allocations were returned to the kernel and faulted back in (zeroed pages were
// ~9% of the relay's CPU at max rate; BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "gabp-relay",
    version,
    about = "Relay and recorder for GABP: many bridges share one game mod"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Relay bridges to a mod and record every session.
    Serve(Box<serve::ServeArgs>),
    /// Show what running relays are doing: mod, session, bridges, queues, recorder.
    Status(status::StatusArgs),
    /// Run a simulated mod, the relay and simulated bridges for a few seconds.
    Demo(demo::DemoArgs),
    /// List, check or remove recorded sessions.
    Sessions(sessions::SessionsArgs),
    /// Per-channel and per-method figures of a recorded session.
    Stats(stats::StatsArgs),
    /// Write a recorded session as JSON lines.
    Export(export::ExportArgs),
    /// Serve a recorded session as a GABP mod.
    Replay(replay::ReplayArgs),
    /// Repair a damaged data dir, after copying it aside to DIR.bak-<time>.
    Repair(repair::RepairArgs),
    /// Run a game behind the relay where a launcher expects the game (GABP_SERVER_PORT, GABP_TOKEN).
    Wrap(Box<wrap::WrapArgs>),
    /// Run the built-in simulated mod on its own.
    ModSim(mod_sim::ModSimArgs),
    /// Print a fresh 128-bit token.
    Token,
    /// Serve MCP on stdio for an AI assistant, attached to a running route as a bridge.
    Mcp(gabp_relay::mcp::McpArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    gabp_rt::log::init("info");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gabp-relay")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gabp-relay: cannot start: {e}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) if cli::is_broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("gabp-relay: {}", cli::one_line(&e));
            cli::exit_code(&e)
        }
    };
    // Tasks still running (a replay's bridges) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(code);
}

/// Runs the command; returns the exit code (a wrapped game's own, else 0).
async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Serve(a) => serve::run(*a).await?,
        Cmd::Status(a) => status::run(a).await?,
        Cmd::Demo(a) => demo::run(a).await?,
        Cmd::Sessions(a) => sessions::run(a)?,
        Cmd::Stats(a) => stats::run(a)?,
        Cmd::Export(a) => export::run(a)?,
        Cmd::Replay(a) => replay::run(a).await?,
        Cmd::Repair(a) => repair::run(a)?,
        Cmd::Wrap(a) => return wrap::run(*a).await,
        Cmd::ModSim(a) => mod_sim::run(a).await?,
        Cmd::Mcp(a) => gabp_relay::mcp::run(a).await?,
        Cmd::Token => {
            use std::io::Write;
            writeln!(std::io::stdout(), "{}", gabp_relay::auth::generate_token())?;
        }
    }
    Ok(0)
}
