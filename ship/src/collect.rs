//! `gabp-relay collect`: a durable JetStream pull consumer that writes shipped sessions into
//! an ordinary data dir (the archive).
//!
//! Each fetched batch is applied as one RocksDB write (idempotent, keyed by session and first
//! frame, see `gabp_storage::ship`) and acknowledged only after that write is synced: a
//! `kill -9` at any point loses nothing (unacknowledged messages come again) and doubles
//! nothing (what is already there is skipped). Several collectors may share the durable
//! consumer, each on its own archive.
//!
//! Only what a relay of the fleet signed goes in: a message whose signature (see
//! [`super::fleet`]) is missing, made with a key this collector does not have, or wrong, is
//! refused, as is one that cannot be read (not a chunk or snapshot this version knows, a chunk
//! that does not decode, a catalog with a route name no relay accepts). A refused message is
//! logged on one line (within a budget, never its payload), counted in
//! `gabp_collect_rejected_messages_total` (and, when its signature failed,
//! `gabp_collect_unverified_messages_total`) and terminated, so it neither comes back forever
//! nor holds up the rest.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::AckKind;
use futures::StreamExt;
use gabp_storage::ship::{CatalogSnapshot, Taken};
use gabp_storage::{SessionId, Store, StoreOptions};
use tokio_util::sync::CancellationToken;

use super::fleet::{self, Covered, FleetKey, KeyId, Kind};
use super::{one_line, NatsFlags, FIRST, KIND};
use gabp_rt::log_budget::LogBudget;

/// Refusals of unsigned or badly signed messages logged per budget window.
static UNVERIFIED_LOG: LogBudget = LogBudget::new(10);
/// Refusals of unreadable messages logged per budget window.
static UNREADABLE_LOG: LogBudget = LogBudget::new(10);
/// Longest host name a catalog's origin may carry (a DNS name's limit).
const MAX_HOST: usize = 253;

/// What to collect and where to.
#[derive(Debug, Clone)]
pub struct Collector {
    /// `nats://…` list.
    pub urls: String,
    /// Connection and stream options.
    pub flags: NatsFlags,
    /// The durable consumer's name.
    pub durable: String,
    /// The archive.
    pub data_dir: PathBuf,
    /// What it takes.
    pub verifier: Verifier,
}

/// Which messages a collector takes: those signed with one of its fleet keys, and unsigned
/// ones only when told to.
#[derive(Debug, Clone)]
pub struct Verifier {
    keys: HashMap<KeyId, FleetKey>,
    accept_unsigned: bool,
}

impl Verifier {
    /// A verifier with `keys` (several while one is rotated); without any, only
    /// `accept_unsigned` makes one.
    pub fn new(keys: Vec<FleetKey>, accept_unsigned: bool) -> Result<Verifier, String> {
        if keys.is_empty() && !accept_unsigned {
            return Err(format!("collecting needs {}", super::NO_KEY));
        }
        Ok(Verifier {
            keys: keys.into_iter().map(|k| (k.id(), k)).collect(),
            accept_unsigned,
        })
    }

    /// The ids of its keys, sorted, for the log.
    fn key_ids(&self) -> String {
        let mut ids: Vec<String> = self.keys.keys().map(KeyId::to_string).collect();
        ids.sort();
        ids.join(", ")
    }

    /// Whether the message covering `c` with these headers may go in; why not otherwise.
    fn verify(&self, h: Option<&async_nats::HeaderMap>, c: &Covered<'_>) -> Result<(), String> {
        let mac = h.and_then(|h| h.get(fleet::MAC)).map(|v| v.as_str());
        let Some(mac) = mac else {
            return if self.accept_unsigned {
                Ok(())
            } else {
                Err("not signed with the fleet key (no Gabp-Mac header)".into())
            };
        };
        if self.keys.is_empty() {
            // An unsigned-only collector cannot check a signature: it takes the message as
            // it takes every other.
            return Ok(());
        }
        let id = h
            .and_then(|h| h.get(fleet::KEY_ID))
            .and_then(|v| fleet::parse_key_id(v.as_str()));
        let Some(id) = id else {
            return Err("signed without a key id (no valid Gabp-Key header)".into());
        };
        let Some(key) = self.keys.get(&id) else {
            return Err(format!(
                "signed with fleet key {id}, which this collector does not have (it has {})",
                self.key_ids()
            ));
        };
        if key.verify(c, mac) {
            Ok(())
        } else {
            Err(format!("a wrong signature for fleet key {id}"))
        }
    }
}

/// What a collector did, counted since it started.
#[derive(Debug, Default)]
pub struct Tally {
    frames: AtomicU64,
    unverified: AtomicU64,
    unreadable: AtomicU64,
}

impl Tally {
    /// New frames written into the archive.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// Messages refused for their signature.
    pub fn unverified(&self) -> u64 {
        self.unverified.load(Ordering::Relaxed)
    }

    /// Messages refused as unreadable or invalid.
    pub fn unreadable(&self) -> u64 {
        self.unreadable.load(Ordering::Relaxed)
    }
}

/// One message, parsed.
enum Item {
    Chunk(SessionId, u64, bytes::Bytes),
    Catalog(Box<CatalogSnapshot>),
}

/// Why a message is refused.
enum Refusal {
    /// Its signature is missing, of an unknown key, or wrong.
    Unverified(String),
    /// It cannot be read, or holds what no relay would ship.
    Unreadable(String),
}

fn parse(m: &async_nats::jetstream::Message, v: &Verifier) -> Result<Item, Refusal> {
    let bad = |why: &str| Refusal::Unreadable(why.to_string());
    let session = m
        .subject
        .rsplit('.')
        .next()
        .and_then(|s| s.parse::<SessionId>().ok())
        .ok_or_else(|| bad("a message on a subject that names no session"))?;
    let h = m.headers.as_ref();
    let kind = match h.and_then(|h| h.get(KIND)).map(|v| v.as_str()) {
        Some("chunk") => Kind::Chunk,
        Some("catalog") => Kind::Catalog,
        _ => return Err(bad("a message of unknown kind")),
    };
    let first = match kind {
        Kind::Chunk => h
            .and_then(|h| h.get(FIRST))
            .and_then(|v| v.as_str().parse::<u64>().ok())
            .ok_or_else(|| bad("a chunk without its first frame number"))?,
        Kind::Catalog => 0,
    };
    let covered = Covered {
        session,
        kind,
        first,
        body: &m.payload,
    };
    v.verify(h, &covered).map_err(Refusal::Unverified)?;
    match kind {
        Kind::Chunk => Ok(Item::Chunk(session, first, m.payload.clone())),
        Kind::Catalog => {
            let snap: CatalogSnapshot = serde_json::from_slice(&m.payload)
                .map_err(|e| Refusal::Unreadable(format!("an unreadable catalog snapshot: {e}")))?;
            if snap.meta.id != session {
                return Err(bad("a catalog snapshot on another session's subject"));
            }
            valid_catalog(&snap).map_err(Refusal::Unreadable)?;
            Ok(Item::Catalog(Box::new(snap)))
        }
    }
}

/// A catalog holds only what a relay accepts where it enters: its route names are valid
/// ones, its host a bounded printable name.
fn valid_catalog(snap: &CatalogSnapshot) -> Result<(), String> {
    for (what, route) in [
        ("route", &snap.meta.route),
        ("origin route", &snap.origin.route),
    ] {
        gabp_rt::route_name::check_route_name(route).map_err(|m| {
            format!(
                "a catalog snapshot whose {what} {:?} is not a valid route name: {m}",
                gabp_rt::route_name::shown_route_name(route)
            )
        })?;
    }
    let host = &snap.origin.host;
    if host.len() > MAX_HOST || host.chars().any(char::is_control) {
        return Err(format!(
            "a catalog snapshot whose origin host is not a host name ({} bytes)",
            host.len()
        ));
    }
    Ok(())
}

/// A subject as a log line shows it: at most 120 characters.
fn shown_subject(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

impl Collector {
    /// Collects until `cancel`, reconnecting with backoff; fails only if the archive cannot be
    /// opened or written. `tally` counts what it took and refused.
    pub async fn run(&self, cancel: CancellationToken, tally: &Tally) -> Result<()> {
        gabp_rt::private_files::private_file_modes();
        // No crash recovery: sessions still recording at their source stay `recording` here.
        let store =
            Store::reopen(&self.data_dir, StoreOptions::default()).map_err(|e| anyhow!("{}", e))?;
        metrics::counter!("gabp_collect_rejected_messages_total").increment(0);
        metrics::counter!("gabp_collect_unverified_messages_total").increment(0);
        match (self.verifier.keys.is_empty(), self.verifier.accept_unsigned) {
            (false, false) => tracing::info!(
                "taking only messages signed with fleet key {}",
                self.verifier.key_ids()
            ),
            (false, true) => tracing::warn!(
                "taking messages signed with fleet key {} and unsigned ones (--insecure-unsigned): anyone who can publish on {}.> can write into this archive",
                self.verifier.key_ids(),
                self.flags.subject_prefix
            ),
            (true, _) => tracing::warn!(
                "no fleet key (--insecure-unsigned): taking every message unchecked; anyone who can publish on {}.> can write into this archive",
                self.flags.subject_prefix
            ),
        }
        let mut backoff = Duration::from_millis(200);
        let mut last_logged: Option<String> = None;
        loop {
            let e = tokio::select! {
                _ = cancel.cancelled() => break,
                r = self.consume(&store, tally) => match r {
                    Ok(()) => continue,
                    Err(e) => e,
                },
            };
            if e.downcast_ref::<gabp_storage::StoreError>().is_some() {
                return Err(e);
            }
            let line = one_line(&e);
            if last_logged.as_deref() != Some(line.as_str()) {
                tracing::warn!("collecting paused: {line}");
                last_logged = Some(line);
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.sync()).await??;
        Ok(())
    }

    async fn consume(&self, store: &Store, tally: &Tally) -> Result<()> {
        let js = super::connect(&self.urls, &self.flags, "gabp-relay collector")
            .await?
            .js;
        let stream = js.get_stream(&self.flags.stream).await.map_err(|e| {
            anyhow!(
                "cannot open the stream {}: {}",
                self.flags.stream,
                one_line(&e)
            )
        })?;
        let consumer: async_nats::jetstream::consumer::Consumer<pull::Config> = stream
            .get_or_create_consumer(
                &self.durable,
                pull::Config {
                    durable_name: Some(self.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    deliver_policy: DeliverPolicy::All,
                    ack_wait: Duration::from_secs(30),
                    max_ack_pending: 20_000,
                    filter_subject: format!("{}.>", self.flags.subject_prefix),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                anyhow!(
                    "cannot create the consumer {}: {}",
                    self.durable,
                    one_line(&e)
                )
            })?;
        tracing::info!(durable = %self.durable, "collecting");
        let (mut frames, mut since) = (0u64, Instant::now());
        loop {
            // Bounded: a fetch whose server went away would otherwise wait forever.
            let fetch = async {
                let mut batch = consumer
                    .fetch()
                    .max_messages(512)
                    .expires(Duration::from_millis(500))
                    .messages()
                    .await
                    .map_err(|e| anyhow!("fetching from JetStream failed: {}", one_line(&e)))?;
                let mut msgs = Vec::new();
                while let Some(m) = batch.next().await {
                    msgs.push(m.map_err(|e| {
                        anyhow!("fetching from JetStream failed: {}", one_line(&e))
                    })?);
                }
                Ok::<_, anyhow::Error>(msgs)
            };
            let msgs = tokio::time::timeout(Duration::from_secs(5), fetch)
                .await
                .map_err(|_| anyhow!("fetching from JetStream timed out"))??;
            if msgs.is_empty() {
                continue;
            }
            // A refused message is reported and terminated (JetStream will not deliver it
            // again); the rest of the batch goes in as ever.
            let mut refused: Vec<Option<Refusal>> = msgs.iter().map(|_| None).collect();
            let mut items = Vec::with_capacity(msgs.len());
            for (i, m) in msgs.iter().enumerate() {
                match parse(m, &self.verifier) {
                    Ok(it) => items.push((i, it)),
                    Err(r) => refused[i] = Some(r),
                }
            }
            let s = store.clone();
            let (n, undecodable) = tokio::task::spawn_blocking(
                move || -> Result<(u64, Vec<(usize, String)>), gabp_storage::StoreError> {
                    let mut ing = s.ingest();
                    let (mut n, mut undecodable) = (0u64, Vec::new());
                    for (i, it) in items {
                        match it {
                            Item::Chunk(id, first, data) => {
                                let count = u32::from_le_bytes(
                                    data.get(1..5)
                                        .and_then(|b| b.try_into().ok())
                                        .unwrap_or([0; 4]),
                                );
                                match ing.chunk(id, first, data)? {
                                    Taken::New => n += u64::from(count),
                                    Taken::Known => {}
                                    Taken::Undecodable(why) => {
                                        undecodable.push((i, format!("an unreadable chunk: {why}")))
                                    }
                                }
                            }
                            Item::Catalog(snap) => {
                                ing.snapshot(&snap)?;
                            }
                        }
                    }
                    ing.commit()?;
                    Ok((n, undecodable))
                },
            )
            .await??;
            for (i, why) in undecodable {
                refused[i] = Some(Refusal::Unreadable(why));
            }
            // Acknowledged only now that the batch is durable in the archive.
            for (m, refusal) in msgs.iter().zip(refused) {
                let kind = match refusal {
                    None => AckKind::Ack,
                    Some(r) => {
                        report(m, &r, tally);
                        AckKind::Term
                    }
                };
                m.ack_with(kind)
                    .await
                    .map_err(|e| anyhow!("acknowledging failed: {}", one_line(&e)))?;
            }
            frames += n;
            tally.frames.fetch_add(n, Ordering::Relaxed);
            metrics::counter!("gabp_collected_frames_total").increment(n);
            if since.elapsed() >= Duration::from_secs(10) {
                tracing::info!(
                    frames_per_second = frames as f64 / since.elapsed().as_secs_f64(),
                    refused_unverified = tally.unverified(),
                    refused_unreadable = tally.unreadable(),
                    "collected"
                );
                (frames, since) = (0, Instant::now());
            }
        }
    }
}

/// Counts a refused message and logs it within its budget: its stream sequence number,
/// subject and why, never its payload.
fn report(m: &async_nats::jetstream::Message, r: &Refusal, tally: &Tally) {
    let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
    let subject = shown_subject(&m.subject);
    metrics::counter!("gabp_collect_rejected_messages_total").increment(1);
    match r {
        Refusal::Unverified(why) => {
            tally.unverified.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("gabp_collect_unverified_messages_total").increment(1);
            if let Some(earlier_unlogged) = UNVERIFIED_LOG.admit() {
                tracing::warn!(
                    earlier_unlogged,
                    "refusing message {seq} on {subject}, terminated: {why}"
                );
            }
        }
        Refusal::Unreadable(why) => {
            tally.unreadable.fetch_add(1, Ordering::Relaxed);
            if let Some(earlier_unlogged) = UNREADABLE_LOG.admit() {
                tracing::warn!(
                    earlier_unlogged,
                    "skipping message {seq} on {subject}, terminated: {why}"
                );
            }
        }
    }
}
