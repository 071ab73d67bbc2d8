//! `gabp-relay check-mod`: the conformance suite of `gabp-check` against a live mod, reached
//! at an address or started as a stdio child (`--command`, everything after it). Prints the
//! report (or `--json`) and exits 1 when a check failed; it parses and dispatches, the checks
//! are `gabp-check`'s.

use std::io::Write;
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use futures::future::BoxFuture;
use futures::FutureExt;
use gabp_check::modcheck::{self, Call, Options, Target};
use gabp_rt::net::Conn;
use gabp_rt::Addr;
use tokio::io::{AsyncRead, ReadBuf};

use super::{usage, Json};
use crate::config::{limits, parse_duration, parse_timeout, units};

#[derive(Args, Debug)]
pub struct CheckModArgs {
    /// The mod: HOST:PORT or unix:PATH (or --command).
    pub addr: Option<String>,
    /// The token the mod expects in session/hello [default: none].
    #[arg(
        long,
        env = "GABP_TOKEN",
        default_value = "",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub token: String,
    /// Also call this tool, with these arguments (a JSON object, default {}); repeatable. Only
    /// read methods and the tools named here are ever called.
    #[arg(long = "call", value_name = "TOOL[=JSONARGS]", value_parser = parse_call)]
    pub calls: Vec<String>,
    /// How long any one answer may take; a mod that takes longer gets a verdict, not a wait.
    #[arg(long, value_parser = parse_timeout, default_value = "5s")]
    pub timeout: Duration,
    /// How long events are watched while requests are pipelined.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub flow: Duration,
    /// The largest request tried, 1KiB to 64MiB (at most the mod's limits.maxMessageSize).
    #[arg(long, value_parser = super::serve::max_body, default_value = "1MiB")]
    pub large: String,
    #[command(flatten)]
    pub json: Json,
    /// Start the mod as a stdio child instead: its command and arguments, everything after
    /// --command (so it comes last). Each connection the checks need starts it again.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `TOOL` or `TOOL=JSON` with a JSON object: checked here, split again in [`calls`].
fn parse_call(s: &str) -> Result<String, String> {
    split_call(s).map(|_| s.to_string())
}

fn split_call(s: &str) -> Result<Call, String> {
    let (tool, args) = s.split_once('=').unwrap_or((s, "{}"));
    if tool.is_empty() {
        return Err("expected TOOL or TOOL={...}".into());
    }
    let arguments: serde_json::Value =
        serde_json::from_str(args).map_err(|e| format!("the arguments are not JSON: {e}"))?;
    if !arguments.is_object() {
        return Err("the arguments must be a JSON object".into());
    }
    Ok(Call {
        tool: tool.to_string(),
        arguments,
    })
}

/// A mod at a socket address.
struct AtAddr(Addr);

impl Target for AtAddr {
    fn connect(&self) -> BoxFuture<'_, std::io::Result<Conn>> {
        Conn::connect(&self.0).boxed()
    }
    fn name(&self) -> String {
        self.0.to_string()
    }
    fn single_connection(&self) -> bool {
        false
    }
}

/// A mod started as a child speaking GABP on its stdin and stdout; its stderr is the
/// checker's, so what the mod says about itself is seen.
struct StdioMod(Vec<String>);

impl Target for StdioMod {
    fn connect(&self) -> BoxFuture<'_, std::io::Result<Conn>> {
        async move {
            let (program, args) = self
                .0
                .split_first()
                .ok_or_else(|| std::io::Error::other("empty command"))?;
            let mut child = tokio::process::Command::new(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
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
            Ok(Conn::from_halves(
                OwnedStdout {
                    stdout,
                    _child: child,
                },
                stdin,
                "stdio",
            ))
        }
        .boxed()
    }
    fn name(&self) -> String {
        format!("stdio: {}", self.0.join(" "))
    }
    fn single_connection(&self) -> bool {
        true
    }
}

/// A child's stdout that owns the child: the connection's end is the child's.
struct OwnedStdout {
    stdout: tokio::process::ChildStdout,
    _child: tokio::process::Child,
}

impl AsyncRead for OwnedStdout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

/// Runs the suite; the exit code is 1 when a check failed.
pub async fn run(a: CheckModArgs) -> Result<i32> {
    let target: Box<dyn Target> = match (&a.addr, a.command.is_empty()) {
        (Some(addr), true) => Box::new(AtAddr(
            addr.parse()
                .map_err(|e: String| usage(format!("the mod's address: {e}")))?,
        )),
        (None, false) => {
            gabp_engine::transport::check_command(&a.command).map_err(usage)?;
            Box::new(StdioMod(a.command.clone()))
        }
        (Some(_), false) => {
            return Err(usage(
                "give the mod's address or --command with its command line, not both",
            ))
        }
        (None, true) => return Err(usage(
            "give the mod's address (HOST:PORT or unix:PATH) or --command with its command line",
        )),
    };
    let large =
        units::parse_size_in(&a.large, limits::MIN_SIZE, limits::MAX_BODY).map_err(usage)?;
    let opts = Options {
        token: a.token.clone(),
        wait: a.timeout,
        calls: a
            .calls
            .iter()
            .map(|c| split_call(c).map_err(usage))
            .collect::<Result<_>>()?,
        large,
        flow: a.flow,
    };
    let report = modcheck::run(target.as_ref(), &opts).await;
    if a.json.json {
        super::print_json(&report)?;
    } else {
        write!(std::io::stdout(), "{}", report.text())?;
    }
    Ok(if report.ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_a_tool_with_an_object_of_arguments() {
        let c = split_call("sim/echo").expect("bare tool");
        assert_eq!(
            (c.tool.as_str(), c.arguments.to_string().as_str()),
            ("sim/echo", "{}")
        );
        let c = split_call(r#"sim/echo={"text":"h=é"}"#).expect("with arguments");
        assert_eq!(c.arguments["text"], "h=é");
        assert!(split_call("sim/echo=[1]").is_err());
        assert!(split_call("sim/echo={").is_err());
        assert!(split_call("={}").is_err());
    }
}
