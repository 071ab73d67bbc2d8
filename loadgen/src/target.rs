//! Starting the system under test as its own process: the built `gabp-relay`, any relay given
//! as a command template, the baseline forwarder, or a pub/sub server measured as a peer. Every process started here is stopped
//! (SIGTERM, then SIGKILL) when the run ends, whatever happened.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gabp_client::Client;
use gabp_sim::Addr;
use tokio::process::{Child, Command};

use crate::actors::broker::Broker;
use crate::scenario::Scenario;

/// A running target.
#[derive(Debug)]
pub struct Target {
    /// `gabp-relay`, `baseline` or the command's program name.
    pub name: String,
    /// Where bridges connect.
    pub addr: Addr,
    /// The bridge token.
    pub token: String,
    child: Child,
}

/// How a started target shows it is ready.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// A bridge completes `session/hello` (the target is connected to the mod).
    Hello,
    /// It accepts a connection.
    Listening,
}

/// How to start the relay under test.
#[derive(Debug, Clone)]
pub enum RelayCommand {
    /// The built `gabp-relay` at this path.
    Builtin(PathBuf),
    /// A command template with `{upstream}`, `{upstream_token}`, `{listen}`, `{port}`,
    /// `{token}` and `{data_dir}` placeholders.
    Template(String),
}

/// Where a target listens and the token it wants: a free loopback port (bound, read,
/// released), its address, and a fresh token.
fn endpoint() -> Result<(u16, String, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok((
        port,
        format!("127.0.0.1:{port}"),
        uuid::Uuid::new_v4().simple().to_string(),
    ))
}

/// The sibling binary `name` next to the running executable.
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

impl Target {
    /// Starts the relay under test in front of the mod at `upstream`; `extra` arguments go to
    /// the built relay only (a command template says everything itself). Its stderr goes to
    /// `log` when given, to ours otherwise.
    pub async fn relay(
        cmd: &RelayCommand,
        upstream: &Addr,
        upstream_token: &str,
        sc: &Scenario,
        data_dir: &Path,
        extra: &[String],
        log: Option<std::fs::File>,
    ) -> Result<Target> {
        let (port, listen, token) = endpoint()?;
        let (name, mut command) = match cmd {
            RelayCommand::Builtin(bin) => {
                let mut c = Command::new(bin);
                // Tokens go in the environment, not the arguments every local user can read
                // in `ps`.
                c.args([
                    "serve",
                    "--upstream",
                    &upstream.to_string(),
                    "--listen",
                    &listen,
                ])
                .env("GABP_UPSTREAM_TOKEN", upstream_token)
                .env("GABP_RELAY_TOKEN", &token);
                c.args([
                    "--data-dir",
                    &data_dir.display().to_string(),
                    "--on-slow",
                    &sc.policy,
                    "--durability",
                    &sc.durability,
                    // A measured relay is private to the run: it must not take (or clash with)
                    // the discovery file of a relay the user runs on the same route name.
                    "--no-bridge-file",
                ]);
                if !sc.record {
                    c.arg("--no-record");
                }
                c.args(extra);
                ("gabp-relay".to_string(), c)
            }
            RelayCommand::Template(t) => {
                let filled = t
                    .replace("{upstream}", &upstream.to_string())
                    .replace("{upstream_token}", upstream_token)
                    .replace("{listen}", &listen)
                    .replace("{port}", &port.to_string())
                    .replace("{token}", &token)
                    .replace("{data_dir}", &data_dir.display().to_string());
                let mut words = filled.split_whitespace();
                let program = words
                    .next()
                    .ok_or_else(|| anyhow!("--relay-cmd is empty"))?
                    .to_string();
                let mut c = Command::new(&program);
                c.args(words);
                (program, c)
            }
        };
        command.env("GABP_LOG", "warn");
        Target::spawn_probed(
            name,
            command,
            listen.parse().map_err(|e: String| anyhow!(e))?,
            token,
            Probe::Hello,
            log.map(Stdio::from),
        )
        .await
    }

    /// Starts the built relay serving the routes of a config file (`serve --config`), ready
    /// when a bridge completes a hello on `first` (one of its routes, with that route's
    /// token); the other routes are the caller's to wait for. Its stderr goes to `log` when
    /// given, to ours otherwise.
    pub async fn relay_config(
        bin: &Path,
        config: &Path,
        first: Addr,
        token: String,
        log: Option<std::fs::File>,
    ) -> Result<Target> {
        let mut c = Command::new(bin);
        c.args(["serve", "--config"])
            .arg(config)
            // Private to the run, as in `relay`: no discovery files.
            .arg("--no-bridge-file")
            .env("GABP_LOG", "warn");
        Target::spawn_probed(
            "gabp-relay".into(),
            c,
            first,
            token,
            Probe::Hello,
            log.map(Stdio::from),
        )
        .await
    }

    /// Starts the baseline forwarder (this binary's hidden `forwarder` command).
    pub async fn baseline(upstream: &Addr, upstream_token: &str) -> Result<Target> {
        let (_, listen, token) = endpoint()?;
        let exe = std::env::current_exe().context("locating gabp-loadgen")?;
        let mut c = Command::new(exe);
        c.args([
            "forwarder",
            "--upstream",
            &upstream.to_string(),
            "--listen",
            &listen,
        ])
        .env("GABP_UPSTREAM_TOKEN", upstream_token)
        .env("GABP_RELAY_TOKEN", &token);
        Target::spawn(
            "baseline".into(),
            c,
            listen.parse().map_err(|e: String| anyhow!(e))?,
            token,
        )
        .await
    }

    /// Starts a byte pipe (this binary's `pipe` command) in front of the mod at `upstream`:
    /// the floor any proxy process adds, to weigh the relay against.
    pub async fn pipe(upstream: std::net::SocketAddr, upstream_token: &str) -> Result<Target> {
        let (_, listen, _) = endpoint()?;
        let exe = std::env::current_exe().context("locating gabp-loadgen")?;
        let mut c = Command::new(exe);
        c.args([
            "pipe",
            "--listen",
            &listen,
            "--upstream",
            &upstream.to_string(),
        ]);
        // Ready when a hello through it reaches the mod.
        Target::spawn_probed(
            "pipe".into(),
            c,
            listen.parse().map_err(|e: String| anyhow!(e))?,
            upstream_token.to_string(),
            Probe::Hello,
            Some(Stdio::null()),
        )
        .await
    }

    /// Starts a pub/sub server (`redis-server`, `nats-server`) on a free loopback port.
    pub async fn broker(kind: Broker) -> Result<Target> {
        let (port, listen, _) = endpoint()?;
        let mut c = Command::new(kind.program_path());
        c.args(kind.args(port));
        Target::spawn_probed(
            kind.label(),
            c,
            listen.parse().map_err(|e: String| anyhow!(e))?,
            String::new(),
            Probe::Listening,
            None,
        )
        .await
        .with_context(|| {
            format!(
                "is {} installed? (scripts/setup installs it)",
                kind.program()
            )
        })
    }

    async fn spawn(name: String, command: Command, addr: Addr, token: String) -> Result<Target> {
        Target::spawn_probed(name, command, addr, token, Probe::Hello, None).await
    }

    async fn spawn_probed(
        name: String,
        mut command: Command,
        addr: Addr,
        token: String,
        probe: Probe,
        stderr: Option<Stdio>,
    ) -> Result<Target> {
        // Its own process group, so a wrapper (perf, taskset, a shell) and everything it
        // starts are stopped together.
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A peer server's start-up banner is noise; the relay's own warnings are not.
            .stderr(stderr.unwrap_or_else(|| match probe {
                Probe::Hello => Stdio::inherit(),
                Probe::Listening => Stdio::null(),
            }))
            .kill_on_drop(true)
            .process_group(0);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        // Ready when a bridge can complete a hello (the target is connected to the mod).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited during start-up ({status})");
            }
            let ready = match probe {
                Probe::Hello => matches!(
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        Client::connect_hello(&addr, &token)
                    )
                    .await,
                    Ok(Ok(_))
                ),
                Probe::Listening => match &addr {
                    Addr::Tcp(a) => tokio::net::TcpStream::connect(a).await.is_ok(),
                    Addr::Unix(p) => tokio::net::UnixStream::connect(p).await.is_ok(),
                },
            };
            if ready {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.start_kill();
                bail!("{name} did not accept a bridge on {addr} within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Ok(Target {
            name,
            addr,
            token,
            child,
        })
    }

    /// The TCP address (peers listen on TCP only).
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr> {
        match &self.addr {
            Addr::Tcp(a) => Ok(*a),
            Addr::Unix(p) => bail!("{} listens on {}, not TCP", self.name, p.display()),
        }
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns whether it exited on its own.
    pub async fn stop(self, grace: Duration) -> bool {
        self.stop_status(grace).await.is_some()
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns its exit status if it exited on its own.
    pub async fn stop_status(mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        use nix::sys::signal::Signal;
        let group = self.group();
        signal_group(group, Signal::SIGTERM);
        let status = tokio::time::timeout(grace, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        // Whatever is left in the group (a wrapper's child) goes too.
        signal_group(group, Signal::SIGKILL);
        if status.is_none() {
            let _ = self.child.wait().await;
        }
        status
    }

    /// The target's process group (its own: started with `process_group(0)`), while it runs.
    fn group(&self) -> Option<nix::unistd::Pid> {
        let pid = i32::try_from(self.child.id()?).ok()?;
        Some(nix::unistd::Pid::from_raw(pid))
    }
}

fn signal_group(group: Option<nix::unistd::Pid>, sig: nix::sys::signal::Signal) {
    if let Some(g) = group {
        let _ = nix::sys::signal::killpg(g, sig);
    }
}

/// A target dropped while running (an error, or Ctrl-C dropping the whole command) is killed
/// with its group and reaped here, so nothing outlives the load generator and its temp data
/// dir can be removed next.
impl Drop for Target {
    fn drop(&mut self) {
        let Some(group) = self.group() else {
            return;
        };
        signal_group(Some(group), nix::sys::signal::Signal::SIGKILL);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
