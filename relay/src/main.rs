//! The `gabp-relay` binary: command line, config, tracing and signals around the library.
//!
//! Exit codes: 0 ok, 2 usage, 1 runtime failure with a one-line reason on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use gabp_relay::config::{self, FileConfig, OnRecordError, Retention};
use gabp_relay::display;
use gabp_relay::{OnSlow, Relay, RelayConfig, RouteConfig, Upstream};
use gabp_rt::Addr;
use gabp_storage::{Compression, Durability, Store};

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
    Serve(Box<ServeArgs>),
    /// Run a simulated mod, the relay and simulated bridges for a few seconds.
    Demo(DemoArgs),
    /// List, check or remove recorded sessions.
    Sessions(SessionsArgs),
    /// Per-channel and per-method figures of a recorded session.
    Stats(StatsArgs),
    /// Write a recorded session as JSONL.
    Export(ExportArgs),
    /// Serve a recorded session as a GABP mod.
    Replay(ReplayArgs),
    /// Repair a damaged data dir, after copying it aside to DIR.bak-<time>.
    Repair(RepairArgs),
    /// Run a game behind the relay where a launcher expects the game (GABP_SERVER_PORT, GABP_TOKEN).
    Wrap(WrapArgs),
    /// Run the built-in simulated mod on its own.
    ModSim(ModSimArgs),
    /// Print a fresh 128-bit token.
    Token,
    /// Serve MCP on stdio for an AI assistant, attached to a running route as a bridge.
    Mcp(gabp_relay::mcp::McpArgs),
}

#[derive(Args, Debug, Clone)]
struct DataDir {
    /// Where recordings live.
    #[arg(
        long,
        global = true,
        env = "GABP_RELAY_DATA_DIR",
        default_value = "gabp-data"
    )]
    data_dir: PathBuf,
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The mod: HOST:PORT, unix:PATH, or `stdio` with the mod's command after `--`.
    #[arg(long)]
    upstream: Option<String>,
    /// Write the bridge discovery file here (`{route}` is replaced by the route name).
    #[arg(long)]
    bridge_file: Option<PathBuf>,
    /// Do not write a bridge discovery file.
    #[arg(long)]
    no_bridge_file: bool,
    /// With `--upstream stdio`: the mod's command and arguments.
    #[arg(last = true)]
    command: Vec<String>,
    /// Token the relay presents to the mod.
    #[arg(
        long,
        env = "GABP_UPSTREAM_TOKEN",
        default_value = "",
        hide_env_values = true
    )]
    upstream_token: String,
    /// Where bridges connect: HOST:PORT or unix:PATH.
    #[arg(long)]
    listen: Option<String>,
    /// Token bridges must present (generated and printed when absent).
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Route name used in recordings and metrics.
    #[arg(long, default_value = "default")]
    route_name: String,
    /// Where recordings go.
    #[arg(long, env = "GABP_RELAY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Do not record.
    #[arg(long)]
    no_record: bool,
    /// Slow-bridge policy.
    #[arg(long, value_parser = parse_on_slow)]
    on_slow: Option<OnSlow>,
    /// WAL sync policy: none or batch.
    #[arg(long)]
    durability: Option<Durability>,
    /// Frame compression: none, lz4 or zstd.
    #[arg(long)]
    compression: Option<Compression>,
    /// Compress the write-ahead log with zstd (smaller WAL, slower synced writes; see BENCHMARKS.md).
    #[arg(long)]
    wal_compression: bool,
    /// Record into --data-dir even if it is a symlink (refused by default).
    #[arg(long)]
    allow_symlinked_data_dir: bool,
    /// What a failed recording write does: stall or continue.
    #[arg(long)]
    on_record_error: Option<OnRecordError>,
    /// Keep recordings by age and/or size, e.g. 7d, 10GiB or 7d,10GiB.
    #[arg(long)]
    retain: Option<Retention>,
    /// Serve Prometheus metrics at HOST:PORT.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Serve MCP's Streamable HTTP transport at http://ADDR/mcp for the first route (bearer token).
    #[arg(long, value_name = "ADDR")]
    mcp_listen: Option<std::net::SocketAddr>,
    /// A TOML config with one or more routes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// How long a forwarded request may wait for the mod.
    #[arg(long, value_parser = config::parse_timeout)]
    request_timeout: Option<Duration>,
    /// Per-bridge outbox bound in events.
    #[arg(long, value_parser = parse_positive)]
    outbox_frames: Option<usize>,
    /// Per-bridge outbox bound in bytes.
    #[arg(long, value_parser = parse_outbox_bytes)]
    outbox_bytes: Option<usize>,
    /// Largest accepted frame body in bytes.
    #[arg(long, value_parser = parse_max_body)]
    max_body: Option<usize>,
    /// Bridges connected at once.
    #[arg(long, value_parser = parse_positive)]
    max_bridges: Option<usize>,
    /// How long a connection may take to say hello, or a frame to arrive whole.
    #[arg(long, value_parser = config::parse_timeout)]
    frame_timeout: Option<Duration>,
    /// How long a bridge's socket may accept nothing before the bridge is cut (reset).
    #[arg(long, value_parser = config::parse_duration)]
    write_deadline: Option<Duration>,
    /// Subscribe upstream only to what bridges ask for (recordings then miss other channels).
    #[arg(long)]
    no_subscribe_all: bool,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Bound on the whole shutdown.
    #[arg(long, value_parser = config::parse_timeout, default_value = "10s")]
    shutdown_timeout: Duration,
}

fn parse_on_slow(s: &str) -> Result<OnSlow, String> {
    s.parse()
}

/// A whole number of at least `min` (a bound of 0 would make the relay useless, not safe).
fn parse_at_least(s: &str, min: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("expected a whole number of at least {min}")),
    }
}

fn parse_positive(s: &str) -> Result<usize, String> {
    parse_at_least(s, 1)
}

/// Outbox bytes: at least 1 KiB, room for one small frame.
fn parse_outbox_bytes(s: &str) -> Result<usize, String> {
    parse_at_least(s, 1024)
}

/// Largest frame body: at least 1 KiB, enough for a welcome and a small event.
fn parse_max_body(s: &str) -> Result<usize, String> {
    parse_at_least(s, 1024)
}

/// A token is sent in a JSON hello and compared exactly: whitespace or control characters in
/// it are a copy-paste accident (a trailing newline), never a secret worth accepting. Checked
/// after parsing, not by clap, whose message would echo the token.
fn check_token(t: &str) -> Result<&str> {
    if t.is_empty() {
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
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1e9).contains(&r) => Ok(r),
        _ => Err(format!(
            "invalid rate {s:?}: expected events per second from 0 to 1000000000"
        )),
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// How long to run.
    #[arg(long, value_parser = config::parse_duration, default_value = "5s")]
    duration: Duration,
    /// Where to record.
    #[arg(long, env = "GABP_RELAY_DATA_DIR", default_value = "gabp-data")]
    data_dir: PathBuf,
    /// Simulated bridges.
    #[arg(long, default_value_t = 3)]
    bridges: usize,
    /// Events per second from the simulated mod.
    #[arg(long, default_value_t = 20_000.0, value_parser = parse_rate)]
    rate: f64,
    /// Do not record.
    #[arg(long)]
    no_record: bool,
}

#[derive(Args, Debug)]
struct SessionsArgs {
    #[command(subcommand)]
    cmd: Option<SessionsCmd>,
    #[command(flatten)]
    dir: DataDir,
    /// With no subcommand: apply this retention before listing.
    #[arg(long)]
    retain: Option<Retention>,
}

#[derive(Subcommand, Debug)]
enum SessionsCmd {
    /// List sessions (the default).
    Ls,
    /// Remove a session.
    Rm {
        /// Session id, unique id prefix, or `latest`.
        session: String,
    },
    /// Verify that sessions' frames, index and catalog agree.
    Check {
        /// Session id, prefix or `latest` (all sessions when absent).
        session: Option<String>,
    },
}

#[derive(Args, Debug)]
struct RepairArgs {
    #[command(flatten)]
    dir: DataDir,
}

#[derive(Args, Debug)]
struct StatsArgs {
    /// Session id, unique id prefix, or `latest`.
    session: String,
    #[command(flatten)]
    dir: DataDir,
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// Session id, unique id prefix, or `latest`.
    session: String,
    #[command(flatten)]
    dir: DataDir,
    /// Only events on this channel (repeatable).
    #[arg(long)]
    channel: Vec<String>,
    /// Only frames from this offset into the session (e.g. 10s).
    #[arg(long, value_parser = config::parse_duration)]
    from: Option<Duration>,
    /// Only frames before this offset.
    #[arg(long, value_parser = config::parse_duration)]
    to: Option<Duration>,
    /// Write here instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// Session id, unique id prefix, or `latest`.
    session: String,
    #[command(flatten)]
    dir: DataDir,
    /// Where bridges connect.
    #[arg(long)]
    listen: String,
    /// Token bridges must present (generated and printed when absent).
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Speed factor, or `max`.
    #[arg(long, default_value = "1")]
    speed: gabp_relay::replay::Speed,
    /// Start over at the end.
    #[arg(long = "loop")]
    looping: bool,
    /// Only this channel (repeatable).
    #[arg(long)]
    channel: Vec<String>,
    /// Start this far into the session.
    #[arg(long, value_parser = config::parse_duration)]
    from: Option<Duration>,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
}

#[derive(Args, Debug)]
struct WrapArgs {
    /// Route name (default: GABS_GAME_ID, else `default`).
    #[arg(long)]
    route_name: Option<String>,
    /// Where recordings go.
    #[arg(long, env = "GABP_RELAY_DATA_DIR", default_value = "gabp-data")]
    data_dir: PathBuf,
    /// Do not record.
    #[arg(long)]
    no_record: bool,
    /// Slow-bridge policy.
    #[arg(long, value_parser = parse_on_slow)]
    on_slow: Option<OnSlow>,
    /// WAL sync policy: none or batch.
    #[arg(long)]
    durability: Option<Durability>,
    /// Serve Prometheus metrics at HOST:PORT.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// The game's command and arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ModSimArgs {
    /// Where to listen (default: 127.0.0.1 on GABP_SERVER_PORT if set, else a free port).
    #[arg(long)]
    listen: Option<String>,
    /// Speak GABP over stdin/stdout instead.
    #[arg(long)]
    stdio: bool,
    /// Token bridges must present.
    #[arg(long, env = "GABP_TOKEN", default_value = "", hide_env_values = true)]
    token: String,
    /// Events per second; 0 for as fast as possible.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_rate)]
    rate: f64,
    /// Event body size in bytes.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Channels to advertise (comma separated).
    #[arg(long, default_value = "world/tick,player/move,chat/message")]
    channels: String,
    /// Delay before answering tools/call.
    #[arg(long, value_parser = config::parse_duration, default_value = "0s")]
    tool_latency: Duration,
    /// Behave like a quirky real mod library (seq from 1, null fields, timestamps).
    #[arg(long)]
    quirks: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gabp-relay")
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => {}
        Err(e) => {
            // A reader that went away (`gabp-relay sessions | head -1`) is not a failure.
            let broken_pipe = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                std::process::exit(0);
            }
            eprintln!("gabp-relay: {}", one_line(&e));
            let usage = e.downcast_ref::<UsageError>().is_some()
                || e.downcast_ref::<config::ConfigError>().is_some();
            std::process::exit(if usage { 2 } else { 1 });
        }
    }
}

/// The error and its causes as one line, each cause said once: a cause whose text the line
/// already holds (an error that prints its source) is left out.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
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

/// `println!` for a command's output that returns an error instead of panicking when stdout
/// is closed or full.
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*).context("cannot write the output")?
    };
}

/// A usage problem found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UsageError(String);

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow!(UsageError(msg.into()))
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Serve(a) => serve(*a).await,
        Cmd::Demo(a) => {
            let opts = gabp_relay::demo::DemoOptions {
                duration: a.duration,
                data_dir: a.data_dir,
                bridges: a.bridges.max(1),
                rate: a.rate,
                record: !a.no_record,
            };
            let mut out = std::io::stdout();
            gabp_relay::demo::run(opts, &mut out)
                .await
                .map_err(|e| anyhow!(e))
        }
        Cmd::Sessions(a) => sessions(a),
        Cmd::Stats(a) => {
            let store = Store::open_for_reading(&a.dir.data_dir)?;
            let meta = store.resolve(&a.session)?;
            let stats = gabp_relay::stats::compute(&store, &meta)?;
            if a.dir.json {
                outln!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                write!(std::io::stdout(), "{}", gabp_relay::stats::render(&stats))
                    .context("cannot write the output")?;
            }
            Ok(())
        }
        Cmd::Export(a) => {
            if let (Some(from), Some(to)) = (a.from, a.to) {
                if from >= to {
                    return Err(usage(format!(
                        "--from {from:?} is not before --to {to:?}: nothing to export"
                    )));
                }
            }
            let store = Store::open_for_reading(&a.dir.data_dir)?;
            let meta = store.resolve(&a.session)?;
            let filter = gabp_relay::export::ExportFilter {
                channels: a.channel,
                from: a.from,
                to: a.to,
            };
            let n = match &a.output {
                Some(path) => gabp_relay::export::export_to_file(&store, &meta, &filter, path)
                    .with_context(|| format!("exporting to {}", path.display()))?,
                None => gabp_relay::export::export(
                    &store,
                    &meta,
                    &filter,
                    &mut std::io::BufWriter::new(std::io::stdout().lock()),
                )?,
            };
            if a.output.is_some() {
                eprintln!("exported {n} frames of session {}", meta.id);
            }
            Ok(())
        }
        Cmd::Replay(a) => replay(a).await,
        Cmd::Repair(a) => {
            // The repaired dir and every file RocksDB writes into it stay private.
            gabp_relay::recorder::private_file_modes();
            let r = gabp_storage::repair::repair(&a.dir.data_dir)?;
            println!(
                "kept an untouched copy at {} ({} files, {} bytes)",
                r.backup.display(),
                r.before.0,
                r.before.1
            );
            for step in &r.steps {
                println!("{step}");
            }
            if !r.lost.is_empty() {
                bail!(
                    "repair of {} could not recover everything: {}; the untouched copy is at {}",
                    a.dir.data_dir.display(),
                    r.lost.join("; "),
                    r.backup.display()
                );
            }
            println!(
                "repaired {}: now {} files, {} bytes; {} session(s); {} left recording by a dead relay marked crash",
                a.dir.data_dir.display(),
                r.after.0,
                r.after.1,
                r.sessions,
                r.crashed.len()
            );
            println!("run `gabp-relay sessions check` to see what every session still holds");
            Ok(())
        }
        Cmd::Wrap(a) => {
            let code = wrap(a).await?;
            std::process::exit(code);
        }
        Cmd::ModSim(a) => mod_sim(a).await,
        Cmd::Mcp(a) => gabp_relay::mcp::run(a).await,
        Cmd::Token => {
            outln!("{}", gabp_relay::auth::generate_token());
            Ok(())
        }
    }
}

fn route_from_flags(a: &ServeArgs) -> Result<Option<RouteConfig>> {
    let (upstream, listen) = match (&a.upstream, &a.listen) {
        (Some(u), Some(l)) => (u, l),
        (None, None) => return Ok(None),
        _ => return Err(usage("--upstream and --listen go together")),
    };
    let upstream = if upstream == "stdio" {
        if a.command.is_empty() {
            return Err(usage("--upstream stdio needs the mod's command after --"));
        }
        Upstream::Stdio(a.command.clone())
    } else {
        Upstream::Addr(
            upstream
                .parse()
                .map_err(|e: String| usage(format!("--upstream: {e}")))?,
        )
    };
    let listen: Addr = listen
        .parse()
        .map_err(|e: String| usage(format!("--listen: {e}")))?;
    let (token, generated) = match &a.token {
        Some(t) if t.trim().is_empty() => return Err(usage("--token must not be empty")),
        Some(t) => (check_token(t)?.to_string(), false),
        None => (gabp_relay::auth::generate_token(), true),
    };
    let mut r = RouteConfig::new(&a.route_name, upstream, listen, token);
    r.token_generated = generated;
    r.upstream_token = a.upstream_token.clone();
    Ok(Some(r))
}

/// A setting from its flag, else from the config file (a parse error names the field), else
/// its default.
fn setting<T: std::str::FromStr>(
    flag: Option<T>,
    file: Option<&String>,
    field: &str,
    default: T,
) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    match (flag, file) {
        (Some(v), _) => Ok(v),
        (None, Some(s)) => s.parse().map_err(|e| anyhow!("config {field}: {e}")),
        (None, None) => Ok(default),
    }
}

fn relay_config(a: &ServeArgs) -> Result<RelayConfig> {
    if !a.command.is_empty() && a.upstream.as_deref() != Some("stdio") {
        return Err(usage(
            "a command after -- is the stdio mod's: it needs --upstream stdio",
        ));
    }
    let file = match &a.config {
        Some(p) => Some((FileConfig::load(p)?, p.display().to_string())),
        None => None,
    };
    let mut routes = match &file {
        Some((f, name)) => f.routes(name)?,
        None => Vec::new(),
    };
    if let Some(r) = route_from_flags(a)? {
        routes.push(r);
    }
    if routes.is_empty() {
        return Err(usage(
            "nothing to serve: give --upstream and --listen, or --config with [[route]] tables",
        ));
    }
    for r in &mut routes {
        if let Some(v) = a.on_slow {
            r.on_slow = v;
        }
        if let Some(v) = a.request_timeout {
            r.request_timeout = v;
        }
        if let Some(v) = a.outbox_frames {
            r.outbox_frames = v.max(1);
        }
        if let Some(v) = a.outbox_bytes {
            r.outbox_bytes = v.max(1024);
        }
        if let Some(v) = a.max_body {
            r.max_body = v.max(64);
        }
        if let Some(v) = a.max_bridges {
            r.max_bridges = v.max(1);
        }
        if let Some(v) = a.frame_timeout {
            r.frame_timeout = v;
        }
        if let Some(v) = a.write_deadline {
            r.write_deadline = v.max(Duration::from_millis(10));
        }
        if a.no_subscribe_all {
            r.subscribe_all = false;
        }
        if a.no_record {
            r.record = false;
        }
    }
    let f = file.as_ref().map(|(f, _)| f);
    let file_str = |get: fn(&FileConfig) -> &Option<String>| f.and_then(|f| get(f).as_ref());
    let durability = setting(
        a.durability,
        file_str(|f| &f.durability),
        "durability",
        Durability::Batch,
    )?;
    let compression = setting(
        a.compression,
        file_str(|f| &f.compression),
        "compression",
        Compression::Lz4,
    )?;
    let on_record_error = setting(
        a.on_record_error,
        file_str(|f| &f.on_record_error),
        "on_record_error",
        OnRecordError::Stall,
    )?;
    let retain = setting(
        a.retain,
        file_str(|f| &f.retain),
        "retain",
        Retention::default(),
    )?;
    let metrics = match (a.metrics, file_str(|f| &f.metrics)) {
        (Some(m), _) => Some(m),
        (None, Some(s)) => Some(
            s.parse()
                .map_err(|_| anyhow!("config metrics: invalid address {s:?}"))?,
        ),
        (None, None) => None,
    };
    let allow_remote = a.allow_remote || f.and_then(|f| f.allow_remote).unwrap_or(false);
    if let Some(r) = routes
        .iter()
        .find(|r| !allow_remote && !r.listen.is_local())
    {
        return Err(usage(format!(
            "refusing to listen on {}: not a loopback address (pass --allow-remote to allow it)",
            r.listen
        )));
    }
    Ok(RelayConfig {
        routes,
        data_dir: a
            .data_dir
            .clone()
            .or_else(|| f.and_then(|f| f.data_dir.clone()))
            .unwrap_or_else(|| PathBuf::from("gabp-data")),
        durability,
        compression,
        wal_compression: a.wal_compression || f.and_then(|f| f.wal_compression).unwrap_or(false),
        allow_symlinked_data_dir: a.allow_symlinked_data_dir,
        on_record_error,
        retain,
        metrics,
        allow_remote,
        shutdown_timeout: a.shutdown_timeout,
        bridge_file: f.and_then(|f| f.bridge_file.clone()),
    })
}

/// The signals that end a command. Installed before anything else starts, so a SIGHUP (a
/// closed terminal, `systemctl reload`) never kills the process with the discovery file left
/// behind: SIGINT and SIGTERM shut down cleanly, SIGHUP is logged and ignored.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let on = |k| signal(k).context("cannot install the signal handlers");
        Ok(Signals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }

    /// Waits for SIGINT or SIGTERM; returns its name.
    async fn shutdown(&mut self) -> &'static str {
        loop {
            tokio::select! {
                _ = self.int.recv() => return "SIGINT",
                _ = self.term.recv() => return "SIGTERM",
                _ = self.hup.recv() => tracing::warn!(
                    "SIGHUP received: reloading the configuration is not supported yet (token and identity reload is planned with issue 15); still running with the configuration it started with"
                ),
            }
        }
    }
}

/// Where each route's discovery file goes, as (route index, path).
fn bridge_file_paths(
    routes: &[RouteConfig],
    flag: Option<&PathBuf>,
    from_config: Option<&PathBuf>,
) -> Vec<(usize, PathBuf)> {
    let mut paths = Vec::new();
    for (i, r) in routes.iter().enumerate() {
        let path = match flag.or(from_config) {
            Some(p) if routes.len() > 1 && !p.to_string_lossy().contains("{route}") => {
                let p = p.to_string_lossy();
                PathBuf::from(p.replace(".json", &format!("-{}.json", r.name)))
            }
            Some(p) => PathBuf::from(p.to_string_lossy().replace("{route}", &r.name)),
            None => match gabp_relay::discovery::default_path(&r.name) {
                Some(p) => p,
                None => continue,
            },
        };
        paths.push((i, path));
    }
    paths
}

/// Refuses to start where a running relay owns a route's discovery file (it must be neither
/// overwritten nor, at this relay's exit, deleted); a file left by a dead relay is replaced.
fn check_bridge_files(routes: &[RouteConfig], paths: &[(usize, PathBuf)]) -> Result<()> {
    use gabp_relay::discovery::{holder, Holder};
    for (i, path) in paths {
        match holder(path) {
            Holder::Live(pid) => bail!(
                "route {}: a running relay (pid {pid}) owns the discovery file {}; stop it, or give this relay another --route-name, --bridge-file or --no-bridge-file",
                routes[*i].name,
                path.display()
            ),
            Holder::Stale(pid) => tracing::info!(
                path = %path.display(),
                pid,
                "replacing a discovery file left by a relay that is no longer running"
            ),
            Holder::Free => {}
        }
    }
    Ok(())
}

/// Writes each route's discovery file; returns the paths written (removed again at exit).
fn write_bridge_files(relay: &Relay, paths: &[(usize, PathBuf)]) -> Vec<PathBuf> {
    let mut written = Vec::new();
    for (i, path) in paths {
        let r = &relay.routes[*i];
        let body = gabp_relay::discovery::contents(
            &r.cfg.name,
            &relay.addrs[*i],
            &r.cfg.token,
            &r.launch_id,
        );
        match gabp_relay::discovery::write(path, &body) {
            Ok(()) => written.push(path.clone()),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the bridge discovery file")
            }
        }
    }
    written
}

async fn serve(a: ServeArgs) -> Result<()> {
    let mut signals = Signals::install()?;
    let cfg = relay_config(&a)?;
    if a.mcp_listen.is_some_and(|m| !m.ip().is_loopback()) && !cfg.allow_remote {
        return Err(usage(
            "--mcp-listen must be a loopback address unless --allow-remote is given",
        ));
    }
    let paths = if a.no_bridge_file {
        Vec::new()
    } else {
        bridge_file_paths(
            &cfg.routes,
            a.bridge_file.as_ref(),
            cfg.bridge_file.as_ref(),
        )
    };
    check_bridge_files(&cfg.routes, &paths)?;
    let relay = Relay::start_with(
        cfg.clone(),
        std::sync::Arc::new(gabp_relay::transport::AnyConnector::default()),
    )
    .await?;
    let bridge_files = write_bridge_files(&relay, &paths);
    // What the operator needs to connect, on stdout; best effort, so a closed stdout (a
    // supervisor that stopped reading) never takes the relay down. The recording line comes last.
    let mut text = String::new();
    for (i, r) in relay.routes.iter().enumerate() {
        text += &format!(
            "route {} listening on {} -> mod {}\n",
            r.cfg.name, relay.addrs[i], r.cfg.upstream
        );
        if r.cfg.token_generated {
            text += &format!("route {} token {}\n", r.cfg.name, r.cfg.token);
        }
    }
    if let Some(m) = relay.metrics_addr {
        text += &format!("metrics on http://{m}/metrics\n");
    }
    if let Some(addr) = a.mcp_listen {
        match gabp_relay::mcp::http::serve_route(
            &relay,
            addr,
            cfg.allow_remote,
            cfg.records().then(|| cfg.data_dir.clone()),
        )
        .await
        {
            Ok(at) => text += &format!("mcp on http://{at}{}\n", gabp_relay::mcp::http::PATH),
            Err(e) => {
                bridge_files
                    .iter()
                    .for_each(|p| gabp_relay::discovery::remove_own(p));
                return Err(e);
            }
        }
    }
    for p in &bridge_files {
        text += &format!("bridge file {}\n", p.display());
    }
    text += &if cfg.records() {
        format!(
            "recording to {} (durability {:?})\n",
            cfg.data_dir.display(),
            cfg.durability
        )
    } else {
        "recording off\n".to_string()
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    drop(out);
    let sig = signals.shutdown().await;
    tracing::info!("{sig} received: shutting down");
    // The discovery files go first: bridges stop finding a relay that is leaving, and they are
    // gone even if the shutdown overruns its bound.
    for p in &bridge_files {
        gabp_relay::discovery::remove_own(p);
    }
    let report = relay.shutdown_report().await;
    if report.unrecorded > 0 {
        bail!(
            "{} frame(s) were not recorded: the disk still failed at the shutdown bound ({:?}); the recording holds a clean prefix up to its last committed frame",
            report.unrecorded,
            a.shutdown_timeout
        );
    }
    if !report.clean {
        bail!("shutdown did not finish within {:?}", a.shutdown_timeout);
    }
    Ok(())
}

async fn wrap(a: WrapArgs) -> Result<i32> {
    use gabp_relay::wrap::{free_port, spawn_game, LaunchEnv};
    let mut signals = Signals::install()?;
    let env = LaunchEnv::from_env().map_err(|e| usage(e.to_string()))?;
    let game_port = free_port()?;
    let game_token = gabp_relay::auth::generate_token();
    let name = a
        .route_name
        .or(env.game_id.clone())
        .unwrap_or_else(|| "default".into());
    let upstream = Upstream::Addr(
        format!("127.0.0.1:{game_port}")
            .parse()
            .map_err(|e: String| anyhow!(e))?,
    );
    let listen: Addr = format!("127.0.0.1:{}", env.port)
        .parse()
        .map_err(|e: String| anyhow!(e))?;
    let mut route = RouteConfig::new(&name, upstream, listen, env.token.clone());
    route.upstream_token = game_token.clone();
    if let Some(p) = a.on_slow {
        route.on_slow = p;
    }
    route.record = !a.no_record;
    let mut cfg = RelayConfig::new(vec![route], a.data_dir);
    cfg.durability = a.durability.unwrap_or_default();
    cfg.metrics = a.metrics;
    let relay = Relay::start(cfg).await?;
    let mut game = spawn_game(&a.command, game_port, &game_token)?;
    tracing::info!(route = %name, listen = %relay.addrs[0], game_port, "wrapping the game; launchers connect to the relay");
    let status = tokio::select! {
        s = game.wait() => s?,
        _ = signals.shutdown() => {
            // Forward the signal and let the game decide how to end.
            if let Some(pid) = game.id() {
                let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            }
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
    Ok(status.code().unwrap_or(1))
}

fn sessions(a: SessionsArgs) -> Result<()> {
    // Only removing opens read-write (and never creates); everything else reads read-only.
    let changes = matches!(a.cmd, Some(SessionsCmd::Rm { .. })) || a.retain.is_some();
    let store = if changes {
        Store::open_for_change(&a.dir.data_dir)?
    } else {
        Store::open_for_reading(&a.dir.data_dir)?
    };
    match a.cmd.unwrap_or(SessionsCmd::Ls) {
        SessionsCmd::Ls => {
            if let Some(r) = a.retain {
                store.apply_retention(
                    gabp_rt::clock::now_ns(),
                    r.max_age.map(|d| d.as_nanos() as u64),
                    r.max_bytes,
                )?;
            }
            let list = store.sessions()?;
            if a.dir.json {
                let v: Vec<serde_json::Value> = list
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "id": m.id.to_string(), "route": m.route, "app": m.app_name, "appVersion": m.app_version,
                            "agentId": m.agent_id, "startedNs": m.started_ns, "endedNs": m.ended_ns, "durationS": m.duration_ns() as f64 / 1e9,
                            "frames": m.frames, "bytes": m.bytes, "events": m.events, "bridges": m.bridges.len(), "end": m.end_label(),
                            "anomalies": m.anomalies, "recordErrors": m.record_errors, "lostFrames": m.lost_frames,
                        })
                    })
                    .collect();
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "sessions": v }))?
                );
            } else {
                outln!(
                    "{:<36}  {:<12} {:<14} {:<20} {:>9} {:>10} {:>12}  END",
                    "SESSION",
                    "ROUTE",
                    "APP",
                    "START (UTC)",
                    "DURATION",
                    "FRAMES",
                    "BYTES"
                );
                for m in &list {
                    outln!(
                        "{:<36}  {:<12} {:<14} {:<20} {:>8.1}s {:>10} {:>12}  {}",
                        m.id,
                        display::name(&m.route),
                        m.app_name.as_deref().map_or("-".into(), display::name),
                        utc(m.started_ns),
                        m.duration_ns() as f64 / 1e9,
                        m.frames,
                        m.bytes,
                        m.end_label()
                    );
                }
            }
        }
        SessionsCmd::Rm { session } => {
            let meta = store.resolve(&session)?;
            store.delete_session(meta.id)?;
            outln!("removed session {}", meta.id);
        }
        SessionsCmd::Check { session } => {
            let ids: Vec<_> = match session {
                Some(s) => vec![store.resolve(&s)?.id],
                None => store.sessions()?.into_iter().map(|m| m.id).collect(),
            };
            let mut reports = Vec::new();
            for id in ids {
                reports.push(store.check_session(id)?);
            }
            let bad = reports.iter().filter(|r| !r.ok()).count();
            if a.dir.json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "ok": bad == 0, "sessions": reports })
                    )?
                );
            } else {
                for r in &reports {
                    outln!(
                        "{}  {}  {} frames, {} chunks, {} index entries, {} channels",
                        r.session,
                        if r.ok() { "ok" } else { "FAILED" },
                        r.frames,
                        r.chunks,
                        r.index_entries,
                        r.channels
                    );
                    for p in &r.problems {
                        outln!("    {}", display::text(p, 300));
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} session(s) failed the consistency check");
            }
        }
    }
    Ok(())
}

/// Formats ns since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
fn utc(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

async fn replay(a: ReplayArgs) -> Result<()> {
    let mut signals = Signals::install()?;
    // Usage first: a bad --listen is reported before the data dir is touched.
    let listen: Addr = a
        .listen
        .parse()
        .map_err(|e: String| usage(format!("--listen: {e}")))?;
    if !a.allow_remote && !listen.is_local() {
        return Err(usage(format!(
            "refusing to listen on {listen}: not a loopback address (pass --allow-remote to allow it)"
        )));
    }
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let meta = store.resolve(&a.session)?;
    let (token, generated) = match a.token {
        Some(t) => (check_token(&t)?.to_string(), false),
        None => (gabp_relay::auth::generate_token(), true),
    };
    let opts = gabp_relay::replay::ReplayOptions {
        token: token.clone(),
        speed: a.speed,
        looping: a.looping,
        channels: a.channel,
        from: a.from,
    };
    let rec = gabp_relay::replay::Recording::load(&store, meta, &opts)?;
    drop(store);
    let listener = gabp_rt::Listener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;
    // Best effort, as in serve: a closed stdout does not stop the replay.
    let mut text = format!(
        "replaying session {} ({} events) on {}\n",
        rec.meta.id,
        rec.event_count(),
        bound
    );
    if generated {
        text += &format!("token {token}\n");
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    drop(out);
    let cancel = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gabp_relay::replay::serve(
        listener,
        std::sync::Arc::new(rec),
        opts,
        cancel.clone(),
    ));
    signals.shutdown().await;
    cancel.cancel();
    let _ = server.await;
    Ok(())
}

async fn mod_sim(a: ModSimArgs) -> Result<()> {
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
        ..gabp_sim::ModSimConfig::default()
    };
    if a.stdio {
        tokio::task::spawn_blocking(move || gabp_sim::ModSim::serve_stdio(cfg)).await?;
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
    signals.shutdown().await;
    sim.stop();
    Ok(())
}
