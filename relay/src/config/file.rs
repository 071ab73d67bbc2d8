//! The TOML config file, and the one place settings are layered: command-line flags over the
//! file over defaults.
//!
//! Flags are turned into TOML keys of the same names ([`Layer`]) and merged into the file's
//! table before one serde pass reads the result, so a flag and a config key are read, checked
//! and defaulted by the same code. Errors name the file, the line and the field, suggest the
//! closest field for a misspelt one, and never repeat a token's value.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::trust::{check_trusted, io_text, read_token_file};
use super::units::{self, num_or_text};
use super::{limits, OnRecordError, OnSlow, RelayConfig, Retention, RouteConfig, Upstream};
use gabp_engine::auth;
use gabp_engine::identity::{self, Identity, Role, ToolRules};
use gabp_rt::Addr;

/// The TOML form of a config file (and of the flags layered over it).
#[derive(Debug, Default, Deserialize)]
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
    /// The recorder queue's byte budget (`64MiB` or a number).
    #[serde(default, deserialize_with = "num_or_text")]
    pub record_queue: Option<String>,
    /// `stall` or `continue`.
    pub on_record_error: Option<String>,
    /// Retention, e.g. `"7d,10GiB"`.
    pub retain: Option<String>,
    /// Prometheus listen address.
    pub metrics: Option<String>,
    /// Allow non-loopback listeners.
    pub allow_remote: Option<bool>,
    /// Record into a data dir that is a symlink.
    pub allow_symlinked_data_dir: Option<bool>,
    /// Bound on the whole shutdown, e.g. `"10s"`.
    #[serde(default, deserialize_with = "num_or_text")]
    pub shutdown_timeout: Option<String>,
    /// Bridge discovery file.
    pub bridge_file: Option<PathBuf>,
    /// Shipping to NATS JetStream (`[ship]`, the `serve --ship` flags).
    pub ship: Option<gabp_ship::FileShip>,
    /// Routes.
    #[serde(default, rename = "route")]
    pub routes: Vec<FileRoute>,
    /// The file's text, to point errors found after parsing at their line.
    #[serde(skip)]
    text: String,
    /// How many of `routes` the file itself wrote (the rest came from the command line, whose
    /// command checked them: `serve` its flags, `wrap` the launcher's token it must accept).
    #[serde(skip)]
    from_file: usize,
}

/// One `[[route]]` table.
#[derive(Debug, Default, Deserialize)]
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
    /// Outbox bound in bytes (`16MiB` or a number).
    #[serde(default, deserialize_with = "num_or_text")]
    pub outbox_bytes: Option<String>,
    /// Request timeout, e.g. `"30s"`.
    #[serde(default, deserialize_with = "num_or_text")]
    pub request_timeout: Option<String>,
    /// Hello and whole-frame timeout, e.g. `"10s"`.
    #[serde(default, deserialize_with = "num_or_text")]
    pub frame_timeout: Option<String>,
    /// How long a bridge's socket may accept nothing before it is cut.
    #[serde(default, deserialize_with = "num_or_text")]
    pub write_deadline: Option<String>,
    /// Subscribe to every advertised channel.
    pub subscribe_all: Option<bool>,
    /// Largest frame body (`1MiB` or a number).
    #[serde(default, deserialize_with = "num_or_text")]
    pub max_body: Option<String>,
    /// Bridges at once.
    pub max_bridges: Option<usize>,
    /// Recent events kept for resuming bridges (0 turns the window off).
    pub resume_window_frames: Option<usize>,
    /// Bytes of recent events kept for resuming bridges (`16MiB` or a number).
    #[serde(default, deserialize_with = "num_or_text")]
    pub resume_window_bytes: Option<String>,
    /// Record this route.
    pub record: Option<bool>,
    /// Labels on every session of this route (`tags = { experiment = "ppo-42" }`).
    pub tags: Option<std::collections::BTreeMap<String, String>>,
    /// Named bridge identities (`[[route.bridge]]` tables).
    #[serde(default, rename = "bridge")]
    pub bridges: Vec<FileBridge>,
    /// Tool globs only the holder of the route's `relay/lease` may call.
    pub leased: Option<Vec<String>>,
    /// The longest `ttlMs` a `relay/lease` request may ask for, e.g. `"5m"`.
    #[serde(default, deserialize_with = "num_or_text")]
    pub lease_max_ttl: Option<String>,
    /// Marks one session keeps (`relay/mark`).
    pub max_marks: Option<u32>,
    /// Write requests to the mod in ASCII (non-ASCII as `\uXXXX` escapes).
    pub ascii_requests: Option<bool>,
}

/// One `[[route.bridge]]` table: a named bridge identity.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBridge {
    /// Its name (in recordings, stats, status, metrics and logs).
    pub name: String,
    /// Its token.
    pub token: Option<String>,
    /// File holding its token.
    pub token_file: Option<PathBuf>,
    /// `control` (the default) or `observe`.
    pub role: Option<String>,
    /// Allow and `!deny` globs over tool names.
    pub tools: Option<Vec<String>>,
    /// Calls per second to the mod.
    pub calls_per_second: Option<f64>,
    /// Channels it may subscribe to at once.
    pub max_subscriptions: Option<usize>,
    /// Allow and `!deny` globs over the methods it may send to the mod.
    pub methods: Option<Vec<String>>,
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

/// Settings from the command line, as TOML keys named like the config file's.
#[derive(Debug, Default, Clone)]
pub struct Layer {
    /// Top-level keys (data_dir, durability, …), over the file's.
    pub globals: toml::Table,
    /// Route keys (on_slow, outbox_bytes, …), over every route's.
    pub policy: toml::Table,
    /// A route given by flags (name, upstream, listen, tokens), served beside the file's; one
    /// named as a file's route overrides that route's keys.
    pub route: Option<toml::Table>,
}

/// The key of a `key = value` line, if it names a secret (a token), so its value is never
/// repeated in an error message.
fn secret_key(line: &str) -> Option<&str> {
    let key = line.split('=').next()?.trim().trim_matches(['"', '\'']);
    key.contains("token").then_some(key)
}

/// serde's "unknown field `x`, expected one of `a`, `b`" with the closest known name suggested.
fn suggest(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((field, known)) = rest.split_once('`') else {
        return message.to_string();
    };
    let best = known
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|k| (strsim::jaro_winkler(field, k), k))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, k)) if score >= 0.8 => format!("unknown field `{field}`; did you mean `{k}`?"),
        _ => message.to_string(),
    }
}

/// The 1-based line of the first `key =` at or after line `from`, if any.
fn line_of(text: &str, key: &str, from: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .skip(from.saturating_sub(1))
        .find(|(_, l)| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with('='))
        })
        .map(|(i, _)| i + 1)
}

/// The 1-based line of the `b`-th `[[route.bridge]]` header (0 is the first) of the file's
/// `index`-th route, if any.
fn bridge_header(text: &str, index: usize, b: usize) -> Option<usize> {
    let from = route_header(text, index)?;
    let squeezed = |l: &str| l.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    text.lines()
        .enumerate()
        .skip(from)
        .take_while(|(_, l)| !squeezed(l).starts_with("[[route]]"))
        .filter(|(_, l)| squeezed(l).starts_with("[[route.bridge]]"))
        .nth(b)
        .map(|(i, _)| i + 1)
}

/// The 1-based line of the file's `index`-th `[[route]]` header (0 is the first), if any.
fn route_header(text: &str, index: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
            l.starts_with("[[route]]")
        })
        .nth(index)
        .map(|(i, _)| i + 1)
}

impl FileConfig {
    /// Reads, checks (owner and mode) and parses a config file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = Self::read(path)?;
        FileConfig::parse(&text, &path.display().to_string())
    }

    /// Reads a config file's text after checking who may have written it.
    pub fn read(path: &Path) -> Result<String, ConfigError> {
        use std::io::Read;
        let err = |message: String| ConfigError {
            file: path.display().to_string(),
            message,
        };
        // Checked on the opened file, so the file read is the file checked.
        let mut f = std::fs::File::open(path).map_err(|e| err(io_text(&e)))?;
        check_trusted(&f.metadata().map_err(|e| err(io_text(&e)))?).map_err(err)?;
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(|e| err(io_text(&e)))?;
        Ok(text)
    }

    /// Parses config text; `file` is used in error messages.
    pub fn parse(text: &str, file: &str) -> Result<FileConfig, ConfigError> {
        let mut parsed: FileConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            let secret = line.and_then(|l| text.lines().nth(l - 1).and_then(secret_key));
            let message = match (line, secret) {
                (Some(l), Some(key)) => {
                    format!("line {l}: invalid {key}: expected a quoted string (the value is not shown)")
                }
                (Some(l), None) => format!("line {l}: {}", suggest(e.message())),
                (None, _) => suggest(e.message()),
            };
            ConfigError {
                file: file.into(),
                message: message.replace('\n', " ").trim().to_string(),
            }
        })?;
        parsed.text = text.to_string();
        parsed.from_file = parsed.routes.len();
        Ok(parsed)
    }

    /// The file's settings with the command line's `layer` over them (`text` and `file` are
    /// the config file's, when there is one): one serde pass reads both.
    pub fn layered(text: Option<(&str, &str)>, layer: Layer) -> Result<FileConfig, ConfigError> {
        let (mut table, file) = match text {
            Some((text, file)) => {
                // Parsed typed first, for errors with lines; then as a table to merge into.
                FileConfig::parse(text, file)?;
                let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError {
                    file: file.into(),
                    message: e.message().to_string(),
                })?;
                (table, file)
            }
            None => (toml::Table::new(), "command line"),
        };
        table.extend(layer.globals);
        let mut routes = match table.remove("route") {
            Some(toml::Value::Array(a)) => a,
            _ => Vec::new(),
        };
        let from_file = routes.len();
        if let Some(flags) = layer.route {
            let named = |r: &&mut toml::Value| r.get("name") == flags.get("name");
            match routes.iter_mut().find(named) {
                // Flags override the file: the route keeps the file's other keys.
                Some(toml::Value::Table(t)) => {
                    // One way to reach the mod: the flags'.
                    for (given, other) in [
                        ("upstream", "upstream_command"),
                        ("upstream_command", "upstream"),
                    ] {
                        if flags.contains_key(given) {
                            t.remove(other);
                        }
                    }
                    t.extend(flags);
                }
                _ => routes.push(toml::Value::Table(flags)),
            }
        }
        for r in &mut routes {
            if let toml::Value::Table(t) = r {
                for (k, v) in layer.policy.clone() {
                    // `--tag` adds to the route's own tags instead of replacing them.
                    match (t.get_mut(&k), v) {
                        (Some(toml::Value::Table(have)), toml::Value::Table(add))
                            if k == "tags" =>
                        {
                            have.extend(add)
                        }
                        (_, v) => {
                            t.insert(k, v);
                        }
                    }
                }
            }
        }
        table.insert("route".into(), toml::Value::Array(routes));
        let mut merged =
            FileConfig::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError {
                file: file.into(),
                message: suggest(e.message()),
            })?;
        merged.text = text.map(|(t, _)| t.to_string()).unwrap_or_default();
        merged.from_file = from_file;
        Ok(merged)
    }

    /// An error about `field` (of the `index`-th route, named `name`, when given), pointing at
    /// its line when the file has it: a route's field is looked for from its own `[[route]]`
    /// header on, so two routes of the same name are told apart.
    fn field_error(
        &self,
        file: &str,
        route: Option<(usize, &str)>,
        field: &str,
        m: String,
    ) -> ConfigError {
        let from = route.map_or(1, |(i, _)| route_header(&self.text, i).unwrap_or(1));
        // A route given by flags has no line; a top-level field is found before any route.
        let at = route
            .is_none_or(|(i, _)| route_header(&self.text, i).is_some())
            .then(|| line_of(&self.text, field, from))
            .flatten()
            .map(|l| format!("line {l}: "))
            .unwrap_or_default();
        let what = match route {
            Some((_, r)) => format!("route {r:?}, field {field}"),
            None => format!("field {field}"),
        };
        ConfigError {
            file: file.into(),
            message: format!("{at}{what}: {m}"),
        }
    }

    /// The whole relay config, every setting resolved (routes, then globals over defaults).
    pub fn relay_config(&self, file: &str) -> Result<RelayConfig, ConfigError> {
        let routes = self.routes(file)?;
        let err = |field: &str, m: String| self.field_error(file, None, field, m);
        fn parsed<T: std::str::FromStr<Err = String>>(
            v: &Option<String>,
            field: &str,
            err: &dyn Fn(&str, String) -> ConfigError,
        ) -> Result<Option<T>, ConfigError> {
            v.as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|m| err(field, m))
        }
        let mut cfg = RelayConfig::new(
            routes,
            self.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("gabp-data")),
        );
        if let Some(v) = parsed(&self.durability, "durability", &err)? {
            cfg.durability = v;
        }
        if let Some(v) = parsed(&self.compression, "compression", &err)? {
            cfg.compression = v;
        }
        if let Some(v) = parsed::<OnRecordError>(&self.on_record_error, "on_record_error", &err)? {
            cfg.on_record_error = v;
        }
        if let Some(v) = parsed::<Retention>(&self.retain, "retain", &err)? {
            cfg.retain = v;
        }
        if let Some(m) = &self.metrics {
            cfg.metrics = Some(
                m.parse()
                    .map_err(|_| err("metrics", format!("invalid address {m:?}")))?,
            );
        }
        if let Some(v) = &self.shutdown_timeout {
            cfg.shutdown_timeout =
                units::parse_timeout(v).map_err(|m| err("shutdown_timeout", m))?;
        }
        cfg.wal_compression = self.wal_compression.unwrap_or(false);
        if let Some(s) = &self.record_queue {
            cfg.record_queue =
                units::parse_size_in(s, limits::RECORD_QUEUE_MIN, limits::RECORD_QUEUE)
                    .map_err(|m| err("record_queue", m))?;
        }
        cfg.allow_remote = self.allow_remote.unwrap_or(false);
        cfg.allow_symlinked_data_dir = self.allow_symlinked_data_dir.unwrap_or(false);
        cfg.bridge_file = self.bridge_file.clone();
        if let Some(s) = &self.ship {
            cfg.retain_unshipped = s.retain_unshipped.unwrap_or(false);
        }
        Ok(cfg)
    }

    /// Where the `[ship]` table ships to, if there is one. Kept apart from
    /// [`FileConfig::relay_config`] because flags may still change its signing before the relay
    /// gets it.
    pub fn ship_target(
        &self,
        file: &str,
    ) -> Result<Option<gabp_ship::shipper::Target>, ConfigError> {
        self.ship
            .as_ref()
            .map(|s| {
                s.target()
                    .map_err(|m| self.field_error(file, None, "ship", m))
            })
            .transpose()
    }

    /// The routes, resolved (token files read, addresses parsed, bounds checked).
    pub fn routes(&self, file: &str) -> Result<Vec<RouteConfig>, ConfigError> {
        let mut out = Vec::new();
        for (i, r) in self.routes.iter().enumerate() {
            out.push(self.route(i, r, file)?);
        }
        let mut names = std::collections::HashMap::new();
        for (i, r) in out.iter().enumerate() {
            if let Some(first) = names.insert(r.name.clone(), i) {
                // Reported at the second route, saying where the first one is.
                let earlier = route_header(&self.text, first)
                    .map_or(String::new(), |l| format!(" (the first is at line {l})"));
                return Err(self.field_error(
                    file,
                    Some((i, &r.name)),
                    "name",
                    format!("route names must be unique{earlier}"),
                ));
            }
        }
        for (i, r) in out.iter().enumerate() {
            if let Some(first) = out[..i]
                .iter()
                .find(|o| same_listener(&o.listen, &r.listen))
            {
                return Err(self.field_error(
                    file,
                    Some((i, &r.name)),
                    "listen",
                    format!(
                        "{} is also route \"{}\"'s listen address: each route needs its own",
                        r.listen, first.name
                    ),
                ));
            }
        }
        Ok(out)
    }

    fn route(&self, index: usize, r: &FileRoute, file: &str) -> Result<RouteConfig, ConfigError> {
        if let Err(m) = super::check_route_name(&r.name) {
            let shown = super::shown_route_name(&r.name);
            return Err(self.field_error(file, Some((index, &shown)), "name", m));
        }
        let err = |field: &str, m: String| self.field_error(file, Some((index, &r.name)), field, m);
        // Bridge tokens the file wrote get a warning when short (the command line's are seen by
        // its command); the mod's token is the mod's choice.
        let warn_if_short = |t: &str, field: &str| {
            if index < self.from_file {
                let at = err(field, String::new());
                let at = format!("{}: {}", at.file, at.message.trim_end_matches(": "));
                auth::warn_if_short(t, &at);
            }
        };
        let upstream = match (&r.upstream, &r.upstream_command) {
            (Some(a), None) => Upstream::Addr(a.parse().map_err(|m| err("upstream", m))?),
            (None, Some(cmd)) if !cmd.is_empty() => Upstream::Stdio(cmd.clone()),
            _ => {
                return Err(err(
                    "upstream",
                    "set exactly one of upstream and upstream_command".into(),
                ))
            }
        };
        let listen: Addr = r.listen.parse().map_err(|m| err("listen", m))?;
        let (token, generated) = match (&r.token, &r.token_file) {
            (Some(t), None) if t.trim().is_empty() => {
                return Err(err(
                    "token",
                    "must not be empty (leave it out to have one generated)".into(),
                ))
            }
            (Some(t), None) => {
                warn_if_short(t, "token");
                (t.clone(), false)
            }
            (None, Some(p)) => {
                let t = read_token_file(p).map_err(|m| err("token_file", m))?;
                warn_if_short(&t, "token_file");
                (t, false)
            }
            (None, None) => (gabp_engine::auth::generate_token(), true),
            _ => {
                return Err(err(
                    "token",
                    "set at most one of token and token_file".into(),
                ))
            }
        };
        let mut rc = RouteConfig::new(&r.name, upstream, listen, token);
        rc.token_generated = generated;
        // An empty upstream token means the mod asks for none.
        rc.upstream_token = match (&r.upstream_token, &r.upstream_token_file) {
            (Some(t), _) if t.is_empty() => String::new(),
            (Some(t), _) => t.clone(),
            (None, Some(p)) => read_token_file(p).map_err(|m| err("upstream_token_file", m))?,
            (None, None) => String::new(),
        };
        let count = |v: Option<usize>, field: &str, max: usize| match v {
            Some(n) if n == 0 || n > max => Err(err(
                field,
                format!("expected a whole number from 1 to {max}"),
            )),
            v => Ok(v),
        };
        let size = |v: &Option<String>, field: &str, max: usize| {
            v.as_deref()
                .map(|s| units::parse_size_in(s, limits::MIN_SIZE, max))
                .transpose()
                .map_err(|m| err(field, m))
        };
        let timeout = |v: &Option<String>, field: &str| {
            v.as_deref()
                .map(units::parse_timeout)
                .transpose()
                .map_err(|m| err(field, m))
        };
        rc.on_slow = r.on_slow.unwrap_or(rc.on_slow);
        rc.outbox_frames = count(r.outbox_frames, "outbox_frames", limits::OUTBOX_FRAMES)?
            .unwrap_or(rc.outbox_frames);
        rc.outbox_bytes =
            size(&r.outbox_bytes, "outbox_bytes", limits::OUTBOX_BYTES)?.unwrap_or(rc.outbox_bytes);
        rc.max_body = size(&r.max_body, "max_body", limits::MAX_BODY)?.unwrap_or(rc.max_body);
        rc.max_bridges =
            count(r.max_bridges, "max_bridges", limits::MAX_BRIDGES)?.unwrap_or(rc.max_bridges);
        if let Some(n) = r.resume_window_frames {
            if n > limits::OUTBOX_FRAMES {
                let most = limits::OUTBOX_FRAMES;
                return Err(err(
                    "resume_window_frames",
                    format!("expected a whole number from 0 to {most}"),
                ));
            }
            rc.resume_window_frames = n;
        }
        rc.resume_window_bytes = size(
            &r.resume_window_bytes,
            "resume_window_bytes",
            limits::OUTBOX_BYTES,
        )?
        .unwrap_or(rc.resume_window_bytes);
        rc.request_timeout =
            timeout(&r.request_timeout, "request_timeout")?.unwrap_or(rc.request_timeout);
        rc.frame_timeout = timeout(&r.frame_timeout, "frame_timeout")?.unwrap_or(rc.frame_timeout);
        if let Some(d) = &r.write_deadline {
            let d = units::parse_duration(d).map_err(|m| err("write_deadline", m))?;
            // Below 10 ms every scheduling hiccup would cut a bridge.
            rc.write_deadline = d.max(Duration::from_millis(10));
        }
        rc.subscribe_all = r.subscribe_all.unwrap_or(rc.subscribe_all);
        rc.record = r.record.unwrap_or(rc.record);
        rc.ascii_requests = r.ascii_requests.unwrap_or(rc.ascii_requests);
        if let Some(tags) = &r.tags {
            for (k, v) in tags {
                gabp_storage::check_tag(k, v).map_err(|m| err("tags", m))?;
            }
            if tags.len() > gabp_storage::catalog::MAX_TAGS {
                let most = gabp_storage::catalog::MAX_TAGS;
                return Err(err("tags", format!("at most {most} tags per session")));
            }
            rc.tags = tags.clone();
        }
        if let Some(globs) = &r.leased {
            if let Some(g) = globs.iter().find(|g| g.is_empty() || g.starts_with('!')) {
                return Err(err(
                    "leased",
                    format!("{g:?} is not a tool glob (no empty or `!` globs here)"),
                ));
            }
            rc.leased = globs.clone();
        }
        if let Some(d) = &r.lease_max_ttl {
            let d = units::parse_duration(d).map_err(|m| err("lease_max_ttl", m))?;
            let most = Duration::from_millis(gabp_engine::identity::MAX_TTL_MS);
            if d < Duration::from_millis(1) || d > most {
                return Err(err(
                    "lease_max_ttl",
                    "expected a duration from 1ms to 1h".into(),
                ));
            }
            rc.lease_max_ttl = d;
        }
        if let Some(n) = r.max_marks {
            if n == 0 || n > limits::MAX_MARKS {
                let most = limits::MAX_MARKS;
                return Err(err(
                    "max_marks",
                    format!("expected a whole number from 1 to {most}"),
                ));
            }
            rc.max_marks = n;
        }
        rc.identities = self.identities(index, r, file, &rc.token)?;
        Ok(rc)
    }

    /// An error about `field` of the `b`-th `[[route.bridge]]` of the `index`-th route.
    fn bridge_error(
        &self,
        file: &str,
        (index, route): (usize, &str),
        (b, name): (usize, &str),
        field: &str,
        m: String,
    ) -> ConfigError {
        let at = bridge_header(&self.text, index, b)
            .and_then(|from| line_of(&self.text, field, from))
            .map(|l| format!("line {l}: "))
            .unwrap_or_default();
        ConfigError {
            file: file.into(),
            message: format!("{at}route {route:?}, bridge {name:?}, field {field}: {m}"),
        }
    }

    /// The route's `[[route.bridge]]` identities, checked: names unique, well-formed and not
    /// `default`; exactly one of token and token_file; no token shared with another identity
    /// or with the route's own `token`.
    fn identities(
        &self,
        index: usize,
        r: &FileRoute,
        file: &str,
        route_token: &str,
    ) -> Result<Vec<Identity>, ConfigError> {
        let mut out: Vec<Identity> = Vec::new();
        for (b, fb) in r.bridges.iter().enumerate() {
            let err = |field: &str, m: String| {
                self.bridge_error(file, (index, &r.name), (b, &fb.name), field, m)
            };
            let valid_name = !fb.name.is_empty()
                && fb.name.len() <= identity::MAX_NAME
                && fb
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
            if !valid_name {
                return Err(err(
                    "name",
                    format!(
                        "expected 1 to {} letters, digits, `_`, `-` or `.`",
                        identity::MAX_NAME
                    ),
                ));
            }
            if fb.name == identity::DEFAULT_NAME {
                return Err(err(
                    "name",
                    "\"default\" names the route's own token; choose another name".into(),
                ));
            }
            if out
                .iter()
                .any(|i| i.name.as_deref() == Some(fb.name.as_str()))
            {
                return Err(err("name", "bridge names must be unique in a route".into()));
            }
            let token = match (&fb.token, &fb.token_file) {
                (Some(t), None) if t.trim().is_empty() => {
                    return Err(err("token", "must not be empty".into()))
                }
                (Some(t), None) => t.clone(),
                (None, Some(p)) => read_token_file(p).map_err(|m| err("token_file", m))?,
                (None, None) => return Err(err("name", "set one of token and token_file".into())),
                _ => return Err(err("token", "set only one of token and token_file".into())),
            };
            let token_field = if fb.token.is_some() {
                "token"
            } else {
                "token_file"
            };
            if index < self.from_file {
                let at = err(token_field, String::new());
                auth::warn_if_short(
                    &token,
                    &format!("{}: {}", at.file, at.message.trim_end_matches(": ")),
                );
            }
            let shared =
                token == route_token || out.iter().any(|i| auth::token_matches(i.token(), &token));
            if shared {
                return Err(err(
                    token_field,
                    "this token is already another identity's; every identity needs its own".into(),
                ));
            }
            let role = match &fb.role {
                Some(r) => r.parse::<Role>().map_err(|m| err("role", m))?,
                None => Role::Control,
            };
            let mut id = Identity::named(fb.name.clone(), token, role);
            if let Some(globs) = &fb.tools {
                id.tools = ToolRules::parse(globs).map_err(|m| err("tools", m))?;
            }
            if let Some(globs) = &fb.methods {
                id.methods = ToolRules::parse(globs).map_err(|m| err("methods", m))?;
            }
            if let Some(rate) = fb.calls_per_second {
                if !(rate > 0.0 && rate <= identity::MAX_RATE) {
                    return Err(err(
                        "calls_per_second",
                        format!("expected a number above 0, at most {}", identity::MAX_RATE),
                    ));
                }
                id.calls_per_second = Some(rate);
            }
            if let Some(n) = fb.max_subscriptions {
                if n == 0 || n > limits::MAX_SUBSCRIPTIONS {
                    return Err(err(
                        "max_subscriptions",
                        format!(
                            "expected a whole number from 1 to {}",
                            limits::MAX_SUBSCRIPTIONS
                        ),
                    ));
                }
                id.max_subscriptions = Some(n);
            }
            out.push(id);
        }
        Ok(out)
    }
}

/// Whether two routes' listen addresses would collide at bind: the same unix path, or the same
/// TCP port on the same address or where either is a wildcard (port 0 is a fresh port each).
fn same_listener(a: &Addr, b: &Addr) -> bool {
    match (a, b) {
        (Addr::Unix(x), Addr::Unix(y)) => x == y,
        (Addr::Tcp(x), Addr::Tcp(y)) => {
            x.port() != 0
                && x.port() == y.port()
                && (x.ip() == y.ip() || x.ip().is_unspecified() || y.ip().is_unspecified())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            e.to_string()
                .contains("line 5: route \"a\", field token: must not be empty"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_reported_on_their_own_line_with_a_suggestion() {
        let e = FileConfig::parse("data_dir = \"/x\"\nduribility = 1\n", "r.toml")
            .expect_err("unknown");
        assert!(e.to_string().starts_with("r.toml: line 2:"), "{e}");
        assert!(e.to_string().contains("did you mean `durability`?"), "{e}");
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
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
        assert!(
            e.to_string().contains("line 4: route \"a\", field listen"),
            "{e}"
        );
    }

    #[test]
    fn a_duplicate_route_is_reported_at_the_second_one() {
        let route = |name: &str, listen: &str| {
            format!(
                "[[route]]\nname = \"{name}\"\nupstream = \"127.0.0.1:1\"\nlisten = \"{listen}\"\n"
            )
        };
        let text = format!(
            "{}\n{}\n{}",
            route("a", "127.0.0.1:0"),
            route("b", "127.0.0.1:0"),
            route("a", "nonsense")
        );
        let cfg = FileConfig::parse(&text, "r.toml").expect("parses");
        // A field of the second "a" is found in that route, not in the first.
        let e = cfg.routes("r.toml").expect_err("bad address");
        assert!(
            e.to_string().contains("line 14: route \"a\", field listen"),
            "{e}"
        );
        let text = text.replace("nonsense", "127.0.0.1:0");
        let cfg = FileConfig::parse(&text, "r.toml").expect("parses");
        let e = cfg.routes("r.toml").expect_err("duplicate");
        assert_eq!(
            e.to_string(),
            "r.toml: line 12: route \"a\", field name: route names must be unique (the first is at line 1)"
        );
    }

    #[test]
    fn two_routes_on_one_listen_address_are_a_config_error() {
        let route = |name: &str, listen: &str| {
            format!(
                "[[route]]\nname = \"{name}\"\nupstream = \"127.0.0.1:1\"\nlisten = \"{listen}\"\n"
            )
        };
        let routes = |a: &str, b: &str| {
            FileConfig::parse(&format!("{}\n{}", route("a", a), route("b", b)), "r.toml")
                .expect("parses")
                .routes("r.toml")
        };
        let e = routes("127.0.0.1:7400", "127.0.0.1:7400").expect_err("same address");
        assert_eq!(
            e.to_string(),
            "r.toml: line 9: route \"b\", field listen: 127.0.0.1:7400 is also route \"a\"'s listen address: each route needs its own"
        );
        routes("0.0.0.0:7400", "127.0.0.1:7400").expect_err("a wildcard covers it");
        routes("unix:/tmp/r.sock", "unix:/tmp/r.sock").expect_err("same path");
        routes("127.0.0.1:0", "127.0.0.1:0").expect("port 0 is a fresh port each");
        routes("127.0.0.1:7400", "127.0.0.2:7400").expect("different addresses");
        routes("127.0.0.1:7400", "127.0.0.1:7401").expect("different ports");
    }

    #[test]
    fn a_flags_route_named_as_a_file_route_overrides_it_and_any_other_is_served_beside() {
        let text = "[[route]]\nname = \"default\"\nupstream_command = [\"mod\"]\nlisten = \"127.0.0.1:0\"\nmax_body = 4096\n";
        let flags = |name: &str| {
            let mut t = toml::Table::new();
            for (k, v) in [
                ("name", name),
                ("upstream", "127.0.0.1:7"),
                ("listen", "127.0.0.1:8"),
            ] {
                t.insert(k.into(), toml::Value::String(v.into()));
            }
            Layer {
                route: Some(t),
                ..Layer::default()
            }
        };
        let cfg = FileConfig::layered(Some((text, "r.toml")), flags("default"))
            .expect("layers")
            .relay_config("r.toml")
            .expect("resolves");
        assert_eq!(cfg.routes.len(), 1, "one route: {:?}", cfg.routes);
        let r = &cfg.routes[0];
        assert_eq!(
            r.upstream.to_string(),
            "127.0.0.1:7",
            "the flag's upstream replaces the file's command"
        );
        assert_eq!(r.listen.to_string(), "127.0.0.1:8");
        assert_eq!(r.max_body, 4096, "the file's other keys stay");
        let cfg = FileConfig::layered(Some((text, "r.toml")), flags("other"))
            .expect("layers")
            .relay_config("r.toml")
            .expect("resolves");
        let names: Vec<&str> = cfg.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["default", "other"]);
    }

    #[test]
    fn the_record_queue_is_a_size_within_its_bounds_and_flags_win() {
        let route =
            "[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\n";
        let resolve = |text: &str, layer: Layer| {
            FileConfig::layered(Some((text, "r.toml")), layer)
                .and_then(|f| f.relay_config("r.toml"))
        };
        let cfg = resolve(route, Layer::default()).expect("resolves");
        assert_eq!(cfg.record_queue, 256 << 20, "default");
        let text = format!("record_queue = 67108864\n{route}");
        assert_eq!(
            resolve(&text, Layer::default())
                .expect("a number")
                .record_queue,
            64 << 20
        );
        let text = format!("record_queue = \"64MiB\"\n{route}");
        assert_eq!(
            resolve(&text, Layer::default())
                .expect("resolves")
                .record_queue,
            64 << 20
        );
        let mut layer = Layer::default();
        layer
            .globals
            .insert("record_queue".into(), toml::Value::String("8MiB".into()));
        assert_eq!(
            resolve(&text, layer).expect("resolves").record_queue,
            8 << 20,
            "flag wins"
        );
        for bad in ["512KiB", "5GiB", "lots"] {
            let text = format!("record_queue = \"{bad}\"\n{route}");
            let e = resolve(&text, Layer::default()).expect_err(bad);
            assert!(e.to_string().contains("record_queue"), "{bad}: {e}");
        }
    }

    #[test]
    fn flags_layer_over_the_file_and_sizes_take_suffixes() {
        let text = "durability = \"none\"\n[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\noutbox_bytes = \"1MiB\"\nmax_body = 4096\n";
        let mut layer = Layer::default();
        layer
            .policy
            .insert("outbox_bytes".into(), toml::Value::String("16MiB".into()));
        layer
            .globals
            .insert("compression".into(), toml::Value::String("zstd".into()));
        let cfg = FileConfig::layered(Some((text, "r.toml")), layer)
            .expect("layers")
            .relay_config("r.toml")
            .expect("resolves");
        assert_eq!(cfg.durability, gabp_storage::Durability::None, "file kept");
        assert_eq!(
            cfg.compression,
            gabp_storage::Compression::Zstd,
            "flag wins"
        );
        assert_eq!(cfg.routes[0].outbox_bytes, 16 << 20, "flag over file");
        assert_eq!(cfg.routes[0].max_body, 4096, "file over default");
        let tagged = text.replace("max_body = 4096", "tags = { seed = \"7\", run = \"a\" }");
        let mut layer = Layer::default();
        let mut add = toml::Table::new();
        add.insert("run".into(), toml::Value::String("b".into()));
        add.insert("gpu".into(), toml::Value::String("1".into()));
        layer.policy.insert("tags".into(), toml::Value::Table(add));
        let cfg = FileConfig::layered(Some((&tagged, "r.toml")), layer)
            .expect("layers")
            .relay_config("r.toml")
            .expect("resolves");
        let tags: Vec<_> = cfg.routes[0]
            .tags
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            tags,
            ["gpu=1", "run=b", "seed=7"],
            "flag tags add to the file's"
        );
        let bad = text.replace("max_body = 4096", "tags = { \"a b\" = \"x\" }");
        let e = FileConfig::parse(&bad, "r.toml")
            .expect("parses")
            .routes("r.toml")
            .expect_err("bad key");
        assert!(e.to_string().contains("field tags: tag key"), "{e}");
        let small = text.replace("max_body = 4096", "max_body = \"512\"");
        let e = FileConfig::parse(&small, "r.toml")
            .expect("parses")
            .routes("r.toml")
            .expect_err("too small");
        assert!(
            e.to_string()
                .contains("line 7: route \"a\", field max_body"),
            "{e}"
        );
    }
}
