//! `gabp-relay mod-sim`: the built-in simulated mod on its own.

use std::io::Write;
use std::time::Duration;

use crate::config::parse_duration;
use anyhow::{Context, Result};
use clap::Args;
use gabp_rt::Addr;

use super::{parse_rate, usage, Signals};

#[derive(Args, Debug)]
pub struct ModSimArgs {
    /// Where to listen [default: 127.0.0.1 on GABP_SERVER_PORT if set, else a free port].
    #[arg(long)]
    pub listen: Option<String>,
    /// Speak GABP over stdin/stdout instead.
    #[arg(long)]
    pub stdio: bool,
    /// Token bridges must present.
    #[arg(long, env = "GABP_TOKEN", default_value = "", hide_env_values = true)]
    pub token: String,
    /// Events per second; 0 for as fast as possible.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Event body size in bytes.
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// Channels to advertise (comma separated).
    #[arg(long, default_value = "world/tick,player/move,chat/message")]
    pub channels: String,
    /// Delay before answering tools/call (e.g. 5ms).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub tool_latency: Duration,
    /// Behave like a quirky real mod library (seq from 1, null fields, timestamps, unknown
    /// welcome members): quirks the relay passes through.
    #[arg(long)]
    pub quirks: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Switch on a defect of real mod libraries, for checkers and shields to be tried against
    /// (repeatable or comma separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub defect: Vec<Defect>,
}

/// The defects `--defect` switches on ([`gabp_sim::Defects`]).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defect {
    /// Count Content-Length in characters, not bytes (a raw non-ASCII request hangs).
    CountChars,
    /// Write each frame's header and body in two writes (frames interleave under load).
    SplitWrites,
    /// Crash when a connection drops while one of its requests is handled.
    CrashOnDrop,
    /// Answer with both result and error, the other one null.
    BothResultAndError,
}

fn defects(list: &[Defect]) -> gabp_sim::Defects {
    gabp_sim::Defects {
        count_chars: list.contains(&Defect::CountChars),
        split_writes: list.contains(&Defect::SplitWrites),
        crash_on_drop: list.contains(&Defect::CrashOnDrop),
        both_result_and_error: list.contains(&Defect::BothResultAndError),
    }
}

/// The one line a crashed simulated mod exits with.
const CRASHED: &str =
    "the simulated mod crashed: a connection dropped while one of its requests was handled (--defect crash-on-drop)";

pub async fn run(a: ModSimArgs) -> Result<()> {
    let cfg = gabp_sim::ModSimConfig {
        token: a.token,
        channels: a
            .channels
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect(),
        rate: if a.rate > 0.0 { Some(a.rate) } else { None },
        payload_bytes: a.payload_bytes,
        seed: a.seed,
        tool_latency: a.tool_latency,
        seq_start: if a.quirks { 1 } else { 0 },
        quirks: a.quirks,
        defects: defects(&a.defect),
        ..gabp_sim::ModSimConfig::default()
    };
    if a.stdio {
        // Spoken to over stdio by a relay that owns its lifetime: signals act as usual.
        super::release_stop_signals();
        if tokio::task::spawn_blocking(move || gabp_sim::ModSim::serve_stdio(cfg)).await? {
            anyhow::bail!(CRASHED);
        }
        return Ok(());
    }
    let mut signals = Signals::install()?;
    let listen = match (a.listen, std::env::var("GABP_SERVER_PORT").ok()) {
        (Some(l), _) => l,
        (None, Some(port)) => format!("127.0.0.1:{port}"),
        (None, None) => "127.0.0.1:0".to_string(),
    };
    let listen: Addr = listen
        .parse()
        .map_err(|e: String| usage(format!("--listen: {e}")))?;
    let sim = gabp_sim::ModSim::start(&listen, cfg)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "simulated mod listening on {}", sim.addr()).and_then(|()| out.flush());
    drop(out);
    let crashed = async {
        while !sim.crashed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        sig = signals.shutdown() => {
            tracing::info!("{sig} received: stopping the simulated mod");
            sim.stop();
            Ok(())
        }
        () = crashed => {
            sim.stop();
            anyhow::bail!(CRASHED)
        }
    }
}
