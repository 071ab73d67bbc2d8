//! Relay configuration: routes and their policies, from flags or a TOML file.
//!
//! One process serves one or many routes (one mod upstream, one downstream listener and its
//! token each). A config file describes several; command-line flags describe one and override
//! the file's global settings. Parse errors name the file, the line and the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gabp_rt::Addr;
use gabp_storage::{Compression, Durability};
use serde::Deserialize;

/// What happens when a bridge's outbox is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnSlow {
    /// Drop that bridge's oldest queued events; it sees a seq gap and a `relay/dropped` event.
    #[default]
    DropOldest,
    /// Disconnect that bridge.
    Disconnect,
    /// Wait for that bridge (lossless; stalls the whole route). For trusted consumers only.
    Block,
}

impl OnSlow {
    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnSlow::DropOldest => "drop-oldest",
            OnSlow::Disconnect => "disconnect",
            OnSlow::Block => "block",
        }
    }
}

impl std::str::FromStr for OnSlow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop-oldest" => Ok(OnSlow::DropOldest),
            "disconnect" => Ok(OnSlow::Disconnect),
            "block" => Ok(OnSlow::Block),
            _ => Err(format!(
                "unknown policy {s:?}: expected drop-oldest, disconnect or block"
            )),
        }
    }
}

/// What the recorder does when a write fails (disk full, I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnRecordError {
    /// Keep retrying; the relay stops reading from the mod meanwhile (nothing is lost).
    #[default]
    Stall,
    /// Drop the failed batch (counted in the session's `lost_frames`) and keep relaying.
    Continue,
}

impl std::str::FromStr for OnRecordError {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stall" => Ok(OnRecordError::Stall),
            "continue" => Ok(OnRecordError::Continue),
            _ => Err(format!("unknown policy {s:?}: expected stall or continue")),
        }
    }
}

/// Where the mod is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// A TCP or unix socket address to connect to.
    Addr(Addr),
    /// A command to start, speaking GABP over its stdin and stdout.
    Stdio(Vec<String>),
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Upstream::Addr(a) => write!(f, "{a}"),
            Upstream::Stdio(cmd) => write!(f, "stdio:{}", cmd.join(" ")),
        }
    }
}

/// One route: a mod, a listener for bridges, and their policies.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Name used in recordings, metrics and status.
    pub name: String,
    /// The mod.
    pub upstream: Upstream,
    /// Token the relay presents to the mod.
    pub upstream_token: String,
    /// Where bridges connect.
    pub listen: Addr,
    /// Token bridges must present.
    pub token: String,
    /// Whether the token was generated (and so must be printed).
    pub token_generated: bool,
    /// Slow-bridge policy.
    pub on_slow: OnSlow,
    /// Per-bridge outbox bound in frames.
    pub outbox_frames: usize,
    /// Per-bridge outbox bound in bytes.
    pub outbox_bytes: usize,
    /// How long a forwarded request may wait for the mod.
    pub request_timeout: Duration,
    /// How long a `session/hello` waits for the mod to be connected.
    pub hello_wait: Duration,
    /// How long a new connection may take to say hello, and any frame to arrive whole.
    pub frame_timeout: Duration,
    /// How long a bridge's socket may accept nothing while frames wait for it before the
    /// bridge is cut (its connection reset), like nats-server's `write_deadline`.
    pub write_deadline: Duration,
    /// Subscribe upstream to every channel the mod advertises (so recordings are complete).
    pub subscribe_all: bool,
    /// Largest accepted frame body.
    pub max_body: usize,
    /// Pending requests one bridge may have.
    pub max_pending: usize,
    /// Channels one bridge may subscribe to.
    pub max_subscriptions: usize,
    /// Bridges connected at once.
    pub max_bridges: usize,
    /// Record this route.
    pub record: bool,
}

impl RouteConfig {
    /// The route's secrets: what redaction removes from anything recorded.
    pub fn secrets(&self) -> [&str; 2] {
        [&self.token, &self.upstream_token]
    }

    /// A route with default policies.
    pub fn new(name: &str, upstream: Upstream, listen: Addr, token: String) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            upstream,
            upstream_token: String::new(),
            listen,
            token,
            token_generated: false,
            on_slow: OnSlow::DropOldest,
            outbox_frames: 16 * 1024,
            outbox_bytes: 16 << 20,
            request_timeout: Duration::from_secs(30),
            hello_wait: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(10),
            write_deadline: Duration::from_secs(10),
            subscribe_all: true,
            max_body: gabp_proto::DEFAULT_MAX_BODY,
            max_pending: 1024,
            max_subscriptions: 1024,
            max_bridges: 256,
            record: true,
        }
    }
}

/// Keep recordings by age, by total size, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete ended sessions older than this.
    pub max_age: Option<Duration>,
    /// Delete the oldest ended sessions while the total exceeds this many bytes.
    pub max_bytes: Option<u64>,
}

impl std::str::FromStr for Retention {
    type Err = String;
    /// Parses `7d`, `12h`, `10GiB`, `500MB`, or both joined by a comma.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut r = Retention::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Ok(d) = parse_duration(part) {
                r.max_age = Some(d);
            } else if let Some(b) = parse_size(part) {
                r.max_bytes = Some(b);
            } else {
                return Err(format!(
                    "invalid retention {part:?}: expected an age like 7d or a size like 10GiB"
                ));
            }
        }
        Ok(r)
    }
}

/// Parses `1.5s`, `200ms`, `10m`, `2h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("invalid duration {s:?}")),
    };
    // Bounded so that no later `Instant + duration` or nanosecond count can overflow.
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("duration {s:?} is too long (at most 100 years)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The longest duration accepted anywhere.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

/// The longest timeout accepted: a day.
const MAX_TIMEOUT: Duration = Duration::from_secs(86400);

/// Parses a timeout: a duration from 1 ms to 24 h.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let too_long = || format!("timeout {s:?} is too long (at most 24h)");
    let d = parse_duration(s).map_err(|e| {
        if e.contains("too long") {
            too_long()
        } else {
            e
        }
    })?;
    if d < Duration::from_millis(1) {
        return Err(format!("timeout {s:?} is too short (at least 1ms)"));
    }
    if d > MAX_TIMEOUT {
        return Err(too_long());
    }
    Ok(d)
}

fn parse_size(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1,
        "kb" => 1000,
        "kib" | "k" => 1 << 10,
        "mb" => 1000 * 1000,
        "mib" | "m" => 1 << 20,
        "gb" => 1000 * 1000 * 1000,
        "gib" | "g" => 1 << 30,
        "tb" => 1000u64.pow(4),
        "tib" | "t" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Everything one relay process serves.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The routes.
    pub routes: Vec<RouteConfig>,
    /// Where recordings go.
    pub data_dir: PathBuf,
    /// WAL sync policy.
    pub durability: Durability,
    /// Frame compression.
    pub compression: Compression,
    /// Compress the write-ahead log.
    pub wal_compression: bool,
    /// Record into a data dir that is a symlink.
    pub allow_symlinked_data_dir: bool,
    /// Recorder failure policy.
    pub on_record_error: OnRecordError,
    /// Retention, applied at start and while serving.
    pub retain: Retention,
    /// Prometheus endpoint.
    pub metrics: Option<std::net::SocketAddr>,
    /// Allow listening on non-loopback addresses.
    pub allow_remote: bool,
    /// Bound on the whole shutdown sequence.
    pub shutdown_timeout: Duration,
    /// Where to write the bridge discovery file, if anywhere.
    pub bridge_file: Option<PathBuf>,
}

impl RelayConfig {
    /// A config serving `routes`, recording to `data_dir`, with every other setting at its
    /// default (durability batch, LZ4, stall on record errors, keep everything, no metrics).
    pub fn new(routes: Vec<RouteConfig>, data_dir: PathBuf) -> RelayConfig {
        RelayConfig {
            routes,
            data_dir,
            durability: Durability::Batch,
            compression: Compression::Lz4,
            wal_compression: false,
            allow_symlinked_data_dir: false,
            on_record_error: OnRecordError::Stall,
            retain: Retention::default(),
            metrics: None,
            allow_remote: false,
            shutdown_timeout: Duration::from_secs(10),
            bridge_file: None,
        }
    }

    /// Whether any route records.
    pub fn records(&self) -> bool {
        self.routes.iter().any(|r| r.record)
    }
}

/// The TOML form of a config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Data dir.
    pub data_dir: Option<PathBuf>,
    /// `none` or `batch`.
    pub durability: Option<String>,
    /// `none`, `lz4` or `zstd`.
    pub compression: Option<String>,
    /// Compress the write-ahead log (default false).
    pub wal_compression: Option<bool>,
    /// `stall` or `continue`.
    pub on_record_error: Option<String>,
    /// Retention, e.g. `"7d,10GiB"`.
    pub retain: Option<String>,
    /// Prometheus listen address.
    pub metrics: Option<String>,
    /// Allow non-loopback listeners.
    pub allow_remote: Option<bool>,
    /// Bridge discovery file.
    pub bridge_file: Option<PathBuf>,
    /// Routes.
    #[serde(default, rename = "route")]
    pub routes: Vec<FileRoute>,
}

/// One `[[route]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    /// Route name.
    pub name: String,
    /// `HOST:PORT` or `unix:PATH`.
    pub upstream: Option<String>,
    /// A command for the stdio transport.
    pub upstream_command: Option<Vec<String>>,
    /// Token for the mod.
    pub upstream_token: Option<String>,
    /// File holding the token for the mod.
    pub upstream_token_file: Option<PathBuf>,
    /// Where bridges connect.
    pub listen: String,
    /// Token bridges present.
    pub token: Option<String>,
    /// File holding the bridge token.
    pub token_file: Option<PathBuf>,
    /// Slow-bridge policy.
    pub on_slow: Option<OnSlow>,
    /// Outbox bound in frames.
    pub outbox_frames: Option<usize>,
    /// Outbox bound in bytes.
    pub outbox_bytes: Option<usize>,
    /// Request timeout, e.g. `"30s"`.
    pub request_timeout: Option<String>,
    /// Subscribe to every advertised channel.
    pub subscribe_all: Option<bool>,
    /// Largest frame body.
    pub max_body: Option<usize>,
    /// Bridges at once.
    pub max_bridges: Option<usize>,
    /// Record this route.
    pub record: Option<bool>,
}

/// A config error that names where it is.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// What is wrong, with line and field where known.
    pub message: String,
}

/// Reads a token file; an empty one is refused (it would let anyone in with an empty token).
fn read_token_file(path: &Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}

/// The effective user id of this process.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

/// Refuses a config that someone other than this user (or root) could have written: its
/// `upstream_command` runs as this user and its tokens guard the routes.
fn check_trusted(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let (uid, me) = (meta.uid(), euid());
    if uid != me && uid != 0 {
        return Err(format!(
            "owned by uid {uid}, not by this user (uid {me}) or root; refusing to load a config another user controls"
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "writable by group or others (mode {mode:04o}); refusing to load it (chmod go-w fixes this)"
        ));
    }
    Ok(())
}

/// The key of a `key = value` line, if it names a secret (a token), so its value is never
/// repeated in an error message.
fn secret_key(line: &str) -> Option<&str> {
    let key = line.split('=').next()?.trim().trim_matches(['"', '\'']);
    key.contains("token").then_some(key)
}

impl FileConfig {
    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        use std::io::Read;
        let file = path.display().to_string();
        let err = |message: String| ConfigError {
            file: file.clone(),
            message,
        };
        // Checked on the opened file, so the file read is the file checked.
        let mut f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        check_trusted(&f.metadata().map_err(|e| err(e.to_string()))?).map_err(err)?;
        let mut text = String::new();
        f.read_to_string(&mut text)
            .map_err(|e| err(e.to_string()))?;
        FileConfig::parse(&text, &file)
    }

    /// Parses config text; `file` is used in error messages.
    pub fn parse(text: &str, file: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1);
            let secret = line.and_then(|l| text.lines().nth(l - 1).and_then(secret_key));
            let message = match (line, secret) {
                (Some(l), Some(key)) => {
                    format!("line {l}: invalid {key}: expected a quoted string (the value is not shown)")
                }
                (Some(l), None) => format!("line {l}: {}", e.message()),
                (None, _) => e.message().to_string(),
            };
            ConfigError {
                file: file.into(),
                message,
            }
        })
    }

    /// The routes, resolved (token files read, addresses parsed).
    pub fn routes(&self, file: &str) -> Result<Vec<RouteConfig>, ConfigError> {
        let err = |route: &str, field: &str, m: String| ConfigError {
            file: file.into(),
            message: format!("route {route:?}, field {field}: {m}"),
        };
        let mut out = Vec::new();
        for r in &self.routes {
            let upstream = match (&r.upstream, &r.upstream_command) {
                (Some(a), None) => {
                    Upstream::Addr(a.parse().map_err(|m| err(&r.name, "upstream", m))?)
                }
                (None, Some(cmd)) if !cmd.is_empty() => Upstream::Stdio(cmd.clone()),
                _ => {
                    return Err(err(
                        &r.name,
                        "upstream",
                        "set exactly one of upstream and upstream_command".into(),
                    ))
                }
            };
            let listen: Addr = r.listen.parse().map_err(|m| err(&r.name, "listen", m))?;
            let (token, generated) = match (&r.token, &r.token_file) {
                (Some(t), None) if t.trim().is_empty() => {
                    return Err(err(
                        &r.name,
                        "token",
                        "must not be empty (leave it out to have one generated)".into(),
                    ))
                }
                (Some(t), None) => (t.clone(), false),
                (None, Some(p)) => (
                    read_token_file(p).map_err(|m| err(&r.name, "token_file", m))?,
                    false,
                ),
                (None, None) => (crate::auth::generate_token(), true),
                _ => {
                    return Err(err(
                        &r.name,
                        "token",
                        "set at most one of token and token_file".into(),
                    ))
                }
            };
            let mut rc = RouteConfig::new(&r.name, upstream, listen, token);
            rc.token_generated = generated;
            rc.upstream_token = match (&r.upstream_token, &r.upstream_token_file) {
                (Some(t), _) => t.clone(),
                (None, Some(p)) => {
                    read_token_file(p).map_err(|m| err(&r.name, "upstream_token_file", m))?
                }
                (None, None) => String::new(),
            };
            if let Some(v) = r.on_slow {
                rc.on_slow = v;
            }
            if let Some(v) = r.outbox_frames {
                rc.outbox_frames = v.max(1);
            }
            if let Some(v) = r.outbox_bytes {
                rc.outbox_bytes = v.max(1024);
            }
            if let Some(v) = &r.request_timeout {
                rc.request_timeout =
                    parse_timeout(v).map_err(|m| err(&r.name, "request_timeout", m))?;
            }
            if let Some(v) = r.subscribe_all {
                rc.subscribe_all = v;
            }
            if let Some(v) = r.max_body {
                rc.max_body = v;
            }
            if let Some(v) = r.max_bridges {
                rc.max_bridges = v.max(1);
            }
            if let Some(v) = r.record {
                rc.record = v;
            }
            out.push(rc);
        }
        let mut names = std::collections::HashSet::new();
        for r in &out {
            if !names.insert(r.name.clone()) {
                return Err(err(&r.name, "name", "route names must be unique".into()));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_sizes_and_retention() {
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("99999999999999999999999d").is_err());
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("99999999999999d")
            .expect_err("too long")
            .contains("at most 24h"));
        assert_eq!(parse_timeout("24h"), Ok(Duration::from_secs(86400)));
        let r: Retention = "7d,10GiB".parse().expect("valid");
        assert_eq!(r.max_age, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(r.max_bytes, Some(10 << 30));
        assert!("7 parsecs".parse::<Retention>().is_err());
    }

    #[test]
    fn secrets_are_never_echoed_and_never_empty() {
        let e = FileConfig::parse("[[route]]\nname = \"a\"\ntoken = hunter2secret\n", "r.toml")
            .expect_err("unquoted");
        assert!(e.to_string().contains("line 3: invalid token"), "{e}");
        assert!(!e.to_string().contains("hunter2secret"), "{e}");
        let e = FileConfig::parse(
            "[[route]]\nname = \"a\"\nupstream_token = 4242424242\n",
            "r.toml",
        )
        .expect_err("a number");
        assert!(!e.to_string().contains("4242424242"), "{e}");
        let empty = FileConfig::parse(
            "[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\ntoken = \" \"\n",
            "r.toml",
        )
        .expect("parses");
        let e = empty.routes("r.toml").expect_err("empty token");
        assert!(
            e.to_string().contains("field token: must not be empty"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_reported_on_their_own_line() {
        let e = FileConfig::parse("data_dir = \"/x\"\nbogus = 1\n", "r.toml").expect_err("unknown");
        assert!(e.to_string().starts_with("r.toml: line 2:"), "{e}");
    }

    #[test]
    fn config_errors_name_file_line_and_field() {
        let e = FileConfig::parse(
            "data_dir = \"/x\"\n[[route]]\nname = \"a\"\nlisten = 5\n",
            "relay.toml",
        )
        .expect_err("bad type");
        assert!(e.to_string().starts_with("relay.toml: line 4"), "{e}");
        let e = FileConfig::parse("bogus = 1\n", "relay.toml").expect_err("unknown field");
        assert!(e.to_string().contains("bogus"), "{e}");
        let ok = FileConfig::parse(
            "[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"nonsense\"\n",
            "r.toml",
        )
        .expect("parses");
        let e = ok.routes("r.toml").expect_err("bad address");
        assert!(e.to_string().contains("field listen"), "{e}");
    }
}
