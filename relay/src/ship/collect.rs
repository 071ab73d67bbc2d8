//! `gabp-relay collect`: a durable JetStream pull consumer that writes shipped sessions into
//! an ordinary data dir (the archive).
//!
//! Each fetched batch is applied as one RocksDB write (idempotent, keyed by session and first
//! frame, see `gabp_storage::ship`) and acknowledged only after that write is synced: a
//! `kill -9` at any point loses nothing (unacknowledged messages come again) and doubles
//! nothing (what is already there is skipped). Several collectors may share the durable
//! consumer, each on its own archive. A message that cannot be read (not a chunk or snapshot
//! this version knows, or a chunk that does not decode) is logged on one line, counted in
//! `gabp_collect_rejected_messages_total` and terminated, so it neither comes back forever nor
//! holds up the rest.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::AckKind;
use futures::StreamExt;
use gabp_storage::ship::{CatalogSnapshot, Taken};
use gabp_storage::{SessionId, Store, StoreOptions};
use tokio_util::sync::CancellationToken;

use super::{one_line, NatsFlags, FIRST, KIND};

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
}

/// One message, parsed.
enum Item {
    Chunk(SessionId, u64, bytes::Bytes),
    Catalog(Box<CatalogSnapshot>),
}

fn parse(m: &async_nats::jetstream::Message) -> Result<Item> {
    let h = m
        .headers
        .as_ref()
        .ok_or_else(|| anyhow!("a message without headers"))?;
    let session = m
        .subject
        .rsplit('.')
        .next()
        .and_then(|s| s.parse::<SessionId>().ok())
        .ok_or_else(|| anyhow!("a message on {} names no session", m.subject))?;
    match h.get(KIND).map(|v| v.as_str()) {
        Some("chunk") => {
            let first = h
                .get(FIRST)
                .and_then(|v| v.as_str().parse::<u64>().ok())
                .ok_or_else(|| anyhow!("a chunk without its first frame number"))?;
            Ok(Item::Chunk(session, first, m.payload.clone()))
        }
        Some("catalog") => {
            let snap: CatalogSnapshot = serde_json::from_slice(&m.payload)
                .map_err(|e| anyhow!("an unreadable catalog snapshot: {e}"))?;
            if snap.meta.id != session {
                return Err(anyhow!("a catalog snapshot on another session's subject"));
            }
            Ok(Item::Catalog(Box::new(snap)))
        }
        _ => Err(anyhow!("a message of unknown kind")),
    }
}

impl Collector {
    /// Collects until `cancel`, reconnecting with backoff; fails only if the archive cannot be
    /// opened or written.
    pub async fn run(&self, cancel: CancellationToken) -> Result<()> {
        crate::recorder::private_file_modes();
        // No crash recovery: sessions still recording at their source stay `recording` here.
        let store =
            Store::reopen(&self.data_dir, StoreOptions::default()).map_err(|e| anyhow!("{}", e))?;
        let mut backoff = Duration::from_millis(200);
        let mut last_logged: Option<String> = None;
        loop {
            let e = tokio::select! {
                _ = cancel.cancelled() => break,
                r = self.consume(&store) => match r {
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

    async fn consume(&self, store: &Store) -> Result<()> {
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
            // A message that cannot be read is reported and terminated (JetStream will not
            // deliver it again); the rest of the batch goes in as ever.
            let mut bad: Vec<Option<String>> = vec![None; msgs.len()];
            let mut items = Vec::with_capacity(msgs.len());
            for (i, m) in msgs.iter().enumerate() {
                match parse(m) {
                    Ok(it) => items.push((i, it)),
                    Err(e) => bad[i] = Some(e.to_string()),
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
                bad[i] = Some(why);
            }
            // Acknowledged only now that the batch is durable in the archive.
            for (m, bad) in msgs.iter().zip(bad) {
                let kind = match bad {
                    None => AckKind::Ack,
                    Some(why) => {
                        let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
                        tracing::warn!(
                            "skipping message {seq} on {}, terminated: {why}",
                            m.subject
                        );
                        metrics::counter!("gabp_collect_rejected_messages_total").increment(1);
                        AckKind::Term
                    }
                };
                m.ack_with(kind)
                    .await
                    .map_err(|e| anyhow!("acknowledging failed: {}", one_line(&e)))?;
            }
            frames += n;
            metrics::counter!("gabp_collected_frames_total").increment(n);
            if since.elapsed() >= Duration::from_secs(10) {
                tracing::info!(
                    frames_per_second = frames as f64 / since.elapsed().as_secs_f64(),
                    "collected"
                );
                (frames, since) = (0, Instant::now());
            }
        }
    }
}
