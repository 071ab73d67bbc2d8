//! Upstream transports beyond sockets: a mod started as a child process speaking GABP over its
//! stdin/stdout (GABP's stdio transport). Its stderr goes to the relay's log, line by line.
//! Every (re)connect starts the command again; the previous child is killed first.

use std::process::Stdio;

use futures::FutureExt;
use gabp_sim::net::Conn;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::config::Upstream;
use crate::upstream::{Connector, SocketConnector};

/// Connects to sockets, or starts the stdio mod.
#[derive(Debug, Default)]
pub struct AnyConnector {
    child: Mutex<Option<Child>>,
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

impl AnyConnector {
    fn spawn(&self, cmd: &[String]) -> std::io::Result<Conn> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty stdio command"))?;
        if let Some(mut old) = self.child.lock().take() {
            let _ = old.start_kill();
        }
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        if let Some(stderr) = child.stderr.take() {
            let name = program.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "gabp_relay::mod_stderr", mod_command = %name, "{line}");
                }
            });
        }
        *self.child.lock() = Some(child);
        Ok(Conn::from_halves(
            stdout,
            stdin,
            &format!("stdio:{program}"),
        ))
    }
}
