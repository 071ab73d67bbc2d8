//! Peers measured by the same harness: a Redis pub/sub server and a NATS server, each as a
//! process of its own, a publisher thread sending the simulated mod's event bodies on the same
//! schedule (and pace) as the mod, and subscribers that count into the same `Tally` as the
//! relay's bridges. So "the relay delivers N events/s, Redis M" is measured with one client
//! code path, on the same machine, in one run.
//!
//! Both protocols are spoken directly (RESP2 `PUBLISH`/`SUBSCRIBE`; NATS `PUB`/`SUB`), with
//! pipelined writes of one batch per call, as a tuned client would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use gabp_sim::events::{EventTemplate, Pace, Schedule};

mod subscriber;

pub use subscriber::subscribe;

/// A pub/sub server measured beside the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// `redis-server` (RESP pub/sub).
    Redis,
    /// `nats-server` (core NATS, no JetStream).
    Nats,
}

impl FromStr for Broker {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Broker> {
        match s {
            "redis" => Ok(Broker::Redis),
            "nats" => Ok(Broker::Nats),
            _ => bail!("unknown peer {s:?}: redis or nats"),
        }
    }
}

impl Broker {
    /// The server program's name.
    pub fn program(self) -> &'static str {
        match self {
            Broker::Redis => "redis-server",
            Broker::Nats => "nats-server",
        }
    }

    /// The server program: on `PATH`, or in an `sbin` directory that a non-root `PATH` lacks
    /// (Debian installs `nats-server` in `/usr/sbin`).
    pub fn program_path(self) -> std::path::PathBuf {
        let name = self.program();
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain(["/usr/sbin", "/usr/local/sbin"].map(std::path::PathBuf::from))
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| name.into())
    }

    /// `redis-7.0.15`, `nats-2.9.10`: the name and the server's own version.
    pub fn label(self) -> String {
        let out = std::process::Command::new(self.program_path())
            .arg("--version")
            .output();
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // "Redis server v=7.0.15 sha=…" / "nats-server: v2.9.10"
        let version = text
            .split_whitespace()
            .find_map(|w| {
                w.strip_prefix("v=")
                    .or_else(|| w.strip_prefix('v'))
                    .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            })
            .unwrap_or("?");
        let name = match self {
            Broker::Redis => "redis",
            Broker::Nats => "nats",
        };
        format!("{name}-{version}")
    }

    /// The server's arguments to listen on loopback `port`, with persistence off.
    pub fn args(self, port: u16) -> Vec<String> {
        let p = port.to_string();
        let v: Vec<&str> = match self {
            Broker::Redis => vec![
                "--port",
                &p,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            Broker::Nats => vec!["-a", "127.0.0.1", "-p", &p],
        };
        v.into_iter().map(String::from).collect()
    }
}

/// What the publisher sends: the simulated mod's channels, sizes, seed, rate and pace.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// Channels (subjects).
    pub channels: Vec<String>,
    /// Event body size.
    pub payload_bytes: usize,
    /// Seed.
    pub seed: u64,
    /// Events/s, `None` = max.
    pub rate: Option<f64>,
    /// Closed-loop pacing at max rate.
    pub pace: Option<Arc<Pace>>,
    /// At a fixed rate, the events due are written once per tick (as the simulated mod does).
    pub tick: std::time::Duration,
}

/// A running publisher thread.
#[derive(Debug)]
pub struct Publisher {
    stop: Arc<AtomicBool>,
    emitted: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Publisher {
    /// Connects to `addr` and starts publishing.
    pub fn start(kind: Broker, addr: SocketAddr, cfg: PublishConfig) -> Result<Publisher> {
        let mut conn = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        conn.set_nodelay(true)?;
        if kind == Broker::Nats {
            read_line_blocking(&mut conn).context("reading the NATS INFO line")?;
            conn.write_all(NATS_CONNECT)?;
        }
        let writer = Arc::new(Mutex::new(conn.try_clone()?));
        let failed = Arc::new(Mutex::new(None::<String>));
        let stop = Arc::new(AtomicBool::new(false));
        // Replies must be drained (Redis answers every PUBLISH; NATS sends PING).
        {
            let (writer, failed, stop) = (writer.clone(), failed.clone(), stop.clone());
            thread::Builder::new()
                .name("publisher-replies".into())
                .spawn(move || drain_replies(kind, conn, &writer, &failed, &stop))?;
        }
        let emitted = Arc::new(AtomicU64::new(0));
        let (st, em) = (stop.clone(), emitted.clone());
        let thread = thread::Builder::new()
            .name("publisher".into())
            .spawn(move || publish(kind, &cfg, &writer, &failed, &st, &em))?;
        Ok(Publisher {
            stop,
            emitted,
            thread: Some(thread),
        })
    }

    /// Events published so far.
    pub fn emitted(&self) -> u64 {
        self.emitted.load(Ordering::Relaxed)
    }

    /// Stops publishing; returns the error that stopped it early, if any.
    pub fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(anyhow!("the publisher thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

const NATS_CONNECT: &[u8] =
    b"CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false,\"lang\":\"rust\",\"version\":\"gabp-loadgen\"}\r\n";

fn publish(
    kind: Broker,
    cfg: &PublishConfig,
    writer: &Mutex<TcpStream>,
    failed: &Mutex<Option<String>>,
    stop: &AtomicBool,
    emitted_out: &AtomicU64,
) -> Result<()> {
    let mut template = EventTemplate::new(&cfg.channels, cfg.payload_bytes, cfg.seed, false);
    let names = cfg.channels.clone();
    let mut seqs = vec![0u64; names.len()];
    let mut schedule = Schedule::new(cfg.rate, u64::MAX, cfg.pace.clone()).with_tick(cfg.tick);
    let mut wire = Vec::with_capacity(256 * 1024);
    let halt = || stop.load(Ordering::Acquire) || failed.lock().is_ok_and(|f| f.is_some());
    let mut emitted = 0u64;
    while let Some(due) = schedule.next(emitted, &halt) {
        wire.clear();
        let n = due.end - due.start;
        for i in due {
            let ch = template.next_channel();
            let seq = seqs[ch];
            seqs[ch] += 1;
            let stamp = schedule.stamp(i);
            let body = template.body(ch, seq, stamp);
            encode_publish(kind, &names[ch], body, &mut wire);
        }
        let mut w = writer.lock().map_err(|_| anyhow!("writer lock poisoned"))?;
        if let Err(e) = w.write_all(&wire) {
            if stop.load(Ordering::Acquire) {
                break;
            }
            return Err(e).context("publishing");
        }
        drop(w);
        emitted += n;
        emitted_out.store(emitted, Ordering::Relaxed);
    }
    match failed.lock().ok().and_then(|mut f| f.take()) {
        Some(e) => bail!("{} refused a publish: {e}", kind.program()),
        None => Ok(()),
    }
}

/// Appends one publish command.
fn encode_publish(kind: Broker, channel: &str, body: &[u8], wire: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = match kind {
        Broker::Redis => write!(
            wire,
            "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{channel}\r\n${}\r\n",
            channel.len(),
            body.len()
        ),
        Broker::Nats => write!(wire, "PUB {channel} {}\r\n", body.len()),
    };
    wire.extend_from_slice(body);
    wire.extend_from_slice(b"\r\n");
}

/// Reads and discards the server's replies to the publisher, noting the first error and
/// answering NATS keep-alive pings.
fn drain_replies(
    kind: Broker,
    mut conn: TcpStream,
    writer: &Mutex<TcpStream>,
    failed: &Mutex<Option<String>>,
    stop: &AtomicBool,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        let chunk = &buf[..n];
        // An error is a line starting with '-' (`-ERR …` in both protocols); success replies
        // to a publisher never start one: Redis answers `:N`, NATS sends `PING`, `PONG`,
        // `+OK` and `INFO {…}`.
        let error_at = if chunk.starts_with(b"-") {
            Some(0)
        } else {
            memchr::memmem::find(chunk, b"\n-").map(|i| i + 1)
        };
        if let Some(at) = error_at {
            let end = memchr::memchr(b'\n', &chunk[at..]).map_or(chunk.len(), |e| at + e);
            let line = String::from_utf8_lossy(&chunk[at..end]).trim().to_string();
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(line);
            }
            break;
        }
        if kind == Broker::Nats && memchr::memmem::find(chunk, b"PING\r\n").is_some() {
            if let Ok(mut w) = writer.lock() {
                let _ = w.write_all(b"PONG\r\n");
            }
        }
    }
}

fn read_line_blocking(conn: &mut TcpStream) -> Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    while !line.ends_with(b"\r\n") {
        if conn.read(&mut b)? == 0 {
            bail!("connection closed");
        }
        line.push(b[0]);
        if line.len() > 64 * 1024 {
            bail!("line too long");
        }
    }
    conn.set_read_timeout(None)?;
    Ok(String::from_utf8_lossy(&line).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_commands_are_well_formed() {
        let mut w = Vec::new();
        encode_publish(Broker::Redis, "a/b", b"{}", &mut w);
        assert_eq!(w, b"*3\r\n$7\r\nPUBLISH\r\n$3\r\na/b\r\n$2\r\n{}\r\n");
        w.clear();
        encode_publish(Broker::Nats, "a/b", b"{}", &mut w);
        assert_eq!(w, b"PUB a/b 2\r\n{}\r\n");
    }

    #[test]
    fn peer_names() {
        assert_eq!("redis".parse::<Broker>().expect("redis"), Broker::Redis);
        assert!("kafka".parse::<Broker>().is_err());
    }
}
