//! Relay configuration as typed values: routes and their policies, the relay's settings and
//! the largest bounds any of them may take. Where the values come from (flags, a TOML file) is
//! the command line's business; nothing here reads text but the small values of
//! [`gabp_rt::units`].

pub use gabp_rt::units;
pub use units::{parse_duration, parse_size, parse_timeout};

use std::path::PathBuf;
use std::time::Duration;

use gabp_rt::Addr;
use gabp_storage::{Compression, Durability};

/// The largest bounds an operator may set, flags and config file alike: what a production relay
/// on one machine would ever need. Anything bigger is a typo (`1TiB` for `1MiB`) that would let
/// one bridge or one frame take the machine's memory.
pub mod limits {
    /// `max_body`: 64 MiB (the default is 1 MiB).
    pub const MAX_BODY: usize = 64 << 20;
    /// `outbox_bytes`, per bridge: 1 GiB (the default is 16 MiB).
    pub const OUTBOX_BYTES: usize = 1 << 30;
    /// `outbox_frames`, per bridge: 1,048,576 events (the default is 16,384).
    pub const OUTBOX_FRAMES: usize = 1 << 20;
    /// `max_bridges`, per route: 65,536 (the default is 256).
    pub const MAX_BRIDGES: usize = 1 << 16;
    /// The size part of `retain`: 1 PiB.
    pub const RETAIN_BYTES: u64 = 1 << 50;
    /// A bridge identity's `max_subscriptions`: 1,048,576.
    pub const MAX_SUBSCRIPTIONS: usize = 1 << 20;
    /// The smallest `max_body` and `outbox_bytes`: 1 KiB.
    pub const MIN_SIZE: usize = 1024;
    /// `record_queue`: 1 MiB to 4 GiB (the default is 256 MiB).
    pub const RECORD_QUEUE_MIN: usize = 1 << 20;
    /// See [`RECORD_QUEUE_MIN`].
    pub const RECORD_QUEUE: usize = 4 << 30;
    /// `max_marks`, per session: 1,000,000 (the default is 10,000; each mark is at most
    /// 2 KiB as sent).
    pub const MAX_MARKS: u32 = 1_000_000;
}

pub use gabp_rt::route_name::{check_route_name, shown_route_name, MAX_ROUTE_NAME};

pub use crate::outbox::OnSlow;
pub use crate::recorder::OnRecordError;

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
    /// Recent events kept in memory for bridges that resume (0: none; history then comes from
    /// the recording only).
    pub resume_window_frames: usize,
    /// Bytes of recent events kept in memory for bridges that resume.
    pub resume_window_bytes: usize,
    /// Record this route.
    pub record: bool,
    /// Tags on every session this route records.
    pub tags: std::collections::BTreeMap<String, String>,
    /// Named bridge identities (`[[route.bridge]]`), beside the implicit one of `token`.
    pub identities: Vec<crate::identity::Identity>,
    /// Tool globs only the holder of the route's `relay/lease` may call.
    pub leased: Vec<String>,
    /// The longest `ttlMs` a `relay/lease` request may ask for.
    pub lease_max_ttl: Duration,
    /// Marks one session keeps (`relay/mark`); later ones are refused.
    pub max_marks: u32,
    /// Write every request to the mod in ASCII, its non-ASCII characters as `\uXXXX` escapes
    /// (the same JSON): a shield for a mod that counts `Content-Length` in characters.
    pub ascii_requests: bool,
}

impl RouteConfig {
    /// The table of the route's implicit identity (its `token`) and its named ones, with the
    /// mod's token among the secrets and the route's leased globs.
    pub fn access_table(&self) -> crate::identity::Table {
        crate::identity::Table::new(
            &self.token,
            &self.identities,
            &self.upstream_token,
            &self.leased,
        )
        .with_lease_max_ttl(self.lease_max_ttl)
    }

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
            resume_window_frames: 16 * 1024,
            resume_window_bytes: 16 << 20,
            record: true,
            tags: Default::default(),
            identities: Vec::new(),
            leased: Vec::new(),
            lease_max_ttl: crate::identity::DEFAULT_MAX_TTL,
            max_marks: 10_000,
            ascii_requests: false,
        }
    }
}

/// How a running relay takes a changed setting when its config is reloaded
/// (`gabp-relay reload`, SIGHUP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnReload {
    /// The new value applies at once.
    Applied,
    /// The relay keeps the value it started with until it is restarted.
    RestartNeeded,
}

/// One setting in a reload: its name, how a reload takes it, and whether it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReloadedSetting {
    /// The setting's name, as the config file spells it.
    pub name: &'static str,
    /// How a reload takes a change to it.
    pub on_reload: OnReload,
    /// Whether the re-read config changes it.
    pub changed: bool,
}

/// Lists every field of a config struct with how a reload takes it. The struct is destructured
/// without `..`, so a field added to it does not compile until it is listed here.
macro_rules! reload_table {
    ($ty:ident, $old:expr, $new:expr;
        applied: $($a:ident),*;
        restart: $($r:ident),*;
        compared_apart: $($c:ident),* $(,)?) => {{
        let (old, new) = ($old, $new);
        let $ty { $($a: _,)* $($r: _,)* $($c: _,)* } = old;
        vec![
            $(ReloadedSetting { name: stringify!($a), on_reload: OnReload::Applied, changed: old.$a != new.$a },)*
            $(ReloadedSetting { name: stringify!($r), on_reload: OnReload::RestartNeeded, changed: old.$r != new.$r },)*
            $(ReloadedSetting { name: stringify!($c), on_reload: OnReload::RestartNeeded, changed: false },)*
        ]
    }};
}

impl RouteConfig {
    /// Every setting of the route, with how a reload takes it and whether `new` (the re-read
    /// config of the same route) changes it. The bridge identities, `leased` and
    /// `lease_max_ttl` apply at once; every other setting needs a restart.
    pub fn reload_table(&self, new: &RouteConfig) -> Vec<ReloadedSetting> {
        let mut table = reload_table!(RouteConfig, self, new;
            applied: identities, leased, lease_max_ttl;
            restart: name, upstream, upstream_token, listen, token, token_generated, on_slow,
                outbox_frames, outbox_bytes, request_timeout, hello_wait, frame_timeout,
                write_deadline, subscribe_all, max_body, max_pending, max_subscriptions,
                max_bridges, resume_window_frames, resume_window_bytes, record, tags, max_marks,
                ascii_requests;
            compared_apart:
        );
        // A token generated at each start is not a change the operator made.
        let generated = self.token_generated && new.token_generated;
        for s in &mut table {
            match s.name {
                "token" if generated => s.changed = false,
                "token_generated" => s.changed = false,
                _ => {}
            }
        }
        table
    }
}

impl RelayConfig {
    /// Every relay-wide setting, with how a reload takes it and whether `new` changes it (none
    /// is applied by a reload; the routes have their own [`RouteConfig::reload_table`]).
    pub fn reload_table(&self, new: &RelayConfig) -> Vec<ReloadedSetting> {
        let mut table = reload_table!(RelayConfig, self, new;
            applied: ;
            restart: data_dir, durability, compression, wal_compression, record_queue,
                allow_symlinked_data_dir, on_record_error, retain, metrics, allow_remote,
                shutdown_timeout, bridge_file, retain_unshipped;
            compared_apart: routes, ship,
        );
        // Shipping is compared by where it ships; the routes by their own tables.
        let shipping = |c: &RelayConfig| c.ship.as_ref().map(|s| s.shown_destination());
        if let Some(s) = table.iter_mut().find(|s| s.name == "ship") {
            s.changed = shipping(self) != shipping(new);
        }
        table.retain(|s| s.name != "routes");
        table
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
            // A bare number is ambiguous; as before, it is an age in seconds.
            // One age and one size at most: a second would silently replace the first.
            let twice = |what: &str| {
                format!("retention {s:?} gives two {what}s; give one age and/or one size, like 7d,10GiB")
            };
            if let Ok(d) = parse_duration(part) {
                if r.max_age.replace(d).is_some() {
                    return Err(twice("age"));
                }
            } else if let Ok(b) = parse_size(part) {
                if r.max_bytes.is_some() {
                    return Err(twice("size"));
                }
                if b > limits::RETAIN_BYTES {
                    return Err(format!(
                        "retention size {part:?} is too large (at most {})",
                        gabp_rt::display::bytes(limits::RETAIN_BYTES)
                    ));
                }
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
    /// Bytes the recorder's queue may hold before the mod is held (`--record-queue`).
    pub record_queue: usize,
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
    /// Ship every recording to this NATS JetStream cluster (`--ship`).
    pub ship: Option<std::sync::Arc<dyn crate::shipping::Shipping>>,
    /// Let retention delete sessions not fully shipped.
    pub retain_unshipped: bool,
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
            record_queue: crate::recorder::DEFAULT_BUDGET,
            allow_symlinked_data_dir: false,
            on_record_error: OnRecordError::Stall,
            retain: Retention::default(),
            metrics: None,
            allow_remote: false,
            shutdown_timeout: Duration::from_secs(10),
            bridge_file: None,
            ship: None,
            retain_unshipped: false,
        }
    }

    /// Whether any route records.
    pub fn records(&self) -> bool {
        self.routes.iter().any(|r| r.record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> RouteConfig {
        RouteConfig::new(
            "r",
            Upstream::Addr("127.0.0.1:1".parse().expect("addr")),
            "127.0.0.1:2".parse().expect("addr"),
            "t".repeat(32),
        )
    }

    fn changed(old: &RouteConfig, new: &RouteConfig) -> Vec<(&'static str, OnReload)> {
        old.reload_table(new)
            .into_iter()
            .filter(|s| s.changed)
            .map(|s| (s.name, s.on_reload))
            .collect()
    }

    #[test]
    fn a_reload_names_each_changed_route_setting_and_whether_it_applies() {
        let old = route();
        assert!(changed(&old, &old.clone()).is_empty());
        let mut new = old.clone();
        new.resume_window_frames += 1;
        new.max_marks += 1;
        new.hello_wait += Duration::from_secs(1);
        new.leased = vec!["admin/*".into()];
        assert_eq!(
            changed(&old, &new),
            [
                ("leased", OnReload::Applied),
                ("hello_wait", OnReload::RestartNeeded),
                ("resume_window_frames", OnReload::RestartNeeded),
                ("max_marks", OnReload::RestartNeeded),
            ]
        );
        // Every field is in the table once (the macro also refuses to compile without one).
        let table = old.reload_table(&old);
        let mut names: Vec<_> = table.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), table.len());
    }

    #[test]
    fn a_generated_token_is_no_change_but_a_new_token_is() {
        let mut old = route();
        old.token_generated = true;
        let mut new = old.clone();
        new.token = "u".repeat(32);
        assert!(changed(&old, &new).is_empty(), "both generated at start");
        new.token_generated = false;
        assert_eq!(changed(&old, &new), [("token", OnReload::RestartNeeded)]);
    }

    #[test]
    fn no_relay_wide_setting_is_applied_by_a_reload() {
        let old = RelayConfig::new(vec![route()], "d".into());
        let mut new = old.clone();
        new.retain_unshipped = true;
        new.allow_symlinked_data_dir = true;
        let table = old.reload_table(&new);
        assert!(table.iter().all(|s| s.on_reload == OnReload::RestartNeeded));
        let names: Vec<_> = table.iter().filter(|s| s.changed).map(|s| s.name).collect();
        assert_eq!(names, ["allow_symlinked_data_dir", "retain_unshipped"]);
    }

    #[test]
    fn retention_reads_ages_and_sizes() {
        let r: Retention = "7d,10GiB".parse().expect("valid");
        assert_eq!(r.max_age, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(r.max_bytes, Some(10 << 30));
        assert!("7 parsecs".parse::<Retention>().is_err());
        for twice in ["7d,10GiB,3", "7d,7d", "1GiB,2GiB"] {
            let e = twice.parse::<Retention>().expect_err(twice);
            assert!(e.contains("gives two"), "{e}");
        }
        assert!("2PiB"
            .parse::<Retention>()
            .expect_err("too large")
            .contains("at most 1.0 PiB"));
    }

    #[test]
    fn route_names_are_bounded_printable_and_trimmed() {
        for good in [
            "default",
            "lab/a",
            "lab b",
            "é",
            &"é".repeat(32),
            &"a".repeat(64),
        ] {
            assert!(check_route_name(good).is_ok(), "{good}");
        }
        for (bad, says) in [
            ("", "empty"),
            (&*"a".repeat(65), "65 bytes"),
            (&*"é".repeat(33), "66 bytes"),
            ("a\nb", "'\\n'"),
            ("a\u{7f}", "character"),
            ("a\u{202e}b", "character"),
            ("a\u{200b}", "character"),
            (" a", "whitespace"),
            ("a\t", "character"),
            ("a ", "whitespace"),
        ] {
            let e = check_route_name(bad).expect_err(bad);
            assert!(
                e.contains(says) && e.contains("1 to 64 bytes"),
                "{bad:?}: {e}"
            );
        }
        assert_eq!(shown_route_name("short"), "short");
        assert_eq!(
            shown_route_name(&"é".repeat(40)),
            format!("{}…", "é".repeat(32))
        );
    }
}
