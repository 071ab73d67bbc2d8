//! Shipping recordings to a NATS JetStream stream and collecting them from it (issue 14).
//!
//! - this module: the connection options every command shares, connecting, making sure the
//!   stream exists, and the message format.
//! - [`shipper`]: the relay's shipping task and `gabp-relay ship`'s backfill: committed chunks
//!   and catalog snapshots, per session in order, the cursor advanced on JetStream's ack.
//! - [`collect`]: `gabp-relay collect`, a durable pull consumer writing an archive.
//!
//! Messages go to `PREFIX.SESSION`, each with `Nats-Msg-Id` = session id and first frame
//! number (`SESSION-FIRST` for a chunk, `SESSION-cSEQ` for the SEQth catalog snapshot), so the
//! stream drops a re-sent message, and the collector's idempotent ingest drops what gets past
//! its dedup window. The header `Gabp-Kind` says `chunk` (the body is the stored chunk
//! unchanged, `Gabp-First` its first frame) or `catalog` (a JSON catalog snapshot).

pub mod collect;
pub mod shipper;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use async_nats::jetstream::{self, stream};
use clap::Args;
use gabp_storage::ship::Destination;

/// How long the stream drops a message whose `Nats-Msg-Id` it has seen.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// Header naming what a message carries.
pub const KIND: &str = "Gabp-Kind";
/// Header with a chunk's first frame number.
pub const FIRST: &str = "Gabp-First";

/// How to reach the NATS cluster and which stream to use (shared by serve, ship, collect).
#[derive(Args, Debug, Clone, Default)]
pub struct NatsFlags {
    /// NATS credentials file (.creds) for the connection.
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// NATS token for the connection.
    #[arg(long, env = "GABP_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// Require TLS, trusting this CA certificate (PEM) besides the system's.
    #[arg(long, value_name = "PEM")]
    pub nats_ca: Option<PathBuf>,
    /// Require TLS to the NATS servers.
    #[arg(long)]
    pub nats_tls: bool,
    /// JetStream stream name.
    #[arg(long, default_value = "GABP", value_parser = nats_name)]
    pub stream: String,
    /// Subject prefix; messages go to PREFIX.SESSION.
    #[arg(long, default_value = "gabp", value_parser = subject_prefix)]
    pub subject_prefix: String,
    /// Replicas of the stream when it is created, 1 to 5.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: u8,
    /// The stream keeps messages this long when created, e.g. 7d [default: forever].
    #[arg(long, value_parser = age)]
    pub stream_max_age: Option<Duration>,
    /// The stream keeps at most this many bytes when created, e.g. 50GiB [default: no limit].
    #[arg(long, value_parser = size)]
    pub stream_max_bytes: Option<u64>,
}

impl NatsFlags {
    /// The flags given that differ from their defaults, by name (a token from the
    /// environment is not counted: it may be set for other commands).
    pub fn given(&self) -> Vec<&'static str> {
        let from_env = std::env::var("GABP_NATS_TOKEN").ok();
        [
            ("--nats-creds", self.nats_creds.is_some()),
            (
                "--nats-token",
                self.nats_token.is_some() && self.nats_token != from_env,
            ),
            ("--nats-ca", self.nats_ca.is_some()),
            ("--nats-tls", self.nats_tls),
            ("--stream", self.stream != "GABP"),
            ("--subject-prefix", self.subject_prefix != "gabp"),
            ("--replicas", self.replicas != 1),
            ("--stream-max-age", self.stream_max_age.is_some()),
            ("--stream-max-bytes", self.stream_max_bytes.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// A JetStream stream or consumer name: 1 to 255 printable ASCII characters without
/// whitespace, `.`, `*`, `>` or path separators (the server refuses those).
pub fn nats_name(s: &str) -> Result<String, String> {
    let bad = |c: char| !c.is_ascii_graphic() || matches!(c, '.' | '*' | '>' | '/' | '\\');
    if s.is_empty() || s.len() > 255 || s.chars().any(bad) {
        return Err(format!(
            "{s:?}: expected 1 to 255 printable characters without whitespace, '.', '*', '>', '/' or '\\'"
        ));
    }
    Ok(s.to_string())
}

/// A subject prefix: dot-separated tokens, none empty, without whitespace or wildcards, and
/// not in the server's own namespaces (`$JS`, `$SYS`, … and `_INBOX`: a stream over those
/// would swallow the server's API).
fn subject_prefix(s: &str) -> Result<String, String> {
    let ok_token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_graphic() && c != '*' && c != '>')
    };
    if s.len() > 200 || !s.split('.').all(ok_token) {
        return Err(format!(
            "{s:?}: expected dot-separated tokens (like gabp or lab.east) without whitespace, '*' or '>'"
        ));
    }
    if s.starts_with('$') || s.split('.').next() == Some("_INBOX") {
        return Err(format!(
            "{s:?}: subjects under '$…' and '_INBOX' belong to the NATS server; pick another prefix"
        ));
    }
    Ok(s.to_string())
}

fn age(s: &str) -> Result<Duration, String> {
    crate::config::units::parse_duration(s)
}

fn size(s: &str) -> Result<u64, String> {
    crate::config::units::parse_size(s)
}

/// `nats://user:pass@host:4222,…` as it may be shown: without credentials.
pub fn shown(urls: &str) -> String {
    urls.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(a)) if a > s => format!("{}{}", &u[..s + 3], &u[a + 1..]),
            (None, Some(a)) => u[a + 1..].to_string(),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The addresses of a `nats://HOST:PORT[,HOST:PORT…]` list: a scheme given once applies to the
/// ones after it that have none (as the NATS tools read such a list).
fn addresses(urls: &str) -> Vec<String> {
    let mut scheme = "nats://";
    urls.split(',')
        .map(|u| {
            let u = u.trim();
            match u.find("://") {
                Some(i) => {
                    scheme = &u[..i + 3];
                    u.to_string()
                }
                None => format!("{scheme}{u}"),
            }
        })
        .collect()
}

/// Checks a `nats://…` list before anything starts (a usage error otherwise): each a
/// `nats://` or `tls://` address (the scheme may be given once, first) with a host and, if
/// given, a port from 1 to 65535.
pub fn check_urls(urls: &str) -> Result<(), String> {
    if urls.split(',').any(|u| u.trim().is_empty()) {
        return Err(format!(
            "{}: an empty address in the list; expected nats://HOST:PORT[,HOST:PORT…]",
            shown(urls)
        ));
    }
    for u in addresses(urls) {
        let expected = || format!("{}: expected nats://HOST:PORT", shown(&u));
        let rest = u
            .strip_prefix("nats://")
            .or_else(|| u.strip_prefix("tls://"))
            .ok_or_else(expected)?;
        let host_port = rest.rsplit('@').next().unwrap_or(rest);
        if host_port.is_empty() || host_port.starts_with(':') {
            return Err(expected());
        }
        let addr: async_nats::ServerAddr = u.parse().map_err(|e| format!("{}: {e}", shown(&u)))?;
        if addr.port() == 0 {
            return Err(format!("{}: port 0 is not a server's port", shown(&u)));
        }
    }
    Ok(())
}

/// A JetStream connection with a stream that exists, and that stream's identity as a ship
/// destination (cursors are kept per destination).
pub struct Connected {
    /// The JetStream context.
    pub js: jetstream::Context,
    /// The stream (as created) and subject prefix messages go to.
    pub to: Destination,
}

/// Connects (one attempt, bounded) and makes sure the stream exists.
pub async fn connect(urls: &str, f: &NatsFlags, name: &str) -> Result<Connected> {
    let mut o = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)));
    if let Some(t) = &f.nats_token {
        o = o.token(t.clone());
    }
    if let Some(p) = &f.nats_creds {
        o = o
            .credentials_file(p)
            .await
            .map_err(|e| anyhow!("cannot read the NATS credentials file {}: {e}", p.display()))?;
    }
    if let Some(ca) = &f.nats_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    } else if f.nats_tls {
        o = o.require_tls(true);
    }
    let mut addrs: Vec<async_nats::ServerAddr> = addresses(urls)
        .iter()
        .map(|u| u.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("invalid NATS address {}: {e}", shown(urls)))?;
    // `nats://TOKEN@host` is how the NATS tools take a token: the client would send it as a
    // user name, so it goes as the token (a --nats-token given as well wins).
    if f.nats_token.is_none() {
        if let Some(token) = addrs
            .iter()
            .find(|a| a.username().is_some() && a.password().is_none())
            .and_then(|a| a.username().map(str::to_string))
        {
            o = o.token(token);
        }
    }
    for a in &mut addrs {
        if a.username().is_some() && a.password().is_none() {
            *a = shown(a.as_url_str())
                .parse()
                .map_err(|e| anyhow!("invalid NATS address {}: {e}", shown(urls)))?;
        }
    }
    let client = o.connect(addrs).await.map_err(|e| {
        anyhow!(
            "cannot connect to NATS at {}: {}",
            shown(urls),
            one_line(&e)
        )
    })?;
    let js = jetstream::new(client);
    // No account-info probe: async-nats 0.50 cannot parse a 2.9 server's answer to it. A
    // server without JetStream fails the stream lookup below, with a line saying so.
    let cfg = stream::Config {
        name: f.stream.clone(),
        subjects: vec![format!("{}.>", f.subject_prefix)],
        storage: stream::StorageType::File,
        num_replicas: f.replicas as usize,
        max_age: f.stream_max_age.unwrap_or_default(),
        max_bytes: f
            .stream_max_bytes
            .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        // The server refuses a duplicate window longer than the stream keeps messages.
        duplicate_window: f
            .stream_max_age
            .map_or(DEDUP_WINDOW, |age| age.min(DEDUP_WINDOW)),
        ..Default::default()
    };
    // A cluster electing a new leader (a node just lost) answers nothing for a few seconds:
    // a timed-out lookup is tried twice more before it is an error.
    let mut tries = 0;
    let found = loop {
        match js.get_or_create_stream(cfg.clone()).await {
            Err(e) if tries < 2 && one_line(&e).contains("timed out") => tries += 1,
            other => break other,
        }
    };
    let stream = found.map_err(|e| {
        let why = one_line(&e);
        // The hint only where a server without JetStream is the likely cause.
        let hint = if ["no responders", "timed out", "not enabled"]
            .iter()
            .any(|h| why.contains(h))
        {
            " (is JetStream enabled?)"
        } else {
            ""
        };
        anyhow!(
            "the NATS server at {} gave no JetStream stream {}{hint}: {why}",
            shown(urls),
            f.stream,
        )
    })?;
    let to = Destination::new(
        &f.stream,
        stream.cached_info().created.unix_timestamp_nanos(),
        &f.subject_prefix,
    );
    Ok(Connected { js, to })
}

/// An error as one line.
pub fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or("error").to_string()
}

/// This machine's host name, for the origin of shipped sessions.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// `sessions --json`'s entry for `m` with what shipping knows: `ship` once the session was
/// shipped anywhere, archives shipping on included (frames and bytes the destination that took most has not acknowledged,
/// whether one has it all, and to how many destinations it went), and `origin` (host,
/// route, relay version) for a session collected from elsewhere.
pub fn session_json(
    store: &gabp_storage::Store,
    m: &gabp_storage::SessionMeta,
    mut v: serde_json::Value,
) -> serde_json::Value {
    let origin = store.origin(m.id).ok().flatten();
    if let Ok(cursors) = store.ship_cursors(m.id) {
        if let Some(c) = cursors
            .iter()
            .map(|(_, c)| c)
            .filter(|c| c.catalog_seq > 0)
            .max_by_key(|c| c.frames)
        {
            v["ship"] = serde_json::json!({
                "lagFrames": m.frames.saturating_sub(c.frames),
                "lagBytes": m.bytes.saturating_sub(c.bytes),
                "shipped": store.fully_shipped(m).unwrap_or(false),
                "destinations": cursors.len(),
            });
        }
    }
    if let Some(o) = origin {
        v["origin"] = serde_json::json!({
            "host": o.host, "route": o.route, "relayVersion": o.relay_version,
        });
    }
    v
}

/// The config file's `[ship]` table: the same settings as `serve`'s shipping flags.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileShip {
    /// `nats://HOST:PORT[,HOST:PORT…]`.
    pub to: String,
    /// Credentials file.
    pub nats_creds: Option<PathBuf>,
    /// A file holding the token (kept out of the config itself).
    pub nats_token_file: Option<PathBuf>,
    /// Require TLS.
    pub nats_tls: Option<bool>,
    /// CA certificate (PEM); implies TLS.
    pub nats_ca: Option<PathBuf>,
    /// Stream name.
    pub stream: Option<String>,
    /// Subject prefix.
    pub subject_prefix: Option<String>,
    /// Replicas when the stream is created.
    pub replicas: Option<u8>,
    /// Stream age limit when created, e.g. `"30d"`.
    pub stream_max_age: Option<String>,
    /// Stream size limit when created, e.g. `"500GiB"`.
    pub stream_max_bytes: Option<String>,
    /// Let retention delete sessions not fully shipped.
    pub retain_unshipped: Option<bool>,
}

impl FileShip {
    /// The shipping target this table describes (the message is one line).
    pub fn target(&self) -> Result<shipper::Target, String> {
        check_urls(&self.to)?;
        let token = match &self.nats_token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let replicas = self.replicas.unwrap_or(1);
        if !(1..=5).contains(&replicas) {
            return Err(format!("replicas {replicas}: expected 1 to 5"));
        }
        Ok(shipper::Target {
            urls: self.to.clone(),
            flags: NatsFlags {
                nats_creds: self.nats_creds.clone(),
                nats_token: token,
                nats_ca: self.nats_ca.clone(),
                nats_tls: self.nats_tls.unwrap_or(false),
                stream: self.stream.clone().unwrap_or_else(|| "GABP".into()),
                subject_prefix: self.subject_prefix.clone().unwrap_or_else(|| "gabp".into()),
                replicas,
                stream_max_age: self.stream_max_age.as_deref().map(age).transpose()?,
                stream_max_bytes: self.stream_max_bytes.as_deref().map(size).transpose()?,
            },
            host: host_name(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheme_given_once_applies_to_the_whole_list() {
        assert_eq!(
            addresses("nats://a:1,b:2, tls://c:3,d:4"),
            ["nats://a:1", "nats://b:2", "tls://c:3", "tls://d:4"]
        );
        // The README's form.
        assert!(check_urls("nats://nats1:4222,nats2:4222,nats3:4222").is_ok());
        assert!(check_urls("nats://TOKEN@nats1:4222").is_ok());
        for (bad, says) in [
            ("nats://a:1,b:99999", "b:99999"),
            ("nats://a:1,", "empty address"),
            ("nats://:4222", "expected nats://HOST:PORT"),
            ("http://a:1", "expected nats://HOST:PORT"),
            ("nats://a:0", "port 0"),
        ] {
            let e = check_urls(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn prefixes_in_the_servers_namespaces_are_refused() {
        for bad in ["$JS", "$SYS.x", "_INBOX", "_INBOX.lab", "a..b", "a.*", ""] {
            assert!(subject_prefix(bad).is_err(), "{bad}");
        }
        for good in ["gabp", "lab.east", "x_INBOX", "a$"] {
            assert!(subject_prefix(good).is_ok(), "{good}");
        }
    }
}
