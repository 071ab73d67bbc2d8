//! `gabp-relay reload [--route R]`: asks a running relay to re-read its bridge identities and
//! tokens (the config file), as SIGHUP does, and says what it did in one line per route.
//!
//! The relay is found through its discovery file like `status` finds it; its pid there gets
//! the SIGHUP. The outcome is read back from the relay's `relay/status` (`reload`: count,
//! kept, revoked, error), so a config that no longer loads is reported here, not only in the
//! relay's log.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;

use super::status::{self, StatusArgs};
use super::Json;

#[derive(Args, Debug)]
pub struct ReloadArgs {
    /// Only this route's relay [default: every route with a discovery file].
    #[arg(long)]
    pub route: Option<String>,
    /// Read this discovery file instead of the default one.
    #[arg(long)]
    pub bridge_file: Option<PathBuf>,
    /// How long to wait for the relay to report the reload.
    #[arg(long, value_parser = crate::config::parse_timeout, default_value = "15s")]
    pub wait: Duration,
}

pub async fn run(a: ReloadArgs) -> Result<()> {
    let ask_args = StatusArgs {
        route: a.route.clone(),
        bridge_file: a.bridge_file.clone(),
        address: None,
        token: None,
        wait: a.wait,
        json: Json { json: false },
    };
    let targets = status::targets(&ask_args)?;
    let launch = uuid::Uuid::new_v4().to_string();
    let count = |st: &serde_json::Value| st["reload"]["count"].as_u64().unwrap_or(0);
    let mut before = Vec::new();
    let mut pids = BTreeSet::new();
    for t in &targets {
        let Some(pid) = t.pid.filter(|p| gabp_engine::discovery::relay_running(*p)) else {
            bail!("route {}: no running relay process to signal", t.route);
        };
        before.push(count(&status::ask(t, a.wait, &launch).await?));
        pids.insert(pid);
    }
    for pid in pids {
        let raw = i32::try_from(pid).map_err(|_| anyhow!("invalid pid {pid}"))?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGHUP,
        )
        .map_err(|e| anyhow!("cannot signal the relay (pid {pid}): {}", e.desc()))?;
    }
    let deadline = Instant::now() + a.wait;
    let mut lines = String::new();
    let mut failures = Vec::new();
    for (t, n) in targets.iter().zip(before) {
        let st = loop {
            let st = status::ask(t, a.wait, &launch).await?;
            if count(&st) > n {
                break st;
            }
            if Instant::now() >= deadline {
                bail!(
                    "route {}: the relay did not report the reload within {}",
                    t.route,
                    humantime::format_duration(a.wait)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let r = &st["reload"];
        match r["error"].as_str() {
            Some(e) => failures.push(format!(
                "route {}: reload failed, nothing changed: {e}",
                t.route
            )),
            None => {
                lines += &format!(
                    "route {}: reloaded ({} kept, {} disconnected)\n",
                    t.route,
                    r["kept"].as_u64().unwrap_or(0),
                    r["revoked"].as_u64().unwrap_or(0)
                );
            }
        }
    }
    super::print_best_effort(&lines);
    if let Some(first) = failures.into_iter().next() {
        bail!(first);
    }
    Ok(())
}
