//! Upstream transports beyond sockets: a mod started as a child process speaking GABP over its
//! stdin/stdout (GABP's stdio transport).
//!
//! Every (re)connect starts the command again. Each child belongs to the connection it serves,
//! not to the connector: it is killed when that connection's read half is dropped, so two routes
//! with stdio mods never touch each other's process. An exit the relay did not cause is logged
//! with its status (repeats summarised). The child's stderr goes to the relay's log line by line:
//! read as bytes, decoded lossily, control characters escaped, lines cut at [`MAX_LINE`] bytes and
//! at most [`LINES_PER_SEC`] logged per second. It is drained until the child closes it, whatever
//! it holds, so the child never blocks on (or dies of) a full or closed pipe.

use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use gabp_rt::net::Conn;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, ReadBuf};
use tokio::process::{Child, Command};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::Upstream;
use crate::upstream::{Connector, Repeats, SocketConnector};

/// Longest stderr line logged; the rest of the line is counted, not kept.
pub const MAX_LINE: usize = 4096;
/// Stderr lines logged per second; the others are counted and reported.
pub const LINES_PER_SEC: u32 = 100;

/// Connects to sockets, or starts the stdio mod.
#[derive(Debug, Default)]
pub struct AnyConnector {
    /// Exits of stdio mods, so one that keeps exiting is logged once with a count.
    exits: Arc<Mutex<Repeats>>,
}

impl Connector for AnyConnector {
    fn connect<'a>(
        &'a self,
        upstream: &'a Upstream,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Conn>> {
        async move {
            match upstream {
                Upstream::Addr(_) => SocketConnector.connect(upstream).await,
                Upstream::Stdio(cmd) => self.spawn(cmd),
            }
        }
        .boxed()
    }
}

/// Checks that a stdio mod's program can be started (it exists and is executable, on `PATH`
/// when it has no slash), so a typo fails at start with one line instead of retrying forever.
pub fn check_command(cmd: &[String]) -> Result<(), String> {
    let Some(program) = cmd.first() else {
        return Err("the stdio mod command is empty".into());
    };
    let runnable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        runnable(Path::new(program))
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| runnable(&d.join(program))))
    };
    if found {
        Ok(())
    } else {
        Err(format!(
            "cannot start the stdio mod: {program:?} is not an executable file{}",
            if program.contains('/') {
                ""
            } else {
                " on PATH"
            }
        ))
    }
}

impl AnyConnector {
    fn spawn(&self, cmd: &[String]) -> std::io::Result<Conn> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty stdio command"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start {program:?}: {e}")))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(drain_stderr(stderr, program.clone()));
        }
        let stop = CancellationToken::new();
        tokio::spawn(watch(
            child,
            stop.clone(),
            program.clone(),
            self.exits.clone(),
        ));
        Ok(Conn::from_halves(
            Owned {
                inner: stdout,
                _child: stop.drop_guard(),
            },
            stdin,
            &format!("stdio:{program}"),
        ))
    }
}

/// Waits for the child: logs an exit the relay did not ask for, kills it when its connection
/// is dropped.
async fn watch(
    mut child: Child,
    stop: CancellationToken,
    name: String,
    exits: Arc<Mutex<Repeats>>,
) {
    tokio::select! {
        status = child.wait() => {
            let what = match status {
                Ok(s) => format!("stdio mod {name:?} exited ({s})"),
                Err(e) => format!("stdio mod {name:?}: cannot read its exit status: {e}"),
            };
            let log = exits.lock().note(&what);
            match log {
                Some(0) => tracing::warn!("{what}; restarting with backoff"),
                Some(n) => tracing::warn!(repeated = n, "{what}; restarting with backoff ({n} more times since last logged)"),
                None => tracing::debug!("{what}"),
            }
        }
        _ = stop.cancelled() => {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// A read half that owns its child process: dropping it kills the child.
struct Owned<R> {
    inner: R,
    _child: DropGuard,
}

impl<R: AsyncRead + Unpin> AsyncRead for Owned<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// Logs a child's stderr until it is closed; see the module doc for the bounds.
async fn drain_stderr(stderr: impl AsyncRead + Unpin, name: String) {
    let mut r = BufReader::with_capacity(64 * 1024, stderr);
    let mut log = StderrLog::new(name);
    loop {
        // Lines not logged are reported within a second even if the mod then goes quiet.
        let read = tokio::time::timeout(Duration::from_secs(1), r.fill_buf()).await;
        let buf = match read {
            Err(_) => {
                log.report_suppressed();
                continue;
            }
            Ok(Ok([])) => break,
            Ok(Ok(b)) => b,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(Err(_)) => break,
        };
        let (chunk, consumed, ends) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        log.push(chunk);
        r.consume(consumed);
        if ends {
            log.end_line();
        }
    }
    log.end_line();
    log.report_suppressed();
}

/// One stderr stream's line buffer and rate limit.
struct StderrLog {
    name: String,
    line: Vec<u8>,
    /// Bytes of the current line past [`MAX_LINE`].
    cut: usize,
    window: Instant,
    in_window: u32,
    suppressed: u64,
}

impl StderrLog {
    fn new(name: String) -> StderrLog {
        StderrLog {
            name,
            line: Vec::with_capacity(256),
            cut: 0,
            window: Instant::now(),
            in_window: 0,
            suppressed: 0,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        let take = chunk.len().min(MAX_LINE - self.line.len());
        self.line.extend_from_slice(&chunk[..take]);
        self.cut += chunk.len() - take;
    }

    fn end_line(&mut self) {
        if self.line.is_empty() && self.cut == 0 {
            return; // blank lines are not worth a log line
        }
        if self.window.elapsed() >= Duration::from_secs(1) {
            self.report_suppressed();
            self.window = Instant::now();
            self.in_window = 0;
        }
        if self.in_window < LINES_PER_SEC {
            self.in_window += 1;
            let text = printable(&self.line);
            let name = &self.name;
            if self.cut > 0 {
                let cut = self.cut;
                tracing::info!(target: "gabp_relay::mod_stderr", mod_command = %name, "{text} [… {cut} more bytes of this line not logged]");
            } else {
                tracing::info!(target: "gabp_relay::mod_stderr", mod_command = %name, "{text}");
            }
        } else {
            self.suppressed += 1;
        }
        self.line.clear();
        self.cut = 0;
    }

    fn report_suppressed(&mut self) {
        if self.suppressed > 0 {
            let n = std::mem::take(&mut self.suppressed);
            tracing::warn!(target: "gabp_relay::mod_stderr", mod_command = %self.name, "{n} stderr lines of the mod not logged (more than {LINES_PER_SEC} per second)");
        }
    }
}

/// A stderr line as log text: invalid UTF-8 replaced, control characters escaped (a mod must
/// not be able to move the cursor of whoever reads the log), a trailing `\r` dropped.
fn printable(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return text.into_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_and_replaces() {
        assert_eq!(printable(b"ok\tline\r"), "ok\tline");
        assert_eq!(printable(b"a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable(b"bad \xff byte"), "bad \u{fffd} byte");
    }

    #[test]
    fn lines_are_cut_at_the_bound() {
        let mut log = StderrLog::new("m".into());
        log.push(&vec![b'x'; MAX_LINE * 3]);
        log.push(b"more");
        assert_eq!((log.line.len(), log.cut), (MAX_LINE, MAX_LINE * 2 + 4));
        log.end_line();
        assert_eq!((log.line.len(), log.cut), (0, 0));
    }

    #[test]
    fn missing_programs_are_found_before_start() {
        assert!(check_command(&["sh".into()]).is_ok());
        let err = check_command(&["/nonexistent/mod-binary".into()]).expect_err("missing");
        assert!(err.contains("/nonexistent/mod-binary"), "{err}");
        assert!(check_command(&["no-such-mod-binary-xyz".into()]).is_err());
        assert!(check_command(&[]).is_err());
    }
}
