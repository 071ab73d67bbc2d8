//! Shipping recordings to a NATS JetStream stream and collecting them from it. The relay engine
//! reaches shipping only through its hook ([`gabp_engine::shipping::Shipping`], implemented by
//! [`shipper::Target`]).
//!
//! - this module: the connection options every command shares (credentials, TLS, inboxes),
//!   connecting, making sure the stream exists, and the message format.
//! - [`fleet`]: the fleet key, the signature each message carries, and the message id.
//! - [`shipper`]: the relay's shipping task and `gabp-relay ship`'s backfill: committed chunks
//!   and catalog snapshots, per session in order, the cursor advanced on JetStream's ack.
//! - [`collect`]: `gabp-relay collect`, a durable pull consumer writing an archive of what the
//!   fleet signed.
//!
//! Messages go to `PREFIX.SESSION`. The header `Gabp-Kind` says `chunk` (the body is the
//! stored chunk unchanged, `Gabp-First` its first frame) or `catalog` (a JSON catalog
//! snapshot); `Gabp-Key` and `Gabp-Mac` carry the fleet key's id and the HMAC-SHA256 over
//! session, kind, first frame and body. `Nats-Msg-Id` is the session and first frame
//! (`SESSION-FIRST-…`, `SESSION-cSEQ-…` for a snapshot) followed by 128 bits of that MAC (of a
//! SHA-256 when shipping unsigned): the same content always gets the same id, so the stream
//! drops a re-sent message and the collector's idempotent ingest drops what gets past its
//! dedup window, and nobody without the key can take the id a genuine message will have.

pub mod collect;
pub mod fleet;
pub mod shipper;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use async_nats::jetstream::message::PublishMessage as Publish;
use async_nats::jetstream::{self, stream};
use clap::Args;
use fleet::{Covered, FleetKey, Kind};
use gabp_storage::ship::Destination;

/// How long the stream drops a message whose `Nats-Msg-Id` it has seen.
const DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// Header naming what a message carries.
pub const KIND: &str = "Gabp-Kind";
/// Header with a chunk's first frame number.
pub const FIRST: &str = "Gabp-First";

/// How to reach the NATS cluster and which stream to use (shared by serve, ship, collect).
/// Its `Debug` leaves the token and password out.
#[derive(Args, Clone, Default)]
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
    /// NATS user name (with --nats-password, or as nats://USER:PASSWORD@HOST:PORT).
    #[arg(long, env = "GABP_NATS_USER")]
    pub nats_user: Option<String>,
    /// NATS password; better from the environment than on the command line, which `ps` shows.
    #[arg(long, env = "GABP_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// NATS nkey seed file (`SU…`, as `nk -gen user` writes it) to sign the server's challenge.
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// TLS client certificate (PEM) for servers that verify clients; implies TLS.
    #[arg(long, value_name = "PEM")]
    pub nats_cert: Option<PathBuf>,
    /// The TLS client certificate's private key (PEM).
    #[arg(long, value_name = "PEM")]
    pub nats_key: Option<PathBuf>,
    /// Subject prefix of this client's reply inboxes; a user of its own per role lets the
    /// servers' permissions keep each role's replies from the others.
    #[arg(long, default_value = "_INBOX", value_parser = inbox_prefix)]
    pub nats_inbox_prefix: String,
}

impl std::fmt::Debug for NatsFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "<hidden>");
        f.debug_struct("NatsFlags")
            .field("nats_creds", &self.nats_creds)
            .field("nats_token", &hidden(&self.nats_token))
            .field("nats_ca", &self.nats_ca)
            .field("nats_tls", &self.nats_tls)
            .field("stream", &self.stream)
            .field("subject_prefix", &self.subject_prefix)
            .field("replicas", &self.replicas)
            .field("stream_max_age", &self.stream_max_age)
            .field("stream_max_bytes", &self.stream_max_bytes)
            .field("nats_user", &self.nats_user)
            .field("nats_password", &hidden(&self.nats_password))
            .field("nats_nkey", &self.nats_nkey)
            .field("nats_cert", &self.nats_cert)
            .field("nats_key", &self.nats_key)
            .field("nats_inbox_prefix", &self.nats_inbox_prefix)
            .finish()
    }
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
            (
                "--nats-user",
                self.nats_user.is_some() && self.nats_user != std::env::var("GABP_NATS_USER").ok(),
            ),
            (
                "--nats-password",
                self.nats_password.is_some()
                    && self.nats_password != std::env::var("GABP_NATS_PASSWORD").ok(),
            ),
            ("--nats-nkey", self.nats_nkey.is_some()),
            ("--nats-cert", self.nats_cert.is_some()),
            ("--nats-key", self.nats_key.is_some()),
            ("--nats-inbox-prefix", self.nats_inbox_prefix != "_INBOX"),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }

    /// Checks what can be checked before connecting (a usage error otherwise, one line,
    /// without any secret): a user goes with a password, a certificate with its key, and an
    /// nkey seed file holds a user seed.
    pub fn check(&self) -> Result<(), String> {
        match (&self.nats_user, &self.nats_password) {
            (Some(_), None) => {
                return Err("--nats-user needs --nats-password (or GABP_NATS_PASSWORD)".into())
            }
            (None, Some(_)) => {
                return Err("--nats-password needs --nats-user (or GABP_NATS_USER)".into())
            }
            _ => {}
        }
        match (&self.nats_cert, &self.nats_key) {
            (Some(_), None) => return Err("--nats-cert needs --nats-key, its private key".into()),
            (None, Some(_)) => return Err("--nats-key needs --nats-cert, its certificate".into()),
            _ => {}
        }
        if let Some(p) = &self.nats_nkey {
            nkey_seed(p)?;
        }
        Ok(())
    }
}

/// The user seed in an nkey seed file: `SU` and 56 more base32 characters, alone on a line
/// (surrounding whitespace ignored); never echoed in an error.
fn nkey_seed(p: &std::path::Path) -> Result<String, String> {
    let at = |m: String| format!("--nats-nkey {}: {m}", p.display());
    let meta = std::fs::metadata(p).map_err(|e| at(e.to_string()))?;
    if meta.len() > 4096 {
        return Err(at("not an nkey seed file (over 4 KiB)".into()));
    }
    let text = std::fs::read_to_string(p).map_err(|e| at(e.to_string()))?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .ok_or_else(|| at("no user seed (a line starting SU…, as `nk -gen user` writes)".into()))?;
    if seed.len() != 58
        || !seed
            .bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
    {
        return Err(at(
            "the seed line is not an nkey seed (58 base32 characters)".into(),
        ));
    }
    Ok(seed.to_string())
}

/// `%XX` escapes of a URL's user or password decoded (as the NATS tools read them).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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

/// A reply inbox prefix: dot-separated tokens without whitespace or wildcards, up to 100
/// characters (`_INBOX`, or one per role such as `_INBOX_relay`).
fn inbox_prefix(s: &str) -> Result<String, String> {
    let ok_token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_graphic() && c != '*' && c != '>')
    };
    if s.len() > 100 || !s.split('.').all(ok_token) {
        return Err(format!(
            "{s:?}: expected dot-separated tokens (like _INBOX or _INBOX_relay) without whitespace, '*' or '>'"
        ));
    }
    Ok(s.to_string())
}

fn age(s: &str) -> Result<Duration, String> {
    gabp_rt::units::parse_duration(s)
}

fn size(s: &str) -> Result<u64, String> {
    gabp_rt::units::parse_size(s)
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

/// How a shipper signs its messages: with the fleet key, or, only when told so, not at all.
#[derive(Debug, Clone, Default)]
pub struct Signing {
    /// The fleet key.
    pub key: Option<FleetKey>,
    /// Ship unsigned messages (`--insecure-unsigned`): a collector cannot tell them from
    /// forged ones.
    pub insecure_unsigned: bool,
}

impl Signing {
    /// The signing a key file and the insecure flag describe (the key file read and checked).
    pub fn new(key: Option<&std::path::Path>, insecure_unsigned: bool) -> Result<Signing, String> {
        if key.is_some() && insecure_unsigned {
            return Err(
                "a fleet key and --insecure-unsigned (insecure_unsigned) exclude each other".into(),
            );
        }
        Ok(Signing {
            key: key.map(FleetKey::load).transpose()?,
            insecure_unsigned,
        })
    }

    /// An error unless messages can be shipped: signed, or unsigned on purpose.
    pub fn check(&self) -> Result<(), String> {
        if self.key.is_none() && !self.insecure_unsigned {
            return Err(format!("shipping needs {NO_KEY}"));
        }
        Ok(())
    }

    /// The message id and headers of a message covering `c`; `label` is the id's readable
    /// part (session and first frame, or session and catalog number).
    pub fn message(&self, c: &Covered<'_>, label: &str) -> Publish {
        let (sum, signed) = match &self.key {
            Some(k) => (k.sign(c), Some(k)),
            None => (c.digest(), None),
        };
        let mut msg = Publish::build()
            .message_id(format!("{label}-{}", fleet::hex(&sum[..16])))
            .header(KIND, c.kind.as_str());
        if c.kind == Kind::Chunk {
            msg = msg.header(FIRST, c.first.to_string().as_str());
        }
        if let Some(k) = signed {
            msg = msg
                .header(fleet::KEY_ID, k.id().to_string().as_str())
                .header(fleet::MAC, fleet::hex(&sum).as_str());
        }
        msg
    }
}

/// What a missing fleet key is told with (shipping or collecting "needs …").
pub const NO_KEY: &str = "the fleet key every relay and collector of the fleet share: --fleet-key FILE (fleet_key in a config's [ship] table); make one with `gabp-relay fleet-key new -o FILE`, or pass --insecure-unsigned to go without (anyone who can publish on the subjects could then write into the archive)";

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
    f.check().map_err(|e| anyhow!("{e}"))?;
    let mut o = async_nats::ConnectOptions::new()
        .name(name)
        .custom_inbox_prefix(&f.nats_inbox_prefix)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)));
    if let Some(t) = &f.nats_token {
        o = o.token(t.clone());
    }
    if let (Some(u), Some(p)) = (&f.nats_user, &f.nats_password) {
        o = o.user_and_password(u.clone(), p.clone());
    }
    if let Some(p) = &f.nats_nkey {
        o = o.nkey(nkey_seed(p).map_err(|e| anyhow!("{e}"))?);
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
    if let (Some(cert), Some(key)) = (&f.nats_cert, &f.nats_key) {
        o = o
            .add_client_certificate(cert.clone(), key.clone())
            .require_tls(true);
    }
    let mut addrs: Vec<async_nats::ServerAddr> = addresses(urls)
        .iter()
        .map(|u| u.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("invalid NATS address {}: {e}", shown(urls)))?;
    // The client ignores credentials in an address; the NATS tools take `nats://TOKEN@host`
    // as a token and `nats://USER:PASSWORD@host` as a user (flags given as well win).
    if f.nats_token.is_none() && f.nats_user.is_none() {
        if let Some(a) = addrs.iter().find(|a| a.username().is_some()) {
            let user = percent_decoded(a.username().unwrap_or_default());
            o = match a.password() {
                Some(p) => o.user_and_password(user, percent_decoded(p)),
                None => o.token(user),
            };
        }
    }
    for a in &mut addrs {
        if a.username().is_some() {
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
    /// NATS user name (with `nats_password_file`).
    pub nats_user: Option<String>,
    /// A file holding the NATS password (kept out of the config itself).
    pub nats_password_file: Option<PathBuf>,
    /// NATS nkey seed file.
    pub nats_nkey: Option<PathBuf>,
    /// TLS client certificate (PEM), with `nats_key`.
    pub nats_cert: Option<PathBuf>,
    /// The TLS client certificate's private key (PEM).
    pub nats_key: Option<PathBuf>,
    /// Subject prefix of the reply inboxes (default `_INBOX`).
    pub nats_inbox_prefix: Option<String>,
    /// The fleet key file every message is signed with.
    pub fleet_key: Option<PathBuf>,
    /// Ship unsigned (anyone who can publish could forge what a collector takes).
    pub insecure_unsigned: Option<bool>,
}

impl FileShip {
    /// The shipping target this table describes (the message is one line).
    pub fn target(&self) -> Result<shipper::Target, String> {
        check_urls(&self.to)?;
        let secret = |p: &Option<PathBuf>| match p {
            Some(p) => std::fs::read_to_string(p)
                .map(|t| Some(t.trim().to_string()))
                .map_err(|e| format!("cannot read {}: {e}", p.display())),
            None => Ok(None),
        };
        let token = secret(&self.nats_token_file)?;
        let password = secret(&self.nats_password_file)?;
        let inbox = match &self.nats_inbox_prefix {
            Some(p) => inbox_prefix(p)?,
            None => "_INBOX".into(),
        };
        let replicas = self.replicas.unwrap_or(1);
        if !(1..=5).contains(&replicas) {
            return Err(format!("replicas {replicas}: expected 1 to 5"));
        }
        let target = shipper::Target {
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
                nats_user: self.nats_user.clone(),
                nats_password: password,
                nats_nkey: self.nats_nkey.clone(),
                nats_cert: self.nats_cert.clone(),
                nats_key: self.nats_key.clone(),
                nats_inbox_prefix: inbox,
            },
            host: host_name(),
            signing: Signing::new(
                self.fleet_key.as_deref(),
                self.insecure_unsigned.unwrap_or(false),
            )?,
        };
        target.flags.check()?;
        Ok(target)
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
    fn credentials_in_addresses_are_decoded_and_never_shown() {
        assert_eq!(percent_decoded("p%40ss%3Aw%2Fd"), "p@ss:w/d");
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
        assert_eq!(
            shown("nats://user:p%40ss@a:1,tls://TOKEN@b:2"),
            "nats://a:1,tls://b:2"
        );
        assert!(check_urls("tls://user:pass@nats1:4222,nats2:4222").is_ok());
        for good in ["_INBOX", "_INBOX_relay", "a.b"] {
            assert!(inbox_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "a.*", "a..b", "a b", ">"] {
            assert!(inbox_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_goes_with_a_password_and_a_certificate_with_its_key() {
        let f = |user: bool, pass: bool, cert: bool, key: bool| NatsFlags {
            nats_user: user.then(|| "u".into()),
            nats_password: pass.then(|| "p".into()),
            nats_cert: cert.then(|| "c.pem".into()),
            nats_key: key.then(|| "k.pem".into()),
            ..NatsFlags::default()
        };
        assert!(f(true, true, true, true).check().is_ok());
        let shown = format!("{:?}", f(true, true, false, false));
        assert!(
            shown.contains("<hidden>") && !shown.contains("\"p\""),
            "{shown}"
        );
        assert!(f(false, false, false, false).check().is_ok());
        assert!(f(true, false, false, false).check().is_err());
        assert!(f(false, true, false, false).check().is_err());
        assert!(f(false, false, true, false).check().is_err());
        assert!(f(false, false, false, true).check().is_err());
        let dir = tempfile::tempdir().expect("tmp");
        let seed = dir.path().join("s.nk");
        let good = format!("SU{}", "A".repeat(56));
        for (text, ok) in [
            (
                format!("-----BEGIN USER NKEY SEED-----\n{good}\n------END------\n"),
                true,
            ),
            (format!("{good}\n"), true),
            ("SUshort\n".to_string(), false),
            ("nothing\n".to_string(), false),
        ] {
            std::fs::write(&seed, &text).expect("write");
            let r = nkey_seed(&seed);
            assert_eq!(r.is_ok(), ok, "{r:?}");
            if let Err(e) = r {
                assert!(!e.contains("SUshort"), "no seed in the error: {e}");
            }
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
